"""Building kind-45010 revisions and reading their envelope (NIP-AR "Event format").

The client builds envelopes the way the spec lays them out; the relay is the one that
validates them, and the conformance suite checks that it does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from .events import Event, Keys

KIND_ARTIFACT: Final = 45010
KIND_REMOVAL: Final = 45011
ENVELOPE_TAGS: Final = frozenset({"ar", "d", "h", "type", "title", "op", "root", "prev"})
# NIP-OA owner attestations: verified by the relay, not content.
AUTH_TAG: Final = "auth"


@dataclass(frozen=True, slots=True)
class Head:
    """The envelope fields of a revision (or of a kind-45011 removal: type, title and op are None)."""

    d: str
    h: str
    type: str | None
    op: str | None
    title: str | None
    prev: str | None
    root: str | None

    @classmethod
    def of(cls, event: Event) -> Head:
        d, h = event.first("d"), event.first("h")
        if d is None or h is None:
            raise ValueError("a NIP-AR event has d and h tags")
        return cls(
            d, h, event.first("type"), event.first("op"), event.first("title"), event.first("prev"), event.first("root")
        )

    @property
    def deleted(self) -> bool:
        return self.op == "delete"


def client_tags(event: Event) -> list[list[str]]:
    """Every tag that is neither an envelope tag nor a NIP-OA attestation, in order."""
    return [list(t) for t in event.tags if t[0] not in ENVELOPE_TAGS and t[0] != AUTH_TAG]


def json_text(value: Any) -> str:
    """A JSON value as compact JSON text, keys sorted."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def content_text(content: str | Any) -> str:
    """Content as sent: a str as it is, anything else as compact JSON."""
    if isinstance(content, str):
        return content
    return json_text(content)


def revision(
    keys: Keys,
    *,
    d: str,
    h: str,
    type: str,
    op: str,
    title: str | None = None,
    prev: str | None = None,
    root: str | None = None,
    content: str | Any = "",
    tags: Sequence[Sequence[str]] = (),
    created_at: int | None = None,
) -> Event:
    """A signed kind 45010. A delete carries no title and empty content (pass neither)."""
    envelope: list[list[str]] = [["ar", "1"], ["d", d], ["h", h], ["type", type]]
    if title is not None:
        envelope.append(["title", title])
    envelope.append(["op", op])
    if root is not None:
        envelope.append(["root", root])
    if prev is not None:
        envelope.append(["prev", prev])
    return keys.sign(KIND_ARTIFACT, [*envelope, *(list(t) for t in tags)], content_text(content), created_at=created_at)


def next_revision(
    keys: Keys,
    head: Event,
    op: str,
    *,
    h: str | None = None,
    title: str | None = None,
    content: str | Any | None = None,
    tags: Sequence[Sequence[str]] | None = None,
    created_at: int | None = None,
) -> Event:
    """A revision whose prev is `head`, keeping what is not given (h, type, title, root, tags, content).

    A delete keeps type, h and root and drops title, content and client tags, as the spec wants.
    """
    cur = Head.of(head)
    if cur.type is None:
        raise ValueError("the head is not a kind-45010 revision")
    if op == "delete":
        return revision(
            keys, d=cur.d, h=cur.h, type=cur.type, op=op, prev=head.id, root=cur.root, created_at=created_at
        )
    return revision(
        keys,
        d=cur.d,
        h=h or cur.h,
        type=cur.type,
        op=op,
        title=title if title is not None else cur.title,
        prev=head.id,
        root=None if op == "move" else cur.root,
        content=content if content is not None else head.content,
        tags=tags if tags is not None else client_tags(head),
        created_at=created_at,
    )
