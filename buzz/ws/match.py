"""NIP-01 filter matching for live events (the stored side is SQL in buzz.events.query). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from buzz.ws.frames import Filter


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
