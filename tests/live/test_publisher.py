"""The after-commit publisher: retried until Redis takes the message, FIFO per topic, bounded.

The retry logic is tested with a Hub whose publish fails on demand (a fake failure in
front of a real Redis); delivery is checked by a real subscription on the same hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from buzz.live.hub import Hub, LossReason
from buzz.live.publisher import Publisher, publish_blocking_on_commit

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

    async def publish_many(self, items: Sequence[tuple[str, dict[str, Any]]]) -> list[int]:
        self.calls += 1
        if self.failures_left is None or self.failures_left > 0:
            if self.failures_left is not None:
                self.failures_left -= 1
            raise RedisConnectionError("injected publish failure")
        return await super().publish_many(items)


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
        assert publisher.pending == 0 and publisher.dropped == 0
        assert hub.calls >= 3 + 60 // 7
        await eventually(lambda: len(rec.messages) == 60)
        for topic, numbers in sent.items():
            assert [m["n"] for t, m in rec.messages if t == topic] == numbers
        assert rec.losses == []
        assert await publisher.aclose(1.0)


@pytest.mark.asyncio
async def test_flush_times_out_while_redis_refuses_and_succeeds_once_it_recovers() -> None:
    async with flaky_hub(failures=None) as hub:
        rec = Recorder()
        await hub.subscribe(["t"], rec)
        publisher = Publisher(hub, retry_base=0.01, retry_cap=0.05)
        publisher.publish_soon("t", {"d": "x"})
        assert not await publisher.flush(0.3)
        assert publisher.pending == 1 and hub.calls >= 2
        hub.failures_left = 0  # Redis is back
        assert await publisher.flush(5.0)
        await eventually(lambda: rec.messages == [("t", {"d": "x"})])
        await publisher.aclose(1.0)


@pytest.mark.asyncio
async def test_publish_confirmed_waits_for_its_own_message() -> None:
    async with flaky_hub(failures=None) as hub:
        rec = Recorder()
        await hub.subscribe(["t"], rec)
        publisher = Publisher(hub, retry_base=0.01, retry_cap=0.05)
        assert not await publisher.publish_confirmed("t", {"n": 1}, timeout=0.2)
        assert publisher.pending == 1  # still queued, still retried
        hub.failures_left = 0
        assert await publisher.publish_confirmed("t", {"n": 2}, timeout=5.0)
        await eventually(lambda: [m["n"] for _, m in rec.messages] == [1, 2])
        await publisher.aclose(1.0)


@pytest.mark.asyncio
async def test_full_queue_drops_the_oldest_and_logs_an_error(caplog: pytest.LogCaptureFixture) -> None:
    async with flaky_hub(failures=None) as hub:
        rec = Recorder()
        await hub.subscribe(["t"], rec)
        publisher = Publisher(hub, max_pending=5, retry_base=0.01, retry_cap=0.05)
        with caplog.at_level(logging.ERROR, logger="buzz.live"):
            for n in range(12):
                publisher.publish_soon("t", {"n": n})
        assert publisher.pending == 5 and publisher.dropped == 7
        assert any("queue full" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
        await asyncio.sleep(0.05)  # a few failed attempts on the batch at the head
        hub.failures_left = 0
        assert await publisher.flush(5.0)
        await eventually(lambda: len(rec.messages) == 5)
        assert [m["n"] for _, m in rec.messages] == [7, 8, 9, 10, 11]
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


@pytest.mark.asyncio
async def test_publish_on_commit_gives_up_after_its_budget(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from django.db import transaction

    registered: list[Callable[[], object]] = []
    monkeypatch.setattr(transaction, "on_commit", lambda func, **kw: registered.append(func))
    publish_blocking_on_commit(f"redis://127.0.0.1:{closed_port()}/0", "t", {"d": "abc"}, budget=0.4)
    [callback] = registered
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="buzz.live"):
        assert await asyncio.to_thread(callback) is False
    assert 0.35 <= time.monotonic() - started < 3.0
    assert any("gave up" in r.getMessage() for r in caplog.records)
    with pytest.raises(TypeError):
        publish_blocking_on_commit(REDIS_URL, "t", {"x": {1, 2}})  # not JSON: refused before registering
    assert len(registered) == 1
