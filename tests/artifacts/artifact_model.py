"""An executable model of NIP-AR's artifact state machine, written from spec/NIP-AR.md.

Plain Python: no Django, no I/O, no import from the relay. The stateful test drives the
relay and this model with the same operations and compares every answer.

What the model holds:
  channels   id -> visibility (open/private), archived, deleted, members
  anchors    kind-9 message id -> its channel, and whether it was removed
  artifacts  d -> type, head revision id, home h, root, deleted, its accepted revisions
  accepted   every accepted revision id -> its d (a resubmission is found by id)
  moves      (d, source, replaced revision) for every accepted move

Where the spec fixes an answer's text, the model gives it exactly ("conflict: head
unavailable", "conflict: artifact identity is taken", and the kind-9 texts). Where the
spec only says "reject", the model gives the NIP-01 prefix the rule implies (`invalid:`
for a malformed or disallowed revision, `conflict:` for a stale prev). Where an event
breaks several rules and the spec does not order the checks, every reason that
discloses nothing the sender can't read is an acceptable answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

KIND_ARTIFACT: Final = 45010

OPEN: Final = "open"
PRIVATE: Final = "private"
OPS: Final = frozenset({"create", "update", "move", "delete", "restore"})

# Texts the spec (Identity and edits, Access) and the kind-9 write rules fix.
HEAD_UNAVAILABLE: Final = "conflict: head unavailable"
IDENTITY_TAKEN: Final = "conflict: artifact identity is taken"
NOT_A_MEMBER: Final = "restricted: not a channel member"
ARCHIVED: Final = "invalid: channel is archived"
# Prefixes for rules whose text the spec leaves to the relay.
CONFLICT: Final = "conflict:"
INVALID: Final = "invalid:"

_UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_TYPE: Final = re.compile(r"[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*")
NIL_UUID: Final = "00000000-0000-0000-0000-000000000000"


@dataclass
class Channel:
    id: str
    visibility: str = OPEN
    archived: bool = False
    deleted: bool = False
    members: set[str] = field(default_factory=set)


@dataclass
class Anchor:
    channel: str
    removed: bool = False


@dataclass
class Artifact:
    d: str
    type: str
    head: str
    home: str
    root: str | None
    deleted: bool = False
    revisions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ArtifactEvent:
    """The fields of a kind-45010 event the rules look at. None means the tag is absent."""

    id: str
    pubkey: str
    d: str
    h: str
    type: str
    op: str
    title: str | None
    root: str | None = None
    prev: str | None = None
    content: str = ""
    ar: str = "1"
    # Names of client-defined tags (not envelope tags, not NIP-OA auth).
    client_tags: tuple[str, ...] = ()


def _fits(message: str, reason: str) -> bool:
    """A reason ending in ":" is a NIP-01 prefix; any other is the whole text (nothing may be added to it,
    so a non-disclosure answer can't carry more than it says)."""
    return message.startswith(reason) if reason.endswith(":") or not reason else message == reason


@dataclass(frozen=True)
class Outcome:
    accepted: bool
    duplicate: bool = False
    # The reason the model expects: a prefix ("invalid:") or a whole text; "" when the spec asks only for
    # an explicit reason.
    reason_prefix: str = ""
    # Other reasons that are just as right: the event broke several rules and the spec does not order them.
    alternatives: tuple[str, ...] = ()

    @classmethod
    def ok(cls) -> Outcome:
        return cls(True)

    @classmethod
    def dup(cls) -> Outcome:
        return cls(True, duplicate=True)

    @classmethod
    def reject(cls, *reasons: str) -> Outcome:
        unique = tuple(dict.fromkeys(reasons))
        return cls(False, reason_prefix=unique[0], alternatives=unique[1:])

    @property
    def reasons(self) -> tuple[str, ...]:
        return (self.reason_prefix, *self.alternatives)

    def matches(self, ok: bool, message: str) -> bool:
        """Does the relay's OK (ok, message) give this outcome?"""
        if ok != self.accepted:
            return False
        if ok:
            return message.startswith("duplicate:") == self.duplicate
        # Rejections always carry an explicit reason.
        return bool(message) and any(_fits(message, reason) for reason in self.reasons)


@dataclass(frozen=True)
class Move:
    d: str
    source: str
    replaced: str


def _utf8(text: str) -> int:
    return len(text.encode("utf-8"))


def envelope_error(ev: ArtifactEvent) -> str | None:
    """Event format: the checks that need no state. None when the envelope is valid."""
    if ev.ar != "1":
        return INVALID
    for uuid_value in (ev.d, ev.h):
        if not _UUID.fullmatch(uuid_value) or uuid_value == NIL_UUID:
            return INVALID
    if _utf8(ev.type) > 128 or not _TYPE.fullmatch(ev.type):
        return INVALID
    if ev.op not in OPS:
        return INVALID
    if ev.op == "delete":
        # "title MUST be absent on delete"
        if ev.title is not None:
            return INVALID
    elif ev.title is None or not ev.title.strip() or _utf8(ev.title) > 512:
        return INVALID
    for value in (ev.root, ev.prev):
        if value is not None and not _HEX64.fullmatch(value):
            return INVALID
    # "prev: required except on creation"; "Creation requires ... no prev".
    if (ev.op == "create") != (ev.prev is None):
        return INVALID
    # "a revision with op=delete, empty content, and no title tag ... contains only envelope tags and NIP-OA auth tags"
    if ev.op == "delete" and (ev.content != "" or ev.client_tags):
        return INVALID
    return None


class ArtifactModel:
    """One community's artifacts, channels and anchors, and the rules that change them."""

    def __init__(self) -> None:
        self.channels: dict[str, Channel] = {}
        self.actors: set[str] = set()
        self.anchors: dict[str, Anchor] = {}
        self.artifacts: dict[str, Artifact] = {}
        self.accepted: dict[str, str] = {}
        self.moves: list[Move] = []

    # --- the world ------------------------------------------------------------------

    def add_actor(self, actor: str) -> None:
        self.actors.add(actor)

    def add_channel(self, channel: str, *, visibility: str = OPEN, members: set[str] | None = None) -> Channel:
        record = Channel(channel, visibility=visibility, members=set(members or ()))
        self.channels[channel] = record
        self.actors |= record.members
        return record

    def set_member(self, channel: str, actor: str, member: bool) -> None:
        (self.channels[channel].members.add if member else self.channels[channel].members.discard)(actor)

    def set_archived(self, channel: str, archived: bool) -> None:
        self.channels[channel].archived = archived

    def set_visibility(self, channel: str, visibility: str) -> None:
        self.channels[channel].visibility = visibility

    def delete_channel(self, channel: str) -> None:
        self.channels[channel].deleted = True

    def member_channels(self, actor: str) -> set[str]:
        return {c.id for c in self.channels.values() if actor in c.members and not c.deleted}

    # --- access (spec: Access) --------------------------------------------------------

    def can_read(self, actor: str, channel: str) -> bool:
        """Channel read permission: a member, or anyone in an open channel. A deleted channel is like a missing one."""
        record = self.channels.get(channel)
        if record is None or record.deleted:
            return False
        return actor in record.members or record.visibility == OPEN

    def write_denial(self, actor: str, channel: str) -> str | None:
        """Write permission = permission to post a kind-9 message there, with the kind-9 reasons."""
        if not self.can_read(actor, channel):
            return NOT_A_MEMBER
        if self.channels[channel].archived:
            return ARCHIVED
        return None

    # --- kind 9 anchors -------------------------------------------------------------

    def post_message(self, actor: str, message_id: str, channel: str) -> Outcome:
        denial = self.write_denial(actor, channel)
        if denial is not None:
            return Outcome.reject(denial)
        self.anchors.setdefault(message_id, Anchor(channel))
        return Outcome.ok()

    def remove_message(self, message_id: str) -> None:
        self.anchors[message_id].removed = True

    def anchor_ok(self, root: str, channel: str) -> bool:
        """An existing, undeleted conversation anchor in `channel`."""
        anchor = self.anchors.get(root)
        return anchor is not None and anchor.channel == channel and not anchor.removed

    # --- kind 5 (Moderation and retention) ----------------------------------------------

    def deletion_request(self, actor: str, targets: list[str]) -> Outcome:
        """Kind 5 targeting artifact revisions: rejected with an explicit reason, nothing changes."""
        return Outcome.reject("")

    # --- kind 45010 ------------------------------------------------------------------

    def apply(self, actor: str, ev: ArtifactEvent) -> Outcome:
        """The relay's answer to `actor` sending `ev`, applying it when accepted."""
        # "Resubmitting an already accepted event succeeds without applying it again, even if a later
        # revision has since become current" - and whatever the sender can read now.
        if ev.id in self.accepted:
            return Outcome.dup()
        error = envelope_error(ev)
        if error is not None:
            return Outcome.reject(error)
        if ev.op == "create":
            return self._create(actor, ev)
        return self._edit(actor, ev)

    def _create(self, actor: str, ev: ArtifactEvent) -> Outcome:
        taken = ev.d in self.artifacts  # deleted ones too: "A deleted d stays reserved"
        if not self.can_read(actor, ev.h):
            # Nothing about h may leak (not its anchors); that d is taken may always be said.
            return Outcome.reject(NOT_A_MEMBER, *([IDENTITY_TAKEN] if taken else []))
        problems = []
        if self.channels[ev.h].archived:
            problems.append(ARCHIVED)
        if taken:
            problems.append(IDENTITY_TAKEN)
        if ev.root is not None and not self.anchor_ok(ev.root, ev.h):
            problems.append(INVALID)
        if problems:
            return Outcome.reject(*problems)
        self.artifacts[ev.d] = Artifact(ev.d, ev.type, ev.id, ev.h, ev.root, revisions=[ev.id])
        self.accepted[ev.id] = ev.d
        return Outcome.ok()

    def _edit(self, actor: str, ev: ArtifactEvent) -> Outcome:
        art = self.artifacts.get(ev.d)
        # An artifact the sender can't read answers exactly like a missing one.
        if art is None or not self.can_read(actor, art.home):
            return Outcome.reject(HEAD_UNAVAILABLE)
        # Write permission in the source, then in a move's destination, is checked where a kind-9 message's
        # is, before anything about the edit ("at the same point"): its refusal is the answer.
        if self.channels[art.home].archived:
            return Outcome.reject(ARCHIVED)
        if ev.op == "move" and ev.h != art.home:
            denial = self.write_denial(actor, ev.h)  # "Write in both source and destination"
            if denial is not None:
                return Outcome.reject(denial)
        problems = []
        if ev.prev != art.head:
            problems.append(CONFLICT)
        if ev.type != art.type:
            problems.append(INVALID)  # "d and type are immutable"
        if art.deleted != (ev.op == "restore"):
            problems.append(INVALID)  # "After deletion, only restore is accepted"; restore only after a delete
        if ev.op == "move":
            if ev.h == art.home:
                problems.append(INVALID)  # "a move changes it"
            elif ev.root is not None and not self.anchor_ok(ev.root, ev.h):
                problems.append(INVALID)  # "Its root must be absent or belong to the destination"
        elif ev.h != art.home:
            problems.append(INVALID)  # "An update keeps h"; delete and restore keep it too
        elif ev.op == "delete":
            if ev.root != art.root:
                problems.append(INVALID)  # "It preserves the current type, h, and root"
        elif ev.root is not None and ev.root != art.root and not self.anchor_ok(ev.root, ev.h):
            # A changed root must be an existing, undeleted anchor in h; a kept one needs nothing.
            problems.append(INVALID)
        if problems:
            return Outcome.reject(*problems)
        if ev.op == "move":
            self.moves.append(Move(ev.d, art.home, art.head))
        art.head = ev.id
        art.home = ev.h
        art.root = ev.root
        art.deleted = ev.op == "delete"
        art.revisions.append(ev.id)
        self.accepted[ev.id] = ev.d
        return Outcome.ok()

    # --- what the database must hold -------------------------------------------------------

    def heads(self) -> dict[str, tuple[str, str, bool, str, str | None]]:
        """d -> (head id, home, deleted, type, root) for every artifact identity."""
        return {d: (a.head, a.home, a.deleted, a.type, a.root) for d, a in self.artifacts.items()}
