"""The live hub against a real Redis (REDIS_URL, default redis://127.0.0.1:6379/0).

Each test uses its own random topic prefix, so tests (and runs) never see each
other's traffic on a shared server. A connection is found by its CLIENT SETNAME.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from buzz.live.hub import Hub, HubUnavailable, LossReason, topic_for_channel, topic_for_community
from tests.support.proxy import StallableProxy

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def unique_prefix() -> str:
    """A prefix no other test (or test run) shares, so topics never collide."""
    base = os.environ.get("BUZZ_REDIS_PREFIX", "buzztest:")
    return f"{base}live-{secrets.token_hex(4)}:"


class Recorder:
    """A Listener that records everything it is told."""

    def __init__(self, hub: Hub | None = None) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self.losses: list[tuple[LossReason, str]] = []
        self.healthy_at_loss: list[bool] = []
        self._hub = hub

    def on_message(self, topic: str, message: dict[str, Any]) -> None:
        self.messages.append((topic, message))

    def on_loss(self, reason: LossReason, detail: str) -> None:
        self.losses.append((reason, detail))
        if self._hub is not None:
            self.healthy_at_loss.append(self._hub.healthy)


async def eventually(predicate: Callable[[], bool], timeout: float = 3.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def make_hub(url: str = REDIS_URL, hub_class: type[Hub] = Hub, **kwargs: Any) -> AsyncIterator[Hub]:
    kwargs.setdefault("prefix", unique_prefix())
    hub = hub_class(url, **kwargs)
    try:
        yield hub
    finally:
        await hub.aclose()


@contextlib.asynccontextmanager
async def redis_client() -> AsyncIterator[Redis]:
    client = Redis.from_url(REDIS_URL)
    try:
        yield client
    finally:
        await client.aclose()


async def numsub(client: Redis, wire: str) -> int:
    [(_, count)] = await client.pubsub_numsub(wire)
    return int(count)


async def pubsub_client_id(client: Redis, hub: Hub) -> int:
    ids = [int(c["id"]) for c in await client.client_list() if c.get("name") == hub.client_name]
    assert len(ids) == 1, f"expected one connection named {hub.client_name}, found {ids}"
    return ids[0]


async def kill_pubsub(client: Redis, hub: Hub) -> int:
    client_id = await pubsub_client_id(client, hub)
    assert await client.client_kill_filter(_id=str(client_id)) == 1
    return client_id


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def payload(obj: dict[str, Any]) -> str:
    return json.dumps(obj)


# -- rule 1: live interest is active when subscribe returns ------------------------------


@pytest.mark.asyncio
async def test_subscribe_returns_only_after_redis_confirmed_it() -> None:
    # If subscribe() returned before Redis processed SUBSCRIBE, a PUBLISH sent right
    # after it would reach nobody (PUBLISH returns the receiver count) and be lost.
    async with make_hub() as hub, redis_client() as r:
        for i in range(50):
            topic = f"t{i}"
            rec = Recorder()
            sub = await hub.subscribe([topic], rec)
            if i % 2:
                assert await numsub(r, hub.wire_topic(topic)) == 1
                assert await r.publish(hub.wire_topic(topic), payload({"i": i})) == 1
            else:
                assert await r.publish(hub.wire_topic(topic), payload({"i": i})) == 1
                assert await numsub(r, hub.wire_topic(topic)) == 1
            await eventually(lambda rec=rec: bool(rec.messages), what=f"message {i}")  # type: ignore[misc]
            assert rec.messages == [(topic, {"i": i})]
            await sub.close()
            assert rec.losses == []


@pytest.mark.asyncio
async def test_subscribe_waits_for_the_confirmation_over_a_slow_link() -> None:
    # On loopback the hub's SUBSCRIBE reaches Redis before the test's PUBLISH even if
    # subscribe() returned early, so the test above cannot tell. Here the hub's link
    # is 20 ms slower each way than the publisher's: a subscribe() that returned
    # before the reply would make the PUBLISH below reach nobody. Two subscribes race
    # on each topic: the second joins the first one's pending SUBSCRIBE and must wait
    # for its reply too.
    # Every setup here (embedded or machine Redis) is TCP; the proxy needs that.
    assert urlsplit(REDIS_URL).scheme == "redis", "the proxy needs a redis://host:port REDIS_URL"
    proxy = StallableProxy(REDIS_URL, delay=0.01)
    url = await proxy.start()
    try:
        async with make_hub(url) as hub, redis_client() as r:
            pending: list[asyncio.Future[list[None]]] = []
            for i in range(12):
                topic = f"t{i % 3}"
                recs = [Recorder(), Recorder()]
                first = asyncio.get_running_loop().create_task(hub.subscribe([topic], recs[0]))
                await asyncio.sleep(0)  # its SUBSCRIBE is queued
                second = await hub.subscribe([topic], recs[1])
                assert await r.publish(hub.wire_topic(topic), payload({"i": i})) == 1
                subs = [await first, second]
                await eventually(lambda recs=recs: all(rec.messages for rec in recs))  # type: ignore[misc]
                closing = asyncio.ensure_future(asyncio.gather(*(s.close() for s in subs)))
                if i % 2:
                    await closing
                else:
                    await asyncio.sleep(0)  # the next subscribe overlaps this UNSUBSCRIBE
                    pending.append(closing)
            await asyncio.gather(*pending)
    finally:
        await proxy.aclose()


@pytest.mark.asyncio
async def test_first_subscribe_of_a_fresh_hub_is_confirmed_too() -> None:
    async with redis_client() as r:
        for i in range(5):
            async with make_hub() as hub:
                assert not hub.healthy
                rec = Recorder()
                await hub.subscribe(["t"], rec)
                assert hub.healthy
                assert await r.publish(hub.wire_topic("t"), payload({"i": i})) == 1
                await eventually(lambda rec=rec: bool(rec.messages))  # type: ignore[misc]


@pytest.mark.asyncio
async def test_concurrent_subscribes_to_one_topic_share_one_redis_subscription() -> None:
    async with make_hub() as hub, redis_client() as r:
        recs = [Recorder() for _ in range(20)]
        subs = await asyncio.gather(*(hub.subscribe(["shared", f"own{i}"], rec) for i, rec in enumerate(recs)))
        assert await numsub(r, hub.wire_topic("shared")) == 1
        assert await numsub(r, hub.wire_topic("own7")) == 1
        # One Redis client is subscribed; the hub fans the message out to all 20.
        assert await r.publish(hub.wire_topic("shared"), payload({"x": 1})) == 1
        await eventually(lambda: all(rec.messages for rec in recs))
        assert all(rec.messages == [("shared", {"x": 1})] for rec in recs)
        for sub in subs:
            await sub.close()
        assert await numsub(r, hub.wire_topic("shared")) == 0


@pytest.mark.asyncio
async def test_one_subscription_many_topics_keeps_order_per_topic() -> None:
    async with make_hub() as hub, redis_client() as r:
        rec = Recorder()
        sub = await hub.subscribe(["a", "b", "c"], rec)
        assert sub.topics == frozenset({"a", "b", "c"})
        for topic in ("a", "b", "c"):
            assert await numsub(r, hub.wire_topic(topic)) == 1
        async with r.pipeline(transaction=False) as pipe:
            for n in range(100):
                pipe.publish(hub.wire_topic("abc"[n % 3]), payload({"n": n}))
            await pipe.execute()
        await eventually(lambda: len(rec.messages) == 100)
        for topic in ("a", "b", "c"):
            got = [m["n"] for t, m in rec.messages if t == topic]
            assert got == sorted(got) and len(got) in (33, 34)
        await sub.close()


@pytest.mark.asyncio
async def test_refcount_unsubscribes_when_the_last_subscription_closes() -> None:
    async with make_hub() as hub, redis_client() as r:
        wire = hub.wire_topic("t")
        first, second = Recorder(), Recorder()
        sub1 = await hub.subscribe(["t"], first)
        sub2 = await hub.subscribe(["t"], second)
        assert await numsub(r, wire) == 1
        await sub1.close()
        assert not sub1.alive and sub2.alive
        assert await numsub(r, wire) == 1
        assert await r.publish(wire, payload({"after": "close"})) == 1
        await eventually(lambda: bool(second.messages))
        await sub2.close()
        assert await numsub(r, wire) == 0
        assert first.messages == [] and first.losses == [] and second.losses == []
        await sub2.close()  # idempotent


@pytest.mark.asyncio
async def test_subscribe_while_the_last_close_is_unsubscribing() -> None:
    # UNSUBSCRIBE and the following SUBSCRIBE of the same topic are in flight together;
    # the new subscription must still be live when subscribe() returns.
    async with make_hub() as hub, redis_client() as r:
        wire = hub.wire_topic("t")
        for i in range(10):
            old = await hub.subscribe(["t"], Recorder())
            closing = asyncio.get_running_loop().create_task(old.close())
            await asyncio.sleep(0)  # close() has queued its UNSUBSCRIBE
            rec = Recorder()
            new = await hub.subscribe(["t"], rec)
            await closing
            assert await r.publish(wire, payload({"i": i})) == 1
            await eventually(lambda rec=rec: bool(rec.messages))  # type: ignore[misc]
            assert await numsub(r, wire) == 1
            await new.close()
        assert await numsub(r, wire) == 0


@pytest.mark.asyncio
async def test_publish_and_publish_many_reach_subscribers() -> None:
    async with make_hub() as hub:
        rec = Recorder()
        await hub.subscribe(["x", "y"], rec)
        assert await hub.publish("x", {"d": "1", "channels": ["general"]}) == 1
        assert await hub.publish_many([("y", {"d": "2"}), ("x", {"d": "3"}), ("nobody", {"d": "4"})]) == [1, 1, 0]
        await eventually(lambda: len(rec.messages) == 3)
        assert rec.messages == [("x", {"d": "1", "channels": ["general"]}), ("y", {"d": "2"}), ("x", {"d": "3"})]
        with pytest.raises(TypeError):
            await hub.publish("x", ["not", "an", "object"])  # type: ignore[arg-type]


async def publish_client_ids(client: Redis, hub: Hub) -> list[int]:
    return [int(c["id"]) for c in await client.client_list() if c.get("name") == hub.publish_client_name]


@pytest.mark.asyncio
async def test_a_killed_publish_connection_fails_one_publish_and_the_next_connects_again() -> None:
    async with make_hub() as hub, redis_client() as r:
        rec = Recorder()
        await hub.subscribe(["t"], rec)
        assert await hub.publish("t", {"n": 1}) == 1
        [first] = await publish_client_ids(r, hub)  # one connection, kept between publishes
        assert await hub.publish_many([("t", {"n": 2}), ("t", {"n": 3})]) == [1, 1]
        assert await publish_client_ids(r, hub) == [first]
        assert await r.client_kill_filter(_id=str(first)) == 1
        with pytest.raises(RedisConnectionError):
            await hub.publish("t", {"lost": True})  # raised, never silent: the Publisher retries it
        assert await hub.publish("t", {"n": 4}) == 1
        [second] = await publish_client_ids(r, hub)
        assert second != first
        await eventually(lambda: [m.get("n") for _, m in rec.messages] == [1, 2, 3, 4])


@pytest.mark.asyncio
async def test_a_publish_cancelled_mid_reply_leaves_no_reply_for_the_next_one() -> None:
    # The cancelled PUBLISH reaches nobody (0); the next reaches one subscriber (1). Had the half-read
    # connection been kept, the next publish would read the cancelled one's late reply.
    assert urlsplit(REDIS_URL).scheme == "redis", "the proxy needs a redis://host:port REDIS_URL"
    proxy = StallableProxy(REDIS_URL)
    url = await proxy.start()
    try:
        async with make_hub(url) as hub:
            rec = Recorder()
            await hub.subscribe(["t"], rec)
            assert await hub.publish("t", {"n": 1}) == 1
            proxy.stall()
            pending = asyncio.ensure_future(hub.publish("nobody", {"n": "cancelled"}))
            await asyncio.sleep(0.2)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
            proxy.resume()
            assert await hub.publish("t", {"n": 2}) == 1
            assert await hub.publish("nobody", {"n": 3}) == 0
            await eventually(lambda: [m["n"] for _, m in rec.messages] == [1, 2])
    finally:
        await proxy.aclose()


# -- rule 5: every loss is reported -------------------------------------------------------


@pytest.mark.asyncio
async def test_client_kill_ends_every_subscription_and_nothing_resubscribes_silently() -> None:
    async with make_hub() as hub, redis_client() as r:
        recs = [Recorder(hub) for _ in range(3)]
        subs = [
            await hub.subscribe(["t1"], recs[0]),
            await hub.subscribe(["t1", "t2"], recs[1]),
            await hub.subscribe(["t3"], recs[2]),
        ]
        closed_rec = Recorder()
        closed = await hub.subscribe(["t3"], closed_rec)
        await closed.close()
        old_id = await kill_pubsub(r, hub)
        await eventually(lambda: all(rec.losses for rec in recs), timeout=5.0, what="on_loss(DISCONNECTED)")
        for rec, sub in zip(recs, subs, strict=True):
            assert [reason for reason, _ in rec.losses] == [LossReason.DISCONNECTED]
            assert rec.healthy_at_loss == [False]
            assert not sub.alive
        assert closed_rec.losses == []
        # The hub reconnects on a new connection, and the dead subscriptions stay dead:
        # no topic is subscribed again behind their owners' backs.
        await eventually(lambda: hub.healthy, timeout=5.0, what="reconnect")
        assert await pubsub_client_id(r, hub) != old_id
        for topic in ("t1", "t2", "t3"):
            assert await numsub(r, hub.wire_topic(topic)) == 0
        assert await r.publish(hub.wire_topic("t1"), payload({"late": True})) == 0
        rec = Recorder()
        await hub.subscribe(["t1"], rec)
        assert await r.publish(hub.wire_topic("t1"), payload({"again": True})) == 1
        await eventually(lambda: bool(rec.messages))
        await asyncio.sleep(0.05)
        assert all(len(r_.losses) == 1 and r_.messages == [] for r_ in recs)


@pytest.mark.asyncio
async def test_subscribe_started_while_reconnecting_waits_for_the_new_connection() -> None:
    async with make_hub() as hub, redis_client() as r:
        first = Recorder(hub)
        await hub.subscribe(["t"], first)
        await kill_pubsub(r, hub)
        await eventually(lambda: bool(first.losses), timeout=5.0)
        assert not hub.healthy  # reconnecting (the first retry waits 50-100 ms)
        rec = Recorder()
        sub = await hub.subscribe(["t"], rec, wait=5.0)
        assert hub.healthy and sub.alive
        assert await r.publish(hub.wire_topic("t"), payload({"ok": 1})) == 1
        await eventually(lambda: bool(rec.messages))


@pytest.mark.asyncio
async def test_subscribe_raises_hub_unavailable_when_redis_is_unreachable() -> None:
    async with make_hub(f"redis://127.0.0.1:{closed_port()}/0") as hub:
        started = time.monotonic()
        with pytest.raises(HubUnavailable, match="unavailable"):
            await hub.subscribe(["t"], Recorder(), wait=0.5)
        elapsed = time.monotonic() - started
        assert 0.45 <= elapsed < 2.0
        assert not hub.healthy
        with pytest.raises(RedisConnectionError):
            await hub.publish("t", {"x": 1})


@pytest.mark.asyncio
async def test_missing_pong_is_a_disconnect() -> None:
    # A connection that stays open but stops answering (a black hole) is caught by the
    # hub's own PING, not by the socket.
    # Every setup here (embedded or machine Redis) is TCP; the proxy needs that.
    assert urlsplit(REDIS_URL).scheme == "redis", "the proxy needs a redis://host:port REDIS_URL"
    proxy = StallableProxy(REDIS_URL)
    url = await proxy.start()
    try:
        async with make_hub(url, ping_interval=0.1, ping_timeout=0.3) as hub:
            rec = Recorder(hub)
            sub = await hub.subscribe(["t"], rec)
            proxy.stall()
            started = time.monotonic()
            await eventually(lambda: bool(rec.losses), timeout=3.0, what="ping timeout")
            assert time.monotonic() - started < 1.5
            [(reason, detail)] = rec.losses
            assert reason is LossReason.DISCONNECTED and "PONG" in detail
            assert not sub.alive and not hub.healthy
            with pytest.raises(HubUnavailable):
                await hub.subscribe(["t"], Recorder(), wait=0.3)  # still stalled: no healthy connection
            proxy.resume()
            again = Recorder()
            await hub.subscribe(["t"], again, wait=5.0)
            assert await hub.publish("t", {"back": True}) == 1
            await eventually(lambda: bool(again.messages))
    finally:
        await proxy.aclose()


@pytest.mark.asyncio
async def test_overflow_ends_only_the_subscription_whose_queue_is_full() -> None:
    async with make_hub() as hub, redis_client() as r:
        slow, fast, other = Recorder(), Recorder(), Recorder()
        slow_sub = await hub.subscribe(["t"], slow, queue_max=4)
        fast_sub = await hub.subscribe(["t"], fast)
        other_sub = await hub.subscribe(["u"], other, queue_max=4)
        # One pipeline: Redis writes the whole burst to the hub at once, and the hub's
        # reader parses it without yielding, so the drain tasks cannot keep up with 4.
        async with r.pipeline(transaction=False) as pipe:
            for n in range(200):
                pipe.publish(hub.wire_topic("t"), payload({"n": n}))
            await pipe.execute()
        await eventually(lambda: len(fast.messages) == 200)
        assert [m["n"] for _, m in fast.messages] == list(range(200))
        assert [reason for reason, _ in slow.losses] == [LossReason.OVERFLOW]
        assert not slow_sub.alive
        assert fast_sub.alive and fast.losses == []
        assert other_sub.alive and other.losses == []
        delivered = len(slow.messages)
        assert delivered <= 4
        assert await numsub(r, hub.wire_topic("t")) == 1  # the fast subscription still holds it
        assert await r.publish(hub.wire_topic("t"), payload({"n": 200})) == 1
        await eventually(lambda: len(fast.messages) == 201)
        assert len(slow.messages) == delivered and len(slow.losses) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("raw", [b"\xff not json", b"{truncated", b"[1, 2]", b'"a string"', b"\xfe\xff\x00{"])
async def test_undecodable_payload_ends_every_subscription_of_that_topic(raw: bytes) -> None:
    async with make_hub() as hub, redis_client() as r:
        a, b, c = Recorder(), Recorder(), Recorder()
        sub_a = await hub.subscribe(["t"], a)
        sub_b = await hub.subscribe(["t", "v"], b)
        sub_c = await hub.subscribe(["u"], c)
        assert await r.publish(hub.wire_topic("t"), raw) == 1
        await eventually(lambda: bool(a.losses and b.losses))
        assert [reason for reason, _ in a.losses] == [LossReason.UNDECODABLE]
        assert [reason for reason, _ in b.losses] == [LossReason.UNDECODABLE]
        assert not sub_a.alive and not sub_b.alive
        assert sub_c.alive and c.losses == []
        assert await hub.publish("u", {"fine": True}) == 1
        await eventually(lambda: bool(c.messages))
        assert hub.healthy  # a bad payload is a loss for its topic, not a connection problem


@pytest.mark.asyncio
async def test_aclose_reports_closed_to_every_live_subscription() -> None:
    async with make_hub() as hub:
        recs = [Recorder() for _ in range(3)]
        for i, rec in enumerate(recs):
            await hub.subscribe([f"t{i}"], rec)
        await hub.aclose()
        assert all([reason for reason, _ in rec.losses] == [LossReason.CLOSED] for rec in recs)
        assert not hub.healthy
        with pytest.raises(HubUnavailable):
            await hub.subscribe(["t0"], Recorder())
        with pytest.raises(HubUnavailable):
            await hub.publish("t0", {"x": 1})
        await hub.aclose()  # idempotent


@pytest.mark.asyncio
async def test_a_listener_that_raises_does_not_stop_its_delivery() -> None:
    class Raising(Recorder):
        def on_message(self, topic: str, message: dict[str, Any]) -> None:
            super().on_message(topic, message)
            if message.get("boom"):
                raise RuntimeError("listener bug")

    async with make_hub() as hub:
        rec = Raising()
        await hub.subscribe(["t"], rec)
        await hub.publish("t", {"boom": True})
        await hub.publish("t", {"boom": False})
        await eventually(lambda: len(rec.messages) == 2)
        assert rec.losses == []


def test_topic_helpers() -> None:
    assert topic_for_community(7) == "community:7"
    assert topic_for_channel(7, "general") == "community:7:channel:general"
    assert topic_for_channel(7, "a:b") != topic_for_channel(7, "a")
    with pytest.raises(ValueError):
        topic_for_channel(7, "")
    with pytest.raises(ValueError):
        topic_for_community(-1)
    with pytest.raises(ValueError):
        topic_for_community(True)
