"""A PostgreSQL backend that dies does not break new clients (issue 9, item 12).

The relay holds database connections in two places: the ORM's, one per executor thread
that runs the Host -> community lookup and the NIP-29 services, and the async pool of the
hot paths. Here every backend of a real relay process is terminated (pg_terminate_backend,
i.e. SIGTERM to each backend, as an operator or a failover would) while the relay is idle.
Afterwards a new HTTP request and a new WebSocket upgrade, each for a Host the relay has
not looked up yet (so the lookup really reads the database), must succeed, and so must the
pool's reads behind AUTH and REQ. Before the fix the lookup answered 500 until a restart.
"""

from __future__ import annotations

import asyncio
import http.client
import secrets
import uuid
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async

from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.nostr import Signer
from tests.support.relay import RelayProcess, relay_database_url
from tests.support.wsclient import RelayClient

ROUNDS = 2  # kill, recover, and kill again: recovery leaves nothing broken behind


def hosts() -> list[str]:
    return [f"backend-loss-{i}.test" for i in range(2 * ROUNDS + 1)]


@pytest.fixture
def alice(transactional_db: None) -> Signer:
    signer = Signer.generate()
    for host in hosts():
        community = community_create(host=host, name=host)
        member_add(community=community, pubkey=signer.pubkey)
        channels.channel_create(community=community, channel_uuid=uuid.uuid4(), name="general", creator=signer.pubkey)
    return signer


def _get(relay: RelayProcess, host: str) -> int:
    conn = http.client.HTTPConnection(relay.host, relay.port, timeout=30)
    try:
        conn.request("GET", "/", headers={"Host": host, "Accept": "application/nostr+json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


async def get_status(relay: RelayProcess, host: str) -> int:
    return await asyncio.to_thread(_get, relay, host)


async def ws_session(relay: RelayProcess, host: str, signer: Signer) -> None:
    """Upgrade, AUTH (a relay-membership read on the pool), and a REQ (access and stored reads) to EOSE."""
    async with RelayClient.connect(relay.ws_url, host=host) as client:
        ok = await client.auth(signer)
        assert ok[2] is True, ok
        await client.send_json(["REQ", "s", {"kinds": [9]}])
        assert await client.expect("EOSE", where=lambda m: m[1] == "s") == ["EOSE", "s"]


def terminate_backends(application_name: str) -> int:
    """SIGTERM every backend of the relay (by its application_name); wait until each has exited."""
    with psycopg.connect(relay_database_url(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            [application_name],
        ).fetchall()
    assert all(r[0] for r in rows), rows
    return len(rows)


async def test_new_http_requests_and_upgrades_succeed_after_backends_die(alice: Signer, relay_factory: Any) -> None:
    name = f"buzz-backend-loss-{secrets.token_hex(4)}"
    # libpq reads PGAPPNAME for every connection the relay opens, ORM and pool alike.
    relay = relay_factory(PGAPPNAME=name)
    first, *rest = hosts()
    # Warm up both kinds of connection: the lookup's executor thread and the pool.
    assert await get_status(relay, first) == 200
    await ws_session(relay, first, alice)
    for round_ in range(ROUNDS):
        killed = await sync_to_async(terminate_backends)(name)
        assert killed >= 2, f"round {round_}: expected the relay's ORM and pool backends, found {killed}"
        http_host, ws_host = rest[2 * round_], rest[2 * round_ + 1]
        assert await get_status(relay, http_host) == 200, relay.log_text()[-3000:]
        await ws_session(relay, ws_host, alice)
        # And the host looked up before the kill still answers (cached or read again).
        assert await get_status(relay, first) == 200


async def test_a_bearer_token_the_database_cannot_check_is_try_again_not_a_refusal(
    transactional_db: None, relay_factory: Any
) -> None:
    """A token refused before the upgrade is a bare 403, which a client takes for a bad token. When the lookup
    itself fails, the upgrade is accepted and closed at once with 1013 (try again later) and an error: reason."""
    from websockets.exceptions import ConnectionClosed

    from buzz.identity.tokens import token_create
    from tests.support.relay import limited_role, set_select

    signer = Signer.generate()
    community = await sync_to_async(community_create)(host="token-lookup.test", name="token lookup")
    await sync_to_async(member_add)(community=community, pubkey=signer.pubkey)
    issued = await sync_to_async(token_create)(community=community, pubkey=signer.pubkey, scopes=["messages:read"])
    bearer = RelayClient.bearer(issued.token)
    with limited_role() as (url, role):
        relay = relay_factory(DATABASE_URL=url)
        async with RelayClient.connect(relay.ws_url, host="token-lookup.test", authorization=bearer) as client:
            await client.send_json(["REQ", "s", {"kinds": [9]}])
            assert await client.expect("EOSE", where=lambda m: m[1] == "s") == ["EOSE", "s"]
        set_select(role, "buzz_apitoken", allowed=False)
        async with RelayClient.connect(relay.ws_url, host="token-lookup.test", authorization=bearer) as client:
            with pytest.raises(ConnectionClosed) as closed:
                await client.recv_json(timeout=10)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
            1013,
            "error: could not check the token, try again",
        )
        set_select(role, "buzz_apitoken", allowed=True)
        async with RelayClient.connect(relay.ws_url, host="token-lookup.test", authorization=bearer) as client:
            await client.send_json(["REQ", "s", {"kinds": [9]}])
            assert await client.expect("EOSE", where=lambda m: m[1] == "s") == ["EOSE", "s"]
