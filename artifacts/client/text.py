"""Untrusted text made safe to print on a terminal (the CLI's text output and the conformance report)."""

from __future__ import annotations

import re
from typing import Final

# What a terminal would act on rather than show: C0 and C1 controls (ESC, CSI...), DEL, and the bidirectional
# controls that reorder what follows them. Artifact text and a relay's reasons are untrusted (NIP-AR "Client
# behavior"): in text output each such character is written as a \uXXXX escape. JSON output (--json) escapes
# C0 as JSON does and is meant for programs.
_UNSAFE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: object) -> str:
    """`text` as a terminal may show it: nothing in it can move the cursor, recolor or reorder the line."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", str(text))
