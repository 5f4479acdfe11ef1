"""SyncSet (the client's set and its live rules) against a model of what a relay sends, with Hypothesis.

A model relay holds artifacts in three channels, of which the reader can read H1 and H2,
and a sync for #h [H1] #status [open]. Writes (create, update with a status, move,
delete, restore) mark their d as changed; a "deliver" step sends, for each changed d,
what rule 3 says: the current head when the artifact was in scope before (as this sync
sent it) or is after, the source's 45011 when the head moved to a channel the reader
cannot read, and nothing otherwise. Delivering later than the write skips intermediate
revisions, as rule 4 allows. The model also repeats heads and, as a faulty relay would,
re-sends older ones.

After every step each artifact the client holds is the model's current head, and at
the end (everything delivered) the client's set is exactly the set in scope.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from artifacts.client import KIND_REMOVAL, Event, Keys, SyncFilter, SyncSet, next_revision, revision, set_digest

WRITER = Keys.generate()
RELAY = Keys.generate()
H1, H2, H3 = (f"{i}{i}{i}{i}{i}{i}{i}{i}-0000-4000-8000-000000000000" for i in (1, 2, 3))
CHANNELS = (H1, H2, H3)
READABLE = {H1, H2}
FILTER = SyncFilter.of([H1], tags={"status": ["open"]})
CHANNEL_ONLY = SyncFilter.of([H1])  # a deletion (no client tags) is then removed for being a deletion
DS = [f"0000000{i}-0000-4000-8000-000000000000" for i in range(4)]


@dataclass
class Artifact:
    head: Event
    removal: Event | None = None  # the latest 45011 stored in a source
    sent: list[Event] = field(default_factory=list)  # what this sync sent for the d, in order


class ModelRelay:
    def __init__(self, flt: SyncFilter) -> None:
        self.filter = flt
        self.artifacts: dict[str, Artifact] = {}
        self.changed: set[str] = set()
        self.client_has: dict[str, bool] = {}  # "before": the client's copy as this sync sent it

    def write(self, op: str, i: int, channel: int, status: str) -> None:
        d = DS[i]
        art = self.artifacts.get(d)
        if op == "create":
            if art is not None:
                return
            self.artifacts[d] = Artifact(
                revision(
                    WRITER,
                    d=d,
                    h=CHANNELS[channel],
                    type="t.x",
                    op="create",
                    title="t",
                    content=secrets.token_hex(4),
                    tags=[["status", status]],
                )
            )
        elif art is None:
            return
        else:
            deleted = art.head.first("op") == "delete"
            if op == "delete" and not deleted:
                art.head = next_revision(WRITER, art.head, "delete")
            elif op == "restore" and deleted:
                art.head = next_revision(WRITER, art.head, "restore", title="t", content="r", tags=[["status", status]])
            elif op == "update" and not deleted:
                art.head = next_revision(
                    WRITER, art.head, "update", content=secrets.token_hex(4), tags=[["status", status]]
                )
            elif op == "move" and not deleted and art.head.first("h") != CHANNELS[channel]:
                source, replaced = art.head.first("h") or "", art.head.id
                art.head = next_revision(WRITER, art.head, "move", h=CHANNELS[channel])
                art.removal = RELAY.sign(
                    KIND_REMOVAL, [["ar", "1"], ["d", d], ["h", source], ["reason", "moved"], ["prev", replaced]], ""
                )
            else:
                return
        self.changed.add(d)

    def in_scope(self, head: Event) -> bool:
        return head.first("op") != "delete" and self.filter.matches(head)

    def initial(self) -> list[Event]:
        out = []
        for d, art in self.artifacts.items():
            readable = art.head.first("h") in READABLE
            self.client_has[d] = readable and self.in_scope(art.head)
            if self.client_has[d]:
                art.sent.append(art.head)
                out.append(art.head)
        self.changed.clear()
        return out

    def deliver(self, d: str) -> Event | None:
        """Rule 3 for one changed d: what the relay sends now (or None)."""
        self.changed.discard(d)
        art = self.artifacts[d]
        before, after = self.client_has.get(d, False), self.in_scope(art.head)
        if not (before or after):
            return None
        if art.head.first("h") in READABLE:
            self.client_has[d] = after
            art.sent.append(art.head)
            return art.head
        self.client_has[d] = False
        return art.removal

    def expected(self) -> dict[str, str]:
        return {
            d: a.head.id for d, a in self.artifacts.items() if a.head.first("h") in READABLE and self.in_scope(a.head)
        }


artifact = st.integers(0, 2)
write = st.tuples(
    st.sampled_from(["create", "create", "update", "update", "move", "move", "delete", "restore"]),
    artifact,
    st.sampled_from([0, 0, 1, 2, 2]),  # mostly the synced channel, or the unreadable one
    st.sampled_from(["open", "open", "done"]),
)
ops = st.one_of(
    write,
    write,
    st.tuples(st.just("deliver"), artifact, st.just(0), st.just("")),
    st.tuples(st.just("deliver-all"), st.just(0), st.just(0), st.just("")),
    st.tuples(st.just("repeat"), artifact, st.just(0), st.just("")),
    st.tuples(st.just("older"), artifact, st.integers(0, 5), st.just("")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, min_size=4, max_size=30), st.integers(0, 6), st.sampled_from([FILTER, CHANNEL_ONLY]))
# The cases each rule is about, always run: a head that stops matching, a move to an unreadable
# channel (45011), a deletion then restore, and older heads re-sent after each.
@example([("create", 0, 0, "open"), ("update", 0, 0, "done"), ("deliver", 0, 0, ""), ("older", 0, 0, "")], 1, FILTER)
@example([("create", 0, 0, "open"), ("delete", 0, 0, ""), ("deliver", 0, 0, "")], 1, CHANNEL_ONLY)
@example([("create", 0, 0, "open"), ("move", 0, 2, ""), ("deliver", 0, 0, ""), ("older", 0, 0, "")], 1, FILTER)
@example(
    [
        ("create", 1, 0, "open"),
        ("delete", 1, 0, ""),
        ("deliver", 1, 0, ""),
        ("restore", 1, 0, "open"),
        ("deliver", 1, 0, ""),
        ("older", 1, 1, ""),
        ("repeat", 1, 0, ""),
    ],
    1,
    FILTER,
)
@example(
    [
        ("create", 2, 2, "open"),
        ("move", 2, 0, ""),
        ("deliver", 2, 0, ""),
        ("move", 2, 1, ""),
        ("update", 2, 0, "open"),
        ("deliver-all", 0, 0, ""),
        ("older", 2, 0, ""),
    ],
    0,
    FILTER,
)
def test_the_live_set_is_the_set_in_scope(steps: list[tuple[str, int, int, str]], start: int, flt: SyncFilter) -> None:
    relay = ModelRelay(flt)
    client = SyncSet(flt)
    synced = False
    for n, (op, i, k, status) in enumerate(steps):
        if n == start and not synced:
            # The sync starts here: the initial set, then EOSE.
            client.begin()
            for event in relay.initial():
                client.initial(event)
            client.commit()
            synced = True
            assert {d: e.id for d, e in client.items.items()} == relay.expected()
        if op in ("create", "update", "move", "delete", "restore"):
            relay.write(op, i, k, status)
            continue
        if not synced:
            continue
        d = DS[i]
        art = relay.artifacts.get(d)
        held_before = client.items.get(d)
        if op == "deliver" and d in relay.changed:
            entry = relay.deliver(d)
            if entry is not None:
                client.live(entry)
            held = client.items.get(d)
            # After delivering d the client holds exactly its current head if it is in scope.
            expected = relay.expected().get(d)
            assert (held.id if held else None) == expected
        elif op == "deliver-all":
            for changed in sorted(relay.changed):
                entry = relay.deliver(changed)
                if entry is not None:
                    client.live(entry)
        elif op == "repeat" and art is not None and art.sent:
            assert client.live(art.sent[-1]) is None
            assert client.items.get(d) is held_before
        elif op == "older" and art is not None and len(art.sent) >= 2:
            # A faulty relay re-sends a head it replaced: the client holds on to the newer one. (It
            # remembers the last SUPERSEDED_PER_D ids per d, so the head is one of the last few.)
            recent = art.sent[-6:]
            older = recent[k % (len(recent) - 1)] if len(recent) >= 2 else recent[0]
            if older.id != art.sent[-1].id:
                assert client.live(older) is None
                assert client.items.get(d) is held_before
    if not synced:
        return
    for d in sorted(relay.changed):
        entry = relay.deliver(d)
        if entry is not None:
            client.live(entry)
    assert {d: e.id for d, e in client.items.items()} == relay.expected()
    assert client.digest == set_digest(relay.expected())
