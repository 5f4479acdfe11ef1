"""Process-wide resources with one owner: the async PostgreSQL pool and the Redis client.

Hot paths (ingest, reads on the WebSocket) use async psycopg from this pool
instead of the ORM through `sync_to_async`, whose default thread-sensitive mode
runs every call of a process on one thread (DESIGN.md, measured facts).
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings
from psycopg import AsyncConnection, OperationalError
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from buzz.live.hub import Hub
from buzz.live.publisher import Publisher
from buzz.orm import socket_has_input


def conninfo_from_settings() -> str:
    db: dict[str, Any] = settings.DATABASES["default"]
    parts = {
        "dbname": db.get("NAME") or "",
        "user": db.get("USER") or "",
        "password": db.get("PASSWORD") or "",
        "host": db.get("HOST") or "",
        "port": str(db.get("PORT") or ""),
    }
    return " ".join(f"{k}='{_escape(v)}'" for k, v in parts.items() if v)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


async def check_pooled(conn: AsyncConnection[Any]) -> None:
    """The pool's checkout check: a connection whose backend died is replaced before anyone uses it.

    An idle connection has nothing to read, so this costs no round trip unless its socket says the
    server hung up (a terminated backend, a server restart); then an empty query decides. Raises if dead.
    """
    if conn.closed or conn.broken:
        raise OperationalError("the connection is closed")
    if socket_has_input(conn.pgconn.socket):
        await AsyncConnectionPool.check_connection(conn)


class Runtime:
    """Owns the pool for the running event loop; a new loop (tests) gets a new pool."""

    def __init__(self) -> None:
        self._pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._redis: Redis | None = None
        self._redis_loop: asyncio.AbstractEventLoop | None = None
        self._hub: Hub | None = None
        self._publisher: Publisher | None = None
        self._hub_loop: asyncio.AbstractEventLoop | None = None

    async def pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        loop = asyncio.get_running_loop()
        if self._pool is not None and self._loop is loop:
            return self._pool
        if self._lock is None or self._loop is not loop:
            self._lock = asyncio.Lock()
            self._loop = loop
            self._pool = None
        async with self._lock:
            if self._pool is None:
                limits = settings.BUZZ_DB_POOL
                pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
                    conninfo_from_settings(),
                    min_size=limits["min_size"],
                    max_size=limits["max_size"],
                    kwargs={"autocommit": True, "row_factory": tuple_row, "prepare_threshold": 2},
                    open=False,
                    timeout=limits["timeout"],
                    check=check_pooled,
                )
                await pool.open(wait=True, timeout=limits["timeout"])
                self._pool = pool
        if self._pool is None:
            raise RuntimeError("database pool failed to open")
        return self._pool

    def redis(self) -> Redis:
        """A command (non-pub/sub) client for the running loop."""
        loop = asyncio.get_running_loop()
        if self._redis is None or self._redis_loop is not loop:
            self._redis = Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
            self._redis_loop = loop
        return self._redis

    def _live(self) -> tuple[Hub, Publisher]:
        loop = asyncio.get_running_loop()
        if self._hub is None or self._publisher is None or self._hub_loop is not loop:
            self._hub = Hub(settings.REDIS_URL, prefix=settings.BUZZ_REDIS_PREFIX)
            self._publisher = Publisher(self._hub)
            self._hub_loop = loop
        return self._hub, self._publisher

    def hub(self) -> Hub:
        """The node's one pub/sub connection (buzz.live.hub)."""
        return self._live()[0]

    def publisher(self) -> Publisher:
        """Publishes after commit and retries until Redis takes it."""
        return self._live()[1]

    async def aclose(self) -> None:
        hub, publisher, self._hub, self._publisher = self._hub, self._publisher, None, None
        if publisher is not None:
            await publisher.flush(timeout=5.0)
        if hub is not None:
            await hub.aclose()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        client, self._redis = self._redis, None
        if client is not None:
            await client.aclose()


runtime = Runtime()
