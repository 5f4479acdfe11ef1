"""Process-wide resources with one owner: the async PostgreSQL pool and the Redis client.

Hot paths (ingest, reads on the WebSocket) use async psycopg from this pool
instead of the ORM through `sync_to_async`, whose default thread-sensitive mode
runs every call of a process on one thread (DESIGN.md, measured facts).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import psycopg
from django.conf import settings
from psycopg import AsyncConnection, OperationalError
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

import buzz.sqlarrays  # noqa: F401 - its array dumpers are registered before any pool connects
from buzz.live.hub import Hub
from buzz.live.publisher import Publisher
from buzz.orm import socket_has_input

T = TypeVar("T")


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


@contextlib.asynccontextmanager
async def pipeline(conn: AsyncConnection[Any]) -> AsyncIterator[None]:
    """`conn.pipeline()`, except that a connection whose pipeline failed is closed (its pool replaces it).

    psycopg 3.3 records a statement as prepared when it sends the statement's first PREPARE, before the
    server has run it. In a pipeline that an earlier statement's error aborts, the server skips that
    PREPARE, and every later execution of the statement on that connection fails with "prepared statement
    ... does not exist", for as long as the connection lives. (psycopg forgets its prepared statements on
    a ROLLBACK, but only on the first since it last did: tests/chat/test_pipeline_failure.py.) So the
    connection is closed when the server failed a statement of the pipeline (a database error, or a
    transaction left in error) or when the pipeline was interrupted (a cancel). Those are rare (a statement
    budget, a lost backend, a refused privilege), and a new connection is cheap beside a poisoned one. An
    error of the caller's own (a refusal decided between statements) leaves the connection as it is.
    """
    try:
        async with conn.pipeline():
            yield
    except BaseException as exc:
        failed = isinstance(exc, psycopg.Error) or not isinstance(exc, Exception)
        if failed or conn.info.transaction_status in (TransactionStatus.INERROR, TransactionStatus.UNKNOWN):
            await conn.close()
        raise


# The write pool's sessions plan every statement once, generically (WRITE_SESSION_OPTIONS). Its statements
# are the hot writes, all exact-key lookups whose generic plans tests/chat/test_hot_plans.py checks on
# never-analyzed tables. Left to choose, PostgreSQL kept planning some of them (the kind-9 statement, an
# edit's read) on every execution: a custom plan folds the parameters in (a message with no thread root
# loses the root lookup), so it always looks cheaper than the generic one, and planning a statement of
# that size cost the server about 1.2 ms of CPU per write, more than running it (docs/operations.md,
# "Workers and pools").
WRITE_SESSION_OPTIONS = "-c plan_cache_mode=force_generic_plan"


def read_session_options() -> str:
    """The main pool's sessions: every statement is cancelled past BUZZ_READ_STATEMENT_BUDGET_MS (a read with a
    budget of its own sets statement_timeout for its transaction, which overrides this)."""
    return f"-c statement_timeout={int(settings.BUZZ_READ_STATEMENT_BUDGET_MS)}"


async def _open_pool(
    min_size: int, max_size: int, timeout: float, *, options: str | None = None
) -> AsyncConnectionPool[AsyncConnection[Any]]:
    kwargs: dict[str, Any] = {"autocommit": True, "row_factory": tuple_row, "prepare_threshold": 2}
    if options is not None:
        # Given here, `options` replaces libpq's PGOPTIONS: the operator's come first, then ours.
        kwargs["options"] = f"{os.environ.get('PGOPTIONS', '')} {options}".strip()
    pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
        conninfo_from_settings(),
        min_size=min_size,
        max_size=max_size,
        kwargs=kwargs,
        open=False,
        timeout=timeout,
        check=check_pooled,
    )
    await pool.open(wait=min_size > 0, timeout=timeout)
    return pool


class Runtime:
    """Owns the pool for the running event loop; a new loop (tests) gets a new pool."""

    def __init__(self) -> None:
        self._pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._snapshots: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._writes: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        # An app's pools of sessions set up for one kind of work (`session_pool`), by name.
        self._sessions: dict[str, AsyncConnectionPool[AsyncConnection[Any]]] = {}
        self._sessions_loop: asyncio.AbstractEventLoop | None = None
        self._shared: dict[str, Any] = {}
        self._shared_loop: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._redis: Redis | None = None
        self._redis_loop: asyncio.AbstractEventLoop | None = None
        self._hub: Hub | None = None
        self._publisher: Publisher | None = None
        self._hub_loop: asyncio.AbstractEventLoop | None = None

    async def pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """The pool of the hot paths: head reads, access checks, short reads, writes other than those of
        `write_pool`."""
        pools = await self._pools()
        return pools[0]

    async def write_pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """Connections of their own for the write statements of kind-9 messages and NIP-AR revisions, so that
        reads holding `pool`'s connections never make a write wait; any other statement belongs in `pool`."""
        pools = await self._pools()
        return pools[2]

    async def snapshot_pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """Connections of their own for long read-only snapshots (NIP-AR sync rule 2), so that slow
        snapshots never take the write path's connections."""
        pools = await self._pools()
        return pools[1]

    async def _pools(self) -> tuple[AsyncConnectionPool[AsyncConnection[Any]], ...]:
        loop = asyncio.get_running_loop()
        if self._pool is not None and self._snapshots is not None and self._writes is not None and self._loop is loop:
            return self._pool, self._snapshots, self._writes
        if self._lock is None or self._loop is not loop:
            self._lock = asyncio.Lock()
            self._loop = loop
            self._pool = self._snapshots = self._writes = None
        async with self._lock:
            if self._pool is None or self._snapshots is None or self._writes is None:
                limits = settings.BUZZ_DB_POOL
                timeout = limits["timeout"]
                self._pool = await _open_pool(
                    limits["min_size"], limits["max_size"], timeout, options=read_session_options()
                )
                self._snapshots = await _open_pool(0, limits["snapshot_max_size"], timeout)
                # Opened on the first write, then kept (psycopg_pool closes an idle one after 10 min).
                self._writes = await _open_pool(0, limits["write_max_size"], timeout, options=WRITE_SESSION_OPTIONS)
        if self._pool is None or self._snapshots is None or self._writes is None:
            raise RuntimeError("database pool failed to open")
        return self._pool, self._snapshots, self._writes

    async def session_pool(
        self, name: str, *, max_size: int, options: str
    ) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """An app's pool `name` for the running loop: at most `max_size` connections, opened when first used,
        whose sessions start with `options` (PostgreSQL's `-c name=value`, after the operator's PGOPTIONS), so
        that work needing the same session settings on every use (an isolation level, a statement budget)
        does not send them in each of its transactions. The first call of a loop decides the size and the
        options; closed with the other pools."""
        loop = asyncio.get_running_loop()
        if self._sessions_loop is not loop:
            self._sessions, self._sessions_loop = {}, loop
        pool = self._sessions.get(name)
        if pool is None:
            pool = await _open_pool(0, max_size, settings.BUZZ_DB_POOL["timeout"], options=options)
            # Another task may have opened it meanwhile (the open awaited): keep the first, close this one.
            if name in self._sessions:
                await pool.close()
                return self._sessions[name]
            self._sessions[name] = pool
        return pool

    def shared(self, name: str, factory: Callable[[], T]) -> T:
        """A process-wide object of an app (e.g. a reader shared by every sync), one per event loop.

        The runtime owns it like the pool and the hub, so no app keeps connection state in a module global.
        """
        loop = asyncio.get_running_loop()
        if self._shared_loop is not loop:
            self._shared, self._shared_loop = {}, loop
        if name not in self._shared:
            self._shared[name] = factory()
        value: T = self._shared[name]
        return value

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
            self._publisher = Publisher(self._hub, max_pending=settings.BUZZ_PUBLISH_MAX_PENDING)
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
        sessions, self._sessions = self._sessions, {}
        for pool in (self._pool, self._snapshots, self._writes, *sessions.values()):
            if pool is not None:
                await pool.close()
        self._pool = self._snapshots = self._writes = None
        client, self._redis = self._redis, None
        if client is not None:
            await client.aclose()


runtime = Runtime()


async def fetch_all(sql: Any, params: Any, *, conn: AsyncConnection[Any] | None = None) -> list[Any]:
    """The rows of one statement: on `conn` (in its transaction or snapshot), or on a connection of the main
    pool held for that statement alone."""
    if conn is not None:
        return await (await conn.execute(sql, params)).fetchall()
    pool = await runtime.pool()
    async with pool.connection() as own:
        return await (await own.execute(sql, params)).fetchall()
