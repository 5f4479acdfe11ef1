"""The sync filter and NIP-AR's match rule.

A filter is {"artifact": "current", "#h": [...], "#name": [...], ...}: a sync's #h is required
(one or more channels), a current view's and an incremental read's is optional. Conditions
on different names are ANDed, the values of one name are ORed, and an event matches a
condition when one of its tags has that name and, as its FIRST value, one of the values
(the tag name and its first value in the same tag).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from .events import Event


class FilterError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class CurrentFilter:
    """A current-view filter: #h optional (no channels: every channel the reader's scope covers)."""

    channels: tuple[str, ...] = ()
    # (tag name, accepted values) for every name but h, in the order given.
    tags: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def of(
        cls,
        channels: Sequence[str] = (),
        *,
        types: Sequence[str] = (),
        tags: Mapping[str, Sequence[str]] | Iterable[tuple[str, str]] = (),
    ) -> Self:
        """Build a filter. `tags` is {name: [values]} or (name, value) pairs; pairs with one name OR."""
        grouped: dict[str, list[str]] = {}
        if types:
            grouped["type"] = list(types)
        items: Iterable[tuple[str, Any]]
        if isinstance(tags, Mapping):
            items = ((name, value) for name, values in tags.items() for value in values)
        else:
            items = tags
        for name, value in items:
            if not isinstance(name, str) or not name:
                raise FilterError("a tag name must be a non-empty string")
            if name == "h":
                raise FilterError("channels are the filter's #h; give them as channels")
            if not isinstance(value, str):
                raise FilterError(f"#{name} values must be strings")
            grouped.setdefault(name, [])
            if value not in grouped[name]:
                grouped[name].append(value)
        return cls(tuple(dict.fromkeys(channels)), tuple((n, tuple(v)) for n, v in grouped.items()))

    def canonical(self) -> Self:
        """The same filter spelled one way: channels, tag names and each name's values sorted. The values of a
        name OR and the names AND, so the order given changes nothing but the text; an incremental read's
        tokens bind the exact text of its query, so a client that keeps one store per query sends this."""
        tags = tuple((name, tuple(sorted(values))) for name, values in sorted(self.tags))
        return type(self)(tuple(sorted(self.channels)), tags)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"artifact": "current"}
        if self.channels:
            out["#h"] = list(self.channels)
        for name, values in self.tags:
            out[f"#{name}"] = list(values)
        return out

    def predicates(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return (("h", self.channels), *self.tags) if self.channels else self.tags

    def matches(self, event: Event) -> bool:
        """The NIP-AR match rule over every predicate, #h included."""
        return all(_matches_one(event, name, values) for name, values in self.predicates())


@dataclass(frozen=True, slots=True)
class SyncFilter(CurrentFilter):
    """A sync's filter: a current-view filter whose #h names one or more channels."""

    def __post_init__(self) -> None:
        if not self.channels:
            raise FilterError("a sync filter needs #h with at least one channel")


def _matches_one(event: Event, name: str, values: tuple[str, ...]) -> bool:
    # Only the first value of each tag counts: ["x", "a", "b"] matches #x:["a"], never #x:["b"].
    return any(len(tag) >= 2 and tag[0] == name and tag[1] in values for tag in event.tags)
