from django.apps import AppConfig


class ModerationConfig(AppConfig):
    name = "moderation"
    verbose_name = "Moderation"

    def ready(self) -> None:
        from artifacts.redaction import observe_redactions
        from moderation.services import record_redaction

        # A member's NIP-29 9005 that redacts a revision leaves an audit record too.
        observe_redactions(record_redaction)
