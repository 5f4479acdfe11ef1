"""JSON from clients, read without guessing: an object that names a key twice is refused.

RFC 8259 leaves the meaning of duplicate names open (section 4: "the behavior of software that receives
such an object is unpredictable"), and Python's decoder keeps the last one. A relay that did the same
would answer a different, narrower request than the one sent: `{"#status":["open"],"#status":["done"]}`
would become one predicate, `{"artifact":"head","artifact":"current"}` another view, and an event whose
"content" appears twice would be stored as one reading of it while other software reads the other.
NIP-AR: "predicates MUST NOT be silently ignored". Every frame, body and token a client sends is read
with `loads`.
"""

from __future__ import annotations

import json
from typing import Any


class DuplicateKey(ValueError):
    """An object names `key` twice (a ValueError, as every other JSON failure)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key[:64]!r} in a JSON object")
        self.key = key

    @property
    def reason(self) -> str:
        """The NIP-01 reason for a refused message."""
        return f"invalid: {self}"


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return value


def loads(text: str | bytes | bytearray) -> Any:
    """`json.loads`, refusing an object with a duplicate key (DuplicateKey). Raises ValueError and
    RecursionError as `json.loads` does."""
    return json.loads(text, object_pairs_hook=_object)
