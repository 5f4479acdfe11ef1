"""Every failure of the signed HTTP endpoints is JSON with an `error:` reason, never Django's HTML 500.

Each failure is forced for real against relay processes:
- a pool timeout: the relay's pool has one connection, held by a /query that waits on a table
  lock the test takes; every other request waits for the pool, gives up, and answers 503;
- a database failure: the relay's one pool backend is killed (pg_terminate_backend); the next
  request answers 503, and the one after it works again on a fresh connection;
- the budget: the access reads of /query and /count run inside the budgeted transaction, so a
  lock on a table only they read ends the request with the budget's 503 while the lock is held;
- a client that goes away: a read waiting on a lock is cancelled when its client closes the connection.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psutil
import psycopg
import pytest
from django.db import connection

from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.nostr import Signer
from tests.http.http_support import Answer, request
from tests.live.live_world import table_locked
from tests.support.factories import message, nip98
from tests.support.relay import RelayFactory, RelayProcess, with_database_name

HOST = "http-failures.test"


@pytest.fixture
def world(transactional_db: None) -> dict[str, Any]:
    w = Signer.generate()
    community = community_create(host=HOST, name="HTTP failures")
    member_add(community=community, pubkey=w.pubkey)
    cid = uuid.uuid4()
    channels.channel_create(community=community, channel_uuid=cid, name="main", creator=w.pubkey)
    return {"w": w, "channel": str(cid)}


@pytest.fixture
def admin_db() -> Iterator[psycopg.Connection[Any]]:
    """A connection of the test's own to the test database (locks, pg_stat_activity, kills)."""
    url = with_database_name(os.environ["DATABASE_URL"], str(connection.settings_dict["NAME"]))
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        yield conn


DB_UNAVAILABLE = "error: the database is unavailable, try again"


def endpoints(world: dict[str, Any]) -> list[tuple[str, str, bytes]]:
    """(method, path, body) of each signed endpoint family: the views, POST /events, the counters."""
    event = json.dumps(message(world["w"], world["channel"])).encode()
    return [
        ("POST", "/query", json.dumps([{"artifact": "current"}]).encode()),
        ("POST", "/count", json.dumps([{"artifact": "current"}]).encode()),
        ("POST", "/events", event),
        ("GET", "/api/unread", b""),
        ("GET", f"/api/channels/{world['channel']}/counts", b""),
    ]


async def call(relay: RelayProcess, world: dict[str, Any], method: str, path: str, body: bytes) -> Answer:
    return await request(relay, method, path, host=HOST, signer=world["w"], body=body)


def failure_reason(answer: Answer, path: str) -> str:
    """The `error:` reason of a JSON failure answer, in the shape of its endpoint."""
    assert answer.is_json, (path, answer.status, answer.body[:300])
    body = answer.json()
    reason = body["message"] if path == "/events" else body["error"]
    if path == "/events":
        assert body["accepted"] is False, body
    assert isinstance(reason, str) and reason.startswith("error: "), (path, body)
    return reason


def wait_for(predicate: Any, what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def waiting_on_lock(admin: psycopg.Connection[Any]) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return bool(row and row[0])


async def test_pool_timeout_is_a_json_503(
    world: dict[str, Any], relay_factory: RelayFactory, admin_db: psycopg.Connection[Any]
) -> None:
    relay = relay_factory(
        BUZZ_DB_POOL_MIN="1", BUZZ_DB_POOL_MAX="1", BUZZ_DB_POOL_TIMEOUT="0.5", BUZZ_QUERY_BUDGET_MS="120000"
    )
    calls = endpoints(world)
    for method, path, body in calls:  # each works while the pool is free
        answer = await call(relay, world, method, path, body if path != "/events" else b"")
        assert answer.status in (200, 400), (path, answer.status, answer.body)
    # The pool's one connection waits on this lock inside a /query, until the lock goes.
    admin_db.execute("BEGIN")
    admin_db.execute("LOCK TABLE artifacts_artifact IN ACCESS EXCLUSIVE MODE")
    holder = asyncio.create_task(call(relay, world, *calls[0]))
    try:
        await asyncio.to_thread(wait_for, lambda: waiting_on_lock(admin_db), "the /query to wait on the lock")
        for method, path, body in calls:
            answer = await call(relay, world, method, path, body)
            assert answer.status == 503, (path, answer.status, answer.body[:300])
            assert failure_reason(answer, path) == "error: the database is busy, try again"
    finally:
        admin_db.execute("ROLLBACK")
    held = await holder
    assert held.status == 200 and held.json() == [], held.body
    assert "Traceback" not in relay.log_text()


def pool_backends(admin: psycopg.Connection[Any], relay: RelayProcess) -> list[int]:
    """The backend pids of the relay's async pools (its Django ORM connection, which last read the
    community by Host, is left alone)."""
    ports = [
        c.laddr.port
        for c in psutil.Process(relay.pid).net_connections(kind="tcp")
        if c.raddr and c.status == psutil.CONN_ESTABLISHED
    ]
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND client_port = ANY(%s)"
        " AND backend_type = 'client backend' AND query NOT LIKE '%%buzz_community%%'",
        [ports],
    ).fetchall()
    return [r[0] for r in rows]


def backend_gone(admin: psycopg.Connection[Any], pid: int) -> bool:
    return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone() == (0,)


