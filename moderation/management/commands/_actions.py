"""The shape the moderation app's operator commands share: `manage.py <command> ACTION ...`, each action a
`_<action>` method, and the services' refusals and database errors as one-line CommandErrors."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from moderation.services import ModerationError


class ActionCommand(BaseCommand):
    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            getattr(self, "_" + opts["action"].replace("-", "_"))(opts)
        except ModerationError as err:
            raise CommandError(str(err)) from None
        except DatabaseError as err:
            raise CommandError(f"database error: {str(err).strip().splitlines()[0]}") from None


def count(n: int, one: str, many: str) -> str:
    """ "1 channel", "2 channels": a number with its noun, for the commands' one-line reports."""
    return f"{n} {one if n == 1 else many}"
