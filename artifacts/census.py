"""How many NIP-AR syncs are open, across every relay node: what the admin's confirmation pages show.

Each relay process keeps a `Census` (one per event loop, owned by buzz.runtime): its open syncs counted
by (community, channel scope). A sync registers once its scope check has passed and releases its
`Registration` when it ends for any reason (artifacts.sync). Registering is an in-memory counter update
and a "dirty" flag; nothing on that path waits for Redis.

Publication. While the process has any registered sync, and once more when the count drops to zero, a
background task replaces the Redis hash `<BUZZ_REDIS_PREFIX>census:<node id>` (MULTI: DEL, HSET, EXPIRE)
with the process's counts: at most once a second when they changed, and at least every 5 s so that the
15 s TTL never runs out on a live node. A killed node's hash expires within 15 s; no server-side state
outlives the process that owns it.

A field is `"<community id>:<channel>[,<channel>...]"` (the sync's channels, sorted) -> how many open
syncs have exactly that scope; a sync over one channel is the field `"<community id>:<channel>"`. Keeping
the scope whole lets `count_open_syncs` count a sync over several of the asked channels once.

`count_open_syncs` is the synchronous reader for the ORM side (the admin, commands): SCAN the census
keys, read every hash, and count the syncs of the community whose scope meets the asked channels. The
figure lags the relays by up to about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import uuid
from collections.abc import Iterable

import redis
from django.conf import settings
from redis.asyncio import Redis

from buzz.runtime import runtime

log = logging.getLogger(__name__)

KEY_TTL = 15  # seconds: a node's counts vanish this long after its last write (a killed node)
MIN_INTERVAL = 1.0  # seconds between two writes of a changed census
REFRESH_INTERVAL = 5.0  # seconds between writes of an unchanged, non-empty census (keeps the TTL)
READ_TIMEOUT = 2.0  # seconds `count_open_syncs` waits for Redis


def census_key(node_id: str) -> str:
    return f"{settings.BUZZ_REDIS_PREFIX}census:{node_id}"


def scope_field(community_id: int, channels: Iterable[uuid.UUID | str]) -> str:
    """The hash field of a sync scope: community id, then its channels sorted and comma-joined."""
    return f"{community_id}:{','.join(sorted({str(c) for c in channels}))}"


def parse_field(field: str) -> tuple[int, frozenset[str]] | None:
    """(community id, channels) of a hash field; None for anything else."""
    community, sep, channels = field.partition(":")
    if not sep or not channels:
        return None
    try:
        return int(community), frozenset(channels.split(","))
    except ValueError:
        return None


def new_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class Registry:
    """Open syncs per scope field, in memory. Pure: no I/O, no event loop. Counts never go negative."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self.dirty = False  # changed since the last `take`

    def add(self, field: str) -> None:
        self._counts[field] = self._counts.get(field, 0) + 1
        self.dirty = True

    def remove(self, field: str) -> None:
        n = self._counts.get(field, 0)
        if n <= 0:
            return  # never registered (or released already): nothing to undo
        if n == 1:
            del self._counts[field]
        else:
            self._counts[field] = n - 1
        self.dirty = True

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def total(self) -> int:
        return sum(self._counts.values())

    def take(self) -> dict[str, int]:
        """The counts to publish; clears `dirty`."""
        self.dirty = False
        return dict(self._counts)


class Registration:
    """One sync's place in the census. `release` is idempotent, so every way a sync ends may call it."""

    def __init__(self, census: Census, field: str) -> None:
        self._census: Census | None = census
        self.field = field

    def release(self) -> None:
        census, self._census = self._census, None
        if census is not None:
            census.unregister(self.field)


class Census:
    """This process's registry and the background task that publishes it (one per event loop)."""

    def __init__(self, node_id: str | None = None) -> None:
        self.node_id = node_id or new_node_id()
        self.key = census_key(self.node_id)
        self.registry = Registry()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def register(self, community_id: int, channels: Iterable[uuid.UUID | str]) -> Registration:
        field = scope_field(community_id, channels)
        self.registry.add(field)
        self._changed()
        return Registration(self, field)

    def unregister(self, field: str) -> None:
        self.registry.remove(field)
        self._changed()

    def _changed(self) -> None:
        if not self.registry.dirty:
            return
        self._wake.set()
        if self._task is None or self._task.done():
            with contextlib.suppress(RuntimeError):  # no running loop: a pure caller, nothing to publish
                self._task = asyncio.get_running_loop().create_task(self._publish(), name="sync-census")

    async def _publish(self) -> None:
        """Write while there is something to say; return once an empty census has been written."""
        loop = asyncio.get_running_loop()
        last = -REFRESH_INTERVAL
        while True:
            if not self.registry.dirty:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, last + REFRESH_INTERVAL - loop.time())):
                        await self._wake.wait()
            self._wake.clear()
            gap = last + MIN_INTERVAL - loop.time()
            if gap > 0:
                await asyncio.sleep(gap)
            counts = self.registry.take()
            try:
                await self._write(runtime.redis(), counts)
            except Exception as exc:  # a Redis outage, say: the next round retries
                self.registry.dirty = True
                if not self._failing:
                    log.warning("sync census: could not publish %s: %s", self.key, exc)
                self._failing = True
            else:
                if self._failing:
                    log.info("sync census: publishing %s again", self.key)
                self._failing = False
            last = loop.time()
            if not counts and not self.registry.dirty:
                return  # zero written: nothing to refresh until a sync registers again

    async def _write(self, client: Redis, counts: dict[str, int]) -> None:
        async with client.pipeline(transaction=True) as pipe:
            pipe.delete(self.key)
            if counts:
                pipe.hset(self.key, mapping=counts)  # type: ignore[arg-type]
                pipe.expire(self.key, KEY_TTL)
            await pipe.execute()


def census() -> Census:
    """The running loop's census (buzz.runtime owns it, like the pool and the hub)."""
    return runtime.shared("artifacts.census", Census)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def count_open_syncs(community_id: int, channels: Iterable[uuid.UUID | str]) -> int:
    """How many NIP-AR syncs open now on any relay node cover at least one of `channels` of the community.

    A sync over several of them counts once. Synchronous (the admin, commands). 0, and a log line, when
    Redis can't be asked: no action depends on this figure.
    """
    wanted = {str(c) for c in channels}
    if not wanted:
        return 0
    pattern = _glob_escape(settings.BUZZ_REDIS_PREFIX) + "census:*"
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=READ_TIMEOUT, socket_connect_timeout=READ_TIMEOUT
        )
        try:
            keys = list(client.scan_iter(match=pattern, count=500))
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            hashes = pipe.execute() if keys else []
        finally:
            client.close()
    except redis.RedisError as exc:
        log.warning("could not count open syncs (Redis): %s", exc)
        return 0
    total = 0
    for fields in hashes:
        for raw_field, raw_count in fields.items():
            parsed = parse_field(raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field))
            if parsed is None or parsed[0] != community_id or not parsed[1] & wanted:
                continue
            with contextlib.suppress(ValueError):
                total += max(0, int(raw_count))
    return total
