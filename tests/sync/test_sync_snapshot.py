"""NIP-AR sync rules 1, 2 and 8 while the initial set is being read, with the snapshot held open by a slow reader.

The reader's socket has a small receive window and it stops reading, so the relay's send queue and the
sync's buffer fill and the snapshot transaction stays open, page after page (pages of one row here). The
test sees that in pg_stat_activity and then acts:
* changes committed meanwhile are not in the set at EOSE (one cut), no live entry comes before EOSE, and
  after EOSE their current heads arrive (held by d, rule 1);
* CLOSE ends the snapshot at once (rule 8);
* a reader too slow for the snapshot budget gets no EOSE but CLOSED "error: ..." (it fits in the send
  queue's slack for notices, so the connection stays open);
* more than max_events changed d during the read: CLOSED "resync: ..." and no EOSE;
* the reader's membership removal, or the channel's deletion, mid-snapshot: CLOSED "resync: ...", no EOSE.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async
from websockets.exceptions import ConnectionClosed

from buzz.chat import channels
from tests.support.relay import relay_database_url
from tests.support.wsclient import RelayClient
from tests.sync.support import (
    RELAY_ENV,
    World,
    make_world,
    revision,
    small_window_client,
    write,
)

HOST = "sync-snapshot.test"
BIG = "x" * 100_000
N = 80
SLOW_ENV = {
    **RELAY_ENV,
    "BUZZ_SYNC_PAGE_ROWS": "1",
    "BUZZ_SYNC_BUFFER_BYTES": "65536",
    "BUZZ_OUTBOUND_MAX_BYTES": "65536",
    "BUZZ_OUTBOUND_MAX_MESSAGES": "8",
}
SNAPSHOT_SQL = "%artifacts_artifact a JOIN artifacts_revision r ON %a.d > %"


pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


def open_snapshots() -> int:
    """Relay transactions that have read a sync page and are still open (the snapshot): idle in the
    transaction between pages, or running the next page's statement. Counting only the idle ones saw an
    open snapshot as ended whenever a poll fell on a page statement (the relay is busy filling the reader's
    socket buffers before it stalls), and the test then read the rest of the set itself."""
    with psycopg.connect(relay_database_url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND (state = 'active' OR state LIKE 'idle in transaction%%') AND xact_start IS NOT NULL"
            " AND query LIKE %s AND pid <> pg_backend_pid()",
            [SNAPSHOT_SQL],
        ).fetchone()
    return int(row[0]) if row else 0


async def wait_until(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        await asyncio.sleep(0.05)


async def load(w: RelayClient, world: World, n: int = N) -> dict[str, dict[str, Any]]:
    heads = {}
    for _ in range(n):
        ev = revision(world.owner, uuid.uuid4(), world.a, "create", content=BIG)
        await write(w, ev)
        heads[next(t[1] for t in ev["tags"] if t[0] == "d")] = ev
    return heads


async def drain(r: RelayClient, sub: str, timeout: float = 30.0) -> tuple[list[list[Any]], bool]:
    """Read the sync's messages up to EOSE or CLOSED; (messages, connection still open)."""
    got: list[list[Any]] = []
    try:
        while True:
            m = await r.recv_json(timeout)
            if len(m) > 1 and m[1] == sub:
                got.append(m)
                if m[0] in ("EOSE", "CLOSED"):
                    return got, True
    except ConnectionClosed:
        return got, False


