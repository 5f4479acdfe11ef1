"""Django set up in this process, for the benchmarks that measure relay code in-process (no relay process,
no database or Redis connection: the URLs point nowhere, and nothing connects).

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import inprocess

    inprocess.setup()   # before importing anything of the relay
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def setup() -> None:
    """The repository importable, dev-mode settings whose database and Redis nothing connects to, and
    django.setup()."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "buzz.settings")
    os.environ.setdefault("BUZZ_DEV", "1")
    os.environ.setdefault("DATABASE_URL", "postgres://bench@127.0.0.1:1/unused")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:1/0")
    import django

    django.setup()
