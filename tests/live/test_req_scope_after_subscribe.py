"""An ordinary REQ decides its channels again once its live interest is confirmed.

A REQ's channels were decided when it arrived, and its SUBSCRIBE confirmed after: an access change that
committed in between was signalled before the subscription listened, and the REQ went on reading the
channel (stored events, then every live one) until the connection ended. Here the SUBSCRIBE is held back
(Redis paused) while the reader is removed from the channel, and the removal's signal is withheld
altogether: what the REQ reads is decided on the reader's access after the removal.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import redis

from buzz.chat import channels
from tests.artifacts.write_support import accepted, message
from tests.support.faults import next_for, redis_paused, unsignalled
from tests.support.wsclient import RelayClient
from tests.sync.support import RELAY_ENV, World, make_world

HOST = "req-rescope.test"
PAUSE_MS = 1200  # under the hub's 2 s PING timeout


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


async def _req_across_a_removal(
    world: World, relay_factory: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, flt: dict[str, Any]
) -> tuple[RelayClient, RelayClient, list[str], Any]:
    """Channel a and b hold one message each; the reader sends REQ "r" with `flt` while Redis holds its
    SUBSCRIBE back, and is removed from a meanwhile (no signal). Returns the open (owner, reader) clients,
    the two messages' ids and the client contexts to leave."""
    relay = relay_factory(**RELAY_ENV)
    stack = contextlib.AsyncExitStack()
    owner = await stack.enter_async_context(RelayClient.connect(relay.ws_url, host=HOST))
    reader = await stack.enter_async_context(RelayClient.connect(relay.ws_url, host=HOST))
    assert (await owner.auth(world.owner))[2] is True and (await reader.auth(world.reader))[2] is True
    ids = [await accepted(owner, message(world.owner, ch, content=f"in {ch}")) for ch in (world.a, world.b)]
    async with redis_paused(redis_client, PAUSE_MS, "ALL"):
        await reader.send_json(["REQ", "r", flt])
        await asyncio.sleep(0.3)  # the REQ's channels are decided; its SUBSCRIBE waits for Redis
        await unsignalled(channels.member_remove, monkeypatch)(
            community=world.community, channel_uuid=world.a, actor=None, pubkey=world.reader.pubkey
        )
    return owner, reader, ids, stack


async def test_a_removal_between_the_reqs_decision_and_its_subscribe_counts(
    world: World, relay_factory: Any, redis_flush: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    flt = {"#h": [str(world.a)], "kinds": [9]}
    owner, reader, _, stack = await _req_across_a_removal(world, relay_factory, redis_client, monkeypatch, flt)
    async with stack:
        await accepted(owner, message(world.owner, world.a, content="after"))
        first = await next_for(reader, "r")
        assert first[0] == "CLOSED" and first[2].startswith("restricted:"), first


async def test_a_wide_req_drops_a_channel_lost_before_its_subscribe_and_keeps_the_others(
    world: World, relay_factory: Any, redis_flush: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    flt = {"kinds": [9]}  # every channel the reader reads: a and b
    owner, reader, (lost, kept), stack = await _req_across_a_removal(
        world, relay_factory, redis_client, monkeypatch, flt
    )
    async with stack:
        stored: list[str] = []
        while (m := await next_for(reader, "r"))[0] == "EVENT":
            stored.append(m[2]["id"])
        assert m[0] == "EOSE" and stored == [kept] and lost not in stored, (m, stored)
        # Live: b's new message arrives; a's, sent before it, does not.
        await accepted(owner, message(world.owner, world.a, content="a again"))
        later = await accepted(owner, message(world.owner, world.b, content="b again"))
        m = await next_for(reader, "r")
        assert m[0] == "EVENT" and m[2]["id"] == later, m
