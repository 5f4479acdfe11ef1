"""NIP-AR compare-and-set under contention, against two real relay processes on one database and Redis.

* 50 writers on 50 connections, split over two relays, send an update naming the same prev at
  the same moment: exactly one is accepted, the other 49 get `conflict: head changed ...`, and
  the stored head is the winner (repeated over several rounds, and chained on the winner).
* A move racing 49 updates of the same prev: exactly one wins. A winning move stores exactly one
  relay-signed kind-45011 removal in the source, with the layout
  ["ar","1"] ["d",d] ["h",source] ["reason","moved"] ["prev",replaced] and nothing about the
  destination; a winning update stores none.
* 50 creates of the same d: one accepted, 49 `conflict: artifact identity is taken`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from artifacts.models import Artifact, MoveRemoval, Revision
from buzz.models import Community
from buzz.nostr import Event, Signer, parse_event, verify_event
from tests.support.factories import make_channel, make_community, revision, signers
from tests.support.relay import start_relays
from tests.support.wire import publish
from tests.support.wsclient import RelayClient, naming

HOST = "races.test"
WRITERS = 50
TIMEOUT = 30.0
HEAD_CHANGED = "conflict: head changed; fetch the current revision and reapply your change"
IDENTITY_TAKEN = "conflict: artifact identity is taken"
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}


@dataclass
class World:
    community: Community
    writers: list[Signer]
    source: uuid.UUID
    dest: uuid.UUID


@pytest.fixture
def world(transactional_db: None) -> World:
    writers = signers(WRITERS)
    community = make_community(HOST, "Races", members=writers)
    # Open channels: every relay member may write in both (write permission is the kind-9 rule).
    source = make_channel(community, writers[0], name="src")
    dest = make_channel(community, writers[0], name="dst")
    return World(community, writers, source, dest)


async def race(clients: list[RelayClient], events: list[dict[str, Any]]) -> list[list[Any]]:
    """Every client sends its event at once; the OK replies in client order."""
    frames = [json.dumps(["EVENT", e], separators=(",", ":")) for e in events]
    await asyncio.gather(*(c.ws.send(f) for c, f in zip(clients, frames, strict=True)))
    return list(
        await asyncio.gather(
            *(c.expect("OK", TIMEOUT, where=naming(e["id"])) for c, e in zip(clients, events, strict=True))
        )
    )


@sync_to_async
def head_of(community: Community, d: uuid.UUID) -> tuple[str, uuid.UUID, int]:
    art = Artifact.objects.get(community=community, d=d)
    return str(art.head_id), art.home, Revision.objects.filter(artifact=art).count()


@sync_to_async
def removals_of(community: Community, d: uuid.UUID) -> list[MoveRemoval]:
    return list(MoveRemoval.objects.filter(community=community, artifact__d=d))


@contextlib.asynccontextmanager
async def writer_connections(world: World, relays: list[Any]) -> Any:
    """One authenticated connection per writer, alternating between the relays."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(RelayClient.connect(relays[i % len(relays)].ws_url, host=HOST))
            for i in range(len(world.writers))
        ]
        oks = await asyncio.gather(*(c.auth(s) for c, s in zip(clients, world.writers, strict=True)))
        assert all(ok[2] is True for ok in oks), oks
        yield clients


def split(replies: list[list[Any]]) -> tuple[list[int], list[str]]:
    winners = [i for i, r in enumerate(replies) if r[2] is True]
    return winners, [r[3] for r in replies if r[2] is not True]


async def create(client: RelayClient, signer: Signer, world: World) -> tuple[uuid.UUID, str]:
    d = uuid.uuid4()
    event = revision(signer, d=d, h=world.source, op="create")
    ok = await publish(client, event, TIMEOUT)
    assert ok[2] is True, ok
    return d, event["id"]


