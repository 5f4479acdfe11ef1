"""Losing the node's hub connection is never silent, and new REQs wait for the hub to be back.

The hub's pub/sub connection is found in CLIENT LIST by its name
(`buzz-hub-pubsub-<relay pid>-<hex>`) and cut with CLIENT KILL. Every REQ the
node serves that registered live interest, including one still reading its
stored events, gets CLOSED "error: live delivery was interrupted ...". A REQ
sent right after the kill gets EOSE once the hub has reconnected, and live
events flow to it.

The second test puts a small TCP gate between the relay and Redis, so the hub
can be kept from reconnecting for a moment: a REQ sent then gets no EOSE until
the hub is back.

Helpers and the world (channels A, B, P, Q, O, D) come from test_live_delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from tests.live.live_world import (
    READ_TIMEOUT,
    RELAY_ENV,
    Clients,
    World,
    build_world,
    chat,
    closed_of,
    events_of,
    next_for,
    read_until,
    req,
    send_ok,
    table_locked,
    wait_for_lock_waiters,
)

INTERRUPTED = "error: live delivery was interrupted"


@pytest.fixture
def world(transactional_db: None) -> World:
    return build_world()


def hub_connections(client: redis.Redis, pid: int) -> list[dict[str, Any]]:
    prefix = f"buzz-hub-pubsub-{pid}-"
    return [c for c in client.client_list() if str(c.get("name", "")).startswith(prefix)]


def all_closed(subs: set[str]) -> Callable[[list[list[Any]]], bool]:
    return lambda messages: subs <= set(closed_of(messages))


def the_hub_connection(client: redis.Redis, pid: int) -> int:
    found = hub_connections(client, pid)
    assert len(found) == 1, f"expected one hub connection of relay {pid}, found {found}"
    return int(found[0]["id"])


async def new_hub_connection(client: redis.Redis, pid: int, old_id: int, timeout: float = READ_TIMEOUT) -> int:
    """Wait for the relay's hub to hold exactly one connection, not `old_id`."""
    deadline = time.monotonic() + timeout
    while True:
        found = hub_connections(client, pid)
        if len(found) == 1 and int(found[0]["id"]) != old_id:
            return int(found[0]["id"])
        assert time.monotonic() < deadline, f"no new hub connection of relay {pid}: {found}"
        await asyncio.sleep(0.05)


async def test_client_kill_of_the_hub_connection_ends_every_req_and_new_reqs_get_eose(
    world: World, relay_factory: Any, redis_client: redis.Redis
) -> None:
    relay = relay_factory(**RELAY_ENV)
    k, c = world.keys, world.chans
    A, B, P, O_ = (str(c[n]) for n in "ABPO")
    clients = Clients(relay)
    try:
        alice = await clients(k["alice"])
        bob = await clients(k["bob"])
        carol = await clients(k["carol"])
        owner = await clients(k["owner"])
        await req(alice, "a", {"#h": [A], "kinds": [9]})
        await req(alice, "p", {"#h": [P]})
        await req(alice, "wide", {"kinds": [9]})
        await req(bob, "a", {"#h": [A]})
        first = chat(k["owner"], c["A"])
        await send_ok(owner, first)
        await read_until(alice, lambda ms: all(first["id"] in events_of(ms, s) for s in ("a", "wide")))
        await read_until(bob, lambda ms: first["id"] in events_of(ms, "a"))

        old_id = the_hub_connection(redis_client, relay.pid)
        with table_locked("buzz_storedevent"):
            # The owner's REQ has registered live interest and waits in its stored read.
            await owner.send_json(["REQ", "stuck", {"#h": [O_]}])
            await wait_for_lock_waiters("buzz_storedevent", 1)
            assert redis_client.client_kill_filter(_id=str(old_id)) == 1
            # Sent right after the kill, on a channel nobody else on this node listens to.
            await carol.send_json(["REQ", "new", {"#h": [B], "kinds": [9]}])

            for client, subs in ((alice, {"a", "p", "wide"}), (bob, {"a"}), (owner, {"stuck"})):
                got = await read_until(client, all_closed(subs))
                closed = closed_of(got)
                assert set(closed) == subs, closed
                assert all(reason.startswith(INTERRUPTED) for reason in closed.values()), closed
                assert [m for m in got if m[0] != "CLOSED"] == [], got
        # The lock is gone and the hub reconnects: the REQ sent after the kill completes.
        assert await next_for(carol, "new") == ["EOSE", "new"]
        new_id = await new_hub_connection(redis_client, relay.pid, old_id)
        assert new_id != old_id

        # The REQ whose stored read was cut short never gets EOSE: a later REQ's EOSE comes first and alone.
        await req(owner, "after", {"#h": [O_]})
        assert [m for m in owner.collected if m[1] == "stuck"] == []
        # Subscriptions made again get live events; the ended ones get nothing.
        await req(alice, "a", {"#h": [A], "kinds": [9]})
        await req(bob, "a-again", {"#h": [A]})
        in_b, in_a = chat(k["owner"], c["B"]), chat(k["owner"], c["A"])
        await send_ok(owner, in_b)
        await send_ok(owner, in_a)
        got = await read_until(carol, lambda ms: in_b["id"] in events_of(ms, "new"))
        assert events_of(got, "new") == [in_b["id"]]
        got = await read_until(alice, lambda ms: in_a["id"] in events_of(ms, "a"))
        assert events_of(got, "a") == [in_a["id"]] and events_of(got, "wide") == []
        got = await read_until(bob, lambda ms: in_a["id"] in events_of(ms, "a-again"))
        assert events_of(got, "a") == []
        assert events_of(got, "a-again") == [in_a["id"]]
    finally:
        await clients.aclose()


