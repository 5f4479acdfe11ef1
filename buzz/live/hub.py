"""The node-level live layer: one Redis pub/sub connection per process, fanned out locally.

Sync (NIP-AR rules 1 and 5) needs three things that a generic channel layer does
not give (DESIGN.md, "channels_redis does not give the guarantees sync needs"):

* `Hub.subscribe` returns only after Redis has answered SUBSCRIBE for every topic
  on a connection that is up, so a caller may open its snapshot right after it.
* Every loss is reported. A dropped connection, a PING left without PONG, a full
  local queue or a payload that cannot be decoded calls `Listener.on_loss` on each
  subscription it can affect, and that subscription is dead from then on.
* Nothing reconnects in place. After a drop the hub opens a new connection with
  capped, jittered backoff; the old subscriptions stay dead and their owners
  subscribe again (a sync answers CLOSED "resync: ...").

The hub talks to Redis through a bare `redis.asyncio` connection instead of
`redis.asyncio.client.PubSub`, because PubSub reconnects and re-subscribes by
itself when a read fails (`PubSub._execute` -> `PubSub._reconnect` ->
`PubSub.on_connect`), and that silent gap is exactly the loss sync must see.
Each pub/sub connection object is used for one Redis session only: its connect
hook refuses a second handshake, so an accidental implicit reconnect inside
redis-py fails loudly instead of yielding a connection with no subscriptions.

Publishing goes through one more connection of the hub's own (not a redis-py client and its pool): the
process's Publisher sends one pipelined batch at a time, so one connection is all it needs, and the
client's pipeline layer cost about 35 µs of CPU per batch on top of the connection's own work (about 55
µs against 90 for one PUBLISH, this machine). Any failure on it closes it, and the next batch connects
again.

Everything runs on the event loop of the process (uvicorn has one). The process's
hub is owned by buzz.runtime; this module keeps no state of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import secrets
from collections import deque
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any, Protocol

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = [
    "Hub",
    "HubUnavailable",
    "Listener",
    "LossReason",
    "Subscription",
    "decode_message",
    "encode_message",
    "topic_for_channel",
    "topic_for_community",
]

logger = logging.getLogger("buzz.live")

# How long a connection must stay healthy before the reconnect backoff starts
# again from its first step. A server that accepts and then drops connections
# keeps the delay growing instead of being hammered every `_BACKOFF_BASE`.
_STABLE_AFTER = 5.0
_BACKOFF_BASE = 0.1
_BACKOFF_CAP = 5.0
# Connection arguments a pool adds for RESP3 only; the hub's pub/sub connection is RESP2.
_RESP3_ONLY_KWARGS = (
    "maint_notifications_config",
    "maint_notifications_pool_handler",
    "oss_cluster_maint_notifications_handler",
)
# The drain task of a subscription yields to the loop after this many messages.
_DRAIN_BATCH = 64


class HubUnavailable(Exception):
    """The hub cannot register live interest now (connection down, or the hub is closed)."""


class LossReason(StrEnum):
    DISCONNECTED = "disconnected"  # the pub/sub connection dropped or stopped answering PING
    RECONNECTED = "reconnected"  # reserved: this hub never reconnects in place, see the module doc
    OVERFLOW = "overflow"  # this subscription's local queue was full
    UNDECODABLE = "undecodable"  # a payload on one of its topics was not a UTF-8 JSON object
    CLOSED = "closed"  # the hub was closed


class Listener(Protocol):
    def on_message(self, topic: str, message: dict[str, Any]) -> None:
        """One message, on the subscription's drain task (or, for an inline subscription, on the
        hub's reader itself). Must not block; must not raise.

        `message` is shared by every subscription of the topic: treat it as read-only.
        """

    def on_loss(self, reason: LossReason, detail: str) -> None:
        """Called at most once; afterwards the subscription receives nothing and is dead."""


def topic_for_community(community_id: int) -> str:
    """Topic for signals that concern a whole community (the prefix is added on the wire)."""
    return f"community:{_community(community_id)}"


def topic_for_channel(community_id: int, channel: str) -> str:
    """Topic for signals about one channel of a community. The channel id comes last,
    so a channel id containing ':' cannot collide with another topic."""
    if not isinstance(channel, str) or not channel:
        raise ValueError("channel must be a non-empty string")
    return f"community:{_community(community_id)}:channel:{channel}"


def _community(community_id: int) -> int:
    if isinstance(community_id, bool) or not isinstance(community_id, int) or community_id < 0:
        raise ValueError(f"community_id must be a non-negative int, got {community_id!r}")
    return community_id


def encode_message(message: dict[str, Any]) -> bytes:
    """The wire form of a message: compact UTF-8 JSON of an object."""
    if not isinstance(message, dict):
        raise TypeError(f"a hub message is a dict, got {type(message).__name__}")
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def decode_message(data: bytes) -> dict[str, Any]:
    """Inverse of `encode_message`; raises ValueError for anything but a UTF-8 JSON object."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(str(exc)) from exc
    if not isinstance(value, dict):
        raise ValueError(f"payload is a JSON {type(value).__name__}, not an object")
    return value


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Subscription:
    """A live-interest handle returned by `Hub.subscribe`.

    It has its own bounded queue and drain task, so a slow listener delays only itself. An inline
    subscription has neither: the hub's reader calls its listener as each message is parsed, so a
    message reaches a thousand listeners without a thousand task switches. Its listener must do no
    more than record the message (it keeps its own backlog bounded: NIP-AR sync resyncs past
    max_events pending changes); there is no queue to overflow.
    """

    def __init__(
        self, hub: Hub, topics: frozenset[str], listener: Listener, queue_max: int, inline: bool = False
    ) -> None:
        self.topics = topics
        self._hub = hub
        self._listener = listener
        self._queue_max = queue_max
        self._inline = inline
        self._queue: deque[tuple[str, dict[str, Any]]] = deque()
        self._wake = asyncio.Event()
        self._link: _Link | None = None  # the connection whose topic table holds this subscription
        self._active = False  # subscribe() has returned it; messages are queued only from then on
        self._alive = True
        self._closed = False
        self._drain_task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """True until a loss or `close()`. A dead subscription never receives again."""
        return self._alive

    def __repr__(self) -> str:
        state = "alive" if self._alive else "dead"
        return f"<Subscription {sorted(self.topics)!r} {state}>"

    async def close(self) -> None:
        """Stop receiving; UNSUBSCRIBE the topics no other subscription of the hub needs.

        Waits (at most the hub's ping_timeout) for Redis to confirm the UNSUBSCRIBE.
        No `on_loss` is called for a close. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        self._alive = False
        self._queue.clear()
        self._wake.set()
        self._hub._live.discard(self)
        confirmations = self._release()
        if confirmations:
            await asyncio.wait(confirmations, timeout=self._hub._ping_timeout)
        task = self._drain_task
        if task is not None and task is not asyncio.current_task():
            await asyncio.wait({task}, timeout=self._hub._ping_timeout)

    # -- used by the hub and its connection ---------------------------------------

    def _release(self) -> list[asyncio.Future[bool]]:
        link, self._link = self._link, None
        return link.release(self) if link is not None else []

    def _activate(self) -> None:
        self._active = True
        if self._inline:
            return
        self._drain_task = asyncio.get_running_loop().create_task(
            self._drain(), name=f"buzz-hub-drain {sorted(self.topics)!r}"
        )

    def _offer(self, topic: str, message: dict[str, Any]) -> None:
        if self._inline:
            if self._alive:  # an earlier listener of this message may have ended this one
                try:
                    self._listener.on_message(topic, message)
                except Exception:
                    logger.exception("hub listener on_message raised on topic %r", topic)
            return
        if len(self._queue) >= self._queue_max:
            self._lose(LossReason.OVERFLOW, f"more than {self._queue_max} messages pending for this subscription")
            return
        self._queue.append((topic, message))
        self._wake.set()

    def _lose(self, reason: LossReason, detail: str) -> None:
        if not self._alive:
            return
        self._alive = False
        self._queue.clear()
        self._wake.set()
        self._hub._live.discard(self)
        self._release()
        try:
            self._listener.on_loss(reason, detail)
        except Exception:
            logger.exception("hub listener on_loss raised (%s)", reason.value)

    async def _drain(self) -> None:
        delivered = 0
        while self._alive:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            topic, message = self._queue.popleft()
            try:
                self._listener.on_message(topic, message)
            except Exception:
                logger.exception("hub listener on_message raised on topic %r", topic)
            delivered += 1
            if delivered % _DRAIN_BATCH == 0:
                await asyncio.sleep(0)


class _Topic:
    """One wire channel on one connection: who wants it and which replies are awaited."""

    __slots__ = ("name", "sent_subscribe", "sub_waiters", "subs", "unsub_waiters")

    def __init__(self, name: str) -> None:
        self.name = name
        self.subs: set[Subscription] = set()
        # The last command sent for this channel was SUBSCRIBE (True) or UNSUBSCRIBE / none (False).
        self.sent_subscribe = False
        # One future per SUBSCRIBE / UNSUBSCRIBE sent and not yet answered, oldest first.
        # Redis answers each channel of each command once, in command order.
        self.sub_waiters: deque[asyncio.Future[bool]] = deque()
        self.unsub_waiters: deque[asyncio.Future[bool]] = deque()


class _ProtocolError(Exception):
    pass


class _Link:
    """One pub/sub connection: a single Redis session, never reconnected in place."""

    def __init__(self, hub: Hub, conn: AbstractConnection) -> None:
        self._hub = hub
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._topics: dict[bytes, _Topic] = {}
        self._pongs: deque[tuple[bytes, asyncio.Future[bool]]] = deque()
        self._ping_seq = 0
        self._outbox: list[tuple[Any, ...]] = []
        self._outbox_ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.failed: str | None = None
        self.dead = asyncio.Event()

    # -- lifecycle ----------------------------------------------------------------

    async def open(self, connect_timeout: float, ping_timeout: float) -> None:
        """Connect, then prove the session with one PING round trip."""
        # One attempt, no redis-py retry; the hub's supervisor owns retrying.
        async with asyncio.timeout(connect_timeout):
            await self._conn.connect_check_health(retry_socket_connect=False)
        self._spawn(self._read_loop(), "reader")
        self._spawn(self._write_loop(), "writer")
        if not await self.ping(ping_timeout):
            raise RedisConnectionError(self.failed or f"no PONG within {ping_timeout}s after connect")
        if self.failed is not None:
            raise RedisConnectionError(self.failed)

    def start_pinger(self, interval: float, timeout: float) -> None:
        self._spawn(self._ping_loop(interval, timeout), "pinger")

    def fail(self, detail: str) -> None:
        """Mark this session lost. Synchronous, so nobody sees it healthy afterwards."""
        if self.failed is not None:
            return
        self.failed = detail
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        for topic in self._topics.values():
            for fut in (*topic.sub_waiters, *topic.unsub_waiters):
                if not fut.done():
                    fut.set_result(False)
            for sub in topic.subs:
                if sub._link is self:
                    sub._link = None
        self._topics.clear()
        for _, fut in self._pongs:
            if not fut.done():
                fut.set_result(False)
        self._pongs.clear()
        self._outbox.clear()
        self._outbox_ready.set()  # a writer that outlived its cancel sees `failed` and ends
        self._hub._link_failed(self, detail)
        self.dead.set()

    async def dispose(self) -> None:
        self.fail("connection closed")
        for task in self._tasks:
            if not task.done():
                task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1.0)
        try:
            await self._conn.disconnect(nowait=True)
        except Exception as exc:  # closing a broken socket may fail; it is gone either way
            logger.debug("hub: closing pub/sub connection failed: %s", _describe(exc))

    def _spawn(self, coro: Any, role: str) -> None:
        self._tasks.append(self._loop.create_task(coro, name=f"buzz-hub-{role}"))

    # -- topic table (synchronous; commands go out in the order they are queued) -----

    def acquire(self, sub: Subscription) -> list[asyncio.Future[bool]]:
        """Register `sub` on its topics; SUBSCRIBE the ones not subscribed yet.

        Returns the confirmations to await: for each topic, its latest SUBSCRIBE if
        that has not been answered yet. A topic whose last SUBSCRIBE is answered and
        which has not been unsubscribed since is live already.
        """
        if self.failed is not None:
            raise RedisConnectionError(self.failed)
        sub._link = self
        needed: list[bytes] = []
        waits: list[asyncio.Future[bool]] = []
        for name in sub.topics:
            wire = self._hub.wire(name)
            topic = self._topics.get(wire)
            if topic is None:
                topic = self._topics[wire] = _Topic(name)
            topic.subs.add(sub)
            if not topic.sent_subscribe:
                topic.sent_subscribe = True
                fut: asyncio.Future[bool] = self._loop.create_future()
                topic.sub_waiters.append(fut)
                needed.append(wire)
                waits.append(fut)
            elif topic.sub_waiters:
                waits.append(topic.sub_waiters[-1])
        if needed:
            self._send("SUBSCRIBE", *needed)
        return waits

    def release(self, sub: Subscription) -> list[asyncio.Future[bool]]:
        """Drop `sub` from its topics; UNSUBSCRIBE those that nobody needs any more."""
        if self.failed is not None:
            return []
        gone: list[bytes] = []
        waits: list[asyncio.Future[bool]] = []
        for name in sub.topics:
            wire = self._hub.wire(name)
            topic = self._topics.get(wire)
            if topic is None or sub not in topic.subs:
                continue
            topic.subs.discard(sub)
            if not topic.subs and topic.sent_subscribe:
                topic.sent_subscribe = False
                fut: asyncio.Future[bool] = self._loop.create_future()
                topic.unsub_waiters.append(fut)
                gone.append(wire)
                waits.append(fut)
        if gone:
            self._send("UNSUBSCRIBE", *gone)
        return waits

    # -- I/O --------------------------------------------------------------------------

    def _send(self, *args: Any) -> None:
        self._outbox.append(args)
        self._outbox_ready.set()

    async def ping(self, timeout: float) -> bool:
        if self.failed is not None:
            return False
        self._ping_seq += 1
        token = str(self._ping_seq).encode()
        fut: asyncio.Future[bool] = self._loop.create_future()
        self._pongs.append((token, fut))
        self._send("PING", token)
        await asyncio.wait({fut}, timeout=timeout)
        return fut.done() and fut.result()

    async def _ping_loop(self, interval: float, timeout: float) -> None:
        while self.failed is None:
            await asyncio.sleep(interval)
            if not await self.ping(timeout):
                self.fail(f"no PONG within {timeout}s")
                return

    async def _write_loop(self) -> None:
        conn = self._conn
        try:
            # Loops check `failed` too: on Python 3.11 a cancel that races a finishing
            # asyncio.wait_for (redis-py uses one around socket writes) can be swallowed.
            while self.failed is None:
                if not self._outbox:
                    self._outbox_ready.clear()
                    await self._outbox_ready.wait()
                    continue
                commands, self._outbox = self._outbox, []
                await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.fail(f"write failed: {_describe(exc)}")

    async def _read_loop(self) -> None:
        conn = self._conn
        try:
            while self.failed is None:
                # math.inf: block without the socket timeout; the pinger bounds silence.
                reply = await conn.read_response(timeout=math.inf, disconnect_on_error=False)
                self._on_reply(reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.fail(f"read failed: {_describe(exc)}")

    def _on_reply(self, reply: Any) -> None:
        # RESP2 in subscribed mode: every reply is an array tagged with its kind.
        # Outside subscribed mode (no topic yet, or all unsubscribed) PING <token>
        # is answered with the bare token.
        if isinstance(reply, bytes):
            self._on_pong(reply)
            return
        if not isinstance(reply, list) or not reply:
            raise _ProtocolError(f"unexpected reply {reply!r:.80}")
        kind = reply[0]
        if kind == b"message" and len(reply) == 3:
            self._on_message(reply[1], reply[2])
        elif kind == b"subscribe" and len(reply) == 3:
            topic = self._topics.get(reply[1])
            if topic is None or not topic.sub_waiters:
                raise _ProtocolError(f"unrequested subscribe reply for {reply[1]!r}")
            fut = topic.sub_waiters.popleft()
            if not fut.done():
                fut.set_result(True)
        elif kind == b"unsubscribe" and len(reply) == 3:
            topic = self._topics.get(reply[1])
            if topic is None or not topic.unsub_waiters:
                raise _ProtocolError(f"unrequested unsubscribe reply for {reply[1]!r}")
            fut = topic.unsub_waiters.popleft()
            if not fut.done():
                fut.set_result(True)
            if not topic.subs and not topic.sent_subscribe and not topic.sub_waiters and not topic.unsub_waiters:
                del self._topics[reply[1]]
        elif kind == b"pong" and len(reply) == 2:
            self._on_pong(reply[1])
        else:
            raise _ProtocolError(f"unexpected reply {reply!r:.80}")

    def _on_pong(self, token: bytes) -> None:
        if not self._pongs:
            raise _ProtocolError(f"unrequested PONG {token!r:.40}")
        expected, fut = self._pongs.popleft()
        if token != expected:
            raise _ProtocolError(f"PONG {token!r:.40} out of order, expected {expected!r}")
        if not fut.done():
            fut.set_result(True)

    def _on_message(self, wire: bytes, data: Any) -> None:
        topic = self._topics.get(wire)
        if topic is None:
            return  # a late message after UNSUBSCRIBE: nobody here asked for it
        targets = [s for s in topic.subs if s._active and s._alive]
        if not targets:
            return  # subscriptions still inside subscribe(): their snapshot comes later
        try:
            if not isinstance(data, bytes):
                raise ValueError(f"payload of type {type(data).__name__}")
            message = decode_message(data)
        except ValueError as exc:
            detail = f"undecodable payload on topic {topic.name!r}: {exc}"
            for sub in targets:
                sub._lose(LossReason.UNDECODABLE, detail)
            return
        for sub in targets:
            sub._offer(topic.name, message)


class Hub:
    """One per process: owns the pub/sub connection, the publish client and the subscriptions."""

    def __init__(
        self,
        redis_url: str,
        *,
        prefix: str = "buzz:",
        ping_interval: float = 1.0,
        ping_timeout: float = 2.0,
        queue_max: int = 1024,
        connect_timeout: float = 5.0,
    ) -> None:
        if queue_max < 1:
            raise ValueError("queue_max must be at least 1")
        self._redis_url = redis_url
        self._prefix = prefix
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._queue_max = queue_max
        self._connect_timeout = connect_timeout
        #: CLIENT SETNAME of the pub/sub connection (unique per hub, so tests can find it).
        tag = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.client_name = f"buzz-hub-pubsub-{tag}"
        #: CLIENT SETNAME of the publish connection.
        self.publish_client_name = f"buzz-hub-publish-{tag}"
        # Only parses the URL (now, not on the first reconnect); it never opens a connection.
        # RESP2 explicitly: redis-py 8 defaults to RESP3 (push frames for pub/sub) and then
        # attaches maintenance-notification handlers that need a RESP3 parser.
        self._pool = ConnectionPool.from_url(redis_url, protocol=2)
        self._publish_conn: AbstractConnection | None = None
        self._publish_lock = asyncio.Lock()
        self._link: _Link | None = None
        self._healthy = False
        self._changed = asyncio.Event()  # set when healthy or closed; waiters re-check
        self._live: set[Subscription] = set()
        self._supervisor: asyncio.Task[None] | None = None
        self._closed = False
        self._last_error = "not connected yet"

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def healthy(self) -> bool:
        """The pub/sub connection is up and has answered its last PING in time."""
        return self._healthy and self._link is not None and not self._closed

    def wire_topic(self, topic: str) -> str:
        """The Redis channel name of `topic`."""
        return self._prefix + topic

    def wire(self, topic: str) -> bytes:
        """The Redis channel name of `topic` as bytes, as `publish_encoded` takes it."""
        return (self._prefix + topic).encode("utf-8")

    async def start(self) -> None:
        """Start the connection supervisor. Idempotent; `subscribe` calls it."""
        if self._closed:
            raise HubUnavailable("hub is closed")
        if self._supervisor is None or self._supervisor.done():
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name="buzz-hub-supervisor")

    async def subscribe(
        self,
        topics: Iterable[str],
        listener: Listener,
        *,
        wait: float = 5.0,
        queue_max: int | None = None,
        inline: bool = False,
    ) -> Subscription:
        """Register live interest; return once it is active (NIP-AR sync rule 1).

        Returns only after Redis has answered SUBSCRIBE for every topic on the
        current connection and that connection is still healthy. While the
        connection is down, waits up to `wait` seconds in all, then raises
        HubUnavailable. `queue_max` overrides the hub's per-subscription bound.
        `inline`: the listener is called by the hub's reader, without a queue
        or a task of its own (see `Subscription`).
        """
        names = frozenset(topics)
        if not names:
            raise ValueError("subscribe needs at least one topic")
        bound = self._queue_max if queue_max is None else queue_max
        if bound < 1:
            raise ValueError("queue_max must be at least 1")
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        sub = Subscription(self, names, listener, bound, inline)
        while True:
            link = await self._wait_healthy(deadline)
            try:
                waits = link.acquire(sub)
                if waits:
                    await asyncio.wait(waits, timeout=max(0.0, deadline - loop.time()))
            except BaseException:
                sub._release()
                raise
            confirmed = all(f.done() and f.result() for f in waits)
            if confirmed and link is self._link and self.healthy:
                sub._activate()
                self._live.add(sub)
                return sub
            sub._release()
            if link.failed is None and link is self._link:
                # Still connected, but Redis did not answer within `wait`.
                raise HubUnavailable(f"SUBSCRIBE not confirmed within {wait}s")
            # The connection dropped while we waited: try again on the next one.

    async def publish(self, topic: str, message: dict[str, Any]) -> int:
        """PUBLISH once; returns the receiver count.

        Raises on any failure (nothing retries here: the Publisher retries).
        """
        return (await self.publish_many([(topic, message)]))[0]

    async def publish_many(self, items: Sequence[tuple[str, dict[str, Any]]]) -> list[int]:
        """PUBLISH several messages in one pipelined round trip (not a transaction).

        Raises on any failure; then some of them may have been published already.
        """
        return await self.publish_encoded([(self.wire(topic), encode_message(message)) for topic, message in items])

    async def publish_encoded(self, items: Sequence[tuple[bytes, bytes]]) -> list[int]:
        """`publish_many` of (wire topic, payload) pairs already encoded (`wire`, `encode_message`), on the
        hub's publish connection. Raises on any failure, and the connection is closed."""
        if not items:
            return []
        async with self._publish_lock:
            conn = await self._publish_connection()
            try:
                await conn.send_packed_command(
                    conn.pack_commands([(b"PUBLISH", wire, payload) for wire, payload in items]), check_health=False
                )
                replies = [await conn.read_response() for _ in items]
            except BaseException:
                # A reply not read, an error, a cancel: what is left on this connection is unknown.
                self._publish_conn = None
                await conn.disconnect(nowait=True)
                raise
        return [int(n) for n in replies]

    async def aclose(self) -> None:
        """Close the hub: every live subscription gets on_loss(CLOSED). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._healthy = False
        self._changed.set()
        link, self._link = self._link, None
        for sub in list(self._live):
            sub._lose(LossReason.CLOSED, "hub closed")
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.wait({self._supervisor})
        if link is not None:
            await link.dispose()
        async with self._publish_lock:
            conn, self._publish_conn = self._publish_conn, None
            if conn is not None:
                await conn.disconnect(nowait=True)

    # -- internals -------------------------------------------------------------------

    async def _publish_connection(self) -> AbstractConnection:
        if self._closed:
            raise HubUnavailable("hub is closed")
        conn = self._publish_conn
        if conn is None or not conn.is_connected:
            # The Publisher retries, with its own backoff; a read waits at most connect_timeout.
            conn = self._connection(self.publish_client_name, socket_timeout=self._connect_timeout)
            try:
                await conn.connect()
            except BaseException:
                await conn.disconnect(nowait=True)
                raise
            self._publish_conn = conn
        return conn

    async def _wait_healthy(self, deadline: float) -> _Link:
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise HubUnavailable("hub is closed")
            link = self._link
            if link is not None and self._healthy:
                return link
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise HubUnavailable(f"pub/sub connection unavailable: {self._last_error}")
            try:
                async with asyncio.timeout(remaining):  # not wait_for: it can swallow a cancel on 3.11
                    await self._changed.wait()
            except TimeoutError:
                raise HubUnavailable(f"pub/sub connection unavailable: {self._last_error}") from None

    def _new_connection(self) -> AbstractConnection:
        handshakes = 0

        async def handshake_once(conn: AbstractConnection) -> None:
            nonlocal handshakes
            handshakes += 1
            if handshakes > 1:
                raise RedisConnectionError("hub pub/sub connections are never reconnected in place")
            await conn.on_connect()

        # No socket timeout: the handshake is bounded by connect_timeout, reads block on purpose and the
        # pinger bounds a stuck write.
        return self._connection(self.client_name, socket_timeout=None, redis_connect_func=handshake_once)

    def _connection(self, client_name: str, **overrides: Any) -> AbstractConnection:
        """A new, unconnected connection of the hub's own (pub/sub or publish), from the URL's settings."""
        kwargs = dict(self._pool.connection_kwargs)
        for key in _RESP3_ONLY_KWARGS:  # present if the URL itself asked for protocol=3
            kwargs.pop(key, None)
        kwargs.update(
            client_name=client_name,
            protocol=2,  # pub/sub replies as tagged arrays, no RESP3 push handling
            decode_responses=False,
            health_check_interval=0,  # the hub pings itself; redis-py's check would eat replies
            retry=Retry(NoBackoff(), 0),  # nothing retries inside redis-py: the hub and the Publisher do
            socket_connect_timeout=self._connect_timeout,
            **overrides,
        )
        conn: AbstractConnection = self._pool.connection_class(**kwargs)
        return conn

    def _link_failed(self, link: _Link, detail: str) -> None:
        if link is not self._link:
            return  # a connection that never became current, or one already replaced
        self._link = None
        self._healthy = False
        self._changed.clear()
        self._last_error = detail
        lost = list(self._live)
        if lost:
            logger.warning("hub: pub/sub connection lost (%s); ending %d subscriptions", detail, len(lost))
        else:
            logger.warning("hub: pub/sub connection lost (%s)", detail)
        for sub in lost:
            sub._lose(LossReason.DISCONNECTED, detail)

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        attempt = 0
        while not self._closed:
            link: _Link | None = None
            try:
                link = _Link(self, self._new_connection())
                await link.open(self._connect_timeout, self._ping_timeout)
                self._link = link
                self._healthy = True
                self._changed.set()
                if attempt:
                    logger.info("hub: pub/sub connection restored after %d attempts", attempt)
                link.start_pinger(self._ping_interval, self._ping_timeout)
                up_since = loop.time()
                await link.dead.wait()
                if loop.time() - up_since >= _STABLE_AFTER:
                    attempt = 0
            except asyncio.CancelledError:
                if link is not None:
                    await link.dispose()
                raise
            except Exception as exc:
                self._last_error = _describe(exc)
                if attempt == 0 or attempt % 10 == 0:
                    logger.warning("hub: pub/sub connect failed (%s)", self._last_error)
            if link is not None:
                await link.dispose()
            attempt += 1
            step = min(_BACKOFF_CAP, _BACKOFF_BASE * 2.0 ** min(attempt - 1, 16))
            await asyncio.sleep(step / 2 + random.uniform(0, step / 2))  # noqa: S311 (jitter, not crypto)