async def fifty_updates_on_one_prev(world: World, clients: list[RelayClient]) -> None:
    for round_no in range(3):
        d, prev = await create(clients[round_no], world.writers[round_no], world)
        events = [revision(s, d=d, h=world.source, op="update", prev=prev) for s in world.writers]
        replies = await race(clients, events)
        winners, losers = split(replies)
        assert len(winners) == 1, f"round {round_no}: {replies}"
        assert losers == [HEAD_CHANGED] * (WRITERS - 1), f"round {round_no}: {losers}"
        winner = events[winners[0]]["id"]
        assert await head_of(world.community, d) == (winner, world.source, 2)
    # Chained: the next race names the last winner.
    events = [revision(s, d=d, h=world.source, op="update", prev=winner) for s in world.writers]
    winners, losers = split(await race(clients, events))
    assert len(winners) == 1 and losers == [HEAD_CHANGED] * (WRITERS - 1), losers
    assert await head_of(world.community, d) == (events[winners[0]]["id"], world.source, 3)
    # No update is a move: no removal anywhere.
    assert await removals_of(world.community, d) == []


def check_removal(world: World, removal: MoveRemoval, *, d: uuid.UUID, replaced: str) -> None:
    event: Event = parse_event(json.loads(removal.raw))
    verify_event(event)
    assert event.pubkey == world.community.relay_pubkey
    assert event.kind == 45011
    assert event.content == ""
    assert [list(t) for t in event.tags] == [
        ["ar", "1"],
        ["d", str(d)],
        ["h", str(world.source)],
        ["reason", "moved"],
        ["prev", replaced],
    ]
    assert str(world.dest) not in removal.raw
    assert removal.source == world.source and removal.replaced == replaced and removal.id == event.id


async def check_move_outcome(
    world: World, d: uuid.UUID, prev: str, events: list[dict[str, Any]], replies: list[list[Any]], mover: int
) -> bool:
    """Exactly one winner, consistent head, and a removal iff the move won. True when the move won."""
    winners, losers = split(replies)
    assert len(winners) == 1, replies
    assert losers == [HEAD_CHANGED] * (len(replies) - 1), losers
    winner = events[winners[0]]
    head, home, count = await head_of(world.community, d)
    assert (head, count) == (winner["id"], 2)
    removals = await removals_of(world.community, d)
    if winners[0] == mover:
        assert home == world.dest
        assert len(removals) == 1, removals
        check_removal(world, removals[0], d=d, replaced=prev)
        return True
    assert home == world.source
    assert removals == []
    return False


async def move_races_updates(world: World, clients: list[RelayClient]) -> None:
    for round_no in range(4):
        d, prev = await create(clients[0], world.writers[0], world)
        # The mover's place in the send order alternates between first and last.
        mover = 0 if round_no % 2 == 0 else WRITERS - 1
        events = [
            revision(s, d=d, h=world.dest if i == mover else world.source, op="move" if i == mover else "update",
                     prev=prev)
            for i, s in enumerate(world.writers)
        ]  # fmt: skip
        replies = await race(clients, events)
        await check_move_outcome(world, d, prev, events, replies, mover)
    # Both outcomes, whatever the scheduling did: the move a moment ahead, then a moment behind.
    for move_first in (True, False):
        d, prev = await create(clients[0], world.writers[0], world)
        events = [
            revision(s, d=d, h=world.dest if i == 0 else world.source, op="move" if i == 0 else "update",
                     prev=prev)
            for i, s in enumerate(world.writers)
        ]  # fmt: skip
        if move_first:
            first = [await publish(clients[0], events[0], TIMEOUT)]
            replies = first + await race(clients[1:], events[1:])
        else:
            rest = await race(clients[1:2], events[1:2])
            replies = [await publish(clients[0], events[0], TIMEOUT), *rest, *await race(clients[2:], events[2:])]
        assert await check_move_outcome(world, d, prev, events, replies, 0) is move_first


async def fifty_creates_of_one_d(world: World, clients: list[RelayClient]) -> None:
    for _ in range(3):
        d = uuid.uuid4()
        events = [revision(s, d=d, h=world.source, op="create") for s in world.writers]
        winners, losers = split(await race(clients, events))
        assert len(winners) == 1
        assert losers == [IDENTITY_TAKEN] * (WRITERS - 1), losers
        assert await head_of(world.community, d) == (events[winners[0]]["id"], world.source, 1)


@pytest.mark.slow
async def test_races_over_two_relays(world: World, relay_factory: Any, redis_flush: Any) -> None:
    """The three races share one pair of relays and one set of 50 connections (half on each relay)."""
    relays = await start_relays(relay_factory, RELAY_ENV, RELAY_ENV)
    async with writer_connections(world, relays) as clients:
        await fifty_updates_on_one_prev(world, clients)
        await move_races_updates(world, clients)
        await fifty_creates_of_one_d(world, clients)
