"""Publishing change signals after commit, retried until Redis takes them (NIP-AR sync rule 5).

A committed change is always published: nothing here ever drops a signal. Two entry points:

* `Publisher.publish_soon` / `publish_confirmed` for the async relay: queue and return at
  once; one background task sends the queue in order, in pipelined batches, and retries a
  failed batch with capped, jittered backoff until it succeeds or the process stops. A
  retried batch may be published twice; that is harmless, a signal only says "this d
  changed" and the reader reads the current head.
* `publish_blocking_on_commit` for the synchronous ORM side (admin, management commands):
  `transaction.on_commit` runs one PUBLISH with the sync redis client, retried until Redis
  takes it. It blocks the committing thread (a command waits out a Redis outage) and logs
  once when it starts failing, then once per interval while it lasts.

The pending bound. A signal can't be refused once its change has committed, so the bound
(`max_pending`, BUZZ_PUBLISH_MAX_PENDING, 100,000 by default) is enforced before the
commit: the write paths call `ensure_room()` first (buzz.events.ingest, for every kind),
and while that many signals wait for Redis it raises `PublisherFull`, which the write
answers with `error:` and stores nothing. Writes already past the check still commit and
queue their signals, so the queue can exceed the bound by the writes in flight at that
instant (at most one per connection and HTTP request); it never drops one. The bound is
over ten seconds of writes at this machine's measured PostgreSQL ceiling, so writes are
refused only after a long publish outage, and they succeed again as soon as the queue
drains below it.

Order: one FIFO for all topics, so each topic's messages go out in the order they
were queued (the spec does not need any order across topics).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .hub import Hub, encode_message

__all__ = ["Publisher", "PublisherFull", "publish_blocking_on_commit"]

logger = logging.getLogger("buzz.live")

# A failure is logged when it starts and then at most this often while it lasts.
_LOG_EVERY = 30.0


def _backoff(failures: int, base: float, cap: float) -> float:
    step = min(cap, base * 2.0 ** min(failures - 1, 30))
    return step / 2 + random.uniform(0, step / 2)  # noqa: S311 (jitter, not crypto)


class PublisherFull(Exception):
    """Too many signals wait for Redis: a new write is refused before it commits (see the module doc)."""

    reason = "error: the relay cannot publish changes right now, try again later"


class Publisher:
    """Queues messages and publishes them through `hub` in the background."""

    def __init__(
        self,
        hub: Hub,
        *,
        max_pending: int = 100_000,
        batch_max: int = 256,
        retry_base: float = 0.05,
        retry_cap: float = 5.0,
    ) -> None:
        if max_pending < 1 or batch_max < 1:
            raise ValueError("max_pending and batch_max must be at least 1")
        self._hub = hub
        self._max_pending = max_pending
        self._batch_max = batch_max
        self._retry_base = retry_base
        self._retry_cap = retry_cap
        # (sequence number, wire topic, payload, waiter); the number lets the sender pop exactly the batch it
        # sent. Encoded once, when queued.
        self._queue: deque[tuple[int, bytes, bytes, asyncio.Future[bool] | None]] = deque()
        self._seq = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: Writes refused by `ensure_room` since the start.
        self.refused = 0
        self._last_refusal_log = -_LOG_EVERY

    @property
    def pending(self) -> int:
        """Messages queued and not yet confirmed published."""
        return len(self._queue)

    @property
    def max_pending(self) -> int:
        return self._max_pending

    def ensure_room(self) -> None:
        """Raise PublisherFull while `max_pending` signals wait: call before a write commits.

        No I/O. The refusal is logged once per interval while it lasts.
        """
        if len(self._queue) < self._max_pending:
            return
        self.refused += 1
        now = time.monotonic()
        if now - self._last_refusal_log >= _LOG_EVERY:
            self._last_refusal_log = now
            logger.error(
                "live publisher has %d signals waiting for Redis (the bound is %d): refusing new writes, %d so far",
                len(self._queue),
                self._max_pending,
                self.refused,
            )
        raise PublisherFull(PublisherFull.reason)

    def publish_soon(self, topic: str, message: dict[str, Any]) -> None:
        """Queue one message; it is sent in the background, retried until it succeeds.

        Call from the event loop's thread (async context). Encoding problems raise here.
        """
        self._enqueue(topic, message, None)

    async def publish_confirmed(self, topic: str, message: dict[str, Any], *, timeout: float) -> bool:
        """Like `publish_soon`, then wait until this message is published (True).

        False if `timeout` passes first (it stays queued and keeps being retried) or
        if the publisher stopped before sending it. For a caller that answers OK only after the
        signal is out; cancelling the wait does not cancel the publish.
        """
        return await self.publish_all_confirmed([(topic, message)], timeout=timeout)

    async def publish_all_confirmed(self, messages: Sequence[tuple[str, dict[str, Any]]], *, timeout: float) -> bool:
        """`publish_confirmed` for several messages of one change (a move's arrival and its removal): all are
        queued before anything is awaited, so a wait cancelled by a client that went away never leaves one
        of them unqueued. True once every one is published; False if `timeout` passes first (they stay
        queued and keep being retried)."""
        loop = asyncio.get_running_loop()
        encoded = [(topic, encode_message(message)) for topic, message in messages]  # all encode, or none is queued
        waiters: list[asyncio.Future[bool]] = []
        for topic, payload in encoded:
            waiter: asyncio.Future[bool] = loop.create_future()
            self._append(topic, payload, waiter)
            waiters.append(waiter)
        # The waiters themselves are awaited, and settled False when the time is up: a cancelled wait cancels
        # only the waiters (the sender skips a waiter that is done), never the queued messages.
        timer = loop.call_later(timeout, _settle_all, waiters, False)
        try:
            published = True
            for waiter in waiters:
                published = await waiter and published
            return published
        finally:
            timer.cancel()
            for waiter in waiters:
                waiter.cancel()  # a wait cut short: the sender skips them

    def _enqueue(self, topic: str, message: dict[str, Any], waiter: asyncio.Future[bool] | None) -> None:
        self._append(topic, encode_message(message), waiter)  # fails now, in the caller, if it can never be sent

    def _append(self, topic: str, payload: bytes, waiter: asyncio.Future[bool] | None) -> None:
        if self._closed:
            raise RuntimeError("publisher is closed")
        loop = asyncio.get_running_loop()
        # Never refused here: the change has committed (the bound is ensure_room, before the commit).
        self._seq += 1
        self._queue.append((self._seq, self._hub.wire(topic), payload, waiter))
        self._idle.clear()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="buzz-live-publisher")

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far is published; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def aclose(self, timeout: float = 5.0) -> bool:
        """Flush for up to `timeout`, then stop the sender. True if nothing was left."""
        flushed = await self.flush(timeout)
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=1.0)
        if self._queue:
            logger.error("live publisher stopped with %d signals unsent", len(self._queue))
        for _, _, _, waiter in self._queue:
            if waiter is not None and not waiter.done():
                waiter.set_result(False)
        return flushed

    async def _run(self) -> None:
        failures = 0
        failing_since = 0.0
        last_log = 0.0
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = [self._queue[i] for i in range(min(self._batch_max, len(self._queue)))]
            try:
                await self._hub.publish_encoded([(wire, payload) for _, wire, payload, _ in batch])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                now = loop.time()
                if failures == 1:
                    failing_since = last_log = now
                    logger.warning("live publish failed, retrying: %s", exc)
                elif now - last_log >= _LOG_EVERY:
                    last_log = now
                    logger.warning(
                        "live publish still failing after %.0fs (%d attempts, %d pending): %s",
                        now - failing_since,
                        failures,
                        len(self._queue),
                        exc,
                    )
                await asyncio.sleep(_backoff(failures, self._retry_base, self._retry_cap))
                continue
            if failures:
                logger.info("live publish recovered after %d failed attempts", failures)
                failures = 0
            last_seq = batch[-1][0]
            while self._queue and self._queue[0][0] <= last_seq:
                waiter = self._queue.popleft()[3]
                if waiter is not None and not waiter.done():
                    waiter.set_result(True)


def _settle(waiter: asyncio.Future[bool], value: bool) -> None:
    if not waiter.done():
        waiter.set_result(value)


def _settle_all(waiters: Sequence[asyncio.Future[bool]], value: bool) -> None:
    for waiter in waiters:
        _settle(waiter, value)


@functools.lru_cache(maxsize=8)
def _sync_client(redis_url: str) -> redis.Redis:
    # One client (and connection pool) per URL for the process; redis.Redis is thread-safe.
    # redis-py's own retries are off: _publish_blocking retries by itself.
    return redis.Redis.from_url(
        redis_url,
        socket_connect_timeout=2.0,
        socket_timeout=2.0,
        retry=Retry(NoBackoff(), 0),
    )


def _publish_blocking(redis_url: str, wire: str, payload: bytes, log_every: float = _LOG_EVERY) -> bool:
    """PUBLISH until Redis takes it; True then. Never gives up: the change it signals has committed."""
    failures = 0
    failing_since = last_log = 0.0
    while True:
        try:
            _sync_client(redis_url).publish(wire, payload)
        except (redis.RedisError, OSError) as exc:
            failures += 1
            now = time.monotonic()
            if failures == 1:
                failing_since = last_log = now
                logger.warning("live publish to %r failed, retrying until Redis takes it: %s", wire, exc)
            elif now - last_log >= log_every:
                last_log = now
                logger.warning(
                    "live publish to %r still failing after %.0fs (%d attempts), still retrying: %s",
                    wire,
                    now - failing_since,
                    failures,
                    exc,
                )
            time.sleep(_backoff(failures, 0.05, 2.0))
            continue
        if failures:
            logger.info("live publish to %r recovered after %d failed attempts", wire, failures)
        return True


def publish_blocking_on_commit(
    redis_url: str,
    topic: str,
    message: dict[str, Any],
    *,
    prefix: str = "buzz:",
    using: str | None = None,
) -> None:
    """After the current transaction commits, PUBLISH `message` on `topic` (sync ORM side).

    Outside a transaction Django runs the callback at once. The callback blocks the
    committing thread until Redis takes the message, however long an outage lasts (a
    management command waits for it; its log says so once per interval). Nothing is
    published if the transaction rolls back.
    """
    from django.db import transaction

    payload = encode_message(message)
    wire = prefix + topic
    transaction.on_commit(
        functools.partial(_publish_blocking, redis_url, wire, payload),
        using=using,
        robust=True,
    )
