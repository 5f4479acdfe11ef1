"""A plain-Python evaluation of the NIP-AR read views, written from spec/NIP-AR.md.

No Django, no I/O, no import from the relay. The query tests build a data set through the
relay, record the same facts here, and compare the relay's answers with `evaluate` / `count`.

What the model holds:
  channels   id -> open or private, listed, DM, deleted, members
  readers    pubkey + what the credential allows (scopes, a channel list)
  artifacts  d -> type and every accepted revision in acceptance order (its channel, tags,
             whether moderation redacted it)

The rules it encodes (sections "Access", "Current state and queries", "Head lookup",
"Moderation and retention", "Incremental reads"):
  * A reader reads a channel that exists (not deleted) when the credential has messages:read,
    covers the channel, and the reader is a member or the channel is open and not a DM.
  * Without #h the scope is every readable channel the reader joined or that is listed:
    unlisted open channels need membership or an explicit #h. With #h every named channel
    must be readable (one answer, "restricted", whether or not it exists).
  * current: each artifact's head, if it is not a deletion, not redacted (retired), and its
    home is in scope; #d and #type compare the artifact, every other #name compares (tag name,
    first value) of some tag of the head, `auth` excluded; names AND, values OR. Ordered by d,
    then offset and limit. count: the same set, unpaged.
  * history: every revision that is not redacted, published in a channel in scope, optionally
    narrowed by #d and #type, in acceptance order.
  * head: the head of each named d whose home is in scope, a deletion included, not redacted.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

KIND_ARTIFACT: Final = 45010
READ_SCOPE: Final = "messages:read"
DEFAULT_LIMIT: Final = 100
NOT_A_MEMBER: Final = "restricted: not a channel member"


@dataclass
class Channel:
    id: str
    visibility: str = "open"  # "open" | "private"
    listed: bool = True
    dm: bool = False
    deleted: bool = False
    members: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Reader:
    name: str
    pubkey: str
    # None: a NIP-98 or NIP-42 login, which holds every scope and every channel.
    scopes: frozenset[str] | None = None
    channels: frozenset[str] | None = None


@dataclass
class Revision:
    id: str
    channel: str
    op: str
    tags: list[list[str]]
    redacted: bool = False


@dataclass
class Artifact:
    d: str
    type: str
    revisions: list[Revision] = field(default_factory=list)

    @property
    def head(self) -> Revision:
        return self.revisions[-1]


@dataclass
class World:
    channels: dict[str, Channel] = field(default_factory=dict)
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    # Every accepted revision in relay acceptance order (a move's revision after its source's).
    order: list[Revision] = field(default_factory=list)

    def accept(self, d: str, type_name: str, revision: Revision) -> None:
        self.artifacts.setdefault(d, Artifact(d, type_name)).revisions.append(revision)
        self.order.append(revision)


class Denied(Exception):
    """The query is refused as a whole (the relay answers 403 with `reason`)."""

    def __init__(self, reason: str = NOT_A_MEMBER, status: int = 403) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


# --- access ------------------------------------------------------------------------


def can_read(world: World, reader: Reader, channel_id: str) -> bool:
    channel = world.channels.get(channel_id)
    if channel is None or channel.deleted:
        return False
    if reader.scopes is not None and READ_SCOPE not in reader.scopes:
        return False
    if reader.channels is not None and channel_id not in reader.channels:
        return False
    return reader.pubkey in channel.members or (channel.visibility == "open" and not channel.dm)


def default_scope(world: World, reader: Reader) -> set[str]:
    """Without #h: readable channels the reader joined, or that are listed."""
    return {
        cid
        for cid, channel in world.channels.items()
        if can_read(world, reader, cid) and (reader.pubkey in channel.members or channel.listed)
    }


def scope(world: World, reader: Reader, filt: dict[str, Any]) -> set[str]:
    if reader.scopes is not None and READ_SCOPE not in reader.scopes:
        raise Denied(f"restricted: this token lacks the {READ_SCOPE} scope")
    named = filt.get("#h")
    if named is None:
        return default_scope(world, reader)
    for value in named:
        # A value names a channel only when it is exactly that channel's id.
        if not can_read(world, reader, value):
            raise Denied()
    return set(named)


# --- matching ----------------------------------------------------------------------


def predicates(filt: dict[str, Any]) -> list[tuple[str, set[str]]]:
    return [(key[1:], set(values)) for key, values in filt.items() if key.startswith("#")]


def head_matches(artifact: Artifact, preds: list[tuple[str, set[str]]]) -> bool:
    head = artifact.head
    for name, values in preds:
        if name == "h":
            continue  # the scope is #h
        if name == "d":
            ok = artifact.d in values
        elif name == "type":
            ok = artifact.type in values
        else:
            # The tag name and its FIRST value, in the same tag.
            ok = any(len(t) >= 2 and t[0] == name and t[0] != "auth" and t[1] in values for t in head.tags)
        if not ok:
            return False
    return True


