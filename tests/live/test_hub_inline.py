"""Inline hub subscriptions (the hub's reader calls the listener itself, no queue or drain task),
against a real Redis, as tests/live/test_hub.py does for queued ones."""

from __future__ import annotations

import asyncio

import pytest

from buzz.live.hub import LossReason
from tests.live.test_hub import Recorder, eventually, kill_pubsub, make_hub, payload, redis_client


@pytest.mark.asyncio
async def test_inline_listeners_get_every_message_in_order_without_a_task() -> None:
    async with make_hub() as hub, redis_client() as r:
        inline, queued = Recorder(), Recorder()
        sub = await hub.subscribe(["t"], inline, inline=True, queue_max=1)
        await hub.subscribe(["t"], queued)
        assert sub._drain_task is None
        # One pipelined burst: the reader parses it without yielding; an inline listener has no queue
        # to overflow, so queue_max=1 does not apply to it.
        async with r.pipeline(transaction=False) as pipe:
            for n in range(200):
                pipe.publish(hub.wire_topic("t"), payload({"n": n}))
            await pipe.execute()
        await eventually(lambda: len(queued.messages) == 200 and len(inline.messages) == 200)
        assert [m["n"] for _, m in inline.messages] == list(range(200))
        assert inline.losses == [] and sub.alive
        await sub.close()
        assert await r.publish(hub.wire_topic("t"), payload({"n": 200})) == 1
        await eventually(lambda: len(queued.messages) == 201)
        assert len(inline.messages) == 200


@pytest.mark.asyncio
async def test_an_inline_listener_that_raises_does_not_stop_the_others() -> None:
    class Raising(Recorder):
        def on_message(self, topic: str, message: dict[str, object]) -> None:
            super().on_message(topic, message)
            raise RuntimeError("listener bug")

    async with make_hub() as hub, redis_client() as r:
        bad, good = Raising(), Recorder()
        await hub.subscribe(["t"], bad, inline=True)
        await hub.subscribe(["t"], good, inline=True)
        for n in range(3):
            assert await r.publish(hub.wire_topic("t"), payload({"n": n})) == 1
        await eventually(lambda: len(good.messages) == 3 and len(bad.messages) == 3)
        assert hub.healthy


@pytest.mark.asyncio
async def test_client_kill_ends_inline_subscriptions_too() -> None:
    async with make_hub() as hub, redis_client() as r:
        rec = Recorder(hub)
        sub = await hub.subscribe(["t"], rec, inline=True)
        await kill_pubsub(r, hub)
        await eventually(lambda: bool(rec.losses))
        assert [reason for reason, _ in rec.losses] == [LossReason.DISCONNECTED]
        assert not sub.alive
        await asyncio.sleep(0)
