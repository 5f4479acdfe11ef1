"""The census of open NIP-AR syncs (artifacts.census), which the admin's "open syncs that get a resync" reads:
the per-process registry, its publication to Redis, `count_open_syncs` over what the nodes published, and
two real relay nodes on one database and one Redis whose syncs are counted while open and forgotten however
they end (CLOSE, a replacing REQ, a resync, a disconnect, a killed node). Ordinary REQs are never counted."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid
from collections.abc import Iterable
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async

from artifacts import census as census_module
from artifacts.census import Census, Registry, count_open_syncs, parse_field, scope_field
from buzz.chat import channels
from buzz.runtime import runtime
from tests.support.relay import start_relays
from tests.support.wsclient import RelayClient, naming
from tests.sync.support import RELAY_ENV, World, make_world, open_sync

HOST = "sync-census.test"
SETTLE = 10.0  # seconds a count may take to reach a live node's figure (it publishes within about a second)
KILLED = 25.0  # seconds a killed node's counts may take to vanish (their TTL is 15 s)


# --- the registry, pure -------------------------------------------------------------------------------


def test_registry_counts_register_and_unregister_and_never_goes_negative() -> None:
    reg = Registry()
    x, y = scope_field(7, [uuid.UUID(int=1)]), scope_field(7, [uuid.UUID(int=2)])
    reg.add(x)
    reg.add(x)
    reg.add(y)
    assert reg.counts() == {x: 2, y: 1} and reg.total() == 3 and reg.dirty
    assert reg.take() == {x: 2, y: 1} and not reg.dirty
    reg.remove(x)
    reg.remove(y)
    assert reg.counts() == {x: 1} and reg.dirty
    reg.take()
    reg.remove(y)  # released already: nothing changes, nothing goes below zero
    reg.remove(scope_field(8, [uuid.UUID(int=1)]))  # never registered
    assert reg.counts() == {x: 1} and not reg.dirty
    reg.remove(x)
    reg.remove(x)
    assert reg.counts() == {} and reg.total() == 0


def test_a_registration_is_released_once_however_often_it_is_released() -> None:
    census = Census(node_id="unit")  # no running loop: counts only, nothing is published
    first = census.register(3, ["b", "a"])
    second = census.register(3, ["a", "b"])
    assert first.field == second.field == "3:a,b"
    assert census.registry.counts() == {"3:a,b": 2}
    first.release()
    first.release()
    assert census.registry.counts() == {"3:a,b": 1}
    second.release()
    assert census.registry.counts() == {}


def test_a_scope_field_names_the_community_and_the_sorted_channels() -> None:
    a, b = uuid.UUID(int=5), uuid.UUID(int=4)
    assert scope_field(12, [a]) == f"12:{a}"
    assert scope_field(12, [a, b, a]) == f"12:{b},{a}"
    assert parse_field(scope_field(12, [a, b])) == (12, frozenset({str(a), str(b)}))
    for junk in ("", "12", "12:", "x:abc", ":abc"):
        assert parse_field(junk) is None


# --- publication and counting, against this run's Redis -------------------------------------------------


def test_count_open_syncs_counts_every_node_and_a_sync_over_several_channels_once(
    redis_flush: redis.Redis, redis_prefix: str
) -> None:
    x, y, z = (str(uuid.uuid4()) for _ in range(3))
    redis_flush.hset(f"{redis_prefix}census:node-a", mapping={f"1:{x}": 3, f"1:{','.join(sorted([x, y]))}": 1})
    redis_flush.hset(f"{redis_prefix}census:node-b", mapping={f"1:{x}": 2, f"1:{y}": 1, f"2:{x}": 9, "bad": 4})
    redis_flush.hset("other-prefix:census:node-c", mapping={f"1:{x}": 100})
    try:
        assert count_open_syncs(1, [x]) == 6
        assert count_open_syncs(1, [y]) == 2
        assert count_open_syncs(1, [x, y]) == 7  # the sync over both is one sync
        assert count_open_syncs(1, [z]) == 0
        assert count_open_syncs(2, [x]) == 9
        assert count_open_syncs(1, []) == 0
    finally:
        redis_flush.delete("other-prefix:census:node-c")


def test_count_open_syncs_is_zero_and_logged_when_redis_cannot_be_asked(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from buzz.dev.devservices import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    with caplog.at_level(logging.WARNING, logger="artifacts.census"):
        assert count_open_syncs(1, [uuid.uuid4()]) == 0
    assert any("could not count open syncs" in r.getMessage() for r in caplog.records)


async def test_a_census_publishes_its_counts_with_a_ttl_and_deletes_them_at_zero(
    redis_flush: redis.Redis,
) -> None:
    census = Census()
    ch = uuid.uuid4()
    try:
        one = census.register(41, [ch])
        two = census.register(41, [ch])
        assert await _eventually(lambda: redis_flush.hgetall(census.key) == {f"41:{ch}".encode(): b"2"})
        assert 0 < redis_flush.ttl(census.key) <= census_module.KEY_TTL
        one.release()
        assert await _eventually(lambda: redis_flush.hgetall(census.key) == {f"41:{ch}".encode(): b"1"})
        two.release()
        assert await _eventually(lambda: not redis_flush.exists(census.key))  # the last write, at zero
    finally:
        await runtime.aclose()


async def _eventually(check: Any, timeout: float = SETTLE) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


# --- two real relay nodes --------------------------------------------------------------------------------


@pytest.fixture
def world(transactional_db: None, redis_flush: redis.Redis) -> World:
    return make_world(HOST)


async def _count(world: World, chans: Iterable[uuid.UUID]) -> int:
    return await asyncio.to_thread(count_open_syncs, world.community.pk, list(chans))


async def settles(world: World, expected: dict[tuple[uuid.UUID, ...], int], timeout: float = SETTLE) -> None:
    """Poll until every count is its expected figure (bounded); fail with the last figures seen."""
    deadline = time.monotonic() + timeout
    while True:
        seen = {chans: await _count(world, chans) for chans in expected}
        if seen == expected:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"open syncs {seen}, expected {expected}")
        await asyncio.sleep(0.1)


async def _sync(client: RelayClient, sub: str, *chans: uuid.UUID) -> None:
    state = await open_sync(client, sub, {"artifact": "current", "#h": [str(c) for c in chans]})
    assert state.eose and state.closed is None, state.closed


async def _req(client: RelayClient, sub: str, chan: uuid.UUID) -> None:
    await client.send_json(["REQ", sub, {"kinds": [9], "#h": [str(chan)]}])
    await client.expect("EOSE", where=lambda m: m[1] == sub)


def _census_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}census:*"))


async def test_open_syncs_on_two_nodes_are_counted_and_a_killed_nodes_vanish(
    world: World, relay_factory: Any, redis_client: redis.Redis, redis_prefix: str
) -> None:
    x, y = world.a, world.b
    node_a, node_b = await start_relays(relay_factory, RELAY_ENV, RELAY_ENV)
    async with (
        RelayClient.connect(node_a.ws_url, host=HOST) as ra,
        RelayClient.connect(node_b.ws_url, host=HOST) as rb,
    ):
        assert (await ra.auth(world.reader))[2] is True
        assert (await rb.auth(world.reader))[2] is True
        for sub in ("s1", "s2", "s3"):
            await _sync(ra, sub, x)
        for sub in ("t1", "t2"):
            await _sync(rb, sub, x)
        await _sync(rb, "y1", y)
        await _req(ra, "plain-x", x)  # ordinary REQs: never counted
        await _req(rb, "plain-y", y)
        await settles(world, {(x,): 5, (y,): 1, (x, y): 6})
        assert len(_census_keys(redis_client, redis_prefix)) == 2  # one hash per node

        await ra.send_json(["CLOSE", "s1"])
        await rb.send_json(["CLOSE", "t1"])
        await settles(world, {(x,): 3, (y,): 1})

        assert node_b.proc is not None
        node_b.proc.send_signal(signal.SIGKILL)  # no goodbye: only the TTL can remove its counts
        await asyncio.to_thread(node_b.proc.wait, 10)
        await settles(world, {(x,): 2, (y,): 0}, timeout=KILLED)
        assert len(_census_keys(redis_client, redis_prefix)) == 1  # node A's only

        await ra.send_json(["CLOSE", "s2"])
        await ra.send_json(["CLOSE", "s3"])
        await settles(world, {(x,): 0})
        # At zero the node writes once more: its hash is gone at once, not when its TTL runs out.
        assert await _eventually(lambda: _census_keys(redis_client, redis_prefix) == [])


async def test_a_sync_is_counted_until_it_ends_however_it_ends(
    world: World, relay_factory: Any, redis_client: redis.Redis, redis_prefix: str
) -> None:
    x, y = world.a, world.b
    (relay,) = await start_relays(relay_factory, RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await r.auth(world.reader))[2] is True
        async with RelayClient.connect(relay.ws_url, host=HOST) as gone:
            assert (await gone.auth(world.reader))[2] is True
            await _sync(gone, "g", x)
            await _sync(r, "both", x, y)
            await _sync(r, "replaced", x)
            await _sync(r, "resynced", y)
            denied = await open_sync(r, "denied", {"artifact": "current", "#h": [str(world.private)]})
            assert denied.closed is not None and denied.closed.startswith("restricted:")
            await settles(world, {(x,): 3, (y,): 2, (x, y): 4, (world.private,): 0})

        # A disconnect ends the connection's syncs.
        await settles(world, {(x,): 2, (y,): 2})

        # A REQ under the same id replaces the sync; the ordinary REQ that replaced it is not counted.
        await _req(r, "replaced", x)
        await settles(world, {(x,): 1, (y,): 2})

        # The relay ends a sync with CLOSED "resync: ..." (the reader left y): both syncs naming y end.
        await sync_to_async(channels.member_remove)(
            community=world.community, channel_uuid=y, actor=None, pubkey=world.reader.pubkey
        )
        for sub in ("resynced", "both"):
            msg = await r.expect("CLOSED", where=naming(sub))
            assert msg[2].startswith("resync:"), msg
        await settles(world, {(x,): 0, (y,): 0})
        assert await _eventually(lambda: _census_keys(redis_client, redis_prefix) == [])
