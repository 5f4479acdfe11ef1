"""Helpers for the moderation tests: a community with every role a 9005 rule names, signed HTTP views,
and sync/REQ readers on a relay. Not a test module."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from artifacts.census import count_open_syncs
from buzz.chat.bans import ban_add
from buzz.models import Community
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, signed
from tests.support.relay import RelayProcess
from tests.support.wire import http, publish
from tests.support.wsclient import RelayClient

RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}
CENSUS_SETTLE = 10.0  # seconds the relays' census may take to publish a sync that just opened (about 1 s)


async def open_syncs_counted(community: Community, channels: list[uuid.UUID], expected: int) -> None:
    """Wait (bounded) until the census counts `expected` open syncs over `channels`, as the admin will."""
    deadline = time.monotonic() + CENSUS_SETTLE
    while (seen := await asyncio.to_thread(count_open_syncs, community.pk, channels)) != expected:
        assert time.monotonic() < deadline, f"{seen} open syncs counted, expected {expected}"
        await asyncio.sleep(0.1)


@dataclass
class World:
    host: str
    community: Community
    owner: Signer  # owner of `ch` and `other`
    admin: Signer  # channel admin of `ch`
    author: Signer  # member of `ch`, writes the artifacts
    member: Signer  # member of `ch`, not the author
    nonmember: Signer  # relay member, not in `ch`
    banned: Signer  # member of `ch`, banned from the community
    ch: uuid.UUID  # a private channel
    other: uuid.UUID  # a second private channel, same people


def make_world(host: str) -> World:
    owner, admin, author, member, nonmember, banned = (Signer.generate() for _ in range(6))
    community = make_community(host, members=[owner, admin, author, member, nonmember, banned])
    ch = make_channel(community, owner, visibility="private", admins=[admin], members=[author, member, banned])
    other = make_channel(community, owner, visibility="private", admins=[admin], members=[author, member, banned])
    return World(host, community, owner, admin, author, member, nonmember, banned, ch, other)


def ban(world: World, signer: Signer) -> None:
    ban_add(community=world.community, pubkey=signer.pubkey, reason="test")


async def aban(world: World, signer: Signer) -> None:
    await sync_to_async(ban, thread_sensitive=False)(world, signer)


def removal(signer: Signer, channel: uuid.UUID, target: str, reason: str = "") -> dict[str, Any]:
    """A NIP-29 kind-9005 naming `target` in `channel`."""
    return signed(signer, 9005, [["h", str(channel)], ["e", target]], reason)


async def view(relay: RelayProcess, world: World, signer: Signer, flt: dict[str, Any]) -> list[str]:
    """POST /query with one NIP-AR filter: the event ids of the page."""
    status, body = await http(relay, "POST", "/query", host=world.host, signer=signer, body=json.dumps([flt]).encode())
    assert status == 200, (status, body)
    return [e["id"] for e in body]


async def count(relay: RelayProcess, world: World, signer: Signer, flt: dict[str, Any]) -> int:
    status, body = await http(relay, "POST", "/count", host=world.host, signer=signer, body=json.dumps([flt]).encode())
    assert status == 200, (status, body)
    return int(body["count"])


async def mentions(relay: RelayProcess, world: World, signer: Signer) -> list[str]:
    status, body = await http(relay, "GET", "/api/mentions", host=world.host, signer=signer)
    assert status == 200, (status, body)
    return [m["event_id"] for m in body["mentions"]]


async def ok(client: RelayClient, event: dict[str, Any]) -> tuple[bool, str]:
    reply = await publish(client, event, timeout=15.0)
    return bool(reply[2]), str(reply[3])


async def replay(client: RelayClient, sub: str, flt: dict[str, Any]) -> list[str]:
    """A generic NIP-01 REQ to EOSE: the stored event ids."""
    await client.send_json(["REQ", sub, flt])
    out: list[str] = []
    while True:
        m = await client.recv_json(15.0)
        if m[0] == "EVENT" and m[1] == sub:
            out.append(m[2]["id"])
        elif m[0] in ("EOSE", "CLOSED") and m[1] == sub:
            assert m[0] == "EOSE", m
            await client.send_json(["CLOSE", sub])
            return out


async def closed(client: RelayClient, sub: str, timeout: float = 15.0) -> str:
    """Read until the CLOSED of `sub`: its reason (EVENTs of other subscriptions are skipped)."""
    m = await client.expect("CLOSED", timeout, where=lambda m: len(m) > 1 and m[1] == sub)
    return str(m[2])


async def ws_count(client: RelayClient, flt: dict[str, Any]) -> int:
    """NIP-45 COUNT over the WebSocket."""
    sub = "count-" + uuid.uuid4().hex[:8]
    await client.send_json(["COUNT", sub, flt])
    m = await client.expect("COUNT", 15.0, where=lambda m: len(m) > 2 and m[1] == sub)
    return int(m[2]["count"])
