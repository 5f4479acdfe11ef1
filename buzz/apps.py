from django.apps import AppConfig


class BuzzConfig(AppConfig):
    name = "buzz"
    verbose_name = "Buzz relay"
