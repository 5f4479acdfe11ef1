"""Random artifact histories against a real relay, checked step by step against the spec model.

Hypothesis drives a RuleBasedStateMachine whose one rule draws what each step is (so the mix is
set here). Each example gets a community of its own (its own Host), three actors with different
memberships and four channels, and talks to the one relay process of the test over WebSocket, one
connection per actor. Every step sends one event (a kind-45010
create/update/move/delete/restore, an exact resubmission of an earlier event, a kind 5, a kind-9
anchor, a kind-9005 removal of an anchor) or changes a channel through the services
(membership, archive, visibility, deletion). Every OK is compared with
tests/artifacts/artifact_model.py, and after every step the heads, the accepted revisions and the
move removals in the database are compared with the model's.

A revision step is drawn abstractly (which d, which actor, which channel, and zero, one or two
deviations from a well-formed edit of the current head) and resolved against the model's
state when it runs, so prevs, roots and homes name real events and channels.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from artifacts.models import Artifact, MoveRemoval, Revision
from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.nostr import Signer
from tests.artifacts.artifact_model import OPEN, PRIVATE, ArtifactEvent, ArtifactModel, Outcome
from tests.support.wsclient import RelayClient

ACTORS = ("alice", "bob", "carol")
# name -> (visibility, members besides alice (who owns every channel), archived at the start)
LAYOUT: dict[str, tuple[str, frozenset[str], bool]] = {
    "open": (OPEN, frozenset({"bob"}), False),
    "private": (PRIVATE, frozenset({"bob"}), False),
    "archived": (PRIVATE, frozenset({"bob"}), True),
    "doomed": (OPEN, frozenset(), False),
}
CHANNELS = (*LAYOUT, "missing")  # "missing" is a UUID no channel has
TYPES = ("buzz.task", "buzz.note")
D_POOL = 12  # creates draw the first four (they collide) or a fresh one of the rest
# What a step may get wrong on purpose, on top of whatever the state makes wrong (access, a deleted head).
#   prev_old: an earlier revision of the artifact (sometimes still the head); h_other: an update, delete or
#   restore naming another channel; root_local: an undeleted anchor in h; root_anchor: any anchor, anywhere,
#   maybe removed; root_revision: an artifact revision, not a conversation anchor; title: a delete with a
#   title, anything else without one; content, extra: a delete with content, with client tags; live: a
#   restore of an artifact that is not deleted.
ROOTS = ("root_none", "root_keep", "root_local", "root_anchor", "root_fake", "root_revision")
PREVS = ("prev_old", "prev_fake", "prev_absent")
DEVIATIONS: dict[str, tuple[str, ...]] = {
    "create": ("create_prev", "title", "blank", *ROOTS),
    "update": (*PREVS, "h_other", "type", "title", "blank", *ROOTS),
    "move": (*PREVS, "type", "title", "blank", *ROOTS),
    "delete": (*PREVS, "h_other", "type", "title", "content", "extra", *ROOTS),
    "restore": (*PREVS, "h_other", "type", "title", "blank", "live", *ROOTS),
}

picks = st.integers(0, 999)
OK_TIMEOUT = 15.0  # seconds; generous, for a loaded machine


@dataclass(frozen=True)
class Choice:
    """One kind-45010 step, drawn abstractly and resolved against the model when it runs."""

    actor: str
    d: int  # 0..3: that d of the pool; 4..9: a create's unused d, an edit's artifact that suits the op
    pick: int  # picks one of a list (revisions, anchors)
    where: str  # a create's h or a move's destination: "home" (the artifact's) or a channel name
    deviations: tuple[str, ...]  # from DEVIATIONS[op]
    age: int  # created_at is this many seconds ago: timestamps must not choose a winner


def choices(op: str) -> st.SearchStrategy[Choice]:
    deviation = st.sampled_from(DEVIATIONS[op])
    return st.builds(
        Choice,
        # A move needs write in two channels: carol, in none but open ones, is drawn less often.
        actor=st.sampled_from(("alice", "bob", "bob", "carol") if op == "move" else ACTORS),
        d=st.integers(0, 9),
        pick=picks,
        # A move mostly goes where someone can write; "home" is a move that stays.
        where=st.sampled_from(("home", *CHANNELS, *(("open", "private") * (3 if op == "move" else 1)))),
        # A quarter well-formed, half with one deviation, a quarter with two.
        deviations=st.one_of(st.just(()), st.tuples(deviation), st.tuples(deviation), st.tuples(deviation, deviation)),
        age=st.integers(0, 600),
    )


# The mix of steps: kind-45010 revisions (the keys of DEVIATIONS), resubmissions and kind 5, kind-9
# anchors and their removal, channel changes.
STEPS: tuple[str, ...] = ("create",) * 3 + ("update",) * 4 + ("move",) * 3 + ("delete",) * 3 + ("restore",) * 2
STEPS += ("resend",) * 3 + ("anchor",) * 2 + ("remove_anchor", "channel", "channel")
RESEND = st.tuples(st.sampled_from(("accepted", "accepted", "any", "kind5")), st.sampled_from(ACTORS), picks)
ANCHOR = st.tuples(st.sampled_from(ACTORS), st.sampled_from((*CHANNELS, "open", "private")))
CHANGE = st.tuples(
    st.sampled_from(("member", "member", "archive", "visibility", "delete")),
    st.sampled_from(("bob", "carol")),
    st.sampled_from(tuple(LAYOUT)),
)

# Shrinking replays whole examples against the relay, a second or more each, and can outlast the test's
# timeout; a failure's message lists every step of its example anyway. ARTIFACT_MODEL_SHRINK=1 turns it
# on (with pytest -o timeout=1800).
PHASES = [Phase.explicit, Phase.generate, *([Phase.shrink] if os.environ.get("ARTIFACT_MODEL_SHRINK") else [])]
SETTINGS = settings(
    max_examples=20,
    stateful_step_count=40,
    deadline=None,
    database=None,
    phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow],
)


def fake_id(n: int) -> str:
    return hashlib.sha256(f"not an event {n}".encode()).hexdigest()


class ArtifactMachine(RuleBasedStateMachine):
    ws_url: ClassVar[str] = ""
    # Which answers the run reached (also hypothesis.event, for --hypothesis-show-statistics).
    reached: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.model = ArtifactModel()
        self.host = f"ar-{uuid.uuid4().hex[:12]}.test"
        self.community = community_create(host=self.host, name="Artifact model")
        self.keys = {name: Signer.generate() for name in ACTORS}
        for name, signer in self.keys.items():
            member_add(community=self.community, pubkey=signer.pubkey)
            self.model.add_actor(name)
        self.channel = {name: str(uuid.uuid4()) for name in CHANNELS}
        for name, (visibility, members, archived) in LAYOUT.items():
            cid = uuid.UUID(self.channel[name])
            channels.channel_create(
                community=self.community, channel_uuid=cid, name=name, creator=self.keys["alice"].pubkey,
                visibility=visibility,
            )  # fmt: skip
            for member in members:
                pubkey = self.keys[member].pubkey
                channels.member_put(community=self.community, channel_uuid=cid, actor=None, pubkey=pubkey)
            self.model.add_channel(str(cid), visibility=visibility, members={"alice", *members})
            if archived:
                changes = {"archived": "true"}
                channels.channel_edit(community=self.community, channel_uuid=cid, actor=None, changes=changes)
                self.model.set_archived(str(cid), True)
        self.ds = [str(uuid.uuid4()) for _ in range(D_POOL)]
        # Kinds 5, 9 and 9005 count created_at up, one second per event.
        self.clock = int(time.time()) - 600
        self.serial = 0
        self.sent: list[tuple[str, dict[str, Any], ArtifactEvent]] = []
        self.accepted: list[tuple[str, dict[str, Any], ArtifactEvent]] = []
        self.anchors: list[str] = []
        self.steps: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        self.clients: dict[str, RelayClient] = self.loop.run_until_complete(self._connect())

    async def _connect(self) -> dict[str, RelayClient]:
        clients = {}
        for name, signer in self.keys.items():
            client = await self.stack.enter_async_context(RelayClient.connect(self.ws_url, host=self.host))
            ok = await client.auth(signer)
            assert ok[2] is True, ok
            clients[name] = client
        return clients

    def teardown(self) -> None:
        self.loop.run_until_complete(self.stack.aclose())
        self.loop.close()

    # --- plumbing ----------------------------------------------------------------------

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _send(self, actor: str, body: dict[str, Any]) -> tuple[bool, str]:
        async def roundtrip() -> list[Any]:
            client = self.clients[actor]
            await client.send_json(["EVENT", body])
            return await client.expect("OK", OK_TIMEOUT, where=lambda m: len(m) > 1 and m[1] == body["id"])

        reply = self.loop.run_until_complete(roundtrip())
        return bool(reply[2]), str(reply[3])

    def _compare(self, what: str, want: Outcome, got: tuple[bool, str], kind: str) -> None:
        self.steps.append(f"{what} -> {got}")
        answer = "duplicate" if got[1].startswith("duplicate:") else "accepted" if got[0] else got[1][:40]
        event(f"{kind}: {answer}")
        self.reached[f"{kind}: {answer}"] += 1
        history = "\n    ".join(self.steps)
        assert want.matches(*got), f"{what}\n  model: {want}\n  relay: {got}\n  steps so far:\n    {history}"

    def _artifact_event(
        self, actor: str, *, op: str, d: str, h: str, type_: str, root: str | None, prev: str | None,
        deviations: tuple[str, ...], age: int,
    ) -> tuple[dict[str, Any], ArtifactEvent]:  # fmt: skip
        title: str | None = None if op == "delete" else "Fix the payment timeout"
        self.serial += 1
        content = "" if op == "delete" else json.dumps({"version": 1, "n": self.serial})
        client_tags: list[list[str]] = [] if op == "delete" else [["status", "open"]]
        if "title" in deviations:
            title = "A stray title" if op == "delete" else None
        if "blank" in deviations:
            title = "   "
        if "content" in deviations and op == "delete":
            content = '{"version":1}'
        if "extra" in deviations:
            client_tags = [["status", "done"], ["p", self.keys["bob"].pubkey]]
        tags = [["ar", "1"], ["d", d], ["h", h], ["type", type_]]
        if title is not None:
            tags.append(["title", title])
        tags.append(["op", op])
        if root is not None:
            tags.append(["root", root])
        if prev is not None:
            tags.append(["prev", prev])
        tags += client_tags
        # Two deletes can come out identical (no content, no client tags): then they are one event.
        created_at = int(time.time()) - age
        signed = self.keys[actor].sign_event(kind=45010, tags=tags, content=content, created_at=created_at)
        fields = ArtifactEvent(
            id=signed.id, pubkey=actor, d=d, h=h, type=type_, op=op, title=title, root=root, prev=prev,
            content=content, client_tags=tuple(t[0] for t in client_tags),
        )  # fmt: skip
        return signed.to_dict(), fields

    def _submit(self, actor: str, body: dict[str, Any], fields: ArtifactEvent, what: str) -> None:
        want = self.model.apply(actor, fields)
        got = self._send(actor, body)
        again = any(b["id"] == body["id"] for _, b, _ in self.sent)
        self._compare(f"{actor} {what}", want, got, "resubmit" if again else fields.op)
        self.sent.append((actor, body, fields))
        if got[0]:
            self.accepted.append((actor, body, fields))

    def _name(self, channel: str) -> str:
        return next((name for name, cid in self.channel.items() if cid == channel), channel)

    # --- resolving a Choice against the model ------------------------------------------------

    def _pick_d(self, op: str, c: Choice) -> str:
        """One of the first four d (so creates collide and edits hit missing ones), else one that suits op."""
        if c.d < 4:
            return self.ds[c.d]
        if op == "create":
            return next((d for d in self.ds[4:] if d not in self.model.artifacts), self.ds[c.d % D_POOL])
        existing = list(self.model.artifacts)
        deleted = op == "restore" and "live" not in c.deviations
        suits = [d for d in existing if self.model.artifacts[d].deleted == deleted]
        pool = suits or existing or self.ds
        return pool[c.pick % len(pool)]

    def _pick_h(self, d: str, op: str, c: Choice) -> str:
        art = self.model.artifacts.get(d)
        home = art.home if art is not None else self.channel["open"]
        if op == "create" or (op == "move" and c.where == "home"):
            return home if c.where == "home" else self.channel[c.where]
        if op == "move":  # "home" above is the move that stays; else another channel
            others = [cid for cid in self.channel.values() if cid != home]
            return self.channel[c.where] if self.channel[c.where] != home else others[c.pick % len(others)]
        if "h_other" in c.deviations:
            others = [cid for cid in self.channel.values() if cid != home]
            return others[c.pick % len(others)]
        return home

    def _pick_prev(self, d: str, op: str, c: Choice) -> str | None:
        art = self.model.artifacts.get(d)
        if op == "create":
            return fake_id(c.pick) if "create_prev" in c.deviations else None
        if "prev_absent" in c.deviations:
            return None
        if "prev_old" in c.deviations:
            pool = art.revisions if art is not None else list(self.model.accepted)
            if pool:
                return pool[c.pick % len(pool)]
        if "prev_fake" in c.deviations or art is None:
            return fake_id(c.pick)
        if not self.model.can_read(c.actor, art.home) and len(art.revisions) > 1 and c.pick % 2:
            # A sender that lost access still holds the revision it last saw, by now often stale.
            return art.revisions[c.pick % (len(art.revisions) - 1)]
        return art.head

    def _local_anchor(self, h: str, pick: int) -> str | None:
        local = [a for a in self.anchors if self.model.anchor_ok(a, h)]
        return local[pick % len(local)] if local else None

    def _pick_root(self, d: str, h: str, op: str, c: Choice) -> str | None:
        art = self.model.artifacts.get(d)
        kinds = [x for x in c.deviations if x.startswith("root_")]
        if kinds:
            kind = kinds[0]
        elif op in ("update", "delete", "restore"):
            kind = "root_keep"
        else:  # a create or move: attached to a conversation in h, or not
            kind = "root_local" if c.pick % 2 else "root_none"
        if kind == "root_keep":
            return art.root if art is not None else None
        if kind == "root_local":
            return self._local_anchor(h, c.pick)
        if kind == "root_anchor" and self.anchors:
            return self.anchors[c.pick % len(self.anchors)]
        if kind == "root_revision" and self.model.accepted:
            revisions = list(self.model.accepted)
            return revisions[c.pick % len(revisions)]
        if kind == "root_fake":
            return fake_id(c.pick + 1)
        return None

    def _pick_type(self, d: str, c: Choice) -> str:
        art = self.model.artifacts.get(d)
        current = art.type if art is not None else TYPES[c.pick % 2]
        return current if "type" not in c.deviations else next(t for t in TYPES if t != current)

    # --- kind 45010 ----------------------------------------------------------------------

    def _revision(self, op: str, c: Choice) -> None:
        d = self._pick_d(op, c)
        h = self._pick_h(d, op, c)
        body, fields = self._artifact_event(
            c.actor, op=op, d=d, h=h, type_=self._pick_type(d, c), root=self._pick_root(d, h, op, c),
            prev=self._pick_prev(d, op, c), deviations=c.deviations, age=c.age,
        )  # fmt: skip
        label = ",".join(c.deviations) or "well-formed"
        self._submit(c.actor, body, fields, f"{op} d{self.ds.index(d)} h={self._name(h)} ({label})")

    @initialize(where=st.sampled_from(("open", "private")), pick=picks)
    def seed(self, where: str, pick: int) -> None:
        """Every example starts with a conversation and an artifact attached to it, both by alice."""
        self.post_anchor("alice", where)
        c = Choice(actor="alice", d=pick % 4, pick=1, where=where, deviations=(), age=0)
        self._revision("create", c)

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One rule draws what the step is, so STEPS sets the mix (not which rules an example enables)."""
        kind = data.draw(st.sampled_from(STEPS), label="step")
        if kind in DEVIATIONS:
            self._revision(kind, data.draw(choices(kind), label=kind))
        elif kind == "resend":
            self.resend(*data.draw(RESEND, label=kind))
        elif kind == "anchor":
            self.post_anchor(*data.draw(ANCHOR, label=kind))
        elif kind == "remove_anchor":
            self.remove_anchor(data.draw(picks, label=kind))
        else:
            self.change_channel(*data.draw(CHANGE, label=kind))

    def resend(self, what: str, actor: str, pick: int) -> None:
        """The exact bytes of an earlier event again, by its author, whatever happened since; or a kind 5."""
        if what == "kind5":
            revisions = list(self.model.accepted) or [fake_id(pick)]
            target = revisions[pick % len(revisions)]
            signed = self.keys[actor].sign_event(
                kind=5, tags=[["e", target], ["k", "45010"]], content="please delete", created_at=self._tick()
            )
            want = self.model.deletion_request(actor, [target])
            self._compare(f"{actor} kind 5 for {target[:8]}", want, self._send(actor, signed.to_dict()), "kind 5")
            return
        pool = self.accepted if what == "accepted" and self.accepted else self.sent
        author, body, fields = pool[pick % len(pool)]
        self._submit(author, body, fields, f"resubmit {fields.op} {body['id'][:8]}")

    # --- kind 9 anchors ------------------------------------------------------------------

    def post_anchor(self, actor: str, where: str) -> None:
        h = self.channel[where]
        signed = self.keys[actor].sign_event(
            kind=9, tags=[["h", h]], content=f"thread {self.clock}", created_at=self._tick()
        )
        want = self.model.post_message(actor, signed.id, h)
        got = self._send(actor, signed.to_dict())
        self._compare(f"{actor} kind 9 in {where}", want, got, "kind 9")
        if got[0]:
            self.anchors.append(signed.id)

    def remove_anchor(self, pick: int) -> None:
        """The channel owner removes a message with NIP-29 9005 (a setup step here, not a NIP-AR rule).

        Half the time it is the root of an artifact, so kept roots whose anchor is gone come up.
        """
        live = [
            a for a in self.anchors
            if not self.model.anchors[a].removed and not self.model.channels[self.model.anchors[a].channel].deleted
        ]  # fmt: skip
        roots = [a for a in live if any(art.root == a for art in self.model.artifacts.values())]
        pool = roots if roots and pick % 2 else live
        if not pool:
            return
        target = pool[pick % len(pool)]
        h = self.model.anchors[target].channel
        tags = [["h", h], ["e", target]]
        signed = self.keys["alice"].sign_event(kind=9005, tags=tags, content="", created_at=self._tick())
        got = self._send("alice", signed.to_dict())
        self.steps.append(f"alice 9005 {target[:8]} in {self._name(h)} -> {got}")
        assert got[0], got
        self.model.remove_message(target)

    # --- channel changes through the services ------------------------------------------------

    def change_channel(self, change: str, actor: str, where: str) -> None:
        """Membership, archive, visibility or deletion of a channel, as an operator would change them."""
        cid = self.channel[where]
        record = self.model.channels[cid]
        if record.deleted:
            return
        community, channel_uuid = self.community, uuid.UUID(cid)
        if change == "member":
            pubkey = self.keys[actor].pubkey
            member = actor in record.members
            if member:
                channels.member_remove(community=community, channel_uuid=channel_uuid, actor=None, pubkey=pubkey)
            else:
                channels.member_put(community=community, channel_uuid=channel_uuid, actor=None, pubkey=pubkey)
            self.model.set_member(cid, actor, not member)
            self.steps.append(f"{'remove' if member else 'add'} {actor} {'from' if member else 'to'} {where}")
        elif change == "archive":
            archived = not record.archived
            changes = {"archived": "true" if archived else "false"}
            channels.channel_edit(community=community, channel_uuid=channel_uuid, actor=None, changes=changes)
            self.model.set_archived(cid, archived)
            self.steps.append(f"{'archive' if archived else 'unarchive'} {where}")
        elif change == "visibility" and not record.archived:  # an archived channel's metadata can't change
            visibility = PRIVATE if record.visibility == OPEN else OPEN
            changes = {"visibility": visibility}
            channels.channel_edit(community=community, channel_uuid=channel_uuid, actor=None, changes=changes)
            self.model.set_visibility(cid, visibility)
            self.steps.append(f"make {where} {visibility}")
        elif change == "delete" and where == "doomed":
            channels.channel_delete(community=community, channel_uuid=channel_uuid, actor=None)
            self.model.delete_channel(cid)
            self.steps.append("delete channel doomed")

    # --- the database against the model -----------------------------------------------------

    @invariant()
    def database_matches_model(self) -> None:
        rows = Artifact.objects.filter(community=self.community).values_list(
            "d", "head_id", "home", "deleted", "type", "root"
        )
        heads = {str(d): (head, str(home), deleted, type_, root) for d, head, home, deleted, type_, root in rows}
        history = "\n    ".join(self.steps)
        assert heads == self.model.heads(), f"heads differ after:\n    {history}"
        revisions = set(Revision.objects.filter(community=self.community).values_list("id", flat=True))
        assert revisions == set(self.model.accepted), f"accepted revisions differ after:\n    {history}"
        removals = MoveRemoval.objects.filter(community=self.community).values_list("artifact__d", "source", "replaced")
        assert sorted((str(d), str(source), replaced) for d, source, replaced in removals) == sorted(
            (m.d, m.source, m.replaced) for m in self.model.moves
        ), f"move removals differ after:\n    {history}"


@pytest.mark.slow
def test_artifact_state_machine(relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(BUZZ_WRITES_PER_SECOND="0")
    ArtifactMachine.ws_url = relay.ws_url
    ArtifactMachine.reached.clear()
    run_state_machine_as_test(ArtifactMachine, settings=SETTINGS)
    # Shown with -s or -rP: which answers this run reached.
    print("\n".join(f"{n:5d}  {label}" for label, n in sorted(ArtifactMachine.reached.items())))
