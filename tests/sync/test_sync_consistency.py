"""NIP-AR sync rule 2 under load: every sync's set at EOSE is the set of heads at one instant.

Writers hammer two channels (creates, updates, moves in and out of the sync's scope, deletes, restores)
through two relay processes on one database and one Redis, while syncs open and close on both nodes. A
poller records the order in which revisions become visible (the relay's acceptance order, seq, is taken
inside each transaction, so concurrent writes can become visible out of seq order; per artifact the order
is exact). For each sync there must be one instant, after its REQ was sent and before its EOSE, whose
heads, filtered by the sync's filter, are exactly its set at EOSE, and that instant includes every
revision whose OK the writer had before it sent the REQ. Long-lived syncs
follow live changes on both nodes; after quiescence their live-maintained digest equals a fresh sync's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from tests.support.relay import relay_database_url
from tests.support.wsclient import RelayClient, naming
from tests.sync.support import RELAY_ENV, SyncState, World, follow, make_world, open_sync, revision

HOST = "sync-consistency.test"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


@dataclass
class Observed:
    node: int
    sent_at: float
    eose_at: float
    flt: dict[str, Any]
    heads: dict[str, str]


@dataclass
class Ledger:
    ok_at: dict[str, float] = field(default_factory=dict)


async def writer(url: str, world: World, ds: list[uuid.UUID], ops: int, rng: random.Random, ledger: Ledger) -> None:
    heads: dict[uuid.UUID, tuple[str, str, bool]] = {}  # d -> (head id, home, deleted)
    homes = [world.a, world.b, world.private]
    async with RelayClient.connect(url, host=HOST) as w:
        assert (await w.auth(world.owner))[2] is True
        for _ in range(ops):
            d = rng.choice(ds)
            status = rng.choice(["open", "done"])
            if d not in heads:
                ev = revision(world.owner, d, rng.choice(homes), "create", tags=[["status", status]])
            else:
                prev, home, deleted = heads[d]
                if deleted:
                    ev = revision(world.owner, d, home, "restore", prev=prev, tags=[["status", status]])
                else:
                    op = rng.choice(["update", "update", "move", "delete"])
                    target = rng.choice([h for h in homes if str(h) != home]) if op == "move" else home
                    ev = revision(world.owner, d, target, op, prev=prev, tags=[["status", status]])
            await w.send_json(["EVENT", ev])
            ok = await w.expect("OK", 30.0, where=naming(ev["id"]))
            assert ok[2] is True, ok
            ledger.ok_at[ev["id"]] = time.monotonic()
            op_tag = next(t[1] for t in ev["tags"] if t[0] == "op")
            home_tag = next(t[1] for t in ev["tags"] if t[0] == "h")
            heads[d] = (ev["id"], home_tag, op_tag == "delete")


FILTERS: list[Callable[[World], dict[str, Any]]] = [
    lambda w: {"artifact": "current", "#h": [str(w.a), str(w.b)]},
    lambda w: {"artifact": "current", "#h": [str(w.a)], "#status": ["open"]},
    lambda w: {"artifact": "current", "#h": [str(w.b), str(w.a)], "#status": ["done"], "kinds": [45010]},
]


async def syncer(urls: list[str], world: World, stop: asyncio.Event, rng: random.Random) -> list[Observed]:
    seen: list[Observed] = []
    clients = []
    async with contextlib.AsyncExitStack() as stack:
        for url in urls:
            c = await stack.enter_async_context(RelayClient.connect(url, host=HOST))
            assert (await c.auth(world.reader))[2] is True
            clients.append(c)
        n = 0
        while not stop.is_set():
            node = n % len(clients)
            flt = rng.choice(FILTERS)(world)
            sent_at = time.monotonic()
            state = await open_sync(clients[node], f"q{n}", flt, timeout=30.0)
            assert state.eose, state.closed
            seen.append(Observed(node, sent_at, time.monotonic(), flt, {d: e["id"] for d, e in state.heads.items()}))
            await clients[node].send_json(["CLOSE", f"q{n}"])
            n += 1
    return seen


class VisibilityPoller(threading.Thread):
    """Records the order in which revisions become visible to new snapshots.

    The relay's acceptance order (artifacts_revision.seq) is taken inside each write transaction, so two
    concurrent writes can become visible in the other order; "one instant" is about visibility. The poller
    takes a snapshot every few milliseconds: each poll is an instant, and the revisions first seen by a poll
    became visible since the one before it (their relative order within that gap is not known).
    """

    def __init__(self, community_id: int) -> None:
        super().__init__(daemon=True)
        self.community_id = community_id
        self.batches: list[tuple[float, set[str]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        seen: set[str] = set()
        with psycopg.connect(relay_database_url(), autocommit=True) as conn:
            while not self.stop.is_set():
                at = time.monotonic()
                rows = conn.execute(
                    "SELECT id FROM artifacts_revision WHERE community_id = %s", [self.community_id]
                ).fetchall()
                new = {r[0] for r in rows} - seen
                if new:
                    seen |= new
                    self.batches.append((at, new))
                time.sleep(0.003)


@dataclass(frozen=True)
class Rev:
    seq: int
    d: str
    id: str
    op: str
    home: str
    tags: list[list[str]]


def history() -> list[Rev]:
    with psycopg.connect(relay_database_url()) as conn:
        rows = conn.execute(
            "SELECT r.seq, a.d::text, r.id, r.op, r.channel::text, r.raw FROM artifacts_revision r"
            " JOIN artifacts_artifact a ON a.id = r.artifact_id ORDER BY r.seq"
        ).fetchall()
    return [Rev(seq, d, rid, op, h, json.loads(raw)["tags"]) for seq, d, rid, op, h, raw in rows]


def in_filter(flt: dict[str, Any], rev: Rev) -> bool:
    if rev.op == "delete" or rev.home not in flt["#h"]:
        return False
    for key, values in flt.items():
        if key.startswith("#") and key != "#h" and not any(t[0] == key[1:] and t[1] in values for t in rev.tags):
            return False
    return True


def check_cuts(observed: list[Observed], ledger: Ledger, poller: VisibilityPoller) -> None:
    revs = history()
    by_id = {r.id: r for r in revs}
    chains: dict[str, list[Rev]] = {}
    for r in revs:
        chains.setdefault(r.d, []).append(r)  # one winner per edit: per d, seq order is the real order
    place = {r.id: i for chain in chains.values() for i, r in enumerate(chain)}
    assert sum(len(b) for _, b in poller.batches) == len(revs), "the poller missed revisions"
    for o in observed:
        # Every revision OK'd before the REQ was sent must be in the set's instant (rule 2).
        floor: dict[str, int] = {}
        for rid, at in ledger.ok_at.items():
            if at < o.sent_at:
                r = by_id[rid]
                floor[r.d] = max(floor.get(r.d, -1), place[rid])
        assert _one_instant(o, chains, by_id, place, floor, poller), (
            f"the set at EOSE of a sync on node {o.node} ({len(o.heads)} heads, filter {o.flt}) is no set of heads"
            " that existed together at one instant after the REQ"
        )


def _one_instant(
    o: Observed,
    chains: dict[str, list[Rev]],
    by_id: dict[str, Rev],
    place: dict[str, int],
    floor: dict[str, int],
    poller: VisibilityPoller,
) -> bool:
    """Is there a gap between two polls, between the REQ and EOSE, in which the set's instant can lie?"""
    head: dict[str, int] = {}  # d -> index of the latest revision visible at the poll before the gap
    for at, batch in poller.batches:
        gap = [by_id[rid] for rid in batch]
        if at >= o.sent_at and _fits(o, chains, head, gap, place, floor):
            return True
        if at > o.eose_at:
            return False
        for r in gap:
            head[r.d] = max(head.get(r.d, -1), place[r.id])
    return _fits(o, chains, head, [], place, floor)


