"""The after-commit publisher: retried until Redis takes the message, FIFO per topic, never dropped.

The retry logic is tested with a Hub whose publish fails on demand (a fake failure in
front of a real Redis), and outages with a real one: a Redis made unreachable by
`RedisGate` (nothing listens on its port) while a subscriber stays on the real Redis.
The pending bound refuses new writes before commit, over a real relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from buzz.live.hub import Hub, LossReason
from buzz.live.publisher import Publisher, PublisherFull, publish_blocking_on_commit
from buzz.live.signals import channel_topic
from buzz.nostr import Signer
from tests.live.redis_gate import redis_gate
from tests.support.factories import make_channel, make_community, message, revision, signers
from tests.support.records import stored
from tests.support.wire import publish
from tests.support.wsclient import RelayClient

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def unique_prefix() -> str:
    base = os.environ.get("BUZZ_REDIS_PREFIX", "buzztest:")
    return f"{base}live-{secrets.token_hex(4)}:"


class Recorder:
    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self.losses: list[tuple[LossReason, str]] = []

    def on_message(self, topic: str, message: dict[str, Any]) -> None:
        self.messages.append((topic, message))

    def on_loss(self, reason: LossReason, detail: str) -> None:
        self.losses.append((reason, detail))


class FlakyHub(Hub):
    """A real hub whose publishing fails while `failures_left` > 0 (or forever if None)."""

    def __init__(self, *args: Any, failures: int | None = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failures_left = failures
        self.calls = 0

    async def publish_encoded(self, items: Sequence[tuple[bytes, bytes]]) -> list[int]:
        self.calls += 1
        if self.failures_left is None or self.failures_left > 0:
            if self.failures_left is not None:
                self.failures_left -= 1
            raise RedisConnectionError("injected publish failure")
        return await super().publish_encoded(items)


async def eventually(predicate: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def flaky_hub(failures: int | None) -> AsyncIterator[FlakyHub]:
    hub = FlakyHub(REDIS_URL, prefix=unique_prefix(), failures=failures)
    try:
        yield hub
    finally:
        await hub.aclose()


@contextlib.asynccontextmanager
async def refusing_publisher() -> AsyncIterator[tuple[FlakyHub, Recorder, Publisher]]:
    """A publisher on a hub whose publishing fails until the test sets failures_left = 0, and a recorder
    subscribed to topic "t"."""
    async with flaky_hub(failures=None) as hub:
        rec = Recorder()
        await hub.subscribe(["t"], rec)
        yield hub, rec, Publisher(hub, retry_base=0.01, retry_cap=0.05)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.asyncio
async def test_failed_publishes_are_retried_until_all_arrive_in_order_per_topic() -> None:
    async with flaky_hub(failures=3) as hub:
        rec = Recorder()
        await hub.subscribe(["a", "b", "c"], rec)
        publisher = Publisher(hub, retry_base=0.01, retry_cap=0.05, batch_max=7)
        sent: dict[str, list[int]] = {"a": [], "b": [], "c": []}
        for n in range(60):
            topic = "abc"[n % 3]
            sent[topic].append(n)
            publisher.publish_soon(topic, {"n": n})
        assert publisher.pending == 60
        assert await publisher.flush(5.0)
        assert publisher.pending == 0 and publisher.refused == 0
        assert hub.calls >= 3 + 60 // 7
        await eventually(lambda: len(rec.messages) == 60)
        for topic, numbers in sent.items():
            assert [m["n"] for t, m in rec.messages if t == topic] == numbers
        assert rec.losses == []
        assert await publisher.aclose(1.0)


@pytest.mark.asyncio
async def test_flush_times_out_while_redis_refuses_and_succeeds_once_it_recovers() -> None:
    async with refusing_publisher() as (hub, rec, publisher):
        publisher.publish_soon("t", {"d": "x"})
        assert not await publisher.flush(0.3)
        assert publisher.pending == 1 and hub.calls >= 2
        hub.failures_left = 0  # Redis is back
        assert await publisher.flush(5.0)
        await eventually(lambda: rec.messages == [("t", {"d": "x"})])
        await publisher.aclose(1.0)


@pytest.mark.asyncio
async def test_publish_confirmed_waits_for_its_own_message() -> None:
    async with refusing_publisher() as (hub, rec, publisher):
        assert not await publisher.publish_confirmed("t", {"n": 1}, timeout=0.2)
        assert publisher.pending == 1  # still queued, still retried
        hub.failures_left = 0
        assert await publisher.publish_confirmed("t", {"n": 2}, timeout=5.0)
        await eventually(lambda: [m["n"] for _, m in rec.messages] == [1, 2])
        await publisher.aclose(1.0)


@pytest.mark.asyncio
async def test_a_cancelled_confirmed_publish_is_still_published() -> None:
    async with refusing_publisher() as (hub, rec, publisher):
        waiting = asyncio.ensure_future(publisher.publish_confirmed("t", {"n": 1}, timeout=30.0))
        await eventually(lambda: hub.calls >= 2)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert publisher.pending == 1  # the wait was cancelled, not the message
        hub.failures_left = 0
        assert await publisher.flush(5.0)
        await eventually(lambda: [m["n"] for _, m in rec.messages] == [1])
        await publisher.aclose(1.0)


@pytest.mark.asyncio
async def test_publish_soon_rejects_a_message_that_can_never_be_sent() -> None:
    async with flaky_hub(failures=0) as hub:
        publisher = Publisher(hub)
        with pytest.raises(TypeError):
            publisher.publish_soon("t", {"x": object()})
        with pytest.raises(TypeError):
            publisher.publish_soon("t", ["not", "a", "dict"])  # type: ignore[arg-type]
        assert publisher.pending == 0
        assert await publisher.flush(0.1)


def test_publish_soon_needs_a_running_loop() -> None:
    publisher = Publisher(Hub(REDIS_URL, prefix=unique_prefix()))
    with pytest.raises(RuntimeError):
        publisher.publish_soon("t", {"x": 1})


@pytest.mark.asyncio
async def test_publish_on_commit_publishes_only_when_the_commit_callback_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import transaction

    registered: list[tuple[Callable[[], object], dict[str, Any]]] = []
    monkeypatch.setattr(transaction, "on_commit", lambda func, **kw: registered.append((func, kw)))
    prefix = unique_prefix()
    hub = Hub(REDIS_URL, prefix=prefix)
    try:
        rec = Recorder()
        await hub.subscribe(["t"], rec)
        publish_blocking_on_commit(REDIS_URL, "t", {"d": "abc", "channels": ["general"]}, prefix=prefix)
        [(callback, kwargs)] = registered
        assert kwargs.get("robust") is True
        await asyncio.sleep(0.05)
        assert rec.messages == []  # nothing before the commit
        assert await asyncio.to_thread(callback) is True
        await eventually(lambda: rec.messages == [("t", {"d": "abc", "channels": ["general"]})])
    finally:
        await hub.aclose()


# --- outages of a real Redis ------------------------------------------------------------------------------

PUBLISH_FAILED = "error: the relay cannot publish changes right now, try again later"


@pytest.mark.asyncio
async def test_no_signal_is_dropped_over_a_long_outage_and_all_arrive_in_order_after_it() -> None:
    prefix = unique_prefix()
    listener = Hub(REDIS_URL, prefix=prefix)  # stays on the real Redis through the outage
    with redis_gate(REDIS_URL) as gate:
        hub = Hub(gate.url, prefix=prefix)
        try:
            rec = Recorder()
            await listener.subscribe(["a", "b"], rec)
            publisher = Publisher(hub, max_pending=40, retry_base=0.01, retry_cap=0.1, batch_max=8)
            publisher.publish_soon("a", {"n": -1})
            assert await publisher.flush(5.0)  # connected through the gate
            gate.shut()
            sent = 0
            # Far longer than the retry cap: the sender fails many times and keeps every signal.
            for _ in range(20):
                for _ in range(2):
                    publisher.ensure_room()
                    publisher.publish_soon("ab"[sent % 2], {"n": sent})
                    sent += 1
                await asyncio.sleep(0.1)
            assert publisher.pending == 40 and sent == 40
            with pytest.raises(PublisherFull):
                publisher.ensure_room()  # the next write is refused before it commits
            assert publisher.refused == 1
            await asyncio.sleep(1.0)
            assert publisher.pending == 40  # nothing dropped, nothing sent
            assert [m["n"] for _, m in rec.messages] == [-1]
            gate.open()
            assert await publisher.flush(10.0)
            await eventually(lambda: len(rec.messages) == 41, timeout=5.0)
            for topic in "ab":
                assert [m["n"] for t, m in rec.messages if t == topic and m["n"] >= 0] == list(
                    range("ab".index(topic), 40, 2)
                )
            publisher.ensure_room()  # room again once the queue drained
            assert rec.losses == []
            await publisher.aclose(1.0)
        finally:
            await hub.aclose()
            await listener.aclose()


@pytest.mark.asyncio
async def test_publish_on_commit_retries_through_an_outage_until_redis_takes_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django.db import transaction

    registered: list[Callable[[], object]] = []
    monkeypatch.setattr(transaction, "on_commit", lambda func, **kw: registered.append(func))
    prefix = unique_prefix()
    listener = Hub(REDIS_URL, prefix=prefix)
    try:
        rec = Recorder()
        await listener.subscribe(["t"], rec)
        with redis_gate(REDIS_URL) as gate:
            gate.shut()
            publish_blocking_on_commit(gate.url, "t", {"d": "abc"}, prefix=prefix)
            [callback] = registered
            with caplog.at_level(logging.WARNING, logger="buzz.live"):
                running = asyncio.ensure_future(asyncio.to_thread(callback))
                # Longer than any give-up budget (it used to be 30 s), and past one log interval.
                await asyncio.sleep(33.0)
                assert not running.done()
                assert rec.messages == []
                messages = [r.getMessage() for r in caplog.records]
                assert sum("retrying until Redis takes it" in m for m in messages) == 1
                assert sum("still failing" in m for m in messages) == 1  # once per interval, not per attempt
                gate.open()
                assert await asyncio.wait_for(running, 10.0) is True
            await eventually(lambda: rec.messages == [("t", {"d": "abc"})])
            assert not any(r.levelno >= logging.ERROR for r in caplog.records)
    finally:
        await listener.aclose()
    with pytest.raises(TypeError):
        publish_blocking_on_commit(REDIS_URL, "t", {"x": {1, 2}})  # not JSON: refused before registering
    assert len(registered) == 1


HOST = "publisher.test"


@pytest.fixture
def room(transactional_db: None) -> tuple[Signer, int, uuid.UUID]:
    (writer,) = signers(1)
    community = make_community(HOST, "Publisher", members=[writer])
    return writer, community.pk, make_channel(community, writer, name="p")


async def test_a_relay_refuses_writes_with_error_while_its_signals_wait_and_publishes_them_all_after(
    room: tuple[Signer, int, uuid.UUID], relay_factory: Any
) -> None:
    writer, community_id, channel = room
    prefix = os.environ["BUZZ_REDIS_PREFIX"]
    listener = Hub(REDIS_URL, prefix=prefix)
    try:
        rec = Recorder()
        await listener.subscribe([channel_topic(community_id, channel)], rec)
        with redis_gate(REDIS_URL) as gate:
            relay = relay_factory(REDIS_URL=gate.url, BUZZ_PUBLISH_MAX_PENDING="3", BUZZ_WRITES_PER_SECOND="0")
            async with RelayClient.connect(relay.ws_url, host=HOST) as client:
                assert (await client.auth(writer))[2] is True
                first = message(writer, channel, content="before")
                assert (await publish(client, first))[2] is True
                accepted = revision(writer, d=uuid.uuid4(), h=channel)
                assert (await publish(client, accepted))[2] is True
                gate.shut()
                during = [message(writer, channel, content=f"during {n}") for n in range(3)]
                for event in during:  # committed, OK after the publish wait; the signal stays queued
                    assert (await publish(client, event))[2] is True
                refused = message(writer, channel, content="refused")
                assert (await publish(client, refused))[2:] == [False, PUBLISH_FAILED]
                assert not await stored(refused["id"])
                artifact = revision(writer, d=uuid.uuid4(), h=channel)  # the NIP-AR write path too
                assert (await publish(client, artifact))[2:] == [False, PUBLISH_FAILED]
                assert not await stored(artifact["id"])
                # A revision accepted before is still a success when sent again (NIP-AR: a client that lost its
                # OK never sees a false failure), applying nothing.
                assert (await publish(client, accepted))[2:] == [True, "duplicate: already accepted"]
                await asyncio.sleep(1.0)
                assert [m["event"]["id"] for _, m in rec.messages] == [first["id"], accepted["id"]]
                gate.open()
                expected = [first["id"], accepted["id"], *(e["id"] for e in during)]
                await eventually(lambda: [m["event"]["id"] for _, m in rec.messages] == expected, timeout=15.0)
                after = message(writer, channel, content="after")
                assert (await publish(client, after))[2] is True  # room again
                await eventually(lambda: len(rec.messages) == 6, timeout=5.0)
                assert rec.messages[-1][1]["event"]["id"] == after["id"]
    finally:
        await listener.aclose()