def _d_key(d: str) -> bytes:
    return uuid.UUID(d).bytes


def current_set(world: World, reader: Reader, filt: dict[str, Any]) -> list[Revision]:
    channels = scope(world, reader, filt)
    preds = predicates(filt)
    out = []
    for d in sorted(world.artifacts, key=_d_key):
        artifact = world.artifacts[d]
        head = artifact.head
        if head.op == "delete" or head.redacted or head.channel not in channels:
            continue
        if head_matches(artifact, preds):
            out.append(head)
    return out


def history_set(world: World, reader: Reader, filt: dict[str, Any]) -> list[Revision]:
    channels = scope(world, reader, filt)
    ds = set(filt["#d"]) if "#d" in filt else None
    types = set(filt["#type"]) if "#type" in filt else None
    by_revision = {r.id: a for a in world.artifacts.values() for r in a.revisions}
    out = []
    for revision in world.order:
        artifact = by_revision[revision.id]
        if revision.redacted or revision.channel not in channels:
            continue
        if ds is not None and artifact.d not in ds:
            continue
        if types is not None and artifact.type not in types:
            continue
        out.append(revision)
    return out


def head_set(world: World, reader: Reader, filt: dict[str, Any]) -> list[Revision]:
    channels = scope(world, reader, filt)
    wanted = set(filt["#d"])
    out = []
    for d in sorted(world.artifacts, key=_d_key):
        head = world.artifacts[d].head
        if d in wanted and head.channel in channels and not head.redacted:
            out.append(head)
    return out


_VIEWS = {"current": current_set, "history": history_set, "head": head_set}


def evaluate(world: World, reader: Reader, filt: dict[str, Any]) -> list[str]:
    """The revision ids POST /query returns, in order. Raises Denied."""
    full = _VIEWS[filt["artifact"]](world, reader, filt)
    offset = int(filt.get("offset", 0))
    limit = int(filt.get("limit", DEFAULT_LIMIT))
    return [r.id for r in full[offset : offset + limit]]


def count(world: World, reader: Reader, filt: dict[str, Any]) -> int:
    """What POST /count returns: the view after access checks, unpaged. Raises Denied."""
    return len(_VIEWS[filt["artifact"]](world, reader, filt))


# --- events ------------------------------------------------------------------------


def envelope(*, d: str, h: str, type_name: str, op: str, title: str | None, prev: str | None) -> list[list[str]]:
    """The NIP-AR envelope tags of one revision (title absent on delete, prev absent on create)."""
    tags = [["ar", "1"], ["d", d], ["h", h], ["type", type_name]]
    if title is not None:
        tags.append(["title", title])
    tags.append(["op", op])
    if prev is not None:
        tags.append(["prev", prev])
    return tags


class EventSigner(Protocol):
    """What Author needs: buzz.nostr.Signer has this shape."""

    def sign_event(self, *, kind: int, tags: list[list[str]], content: str, created_at: int | None = None) -> Any: ...


class Author:
    """Builds each artifact's next revision (prev = the current head) and records it in the world
    once the relay has accepted it. Events are plain dicts, ready to send."""

    def __init__(self, world: World, signer: EventSigner) -> None:
        self.world = world
        self.signer = signer
        self._pending: dict[str, tuple[str, str, Revision]] = {}
        self._serial = itertools.count()

    def revision(
        self,
        d: str,
        op: str,
        *,
        h: str | None = None,
        type_name: str | None = None,
        title: str = "an artifact",
        tags: Iterable[list[str]] = (),
    ) -> dict[str, Any]:
        artifact = self.world.artifacts.get(d)
        if op == "create":
            if artifact is not None or h is None or type_name is None:
                raise ValueError("a create needs a new d, h and type")
            prev = None
        else:
            if artifact is None:
                raise ValueError(f"no artifact {d}")
            prev, type_name = artifact.head.id, artifact.type
            h = h or artifact.head.channel
        deleting = op == "delete"
        all_tags = envelope(d=d, h=h, type_name=type_name, op=op, title=None if deleting else title, prev=prev)
        if not deleting:
            all_tags += [list(t) for t in tags]
        content = "" if deleting else json.dumps({"version": 1, "n": next(self._serial)})
        event = self.signer.sign_event(
            kind=KIND_ARTIFACT, tags=all_tags, content=content, created_at=int(time.time())
        ).to_dict()
        self._pending[event["id"]] = (d, type_name, Revision(event["id"], h, op, all_tags))
        return dict(event)

    def accepted(self, event: dict[str, Any]) -> Revision:
        d, type_name, revision = self._pending.pop(event["id"])
        self.world.accept(d, type_name, revision)
        return revision
