"""Process-wide resources with one owner: the async PostgreSQL pool.

Hot paths (ingest, reads on the WebSocket) use async psycopg from this pool
instead of the ORM through `sync_to_async`, whose default thread-sensitive mode
runs every call of a process on one thread (DESIGN.md, measured facts).
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings
from psycopg import AsyncConnection
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool


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


class Runtime:
    """Owns the pool for the running event loop; a new loop (tests) gets a new pool."""

    def __init__(self) -> None:
        self._pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

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
                )
                await pool.open(wait=True, timeout=limits["timeout"])
                self._pool = pool
        assert self._pool is not None
        return self._pool

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


runtime = Runtime()