async def test_changes_during_the_snapshot_are_held_and_sent_after_eose(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**SLOW_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as w:
        assert (await w.auth(world.owner))[2] is True
        heads = await load(w, world)
        async with small_window_client(relay.ws_url, HOST) as r:
            assert (await r.auth(world.reader))[2] is True
            await r.send_json(["REQ", "s", {"artifact": "current", "#h": [str(world.a)]}])
            await wait_until(lambda: open_snapshots() == 1, "the snapshot held open by the slow reader")
            ordered = sorted(heads)
            first, last, gone = ordered[0], ordered[-1], ordered[-2]
            old = {d: e["id"] for d, e in heads.items()}
            # Changes committed while the snapshot is open: an artifact already sent, one not yet sent,
            # a deletion and a new artifact.
            new_first = revision(world.owner, first, world.a, "update", prev=heads[first]["id"])
            new_last = revision(world.owner, last, world.a, "update", prev=heads[last]["id"])
            deletion = revision(world.owner, gone, world.a, "delete", prev=heads[gone]["id"])
            fresh_d = str(uuid.uuid4())
            fresh = revision(world.owner, fresh_d, world.a, "create")
            for ev in (new_first, new_last, deletion, fresh):
                await write(w, ev)
            assert open_snapshots() == 1
            before, still_open = await drain(r, "s", timeout=60.0)
            assert still_open and before[-1][0] == "EOSE", before[-1:]
            # The set at EOSE is the cut the snapshot saw: the old heads only, nothing live before EOSE.
            assert {m[2]["id"] for m in before if m[0] == "EVENT"} == set(old.values())
            # After EOSE, the current heads of what changed (rule 1: held by d, rule 3: read and sent).
            live: dict[str, str] = {}
            while set(live) != {first, last, gone, fresh_d}:
                m = await r.recv_json(30.0)
                assert m[0] == "EVENT" and m[1] == "s", m
                live[next(t[1] for t in m[2]["tags"] if t[0] == "d")] = m[2]["id"]
            assert live == {first: new_first["id"], last: new_last["id"], gone: deletion["id"], fresh_d: fresh["id"]}


async def test_close_ends_the_snapshot_at_once(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**SLOW_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as w:
        assert (await w.auth(world.owner))[2] is True
        await load(w, world)
        async with small_window_client(relay.ws_url, HOST) as r:
            assert (await r.auth(world.reader))[2] is True
            await r.send_json(["REQ", "s", {"artifact": "current", "#h": [str(world.a)]}])
            await wait_until(lambda: open_snapshots() == 1, "the snapshot held open by the slow reader")
            await r.send_json(["CLOSE", "s"])
            await wait_until(lambda: open_snapshots() == 0, "the snapshot to end after CLOSE")
        # A disconnect ends it too.
        async with small_window_client(relay.ws_url, HOST) as r:
            assert (await r.auth(world.reader))[2] is True
            await r.send_json(["REQ", "s", {"artifact": "current", "#h": [str(world.a)]}])
            await wait_until(lambda: open_snapshots() == 1, "the snapshot held open by the slow reader")
        await wait_until(lambda: open_snapshots() == 0, "the snapshot to end after the disconnect")


async def test_a_reader_slower_than_the_budget_gets_no_eose(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**SLOW_ENV, BUZZ_SYNC_SNAPSHOT_BUDGET_MS="1500")
    async with RelayClient.connect(relay.ws_url, host=HOST) as w:
        assert (await w.auth(world.owner))[2] is True
        await load(w, world)
        async with small_window_client(relay.ws_url, HOST) as r:
            assert (await r.auth(world.reader))[2] is True
            await r.send_json(["REQ", "s", {"artifact": "current", "#h": [str(world.a)]}])
            await wait_until(lambda: open_snapshots() == 1, "the snapshot held open by the slow reader")
            await wait_until(lambda: open_snapshots() == 0, "the relay to end the snapshot at its budget")
            got, still_open = await drain(r, "s", timeout=60.0)
            assert "EOSE" not in [m[0] for m in got]
            # The CLOSED goes out even with the send queue full (its slack for notices): never a silent end.
            assert still_open, "the connection was closed instead of the sync"
            assert got[-1][0] == "CLOSED" and got[-1][2].startswith("error:"), got[-1]


async def test_held_changes_past_max_events_end_the_sync_without_eose(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**SLOW_ENV, BUZZ_SYNC_MAX_EVENTS=str(N + 5))
    async with RelayClient.connect(relay.ws_url, host=HOST) as w:
        assert (await w.auth(world.owner))[2] is True
        await load(w, world)
        async with small_window_client(relay.ws_url, HOST) as r:
            assert (await r.auth(world.reader))[2] is True
            await r.send_json(["REQ", "s", {"artifact": "current", "#h": [str(world.a)]}])
            await wait_until(lambda: open_snapshots() == 1, "the snapshot held open by the slow reader")
            for _ in range(N + 6):
                await write(w, revision(world.owner, uuid.uuid4(), world.a, "create"))
            got, still_open = await drain(r, "s", timeout=60.0)
            assert "EOSE" not in [m[0] for m in got]
            # The CLOSED goes out even with the send queue full (its slack for notices): never a silent end.
            assert still_open, "the connection was closed instead of the sync"
            assert got[-1][0] == "CLOSED" and got[-1][2].startswith("resync:"), got[-1]


@pytest.mark.parametrize("change", ["membership", "deletion"])
async def test_an_access_change_mid_snapshot_ends_the_sync_without_eose(
    world: World, relay_factory: Any, change: str
) -> None:
    relay = relay_factory(**SLOW_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as w:
        assert (await w.auth(world.owner))[2] is True
        await load(w, world)
        async with small_window_client(relay.ws_url, HOST) as r:
            assert (await r.auth(world.reader))[2] is True
            await r.send_json(["REQ", "s", {"artifact": "current", "#h": [str(world.b), str(world.a)]}])
            await wait_until(lambda: open_snapshots() == 1, "the snapshot held open by the slow reader")
            if change == "membership":
                await sync_to_async(channels.member_remove)(
                    community=world.community, channel_uuid=world.b, actor=None, pubkey=world.reader.pubkey
                )
            else:
                await sync_to_async(channels.channel_delete)(
                    community=world.community, channel_uuid=world.b, actor=None
                )
            got, still_open = await drain(r, "s", timeout=60.0)
            assert "EOSE" not in [m[0] for m in got]
            # The CLOSED goes out even with the send queue full (its slack for notices): never a silent end.
            assert still_open, "the connection was closed instead of the sync"
            assert got[-1][0] == "CLOSED" and got[-1][2].startswith("resync:"), got[-1]
            await wait_until(lambda: open_snapshots() == 0, "the snapshot to end")
