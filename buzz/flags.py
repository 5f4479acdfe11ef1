"""The words an on/off environment variable may hold, read the same way by the settings and by the dev
tooling that runs before them (buzz.dev.devservices). Anything else is neither: the settings refuse it."""

from __future__ import annotations

from typing import Final

TRUE_WORDS: Final = frozenset({"1", "true", "yes", "on", "y", "t"})
FALSE_WORDS: Final = frozenset({"", "0", "false", "no", "off", "n", "f"})


def parse_flag(value: str) -> bool | None:
    """True or False for a word of TRUE_WORDS or FALSE_WORDS (case and surrounding spaces aside), else None."""
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None
