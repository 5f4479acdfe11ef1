from django.apps import AppConfig


class ModerationConfig(AppConfig):
    name = "moderation"
    verbose_name = "Moderation"

    def ready(self) -> None:
        from artifacts.redaction import observe_redactions
        from buzz.chat.channels import observe_lifecycle
        from moderation.services import record_lifecycle, record_redaction

        # A member's NIP-29 9005 that redacts a revision leaves an audit record too, and so do a member's
        # archive, unarchive and delete (9002, 9008) and those of `manage.py channel`.
        observe_redactions(record_redaction)
        observe_lifecycle(record_lifecycle)
