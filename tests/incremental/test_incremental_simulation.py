"""A client simulation against two real relays under random writes: creates, updates, moves (into
channels the reader can't read and into a TTL channel), deletes, restores, membership grants and
removals, listing changes (a policy change: the client resets and recovers), and writes between the
pages of a pass. The client follows the spec (checkpoints, prescribed recovery) and removes a row only
when told to. Whenever the writes pause it holds exactly the true readable set, computed here from the
test's own model of the world, not from the relay."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.chat import channels
from buzz.models import Community
from buzz.nostr import Signer
from tests.incremental.support import Client, env
from tests.support.factories import make_channel, make_community, revision
from tests.support.relay import start_relays
from tests.support.wire import accept, logged_in
from tests.support.wsclient import RelayClient

HOST = "incremental-simulation.test"
QUERY = {"artifact": "current", "#type": ["buzz.task"]}
pytestmark = pytest.mark.timeout(900)


@dataclass
class Art:
    d: str
    type: str
    head: dict[str, Any]
    home: uuid.UUID
    deleted: bool = False


@dataclass
class Model:
    """What the test wrote: channels (with the reader's membership and listing) and artifacts."""

    community: Community
    w: Signer
    r: Signer
    members: set[uuid.UUID]  # channels the reader is a member of
    open_: set[uuid.UUID]
    listed: set[uuid.UUID]
    ttl: uuid.UUID
    all: list[uuid.UUID]
    arts: dict[str, Art] = field(default_factory=dict)

    def readable(self, channel: uuid.UUID) -> bool:
        """Wide scope: a membership, or an open listed channel; never a TTL channel."""
        if channel == self.ttl:
            return False
        return channel in self.members or (channel in self.open_ and channel in self.listed)

    def truth(self) -> dict[str, str]:
        return {
            a.d: a.head["id"]
            for a in self.arts.values()
            if not a.deleted and a.type == "buzz.task" and self.readable(a.home)
        }


def _world() -> Model:
    w, r = Signer.generate(), Signer.generate()
    community = make_community(HOST, members=[w, r])
    p1 = make_channel(community, w, visibility="private", members=[r])
    p2 = make_channel(community, w, visibility="private")
    hidden = make_channel(community, w, visibility="private")
    listed_open = make_channel(community, w)
    unlisted = make_channel(community, w, listed=False)
    ttl = uuid.uuid4()
    channels.channel_create(
        community=community, channel_uuid=ttl, name="ttl", creator=w.pubkey, visibility="private", ttl_seconds=86400
    )
    channels.member_put(community=community, channel_uuid=ttl, actor=None, pubkey=r.pubkey)
    return Model(
        community=community,
        w=w,
        r=r,
        members={p1, ttl},
        open_={listed_open, unlisted},
        listed={listed_open},
        ttl=ttl,
        all=[p1, p2, hidden, listed_open, unlisted, ttl],
    )


class Writer:
    def __init__(self, model: Model, client: RelayClient, rng: random.Random) -> None:
        self.m, self.client, self.rng = model, client, rng
        self.ops: list[str] = []

    async def _revise(self, art: Art, op: str, home: uuid.UUID) -> None:
        event = revision(self.m.w, d=art.d, h=home, op=op, prev=art.head["id"], type_=art.type)
        await accept(self.client, event)
        art.head, art.home, art.deleted = event, home, op == "delete"

    async def step(self) -> None:
        m, rng = self.m, self.rng
        live = [a for a in m.arts.values() if not a.deleted]
        dead = [a for a in m.arts.values() if a.deleted]
        ops = ["create"] * 3 + ["update"] * 2 + ["move"] * 3 + ["delete", "restore", "grant", "remove"]
        op = rng.choice(ops)
        if (op in ("update", "move", "delete") and not live) or (op == "restore" and not dead):
            op = "create"
        self.ops.append(op)
        if op == "create":
            d, type_ = str(uuid.uuid4()), rng.choice(["buzz.task"] * 4 + ["buzz.note"])
            home = rng.choice(m.all)
            event = revision(m.w, d=d, h=home, type_=type_)
            await accept(self.client, event)
            m.arts[d] = Art(d, type_, event, home)
        elif op == "update":
            art = rng.choice(live)
            await self._revise(art, "update", art.home)
        elif op == "move":
            art = rng.choice(live)
            await self._revise(art, "move", rng.choice([c for c in m.all if c != art.home]))
        elif op == "delete":
            art = rng.choice(live)
            await self._revise(art, "delete", art.home)
        elif op == "restore":
            art = rng.choice(dead)
            await self._revise(art, "restore", art.home)
        else:
            await self._membership(op)

    async def _membership(self, op: str) -> None:
        m, rng = self.m, self.rng
        candidates = [c for c in m.all if c != m.ttl]
        if op == "grant":
            options = [c for c in candidates if c not in m.members]
            if options:
                channel = rng.choice(options)
                await sync_to_async(channels.member_put)(
                    community=m.community, channel_uuid=channel, actor=None, pubkey=m.r.pubkey
                )
                m.members.add(channel)
        else:
            options = sorted(m.members - {m.ttl})
            if options:
                channel = rng.choice(options)
                await sync_to_async(channels.member_remove)(
                    community=m.community, channel_uuid=channel, actor=None, pubkey=m.r.pubkey
                )
                m.members.discard(channel)

    async def toggle_listing(self) -> None:
        """A policy change: the open listed channel becomes unlisted, or back."""
        m = self.m
        channel = sorted(m.open_)[0]
        now_listed = channel not in m.listed
        await sync_to_async(channels.channel_edit)(
            community=m.community,
            channel_uuid=channel,
            actor=None,
            changes={"listed": "true" if now_listed else "false"},
        )
        (m.listed.add if now_listed else m.listed.discard)(channel)


@pytest.mark.parametrize("seed", [1, 2])
async def test_a_client_converges_to_the_readable_set_under_random_writes(
    transactional_db: None, relay_factory: Any, seed: int
) -> None:
    rng = random.Random(seed)
    model = await sync_to_async(_world)()
    a, b = await start_relays(relay_factory, env(BUZZ_INCREMENTAL_PAGE_ROWS="3"), env(BUZZ_INCREMENTAL_PAGE_ROWS="3"))
    async with logged_in(a, model.w, host=HOST) as ws:
        writer = Writer(model, ws, rng)
        for _ in range(12):
            await writer.step()
        client = Client([a, b], HOST, model.r, QUERY)
        interleave = {"on": False}

        async def between() -> None:
            if interleave["on"]:
                await writer.step()

        client.between_pages = between
        await client.sync()  # the initial read, quiescent
        assert client.store.heads() == model.truth()
        for round_ in range(10):
            for _ in range(rng.randint(3, 8)):
                await writer.step()
            if round_ in (3, 7):
                await writer.toggle_listing()
            interleave["on"] = True
            await client.sync()  # writes land between its pages
            interleave["on"] = False
            await client.sync()  # quiescent: the store is exactly the readable set
            truth = model.truth()
            held = client.store.heads()
            assert held == truth, (
                f"round {round_}: missing {sorted(set(truth) - set(held))}, extra {sorted(set(held) - set(truth))},"
                f" stale {sorted(d for d in held if d in truth and held[d] != truth[d])}; ops {writer.ops}"
            )
        assert client.resets.count("policy_changed") >= 2
        assert {"move", "delete", "restore", "grant", "remove"} <= set(writer.ops)
        # Every removal the client applied came from the relay; a row it holds is never one it wasn't sent.
        assert all(c["type"] in ("upsert", "remove", "removeChannel") for c in client.store.applied)
        assert any(c["type"] == "removeChannel" for c in client.store.applied)