async def test_killed_backend_is_a_json_503_and_the_next_request_recovers(
    world: dict[str, Any], relay_factory: RelayFactory, admin_db: psycopg.Connection[Any]
) -> None:
    """A backend killed while it runs the request's query: JSON 503, and the next request works. A backend
    killed while idle is replaced by the pool's checkout check before anyone uses it: the request works."""
    relay = relay_factory(
        BUZZ_DB_POOL_MIN="1", BUZZ_DB_POOL_MAX="1", BUZZ_WRITE_POOL_MAX="1", BUZZ_WRITES_PER_SECOND="0"
    )
    for method, path, body in endpoints(world):
        warm = await call(relay, world, "POST", "/query", json.dumps([{"artifact": "current"}]).encode())
        assert warm.status == 200, warm.body
        # Idle: replaced unseen. At most one connection in each pool: the hot paths' and, once a write
        # opened it, the write statements'.
        pids = pool_backends(admin_db, relay)
        assert 1 <= len(pids) <= 2, pids
        for pid in pids:
            admin_db.execute("SELECT pg_terminate_backend(%s)", [pid])
            await asyncio.to_thread(wait_for, lambda pid=pid: backend_gone(admin_db, pid), "the kill")
        idle = await call(relay, world, method, path, body)
        assert idle.status == 200, (path, idle.status, idle.body[:300])
        # In flight: every endpoint reads memberships (the access policy); the read waits on a lock, and
        # its backend is killed while it waits.
        if path == "/events":
            body = json.dumps(message(world["w"], world["channel"])).encode()
        with table_locked("buzz_membership"):
            pending = asyncio.create_task(call(relay, world, method, path, body))
            await asyncio.to_thread(wait_for, lambda: waiting_on_lock(admin_db), "the request to wait on the lock")
            waiting = admin_db.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchall()
            admin_db.execute("SELECT pg_terminate_backend(%s)", [waiting[0][0]])
            answer = await pending
        assert answer.status == 503, (path, answer.status, answer.body[:300])
        # POST /events answers from the write pipeline, which says what it could not do.
        expected = "error: could not store the event, try again" if path == "/events" else DB_UNAVAILABLE
        assert failure_reason(answer, path) == expected
        if path == "/events":
            body = json.dumps(message(world["w"], world["channel"])).encode()
        again = await call(relay, world, method, path, body)
        assert again.status == 200, (path, again.status, again.body[:300])
    # The database failure is logged as an outage (buzz/failure_log.py: one traceback where it starts), not
    # once per request.
    assert relay.log_text().count("Traceback") <= 1, relay.log_text()


@pytest.mark.parametrize("path", ["/query", "/count"])
async def test_access_reads_are_inside_the_budget(
    path: str, world: dict[str, Any], relay_factory: RelayFactory, admin_db: psycopg.Connection[Any]
) -> None:
    relay = relay_factory(BUZZ_QUERY_BUDGET_MS="1000")
    body = json.dumps([{"artifact": "current"}]).encode()
    assert (await call(relay, world, "POST", path, body)).status == 200
    # Only the access reads (the reader's channel memberships) touch this table.
    admin_db.execute("BEGIN")
    admin_db.execute("LOCK TABLE buzz_membership IN ACCESS EXCLUSIVE MODE")
    try:
        # Answered while the lock is still held: the budget ended the access read, nothing waited it out.
        answer = await request(relay, "POST", path, host=HOST, signer=world["w"], body=body, timeout=20)
        assert answer.status == 503, (answer.status, answer.body)
        assert answer.json() == {"error": "error: the query exceeded its execution budget; narrow it and try again"}
    finally:
        admin_db.execute("ROLLBACK")
    assert (await call(relay, world, "POST", path, body)).status == 200


@pytest.mark.parametrize("path", ["/query", "/count"])
async def test_a_read_whose_client_goes_away_is_cancelled(
    path: str, world: dict[str, Any], relay_factory: RelayFactory, admin_db: psycopg.Connection[Any]
) -> None:
    """The front cancels a view whose client disconnects (buzz.web.front, once the view has run a while): a read
    waiting on a lock, whose client then closes its connection, stops waiting while the lock is still held and
    its budgets are two minutes off, and the relay answers the next request."""
    relay = relay_factory(BUZZ_QUERY_BUDGET_MS="120000", BUZZ_READ_STATEMENT_BUDGET_MS="120000")
    body = json.dumps([{"artifact": "current"}]).encode()
    assert (await call(relay, world, "POST", path, body)).status == 200
    admin_db.execute("BEGIN")
    admin_db.execute("LOCK TABLE artifacts_artifact IN ACCESS EXCLUSIVE MODE")
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: {nip98(world['w'], HOST, 'POST', path, body)}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection((relay.host, relay.port), timeout=10) as client:
            client.sendall(head.encode() + body)
            await asyncio.to_thread(wait_for, lambda: waiting_on_lock(admin_db), "the read to wait on the lock")
        await asyncio.to_thread(wait_for, lambda: not waiting_on_lock(admin_db), "the read to be cancelled")
    finally:
        admin_db.execute("ROLLBACK")
    assert (await call(relay, world, "POST", path, body)).status == 200
    assert "Traceback" not in relay.log_text()
