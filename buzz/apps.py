from django.apps import AppConfig


class BuzzConfig(AppConfig):
    name = "buzz"
    verbose_name = "Buzz relay"

    def ready(self) -> None:
        from buzz.chat import groups, messages

        messages.register()
        groups.register()
