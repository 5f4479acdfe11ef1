"""NIP-01 filters: the strict parse of a filter object, and matching an event against filters.

Pure: REQ and COUNT frames (buzz.ws.frames) parse their filters here, the stored
read (buzz.events.query) turns them into SQL, and live delivery matches with them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .event import has_surrogate

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_TAG_KEY = re.compile(r"^#[A-Za-z]\Z")
MAX_INT = 2**53 - 1


class FilterError(ValueError):
    """A filter that can't be served; `reason` is the NIP-01 reason for CLOSED."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Filter:
    ids: tuple[str, ...] | None = None
    authors: tuple[str, ...] | None = None
    kinds: tuple[int, ...] | None = None
    tags: tuple[tuple[str, tuple[str, ...]], ...] = ()
    since: int | None = None
    until: int | None = None
    limit: int = 0

    def tag_values(self, letter: str) -> tuple[str, ...] | None:
        for name, values in self.tags:
            if name == letter:
                return values
        return None

    def matches_nothing(self) -> bool:
        """A filter with an empty list matches nothing (NIP-01)."""
        return any(v is not None and len(v) == 0 for v in (self.ids, self.authors, self.kinds)) or any(
            not values for _, values in self.tags
        )


def _int(key: str, v: object, lo: int = 0, hi: int = MAX_INT) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise FilterError(f"invalid: filter {key} must be an integer from {lo} to {hi}")
    return v


def _values(key: str, v: object, max_values: int) -> list[Any]:
    if not isinstance(v, list):
        raise FilterError(f"invalid: filter {key} must be an array")
    if len(v) > max_values:
        raise FilterError(f"invalid: filter {key} has more than {max_values} values")
    return v


def parse_filter(raw: object, *, max_values: int, max_limit: int, default_limit: int) -> Filter:
    """One NIP-01 filter object. Raises FilterError; no key is silently ignored."""
    if not isinstance(raw, dict):
        raise FilterError("invalid: a filter must be a JSON object")
    ids = authors = None
    kinds = None
    tags: list[tuple[str, tuple[str, ...]]] = []
    since = until = None
    limit = default_limit
    for key, v in raw.items():
        if key in ("ids", "authors"):
            items = _values(key, v, max_values)
            if not all(isinstance(x, str) and _HEX64.match(x) for x in items):
                raise FilterError(f"invalid: filter {key} must hold 64-character lowercase hex strings")
            if key == "ids":
                ids = tuple(items)
            else:
                authors = tuple(items)
        elif key == "kinds":
            items = _values(key, v, max_values)
            kinds = tuple(_int("kinds", k, 0, 65535) for k in items)
        elif key == "since":
            since = _int(key, v)
        elif key == "until":
            until = _int(key, v)
        elif key == "limit":
            # NIP-11 max_limit: the relay clamps a larger limit to this value.
            limit = min(_int(key, v), max_limit)
        elif isinstance(key, str) and _TAG_KEY.match(key):
            items = _values(key, v, max_values)
            if not all(isinstance(x, str) for x in items):
                raise FilterError(f"invalid: filter {key} must hold strings")
            # No stored tag holds either (buzz.events.store refuses U+0000; an event can't hold a lone
            # surrogate), and PostgreSQL can't take them as query text: refused here, not failed there.
            if any("\x00" in x or has_surrogate(x) for x in items):
                raise FilterError(f"invalid: filter {key} values can't contain U+0000 or unpaired surrogates")
            tags.append((key[1], tuple(items)))
        else:
            # No predicate is silently ignored: an unknown key would widen the result.
            raise FilterError(f"invalid: unsupported filter key {str(key)[:64]!r}")
    return Filter(ids=ids, authors=authors, kinds=kinds, tags=tuple(tags), since=since, until=until, limit=limit)


def first_values(tags: Iterable[Any]) -> dict[str, set[str]]:
    """Tag name -> the set of first values: what `#x` compares against."""
    out: dict[str, set[str]] = {}
    for tag in tags:
        if isinstance(tag, list | tuple) and len(tag) >= 2:
            out.setdefault(tag[0], set()).add(tag[1])
    return out


def matches(f: Filter, event: Mapping[str, Any], tag_index: Mapping[str, set[str]] | None = None) -> bool:
    if f.ids is not None and event["id"] not in f.ids:
        return False
    if f.authors is not None and event["pubkey"] not in f.authors:
        return False
    if f.kinds is not None and event["kind"] not in f.kinds:
        return False
    if f.since is not None and event["created_at"] < f.since:
        return False
    if f.until is not None and event["created_at"] > f.until:
        return False
    if f.tags:
        index = tag_index if tag_index is not None else first_values(event["tags"])
        for name, values in f.tags:
            have = index.get(name)
            if not have or have.isdisjoint(values):
                return False
    return True


def matches_any(filters: Iterable[Filter], event: Mapping[str, Any]) -> bool:
    index: dict[str, set[str]] | None = None
    for f in filters:
        if f.tags and index is None:
            index = first_values(event["tags"])
        if matches(f, event, index):
            return True
    return False
