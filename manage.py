#!/usr/bin/env python
"""Django's command-line entry point for the Buzz artifact relay.

In a dev checkout where `make run` is going, a command pasted into another shell finds
the embedded servers that `make run` keeps under var/ (for whichever of DATABASE_URL /
REDIS_URL is unset) and runs in dev mode, as the relay does. Anywhere else, and for a
variable that is set, the environment alone decides (buzz/settings.py).
"""

import os
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "buzz.settings")
    from buzz.dev.devservices import checkout_environment, checkout_hint

    os.environ.update(checkout_environment(BASE_DIR, os.environ))
    hint = checkout_hint(BASE_DIR, os.environ)
    if hint is not None:
        raise SystemExit(f"error: {hint}")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
