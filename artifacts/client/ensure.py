"""NIP-AR "Deterministic identity and the ensure flow": make "this record exists with this content" true.

1. Send create (d derived from channel, type and key). Accepted: created. A duplicate of
   an accepted event: duplicate, when that create is still the head (read to make sure: an
   identical create, same second and content, may have been accepted, then deleted or
   edited; then step 2 goes on from the head).
2. On conflict, read the head (the head view, deletions included; in the channel first, by #h, so
   that an unlisted open channel the key writes in without joining it is read too):
   - a deletion: send restore with prev set to it (restored);
   - live, and already holding the title, the content fields and the client tags asked for: unchanged;
   - otherwise: send update with prev set to it (updated), or report the conflict
     when the caller asks for that (on_differs="report").
3. On a further conflict, repeat step 2, up to `attempts` times; then report conflict.

An update keeps what the caller does not set ("Client behavior": editors preserve unfamiliar fields and
annotation tags, or decline the edit): the head's content fields that the caller's content object lacks,
and its client tags whose names the caller's tags lack. So ensure sets fields and tags; it never removes
one. When the head's content is not a JSON object it can merge into (and is not empty or already the
caller's), ensure declines with a conflict.

A head that lives in another channel (the artifact was moved) or has another type is
reported as a conflict: ensure never moves an artifact back or edits a foreign record.
A conflict is an OK whose message starts with "conflict:".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

from .connection import Ok, RelayError
from .events import Event, Keys
from .httpapi import HttpError
from .identity import derive_d
from .revisions import Head, client_tags, content_text, next_revision, revision


class Outcome(StrEnum):
    CREATED = "created"
    DUPLICATE = "duplicate"
    RESTORED = "restored"
    UNCHANGED = "unchanged"
    UPDATED = "updated"
    CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
class EnsureResult:
    outcome: Outcome
    d: str
    head_id: str | None  # the revision now current as far as this call knows (None when unreadable)
    message: str  # the relay's last OK message, or why it is a conflict
    attempts: int  # head reads (step 2 rounds)


class Writer(Protocol):
    """What ensure needs of a relay: EVENT/OK and the head view. connection.Relay is one."""

    @property
    def keys(self) -> Keys | None: ...

    async def publish(self, event: Event, *, timeout: float = ...) -> Ok: ...

    async def head(
        self, ds: Sequence[str], *, channels: Sequence[str] | None = ..., timeout: float = ...
    ) -> dict[str, Event]: ...


# An update would drop content this client can't keep (its fields are not a JSON object's).
_UNMERGEABLE = "conflict: the artifact's content is not a JSON object whose fields an update can keep"


class EnsureRejected(RelayError):
    """A write was refused for another reason than a conflict (invalid:, restricted:, rate-limited: ...)."""


async def _read_head(relay: Writer, d: str, channel: str) -> Event | None:
    """The head of d, read in the channel it was created in first (#h: a reader who has not joined an
    unlisted open channel can write in it, but reads it only by naming it), then wherever else the reader
    can read it (the artifact may have moved). None: no head this key can read."""
    try:
        head = (await relay.head([d], channels=[channel], timeout=15.0)).get(d)
    except HttpError:
        head = None  # the channel is no longer readable (restricted:): the artifact may live elsewhere
    if head is None:
        head = (await relay.head([d], timeout=15.0)).get(d)
    return head


def _object(text: str) -> dict[str, Any] | None:
    """`text` as a JSON object whose every field an update writes back as it was, or None: not JSON, JSON of
    another shape, or JSON holding what compact JSON would write otherwise (a number such as 1E2, 1.50 or
    -0, one past a float's range or precision, NaN or Infinity, a key that occurs twice). An update that
    changed such a field would not keep it: the edit is declined instead."""
    exact = True

    def number(literal: str, kind: type[int] | type[float]) -> int | float:
        nonlocal exact
        value = kind(literal)
        if json.dumps(value) != literal:
            exact = False
        return value

    def constant(literal: str) -> None:
        nonlocal exact
        exact = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal exact
        value = dict(items)
        if len(value) != len(items):
            exact = False
        return value

    try:
        value = json.loads(
            text,
            parse_int=lambda s: number(s, int),
            parse_float=lambda s: number(s, float),
            parse_constant=constant,
            object_pairs_hook=pairs,
        )
    except ValueError:
        return None
    return value if isinstance(value, dict) and exact else None


@dataclass(frozen=True, slots=True)
class _Edit:
    """What an update of the head to the caller's content and tags sends, with what the caller does not set
    kept; `same`: the head holds all of it already."""

    content: str
    tags: list[list[str]]
    same: bool


def _edit_of(head: Event, title: str, content: str, tags: Sequence[Sequence[str]]) -> _Edit | None:
    """The update of `head` that keeps its unfamiliar content fields and annotation tags; None when its content
    has fields that can't be kept (it is not a JSON object, or the caller's content is not one)."""
    current = _object(head.content)
    wanted = _object(content)
    if head.content == content or not head.content:
        text, same_content = content, head.content == content
    elif current is not None and wanted is not None:
        fields = {**current, **wanted}
        # Compared as written: in Python true == 1 == 1.0, in the content they are three values.
        text = content_text(fields)
        same_content = text == content_text(current)
    else:
        return None
    named = {t[0] for t in tags}
    kept = [t for t in client_tags(head) if t[0] not in named]
    merged = [*kept, *(list(t) for t in tags)]
    same = head.first("title") == title and same_content and sorted(merged) == sorted(client_tags(head))
    return _Edit(text, merged, same)


async def ensure(
    relay: Writer,
    *,
    channel: str,
    type: str,
    key: str,
    title: str,
    content: str | Any,
    tags: Sequence[Sequence[str]] = (),
    on_differs: Literal["update", "report"] = "update",
    attempts: int = 5,
    keys: Keys | None = None,
) -> EnsureResult:
    """Run the ensure flow over `relay` (signed with `keys`, default the connection's key)."""
    signer = keys or relay.keys
    if signer is None:
        raise ValueError("ensure needs a key to sign with")
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    text = content_text(content)
    extra = [list(t) for t in tags]
    d = derive_d(channel, type, key)

    async def send(event: Event) -> Ok:
        ok = await relay.publish(event)
        if not ok.accepted and ok.prefix != "conflict":
            raise EnsureRejected(ok.message or "error: refused without a reason")
        return ok

    create = revision(signer, d=d, h=channel, type=type, op="create", title=title, content=text, tags=extra)
    ok = await send(create)
    if ok.accepted and ok.prefix != "duplicate":
        return EnsureResult(Outcome.CREATED, d, create.id, ok.message, 0)
    duplicate, last = ok.accepted, ok.message
    for attempt in range(1, attempts + 1):
        head = await _read_head(relay, d, channel)
        if duplicate and head is not None and head.id == create.id:
            # The spec's step 1 stops at a duplicate. That is right while our create is still the head; but the
            # same create (same second, same content) may have been accepted long ago and deleted or edited
            # since, so the head decides.
            return EnsureResult(Outcome.DUPLICATE, d, create.id, last, attempt)
        if head is None:
            return EnsureResult(Outcome.CONFLICT, d, None, f"{last} (and no head this key can read)", attempt)
        env = Head.of(head)
        if env.type != type or env.h != channel:
            where = f"type {env.type}" if env.type != type else f"channel {env.h}"
            return EnsureResult(Outcome.CONFLICT, d, head.id, f"conflict: the artifact has {where}", attempt)
        if env.deleted:
            # A deletion has no content or client tags: nothing to keep.
            event = next_revision(signer, head, "restore", title=title, content=text, tags=extra)
            outcome = Outcome.RESTORED
        elif (edit := _edit_of(head, title, text, extra)) is None:
            return EnsureResult(Outcome.CONFLICT, d, head.id, _UNMERGEABLE, attempt)
        elif edit.same:
            return EnsureResult(Outcome.UNCHANGED, d, head.id, "", attempt)
        elif on_differs == "report":
            return EnsureResult(Outcome.CONFLICT, d, head.id, "conflict: the artifact has other content", attempt)
        else:
            event = next_revision(signer, head, "update", title=title, content=edit.content, tags=edit.tags)
            outcome = Outcome.UPDATED
        ok = await send(event)
        if ok.accepted:
            # A duplicate here is our own earlier send of this very event: it is what we did.
            return EnsureResult(outcome, d, event.id, ok.message, attempt)
        last = ok.message
    return EnsureResult(Outcome.CONFLICT, d, None, f"{last} (gave up after {attempts} attempts)", attempts)
