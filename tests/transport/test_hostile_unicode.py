"""Lone surrogates in frames get typed replies, and a crashed connection releases its subscriptions.

JSON can spell a lone surrogate ("\\ud800"), which Python decodes but no UTF-8 text frame can
carry back. Each such frame gets a NOTICE, CLOSED or OK false that echoes the id \\u-escaped, and
the connection stays up. Whatever else crashes a connection's handler, its subscriptions leave the
hub: counted as the Redis topics the relay still subscribes after 200 crashed connections.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from websockets.exceptions import ConnectionClosed

from buzz.live.hub import topic_for_community
from buzz.live.signals import channel_topic
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, signers
from tests.support.relay import RelayProcess
from tests.support.wsclient import RelayClient, naming
from tests.transport.crashing_relay import CRASH

HOST = "unicode.test"
CONNECTIONS = 200


@dataclass
class World:
    signer: Signer
    community_id: int
    channels: list[uuid.UUID]


def _world(n_channels: int) -> World:
    (signer,) = signers(1)
    community = make_community(HOST, "Unicode", members=[signer])
    channels = [make_channel(community, signer, name=f"c{i}") for i in range(n_channels)]
    return World(signer, community.pk, channels)


@pytest.fixture
def world(transactional_db: None) -> World:
    return _world(1)


@pytest.fixture
def crowd(transactional_db: None) -> World:
    return _world(CONNECTIONS)


def subscribed_topics(redis_client: redis.Redis, community_id: int) -> list[str]:
    """The community's topics some relay process subscribes to in Redis (the hub's live interest)."""
    pattern = f"{os.environ['BUZZ_REDIS_PREFIX']}{topic_for_community(community_id)}*"
    return sorted(t.decode() if isinstance(t, bytes) else t for t in redis_client.pubsub_channels(pattern))


def wire(topic: str) -> str:
    return os.environ["BUZZ_REDIS_PREFIX"] + topic


async def send_raw(client: RelayClient, frame: list[Any]) -> None:
    # ensure_ascii: the frame spells the surrogate as a JSON escape, as a hostile client would.
    await client.ws.send(json.dumps(frame))


async def test_lone_surrogates_get_typed_replies_and_the_connection_stays_up(
    world: World, relay_factory: Any, redis_client: redis.Redis
) -> None:
    relay = relay_factory()
    channel = str(world.channels[0])
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        client.challenge = str((await client.expect("AUTH"))[1])
        await send_raw(client, ["EVENT", {"id": "\ud800"}])  # before AUTH
        ok = await client.expect("OK")
        assert ok[1] == "\ud800" and ok[2] is False and ok[3].startswith("auth-required:"), ok
        await send_raw(client, ["REQ", "\ud800", {}])  # before AUTH
        closed = await client.expect("CLOSED", where=naming("\ud800"))
        assert closed[2].startswith("invalid:"), closed
        assert (await client.auth(world.signer))[2] is True
        await send_raw(client, ["COUNT", "\udfff", {"kinds": [9], "#h": [channel]}])
        closed = await client.expect("CLOSED", where=naming("\udfff"))
        assert closed[2].startswith("invalid:"), closed
        await send_raw(client, ["REQ", "a\udc80b", {"kinds": [9], "#h": [channel]}])
        closed = await client.expect("CLOSED", where=naming("a\udc80b"))
        assert closed[2].startswith("invalid:"), closed
        await send_raw(client, ["EVENT", {"id": "\ud800"}])
        ok = await client.expect("OK")
        assert ok[1] == "\ud800" and ok[2] is False and ok[3].startswith("invalid:"), ok
        await send_raw(client, ["CLOSE", "\ud800"])
        notice = await client.expect("CLOSED", where=naming("\ud800"))
        assert notice[2].startswith("invalid:"), notice
        # Still up, and only a healthy subscription holds a topic.
        await client.send_json(["REQ", "fine", {"kinds": [9], "#h": [channel]}])
        await client.expect("EOSE", where=naming("fine"))
        topics = subscribed_topics(redis_client, world.community_id)
        assert wire(channel_topic(world.community_id, channel)) in topics
        await client.send_json(["COUNT", "n", {"kinds": [9], "#h": [channel]}])
        assert (await client.expect("COUNT", where=naming("n")))[2] == {"count": 0}
    assert "Traceback" not in relay.log_text()


async def _crash_one(relay: RelayProcess, signer: Signer, channel: uuid.UUID) -> int | None:
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(signer))[2] is True
        await client.send_json(["REQ", "s", {"kinds": [9], "#h": [str(channel)]}])
        await client.expect("EOSE", where=naming("s"))
        await client.ws.send(CRASH)
        try:
            while True:
                await asyncio.wait_for(client.ws.recv(), 10)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd is not None else None


async def test_200_crashed_connections_leave_no_subscription_in_the_hub(
    crowd: World, redis_client: redis.Redis
) -> None:
    with RelayProcess(app="tests.transport.crashing_relay:application") as relay:
        # While a connection is open its channel's topic is subscribed: the count below can see a leak.
        async with RelayClient.connect(relay.ws_url, host=HOST) as client:
            assert (await client.auth(crowd.signer))[2] is True
            await client.send_json(["REQ", "s", {"kinds": [9], "#h": [str(crowd.channels[0])]}])
            await client.expect("EOSE", where=naming("s"))
            assert wire(channel_topic(crowd.community_id, crowd.channels[0])) in subscribed_topics(
                redis_client, crowd.community_id
            )
        codes: list[int | None] = []
        for start in range(0, CONNECTIONS, 20):
            batch = crowd.channels[start : start + 20]
            codes += await asyncio.gather(*(_crash_one(relay, crowd.signer, ch) for ch in batch))
        assert codes == [1011] * CONNECTIONS  # each crash ends its connection with a close frame
        deadline = asyncio.get_running_loop().time() + 10
        while (left := subscribed_topics(redis_client, crowd.community_id)) and (
            asyncio.get_running_loop().time() < deadline
        ):
            await asyncio.sleep(0.1)
        assert left == []
        log = relay.log_text()
        assert log.count("RuntimeError: injected crash in the frame handler") == CONNECTIONS
