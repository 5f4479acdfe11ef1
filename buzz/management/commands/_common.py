"""Shared pieces of the operator commands (argument types, community lookup, printed commands)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shlex
import uuid
from collections.abc import Callable

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from buzz.identity.communities import community_by_host, normalize_host
from buzz.models import Community

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DURATION_SECONDS = 36500 * 86400  # a hundred years


def community_arg(host: str) -> Community:
    try:
        return community_by_host(host)
    except Community.DoesNotExist:
        raise CommandError(f"no community for host {normalize_host(host)}") from None


def channel_arg(value: str) -> uuid.UUID:
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        raise CommandError(f"invalid channel id {value!r}: expected a lowercase UUID") from None
    if str(parsed) != value or parsed.int == 0:
        raise CommandError(f"invalid channel id {value!r}: expected a non-nil lowercase hyphenated UUID")
    return parsed


def duration_arg(value: str) -> dt.timedelta:
    match = _DURATION.match(value)
    if not match:
        raise CommandError(f"invalid duration {value!r}: use a number and s, m, h or d (e.g. 30m, 7d)")
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds > MAX_DURATION_SECONDS:
        # Added to now, a longer one overflows the calendar (or the database's timestamps).
        raise CommandError(f"invalid duration {value!r}: at most {MAX_DURATION_SECONDS // 86400}d")
    return dt.timedelta(seconds=seconds)


def actions(parser: CommandParser, *, host: bool = True) -> Callable[[str, str], argparse.ArgumentParser]:
    """A subcommand adder for `manage.py <command> ACTION ...`; each action takes --host unless host=False."""
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
        if host:
            p.add_argument("--host", required=True, help="the community's host")
        return p

    return add


def manage_command(*args: str) -> str:
    """`.venv/bin/python manage.py ARGS` as it works pasted into another shell in this checkout.

    In dev mode it carries what that shell would lack: a DATABASE_URL / REDIS_URL that is
    not one of the embedded servers manage.py finds under var/ by itself (`make run` with
    the URLs set), BUZZ_REDIS_PREFIX, and then BUZZ_DEV=1. Outside dev mode it carries
    nothing: the operator's environment is theirs, and a secret is never printed.
    """
    words = [".venv/bin/python", "manage.py", *args]
    if not settings.DEV_MODE:
        return shlex.join(words)
    from buzz.dev.devservices import running_urls

    found = running_urls(settings.BASE_DIR / "var")
    prefix = [
        f"{name}={os.environ[name]}"
        for name in ("DATABASE_URL", "REDIS_URL")
        if os.environ.get(name) and found.get(name) != os.environ[name]
    ]
    if os.environ.get("BUZZ_REDIS_PREFIX"):
        prefix.append(f"BUZZ_REDIS_PREFIX={os.environ['BUZZ_REDIS_PREFIX']}")
    if prefix:
        prefix.append("BUZZ_DEV=1")
    return shlex.join([*prefix, *words])