def _fits(
    o: Observed,
    chains: dict[str, list[Rev]],
    head: dict[str, int],
    gap: list[Rev],
    place: dict[str, int],
    floor: dict[str, int],
) -> bool:
    """Per d, the instant shows the head before the gap or a revision of d that became visible in it."""
    in_gap: dict[str, list[int]] = {}
    for r in gap:
        in_gap.setdefault(r.d, []).append(place[r.id])
    for d, chain in chains.items():
        allowed: set[str | None] = set()
        for i in (head.get(d, -1), *in_gap.get(d, [])):
            if i >= floor.get(d, -1):
                allowed.add(chain[i].id if i >= 0 and in_filter(o.flt, chain[i]) else None)
        if o.heads.get(d) not in allowed:
            return False
    return True


@pytest.mark.timeout(600)
@pytest.mark.parametrize("node_count", [1, 2])
async def test_every_eose_is_one_cut_and_live_sets_converge(world: World, relay_factory: Any, node_count: int) -> None:
    # Small pages: the initial set spans many keyset pages, which must all come from one snapshot.
    nodes = [relay_factory(**RELAY_ENV, BUZZ_SYNC_PAGE_ROWS="3") for _ in range(node_count)]
    urls = [n.ws_url for n in nodes]
    ledger = Ledger()
    ds = [uuid.uuid4() for _ in range(48)]
    followers: list[tuple[RelayClient, SyncState]] = []
    async with contextlib.AsyncExitStack() as stack:
        poller = VisibilityPoller(world.community.pk)
        poller.start()
        stop = asyncio.Event()
        sync_task = asyncio.create_task(syncer(urls, world, stop, random.Random(7)))
        writers = asyncio.gather(
            *(writer(urls[i % len(urls)], world, ds[i::4], 120, random.Random(i), ledger) for i in range(4))
        )
        follow_tasks = []
        # Long-lived syncs open while the writers run, so changes arrive during their initial read (held, then
        # sent after EOSE) as well as after it.
        for i in range(6):
            await asyncio.sleep(0.4)
            c = await stack.enter_async_context(RelayClient.connect(urls[i % len(urls)], host=HOST))
            assert (await c.auth(world.reader))[2] is True
            state = await open_sync(c, "follow", FILTERS[i % len(FILTERS)](world))
            assert state.eose, state.closed
            followers.append((c, state))
            follow_tasks.append(asyncio.create_task(follow(c, "follow", state, lambda s: False, timeout=120.0)))
        await writers
        stop.set()
        observed = await sync_task
        poller.stop.set()
        await asyncio.to_thread(poller.join)
        assert len(observed) >= 10, len(observed)
        check_cuts(observed, ledger, poller)
        # Quiescence: each live-maintained set converges to what a fresh sync on the other node holds.
        for task in follow_tasks:
            task.cancel()
        for i, (c, state) in enumerate(followers):
            assert state.closed is None, state.closed
            async with RelayClient.connect(urls[(i + 1) % len(urls)], host=HOST) as fresh:
                assert (await fresh.auth(world.reader))[2] is True
                target = (await open_sync(fresh, "fresh", state.flt)).digest()
            await follow(c, "follow", state, lambda s, t=target: s.digest() == t, timeout=30.0)
            assert state.digest() == target