class RedisGate:
    """A TCP pass-through to Redis that can refuse new connections (existing ones keep working)."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self._url = parts
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.open = True
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        netloc = f"127.0.0.1:{port}"
        if self._url.username or self._url.password:
            netloc = self._url.netloc.rsplit("@", 1)[0] + "@" + netloc
        return urlunsplit(self._url._replace(netloc=netloc))

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(self._pipe(src, dst, (writer, up_writer)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, pair: tuple[asyncio.StreamWriter, ...]
    ) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            for w in pair:
                w.close()
                self._writers.discard(w)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)


@contextlib.asynccontextmanager
async def redis_gate() -> AsyncIterator[RedisGate]:
    gate = RedisGate(os.environ["REDIS_URL"])
    await gate.start()
    try:
        yield gate
    finally:
        await gate.aclose()


async def test_a_req_sent_while_the_hub_is_down_waits_for_it(
    world: World, relay_factory: Any, redis_client: redis.Redis
) -> None:
    k, c = world.keys, world.chans
    A, B = str(c["A"]), str(c["B"])
    async with redis_gate() as gate:
        relay = relay_factory(**RELAY_ENV, REDIS_URL=gate.url)
        clients = Clients(relay)
        try:
            alice = await clients(k["alice"])
            carol = await clients(k["carol"])
            owner = await clients(k["owner"])
            await req(alice, "a", {"#h": [A]})
            old_id = the_hub_connection(redis_client, relay.pid)

            gate.open = False
            assert redis_client.client_kill_filter(_id=str(old_id)) == 1
            closed = await next_for(alice, "a")
            assert closed[0] == "CLOSED" and closed[2].startswith(INTERRUPTED), closed
            await carol.send_json(["REQ", "new", {"#h": [B], "kinds": [9]}])
            # While the hub can't reconnect the REQ waits: no EOSE (and no CLOSED) for it.
            with pytest.raises(TimeoutError):
                early = await next_for(carol, "new", timeout=0.5)
                raise AssertionError(f"REQ answered while the hub was down: {early!r}")
            assert hub_connections(redis_client, relay.pid) == []

            gate.open = True
            assert await next_for(carol, "new") == ["EOSE", "new"]
            await new_hub_connection(redis_client, relay.pid, old_id)
            live = chat(k["owner"], c["B"])
            await send_ok(owner, live)
            got = await read_until(carol, lambda ms: live["id"] in events_of(ms, "new"))
            assert closed_of(got) == {}
            assert events_of(got, "new") == [live["id"]]
        finally:
            await clients.aclose()
