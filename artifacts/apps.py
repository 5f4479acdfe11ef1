from django.apps import AppConfig


class ArtifactsConfig(AppConfig):
    name = "artifacts"
    verbose_name = "NIP-AR artifacts"

    def ready(self) -> None:
        from artifacts import services
        from artifacts.envelope import KIND_ARTIFACT, KIND_REMOVAL
        from buzz.events.ingest import register_kind
        from buzz.web.nip11 import register_section

        register_kind(KIND_ARTIFACT, services.accept_revision, already_accepted=services.already_accepted)
        register_kind(KIND_REMOVAL, services.reject_removal)
        register_kind(5, services.reject_kind5)
        register_section("artifacts", services.nip11_section)
