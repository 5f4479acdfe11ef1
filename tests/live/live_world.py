"""Helpers and the world shared by the live-delivery, hub-loss and multi-node tests.

The world: channels A, B open; P private (owner, alice, bob); Q private (owner only);
O open, to turn private (owner, alice); D open, to delete (owner, alice).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from buzz.live.hub import topic_for_channel
from buzz.models import Community
from buzz.nostr import Signer
from tests.support import factories
from tests.support.factories import make_channel, make_community
from tests.support.relay import relay_database_url
from tests.support.wire import logged_in
from tests.support.wsclient import RelayClient

HOST = "live.test"
READ_TIMEOUT = 15.0

# Relays in this module: no write quota, so posting many messages is not rate-limited.
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}


# --- helpers ---------------------------------------------------------------------------


def sign(
    signer: Signer,
    kind: int,
    tags: list[list[str]],
    *,
    content: str | None = None,
    created_at: int | None = None,
) -> dict[str, Any]:
    return factories.signed(signer, kind, tags, content, created_at)


def chat(signer: Signer, channel: uuid.UUID, *extra: list[str], created_at: int | None = None) -> dict[str, Any]:
    return factories.message(signer, channel, extra=extra, created_at=created_at)


async def send_ok(client: RelayClient, event: dict[str, Any], *, accepted: bool = True) -> list[Any]:
    await client.send_json(["EVENT", event])
    reply = await client.expect("OK", READ_TIMEOUT, where=lambda m: m[1] == event["id"])
    assert reply[2] is accepted, reply
    return reply


async def req(client: RelayClient, sub: str, *filters: dict[str, Any]) -> list[dict[str, Any]]:
    """Open a REQ and read to its EOSE; the stored events before it. Fails on CLOSED."""
    await client.send_json(["REQ", sub, *filters])
    stored: list[dict[str, Any]] = []
    while True:
        m = await next_for(client, sub)
        if m[0] == "EVENT":
            stored.append(m[2])
        elif m[0] == "EOSE":
            return stored
        else:
            raise AssertionError(f"REQ {sub} answered {m!r} before EOSE")


async def req_refused(client: RelayClient, sub: str, *filters: dict[str, Any]) -> str:
    """Open a REQ that must be refused; the CLOSED reason."""
    await client.send_json(["REQ", sub, *filters])
    m = await next_for(client, sub)
    assert m[0] == "CLOSED", m
    return str(m[2])


async def read_until(
    client: RelayClient, done: Callable[[list[list[Any]]], bool], *, timeout: float = READ_TIMEOUT
) -> list[list[Any]]:
    """Read messages (the client's collected ones first) until done(all read so far)."""
    got: list[list[Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not done(got):
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(f"gave up after {timeout} s; read meanwhile: {got!r}")
        try:
            got.append(await client.recv_json(timeout=remaining))
        except TimeoutError:
            raise AssertionError(f"gave up after {timeout} s; read meanwhile: {got!r}") from None
    return got


def events_of(messages: Iterable[list[Any]], sub: str) -> list[str]:
    return [m[2]["id"] for m in messages if m[0] == "EVENT" and m[1] == sub]


def closed_of(messages: Iterable[list[Any]]) -> dict[str, str]:
    return {m[1]: m[2] for m in messages if m[0] == "CLOSED"}


async def next_for(client: RelayClient, sub: str, timeout: float = READ_TIMEOUT) -> list[Any]:
    """The next EVENT / EOSE / CLOSED for `sub`; other messages are kept for later reads."""
    for index, message in enumerate(client.collected):
        if message[0] in ("EVENT", "EOSE", "CLOSED") and message[1] == sub:
            return client.collected.pop(index)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise TimeoutError(f"nothing for {sub!r} within {timeout} s; got meanwhile: {client.collected!r}")
        try:
            message = await client._recv_raw(remaining)
        except TimeoutError:
            raise TimeoutError(f"nothing for {sub!r} within {timeout} s; got meanwhile: {client.collected!r}") from None
        if message[0] in ("EVENT", "EOSE", "CLOSED") and message[1] == sub:
            return list(message)
        client.collected.append(message)


def lock_waiters(table: str) -> int:
    """Backends of the test database waiting for a lock on `table` (pg_locks: pg_stat_activity's query
    text is cut at track_activity_query_size, so a long statement's table names may not be in it)."""
    with psycopg.connect(relay_database_url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE d.datname = current_database() AND l.relation = %s::regclass AND NOT l.granted"
            " AND l.pid <> pg_backend_pid()",
            [table],
        ).fetchone()
    assert row is not None
    return int(row[0])


async def wait_for_lock_waiters(table: str, n: int, timeout: float = READ_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while lock_waiters(table) < n:
        assert time.monotonic() < deadline, f"no query waited for the lock on {table}"
        await asyncio.sleep(0.05)


class TableLock:
    """ACCESS EXCLUSIVE on a table of the test database, held until release() (a rollback)."""

    def __init__(self, table: str) -> None:
        self._conn: psycopg.Connection[Any] | None = psycopg.connect(relay_database_url())
        self._conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.rollback()
            conn.close()


@contextlib.contextmanager
def table_locked(table: str) -> Iterator[TableLock]:
    lock = TableLock(table)
    try:
        yield lock
    finally:
        lock.release()


def publish_raw(client: Any, community_id: int, channel: uuid.UUID, message: dict[str, Any]) -> None:
    """PUBLISH a hub message on a channel's topic, the way the relay's publishers do."""
    wire = os.environ["BUZZ_REDIS_PREFIX"] + topic_for_channel(community_id, str(channel))
    client.publish(wire, json.dumps(message))


# --- the world -----------------------------------------------------------------------------


@dataclass
class World:
    community: Community
    keys: dict[str, Signer]
    chans: dict[str, uuid.UUID]


def build_world() -> World:
    """Channels: A, B open; P private (owner, alice, bob); Q private (owner only);
    O open, to turn private (owner, alice); D open, to delete (owner, alice)."""
    keys = {name: Signer.generate() for name in ("owner", "alice", "bob", "carol")}
    community = make_community(HOST, "Live", members=keys.values())
    chans: dict[str, uuid.UUID] = {}
    for name, visibility, members in (
        ("A", "open", ("alice", "bob")),
        ("B", "open", ()),
        ("P", "private", ("alice", "bob")),
        ("Q", "private", ()),
        ("O", "open", ("alice",)),
        ("D", "open", ("alice",)),
    ):
        chans[name] = make_channel(
            community, keys["owner"], name=f"chan-{name}", visibility=visibility, members=[keys[w] for w in members]
        )
    return World(community, keys, chans)


async def login(relay: Any, signer: Signer, **kwargs: Any) -> Any:
    """A NIP-42 connection: (its context manager, the client)."""
    client_cm = logged_in(relay, signer, host=HOST, **kwargs)
    return client_cm, await client_cm.__aenter__()


class Clients:
    """Authenticated connections, closed together at the end of a test."""

    def __init__(self, relay: Any) -> None:
        self.relay = relay
        self._open: list[Any] = []

    async def __call__(self, signer: Signer, **kwargs: Any) -> RelayClient:
        cm, client = await login(self.relay, signer, **kwargs)
        self._open.append(cm)
        return client

    async def aclose(self) -> None:
        for cm in reversed(self._open):
            await cm.__aexit__(None, None, None)
