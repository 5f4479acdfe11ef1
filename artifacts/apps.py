from django.apps import AppConfig


class ArtifactsConfig(AppConfig):
    name = "artifacts"
    verbose_name = "NIP-AR artifacts"
