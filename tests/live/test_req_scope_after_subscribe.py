"""An ordinary REQ decides its channels again once its live interest is confirmed.

A REQ's channels were decided when it arrived, and its SUBSCRIBE confirmed after: an access change that
committed in between was signalled before the subscription listened, and the REQ went on reading the
channel (stored events, then every live one) until the connection ended. Here the SUBSCRIBE is held back
(Redis paused) while the reader is removed from the channel, and the removal's signal is withheld
altogether: the REQ must end with CLOSED "restricted: ..." and send nothing of the channel.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async

from buzz.chat import channels
from buzz.live import signals
from tests.artifacts.write_support import accepted, message
from tests.support.wsclient import RelayClient
from tests.sync.support import RELAY_ENV, World, make_world

HOST = "req-rescope.test"
PAUSE_MS = 1200  # under the hub's 2 s PING timeout


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


async def test_a_removal_between_the_reqs_decision_and_its_subscribe_counts(
    world: World, relay_factory: Any, redis_flush: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with (
        RelayClient.connect(relay.ws_url, host=HOST) as owner,
        RelayClient.connect(relay.ws_url, host=HOST) as reader,
    ):
        assert (await owner.auth(world.owner))[2] is True and (await reader.auth(world.reader))[2] is True
        await accepted(owner, message(world.owner, world.a, content="before"))

        redis_client.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
        await reader.send_json(["REQ", "r", {"#h": [str(world.a)], "kinds": [9]}])
        await asyncio.sleep(0.3)  # the REQ's channels are decided; its SUBSCRIBE waits for Redis

        def remove() -> None:
            with monkeypatch.context() as patch:
                patch.setattr(signals, "publish_on_commit", lambda *args, **kw: None)
                channels.member_remove(
                    community=world.community, channel_uuid=world.a, actor=None, pubkey=world.reader.pubkey
                )

        await sync_to_async(remove)()
        await asyncio.sleep(PAUSE_MS / 1000)  # Redis answers again: the SUBSCRIBE is confirmed
        await accepted(owner, message(world.owner, world.a, content="after"))

        while True:
            first = await reader.recv_json(15)
            if isinstance(first, list) and len(first) > 1 and first[1] == "r":
                break
        assert first[0] == "CLOSED" and first[2].startswith("restricted:"), first


async def test_a_wide_req_drops_a_channel_lost_before_its_subscribe_and_keeps_the_others(
    world: World, relay_factory: Any, redis_flush: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with (
        RelayClient.connect(relay.ws_url, host=HOST) as owner,
        RelayClient.connect(relay.ws_url, host=HOST) as reader,
    ):
        assert (await owner.auth(world.owner))[2] is True and (await reader.auth(world.reader))[2] is True
        lost = await accepted(owner, message(world.owner, world.a, content="in a"))
        kept = await accepted(owner, message(world.owner, world.b, content="in b"))

        redis_client.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
        await reader.send_json(["REQ", "w", {"kinds": [9]}])  # every channel the reader reads: a and b
        await asyncio.sleep(0.3)

        def remove() -> None:
            with monkeypatch.context() as patch:
                patch.setattr(signals, "publish_on_commit", lambda *args, **kw: None)
                channels.member_remove(
                    community=world.community, channel_uuid=world.a, actor=None, pubkey=world.reader.pubkey
                )

        await sync_to_async(remove)()
        await asyncio.sleep(PAUSE_MS / 1000)
        stored: list[str] = []
        while True:
            m = await reader.recv_json(15)
            if isinstance(m, list) and len(m) > 1 and m[1] == "w":
                if m[0] != "EVENT":
                    break
                stored.append(m[2]["id"])
        assert m[0] == "EOSE" and stored == [kept] and lost not in stored, (m, stored)
        # Live: b's new message arrives; a's does not.
        await accepted(owner, message(world.owner, world.a, content="a again"))
        later = await accepted(owner, message(world.owner, world.b, content="b again"))
        m = await reader.expect("EVENT", where=lambda m: len(m) > 2 and m[1] == "w")
        assert m[2]["id"] == later, m
