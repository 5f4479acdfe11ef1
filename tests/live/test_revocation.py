"""Revocation reaches open connections at once, on every node (issue 9, item 9).

Two relay processes on one PostgreSQL and one Redis. A pubkey has subscriptions on
both: on an open channel it reads without being a member, on a private channel it is
a member of, and one without #h. Then, from the operator's side:

* a ban ends every one of its subscriptions with CLOSED "blocked: ...", the open
  channel included (before, only channels the pubkey was a member of were told);
* removal from the relay members (`manage.py community remove-member`) ends them with
  CLOSED "restricted: not a relay member" (before, nothing: only AUTH checked it);
* revoking a token ends the subscriptions of the connections authenticated by that
  token, with CLOSED "auth-required: ...", and leaves the pubkey's other connections
  alone; a token's expiry does the same at the expiry instant, with nothing sent.

Later frames of the connection get the same refusal, and other readers of the same
channels keep receiving. Absence is asserted without sleeping: a node delivers in
publish order, so a message wrongly delivered would arrive before a later sentinel.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import io
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command

from buzz.chat import bans, channels
from buzz.identity.communities import community_create, member_add
from buzz.identity.tokens import token_create, token_revoke
from buzz.models import Community
from buzz.nostr import Signer
from tests.support.relay import RelayProcess, relay_database_url
from tests.support.wsclient import RelayClient

HOST = "revoke.test"
READ_TIMEOUT = 20.0
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}

BANNED = "blocked: this pubkey is banned from the community"
NOT_ADMITTED = "restricted: not a relay member"
TOKEN_INVALID = "auth-required: this token is revoked or expired"


# --- the world -----------------------------------------------------------------------------


@dataclass
class World:
    community: Community
    owner: Signer
    alice: Signer  # the one whose access goes
    bob: Signer  # reads the same channels and keeps reading
    open_channel: uuid.UUID  # open; alice is not a member, bob is
    private: uuid.UUID  # private; alice and bob are members


@pytest.fixture
def world(transactional_db: None) -> World:
    community = community_create(host=HOST, name="Revoke")
    owner, alice, bob = Signer.generate(), Signer.generate(), Signer.generate()
    for signer in (owner, alice, bob):
        member_add(community=community, pubkey=signer.pubkey)
    open_channel, private = uuid.uuid4(), uuid.uuid4()
    channels.channel_create(community=community, channel_uuid=open_channel, name="open", creator=owner.pubkey)
    channels.member_put(community=community, channel_uuid=open_channel, actor=None, pubkey=bob.pubkey)
    channels.channel_create(
        community=community, channel_uuid=private, name="private", creator=owner.pubkey, visibility="private"
    )
    for signer in (alice, bob):
        channels.member_put(community=community, channel_uuid=private, actor=None, pubkey=signer.pubkey)
    return World(community, owner, alice, bob, open_channel, private)


# --- helpers -------------------------------------------------------------------------------


def chat(signer: Signer, channel: uuid.UUID) -> dict[str, Any]:
    return signer.sign_event(
        kind=9, tags=[["h", str(channel)]], content=secrets.token_hex(8), created_at=int(time.time())
    ).to_dict()


@contextlib.asynccontextmanager
async def nip42(relay: RelayProcess, signer: Signer) -> AsyncIterator[RelayClient]:
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        ok = await client.auth(signer)
        assert ok[2] is True, ok
        yield client


@contextlib.asynccontextmanager
async def by_token(relay: RelayProcess, token: str) -> AsyncIterator[RelayClient]:
    async with RelayClient.connect(relay.ws_url, host=HOST, authorization=RelayClient.bearer(token)) as client:
        yield client


async def _next_for(client: RelayClient, sub: str) -> list[Any]:
    """The next EVENT / EOSE / CLOSED for `sub`; other messages stay collected."""
    for index, message in enumerate(client.collected):
        if message[0] in ("EVENT", "EOSE", "CLOSED") and message[1] == sub:
            return client.collected.pop(index)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READ_TIMEOUT
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(f"nothing for {sub!r} within {READ_TIMEOUT} s; got meanwhile: {client.collected!r}")
        try:
            message = await client._recv_raw(remaining)  # not recv_json: it would hand back `collected`
        except TimeoutError:
            raise AssertionError(f"nothing for {sub!r} within {READ_TIMEOUT} s; got: {client.collected!r}") from None
        if message[0] in ("EVENT", "EOSE", "CLOSED") and message[1] == sub:
            return list(message)
        client.collected.append(message)


async def req(client: RelayClient, sub: str, flt: dict[str, Any]) -> None:
    """Open a REQ and read to its EOSE; fails on CLOSED."""
    await client.send_json(["REQ", sub, flt])
    while True:
        m = await _next_for(client, sub)
        if m[0] == "EOSE":
            return
        assert m[0] == "EVENT", f"REQ {sub} answered {m!r} before EOSE"


async def closed_reasons(client: RelayClient, subs: set[str]) -> dict[str, str]:
    """Read until each of `subs` is CLOSED; fails if one of them gets an EVENT first."""
    reasons: dict[str, str] = {}
    for sub in sorted(subs):
        m = await _next_for(client, sub)
        assert m[0] == "CLOSED", f"{sub} got {m!r} where CLOSED was due"
        reasons[sub] = m[2]
    return reasons


async def send(client: RelayClient, event: dict[str, Any]) -> list[Any]:
    await client.send_json(["EVENT", event])
    return await client.expect("OK", READ_TIMEOUT, where=lambda m: m[1] == event["id"])


async def posted(client: RelayClient, event: dict[str, Any]) -> str:
    reply = await send(client, event)
    assert reply[2] is True, reply
    return str(event["id"])


async def receives(client: RelayClient, sub: str, event_id: str) -> None:
    m = await _next_for(client, sub)
    assert m[0] == "EVENT" and m[2]["id"] == event_id, m


async def refused_frames(client: RelayClient, signer: Signer, w: World, reason: str) -> None:
    """Every later frame of the connection gets `reason`: a post, a REQ (with and without #h), a COUNT."""
    reply = await send(client, chat(signer, w.open_channel))
    assert reply[2:] == [False, reason], reply
    for sub, flt in (("later-h", {"#h": [str(w.open_channel)]}), ("later-wide", {"kinds": [9]})):
        await client.send_json(["REQ", sub, flt])
        assert await _next_for(client, sub) == ["CLOSED", sub, reason]
    await client.send_json(["COUNT", "later-count", {"#h": [str(w.private)]}])
    assert await client.expect("CLOSED", READ_TIMEOUT, where=lambda m: m[1] == "later-count") == [
        "CLOSED",
        "later-count",
        reason,
    ]


SUBS: dict[str, Callable[[World], dict[str, Any]]] = {
    "open": lambda w: {"#h": [str(w.open_channel)], "kinds": [9]},  # alice reads it without membership
    "private": lambda w: {"#h": [str(w.private)], "kinds": [9]},
    "wide": lambda w: {"kinds": [9]},
}


async def open_subs(client: RelayClient, w: World) -> set[str]:
    for sub, flt in SUBS.items():
        await req(client, sub, flt(w))
    return set(SUBS)


def two_nodes(relay_factory: Any) -> tuple[RelayProcess, RelayProcess]:
    a, b = relay_factory(**RELAY_ENV), relay_factory(**RELAY_ENV)
    assert a.pid != b.pid
    return a, b


def command(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


# --- tests ---------------------------------------------------------------------------------


async def test_ban_ends_every_subscription_of_the_pubkey_on_every_node(world: World, relay_factory: Any) -> None:
    w = world
    node_a, node_b = two_nodes(relay_factory)
    async with (
        nip42(node_a, w.alice) as alice_a,
        nip42(node_b, w.alice) as alice_b,
        nip42(node_b, w.bob) as bob_b,
        nip42(node_a, w.owner) as owner_a,
    ):
        subs_a, subs_b = await open_subs(alice_a, w), await open_subs(alice_b, w)
        await req(bob_b, "open", SUBS["open"](w))

        await sync_to_async(bans.ban_add)(community=w.community, pubkey=w.alice.pubkey, reason="test")

        for client, subs in ((alice_a, subs_a), (alice_b, subs_b)):
            assert await closed_reasons(client, subs) == dict.fromkeys(subs, BANNED)
        # Posted after the ban: bob gets it, alice's connections have no subscription left to get it on.
        after = await posted(owner_a, chat(w.owner, w.open_channel))
        await receives(bob_b, "open", after)
        for client in (alice_a, alice_b):
            await refused_frames(client, w.alice, w, BANNED)
            assert not [m for m in client.collected if m[0] == "EVENT"], client.collected


async def test_relay_member_removal_ends_its_subscriptions_and_refuses_its_later_frames(
    world: World, relay_factory: Any
) -> None:
    w = world
    node_a, node_b = two_nodes(relay_factory)
    async with (
        nip42(node_a, w.alice) as alice_a,
        nip42(node_b, w.alice) as alice_b,
        nip42(node_b, w.bob) as bob_b,
        nip42(node_a, w.owner) as owner_a,
    ):
        subs_a, subs_b = await open_subs(alice_a, w), await open_subs(alice_b, w)
        await req(bob_b, "private", SUBS["private"](w))

        out = await sync_to_async(command)("community", "remove-member", "--host", HOST, w.alice.pubkey)
        assert out == f"removed {w.alice.pubkey} from {HOST}\n"

        for client, subs in ((alice_a, subs_a), (alice_b, subs_b)):
            assert await closed_reasons(client, subs) == dict.fromkeys(subs, NOT_ADMITTED)
        after = await posted(owner_a, chat(w.owner, w.private))
        await receives(bob_b, "private", after)
        for client in (alice_a, alice_b):
            await refused_frames(client, w.alice, w, NOT_ADMITTED)
            assert not [m for m in client.collected if m[0] == "EVENT"], client.collected
        # A new login is refused too, on either node.
        async with RelayClient.connect(node_b.ws_url, host=HOST) as again:
            assert (await again.auth(w.alice))[2:] == [False, NOT_ADMITTED]


async def test_token_revocation_ends_only_that_tokens_subscriptions_on_every_node(
    world: World, relay_factory: Any
) -> None:
    w = world
    node_a, node_b = two_nodes(relay_factory)
    scopes = ["messages:read", "messages:write"]
    revoked = await sync_to_async(token_create)(community=w.community, pubkey=w.alice.pubkey, scopes=scopes)
    kept = await sync_to_async(token_create)(community=w.community, pubkey=w.alice.pubkey, scopes=scopes)
    async with (
        by_token(node_a, revoked.token) as gone_a,
        by_token(node_b, revoked.token) as gone_b,
        by_token(node_b, kept.token) as kept_b,
        nip42(node_a, w.alice) as login_a,
        nip42(node_a, w.owner) as owner_a,
    ):
        subs = {c: await open_subs(c, w) for c in (gone_a, gone_b, kept_b, login_a)}

        await sync_to_async(token_revoke)(token_id=revoked.row.pk)

        for client in (gone_a, gone_b):
            assert await closed_reasons(client, subs[client]) == dict.fromkeys(subs[client], TOKEN_INVALID)
        # The same pubkey's other token and its NIP-42 login are untouched: they get a later message.
        after = await posted(owner_a, chat(w.owner, w.private))
        for client in (kept_b, login_a):
            for sub in ("private", "wide"):
                await receives(client, sub, after)
        for client in (gone_a, gone_b):
            await refused_frames(client, w.alice, w, TOKEN_INVALID)
            assert not [m for m in client.collected if m[0] == "EVENT"], client.collected


def _expired_by_database_clock(token_id: int) -> bool:
    with psycopg.connect(relay_database_url(), autocommit=True) as conn:
        row = conn.execute("SELECT expires_at <= now() FROM buzz_apitoken WHERE id = %s", [token_id]).fetchone()
    assert row is not None
    return bool(row[0])


async def test_token_expiry_ends_its_subscriptions_at_the_expiry_instant(world: World, relay_factory: Any) -> None:
    w = world
    relay = relay_factory(**RELAY_ENV)
    scopes = ["messages:read", "messages:write"]
    # Long enough to log in and open the subscriptions on a loaded machine; nothing is sent at expiry.
    issued = await sync_to_async(token_create)(
        community=w.community, pubkey=w.alice.pubkey, scopes=scopes, expires_in=dt.timedelta(seconds=10)
    )
    async with by_token(relay, issued.token) as client, nip42(relay, w.alice) as login:
        subs = await open_subs(client, w)
        await req(login, "private", SUBS["private"](w))
        assert not await sync_to_async(_expired_by_database_clock)(issued.row.pk)

        # Nothing happens on the relay's side but time passing.
        assert await closed_reasons(client, subs) == dict.fromkeys(subs, TOKEN_INVALID)
        assert await sync_to_async(_expired_by_database_clock)(issued.row.pk)
        await refused_frames(client, w.alice, w, TOKEN_INVALID)
        # The NIP-42 login of the same pubkey holds no token and keeps its subscription.
        async with nip42(relay, w.owner) as owner:
            after = await posted(owner, chat(w.owner, w.private))
        await receives(login, "private", after)
