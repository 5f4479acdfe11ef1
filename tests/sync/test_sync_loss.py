"""Rule 5 of NIP-AR sync, each trigger forced for real: a lost change is never silent.

* CLIENT KILL of the relay's hub connection: every sync it serves gets CLOSED "resync: ...", also one
  whose snapshot is still being read (which then never gets EOSE); a new sync gets EOSE once the hub
  is back.
* A Redis restart (a redis-server of the test's own, killed and started again on its port): the same,
  and a sync sent while Redis is down waits for it.
* A garbage signal payload on a channel topic, or a decodable one the sync can't interpret: resync.
* A slow client that stops reading while changes arrive: resync, or the connection is closed.
* An access check that fails (the relay's database role loses a privilege the policy needs): resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from websockets.exceptions import ConnectionClosed

from buzz.live.hub import topic_for_channel
from tests.live.live_world import table_locked, wait_for_lock_waiters
from tests.live.test_hub_loss import the_hub_connection
from tests.support.relay import limited_role, set_select
from tests.support.wsclient import RelayClient
from tests.sync.support import RELAY_ENV, World, follow, make_world, open_sync, own_redis, revision, write

HOST = "sync-loss.test"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


def _resync(state: Any) -> bool:
    return state.closed is not None and state.closed.startswith("resync:")


async def test_client_kill_resyncs_live_and_mid_snapshot_syncs(
    world: World, relay_factory: Any, redis_client: redis.Redis
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as r, RelayClient.connect(relay.ws_url, host=HOST) as r2:
        assert (await r.auth(world.reader))[2] is True
        assert (await r2.auth(world.reader))[2] is True
        live = await open_sync(r, "live", {"artifact": "current", "#h": [str(world.a)]})
        assert live.eose
        with table_locked("artifacts_artifact"):
            await r2.send_json(["REQ", "stuck", {"artifact": "current", "#h": [str(world.b)]}])
            await wait_for_lock_waiters("artifacts_artifact", 1)
            assert redis_client.client_kill_filter(_id=str(the_hub_connection(redis_client, relay.pid))) == 1
            await follow(r, "live", live, lambda s: False)
            assert _resync(live), live.closed
            stuck = await r2.expect("CLOSED", 15.0, where=lambda m: m[1] == "stuck")
            assert stuck[2].startswith("resync:"), stuck
        # Nothing more for the cut-short sync: no EOSE ever; a new sync completes once the hub is back.
        again = await open_sync(r2, "again", {"artifact": "current", "#h": [str(world.b)]})
        assert again.eose
        assert [m for m in r2.collected if len(m) > 1 and m[1] == "stuck"] == []


async def test_redis_restart_resyncs_and_a_sync_sent_meanwhile_waits(world: World, relay_factory: Any) -> None:
    with own_redis() as (url, (start, kill)):
        relay = relay_factory(**RELAY_ENV, REDIS_URL=url)
        async with RelayClient.connect(relay.ws_url, host=HOST) as r:
            assert (await r.auth(world.reader))[2] is True
            state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
            assert state.eose
            kill()
            await follow(r, "s", state, lambda s: False)
            assert _resync(state), state.closed
            # While Redis is down a new sync waits (rule 1); Redis comes back within the wait: EOSE.
            await r.send_json(["REQ", "w", {"artifact": "current", "#h": [str(world.a)]}])
            await asyncio.sleep(0.5)
            assert [m for m in r.collected if len(m) > 1 and m[1] == "w"] == []
            await asyncio.to_thread(start)
            assert (await r.expect("EOSE", 15.0, where=lambda m: m[1] == "w"))[1] == "w"
            # Down for longer than the wait: CLOSED "error: ..." and no EOSE.
            kill()
            late = await open_sync(r, "late", {"artifact": "current", "#h": [str(world.a)]}, timeout=30.0)
            assert late.closed is not None and late.closed.startswith("error:"), late.closed
            assert not late.eose


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xfe{not json",
        # Decodable, but not a signal the sync can interpret (an unknown kind; an event without a kind).
        b'{"t": "renamed", "channel": "x"}',
        b'{"t": "event", "event": {"tags": []}}',
    ],
    ids=["undecodable", "unknown-kind", "event-without-kind"],
)
async def test_a_garbage_signal_resyncs(
    world: World, relay_factory: Any, redis_client: redis.Redis, payload: bytes
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await r.auth(world.reader))[2] is True
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
        assert state.eose
        wire = os.environ["BUZZ_REDIS_PREFIX"] + topic_for_channel(world.community.pk, str(world.a))
        redis_client.publish(wire, payload)
        await follow(r, "s", state, lambda s: False)
        assert _resync(state), state.closed


async def test_a_slow_client_gets_a_resync_or_is_disconnected(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV, BUZZ_OUTBOUND_MAX_MESSAGES="4", BUZZ_OUTBOUND_MAX_BYTES="65536")
    async with RelayClient.connect(relay.ws_url, host=HOST) as w, RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await w.auth(world.owner))[2] is True
        assert (await r.auth(world.reader))[2] is True
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
        assert state.eose
        # The reader stops reading; 60 heads of ~200 KB each are far more than the send queue and the
        # socket buffers hold.
        d = uuid.uuid4()
        prev = None
        for i in range(60):
            ev = revision(
                world.owner,
                d,
                world.a,
                "create" if prev is None else "update",
                prev=prev,
                content="x" * 200_000 + str(i),
            )
            await write(w, ev)
            prev = ev["id"]
        told = False
        try:
            while True:
                m = await r.recv_json(15.0)
                if m[0] == "CLOSED" and m[1] == "s":
                    assert m[2].startswith("resync:"), m
                    told = True
                    break
        except ConnectionClosed:
            told = True  # the relay closed the connection: the client must start a new sync (rule 7)
        assert told


@contextlib.asynccontextmanager
async def writer_and_limited_reader(world: World, relay_factory: Any) -> AsyncIterator[tuple[Any, Any, str]]:
    """The owner logged in on a relay, the reader on another whose database role a test can take privileges
    from (`set_select`): (writer client, reader client, that role)."""
    writer_relay = relay_factory(**RELAY_ENV)
    with limited_role() as (url, role):
        relay = relay_factory(**RELAY_ENV, DATABASE_URL=url)
        async with (
            RelayClient.connect(writer_relay.ws_url, host=HOST) as w,
            RelayClient.connect(relay.ws_url, host=HOST) as r,
        ):
            assert (await w.auth(world.owner))[2] is True
            assert (await r.auth(world.reader))[2] is True
            yield w, r, role


async def test_a_failed_access_check_resyncs(world: World, relay_factory: Any) -> None:
    async with writer_and_limited_reader(world, relay_factory) as (w, r, role):
        d = uuid.uuid4()
        created = revision(world.owner, d, world.a, "create")
        await write(w, created)
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
        assert state.eose and str(d) in state.heads
        set_select(role, "buzz_membership", allowed=False)
        # The artifact moves to b, which the reader can read but the sync doesn't name: deciding between
        # its head and the source's removal needs the reader's access to b, and that check now fails.
        await write(w, revision(world.owner, d, world.b, "move", prev=created["id"]))
        await follow(r, "s", state, lambda s: False)
        assert _resync(state), state.closed


async def test_a_failed_head_read_resyncs(world: World, relay_factory: Any) -> None:
    # Rule 5: after EOSE a change makes the relay read the head from the writer; a read that fails ends the
    # sync with resync, never in silence. The relay's role loses SELECT on the revisions (the head's text).
    async with writer_and_limited_reader(world, relay_factory) as (w, r, role):
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
        assert state.eose
        set_select(role, "artifacts_revision", allowed=False)
        await write(w, revision(world.owner, uuid.uuid4(), world.a, "create"))
        await follow(r, "s", state, lambda s: False)
        assert state.closed is not None and state.closed.startswith("resync: a change could not be read")


async def test_a_failed_initial_read_is_closed_with_error_and_no_eose(world: World, relay_factory: Any) -> None:
    # Rule 2: a read failure gives CLOSED "error: ..." and no EOSE (and no set read on another snapshot).
    writer_relay = relay_factory(**RELAY_ENV)
    with limited_role() as (url, role):
        relay = relay_factory(**RELAY_ENV, DATABASE_URL=url)
        async with RelayClient.connect(writer_relay.ws_url, host=HOST) as w:
            assert (await w.auth(world.owner))[2] is True
            await write(w, revision(world.owner, uuid.uuid4(), world.a, "create"))
        set_select(role, "artifacts_revision", allowed=False)
        async with RelayClient.connect(relay.ws_url, host=HOST) as r:
            assert (await r.auth(world.reader))[2] is True
            state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
            assert not state.eose and state.heads == {}
            assert state.closed is not None and state.closed.startswith("error: the initial read failed"), state.closed
