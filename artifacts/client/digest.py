"""NIP-AR "Set digest" (nip-ar-set-v1): a content identifier of a set of artifact heads.

SHA-256 over b"nip-ar-set-v1", a zero byte, then "<d>:<head event id>\\n" for each artifact,
sorted by d; written as lowercase hex. It is not a counter, a prev precondition or a
live-delivery cursor: two clients holding the same heads compute the same digest.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Final

DOMAIN: Final = b"nip-ar-set-v1\0"
_UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HEX64: Final = re.compile(r"[0-9a-f]{64}")


def is_artifact_id(value: object) -> bool:
    """Is `value` an artifact id (d) as NIP-AR spells it: a lowercase hyphenated UUID?"""
    return isinstance(value, str) and _UUID.fullmatch(value) is not None


def set_digest(heads: Mapping[str, str] | Iterable[tuple[str, str]]) -> str:
    """The digest of a set given as {d: head id} or as (d, head id) pairs.

    d must be a lowercase hyphenated UUID and the id 64 lowercase hex characters, as
    NIP-AR spells them: anything else (a ":" or a newline in particular) would make two
    different sets hash alike, so it is a ValueError. A set holds one head per d, so a
    repeated d is a ValueError too.
    """
    pairs = list(heads.items()) if isinstance(heads, Mapping) else list(heads)
    seen: set[str] = set()
    for d, head in pairs:
        if not is_artifact_id(d):
            raise ValueError(f"d must be a lowercase hyphenated UUID, not {d!r}")
        if not (isinstance(head, str) and _HEX64.fullmatch(head)):
            raise ValueError(f"the head of {d} must be a 64-character lowercase hex event id, not {head!r}")
        if d in seen:
            raise ValueError(f"d {d} occurs twice: a set holds one head per artifact")
        seen.add(d)
    h = hashlib.sha256(DOMAIN)
    # d is ASCII here, so sorting the strings sorts their bytes.
    for d, head in sorted(pairs):
        h.update(f"{d}:{head}\n".encode("ascii"))
    return h.hexdigest()
