"""Where the shared test vectors live: ../shared/vectors beside the checkout (as laid out for
developers and CI), or BUZZ_VECTORS_DIR. They are read in place, never copied into the repo."""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]


def vectors_dir() -> Path:
    override = os.environ.get("BUZZ_VECTORS_DIR")
    if override:
        return Path(override)
    beside = _REPO.parent / "shared" / "vectors"
    # A checkout elsewhere on a developer's machine still finds the workplace's copy.
    return beside if beside.is_dir() else Path("/work/shared/vectors")
