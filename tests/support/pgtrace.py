"""Count the database round trips of code that uses buzz.runtime's pools, from libpq's own protocol trace.

Every connection the pool hands out while a window is open has libpq tracing on
(`conn.pgconn.trace(fd)`, psycopg's binding of PQtrace): libpq writes each protocol message
the client sends ("F") and receives ("B"). The client waits for the server after each Sync
(extended protocol: one statement with parameters, or the Parse of a prepared statement), after
each Flush (pipeline mode: the statements sent since the last wait, whose results are wanted now)
and after each simple Query (a statement without parameters). So the round trips are the frontend
Sync, Flush and Query messages, counted per window:

    tracer = PoolTracer(await runtime.pool(), await runtime.write_pool())
    async with tracer.window() as trips:
        await ingest(actor, event)
    trips.total, trips.statements, trips.prepares

A Sync that follows a Parse with no Bind is the extra round trip psycopg spends preparing a
statement the third time a connection runs it (prepare_threshold=2); `prepares` counts those
apart, so a caller can measure a steady state (a warmed-up connection) and say so.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import IO, Any

from psycopg import AsyncConnection, pq
from psycopg_pool import AsyncConnectionPool

_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
# Each traced message starts a line with its direction and length; a statement's own newlines don't.
_MESSAGE = re.compile(r"\n(?=[FB]\t\d+\t)")


@dataclass
class Trips:
    """The round trips of one window: each statement's first words, in the order sent, and the prepares."""

    statements: list[str] = field(default_factory=list)
    prepares: int = 0

    @property
    def total(self) -> int:
        return len(self.statements) + self.prepares

    def __str__(self) -> str:
        shown = "; ".join(self.statements)
        return f"{self.total} round trips ({self.prepares} prepares): {shown}"


def _label(sql: str) -> str:
    words = " ".join(sql.replace("\\n", " ").split())
    if words.upper().startswith("WITH"):
        names = re.findall(r"(?:WITH|\),) ?(\w+) AS ?\(", words)
        return f"WITH {','.join(names)}"
    return words if len(words) <= 60 else words[:57] + "..."


def parse_trace(text: str, named: dict[str, str]) -> Trips:
    """Trips from a libpq trace (PQTRACE_SUPPRESS_TIMESTAMPS). `named` maps prepared statement names to
    their SQL across windows (a statement prepared in one window is executed by name in later ones)."""
    trips = Trips()
    parsed: str | None = None  # SQL of a Parse since the last wait
    bound: list[str] = []  # SQL of the Binds since the last wait (several in pipeline mode)
    for entry in _MESSAGE.split(text):
        fields = entry.split("\t", 3)
        if len(fields) < 3 or fields[0] != "F":
            continue
        message, rest = fields[2].strip(), fields[3] if len(fields) > 3 else ""
        quoted = _QUOTED.findall(rest)
        if message == "Query":
            trips.statements.append(_label(quoted[0] if quoted else rest))
        elif message == "Parse" and len(quoted) >= 2:
            name, sql = quoted[0], quoted[1]
            if name:
                named[name] = sql
            parsed = sql
        elif message == "Bind" and len(quoted) >= 2:
            statement = quoted[1]
            bound.append(named.get(statement, parsed or statement) if statement else (parsed or ""))
        elif message in ("Sync", "Flush"):
            # The client waits for the server after each (a Flush: pipeline mode wants results now).
            if bound:
                trips.statements.append(" + ".join(_label(sql) for sql in bound))
            elif parsed is not None:
                trips.prepares += 1
            elif message == "Sync":
                trips.statements.append("(sync)")
            parsed, bound = None, []
    return trips


class PoolTracer:
    """Traces every connection the `pools` hand out (by wrapping each pool object's getconn)."""

    def __init__(self, *pools: AsyncConnectionPool[AsyncConnection[Any]]) -> None:
        self._seen: dict[int, AsyncConnection[Any]] = {}
        self._files: dict[int, IO[bytes]] = {}
        self._named: dict[int, dict[str, str]] = {}
        self._open = False
        for pool in pools:
            self._wrap(pool)

    def _wrap(self, pool: AsyncConnectionPool[AsyncConnection[Any]]) -> None:
        original: Callable[..., Any] = pool.getconn

        async def getconn(timeout: float | None = None) -> AsyncConnection[Any]:
            conn: AsyncConnection[Any] = await original(timeout=timeout)
            self._seen.setdefault(id(conn), conn)
            if self._open and id(conn) not in self._files:
                self._start(conn)
            return conn

        pool.getconn = getconn  # type: ignore[method-assign]

    def _start(self, conn: AsyncConnection[Any]) -> None:
        f = tempfile.TemporaryFile()  # noqa: SIM115 - closed at the end of the window
        self._files[id(conn)] = f
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    @contextlib.asynccontextmanager
    async def window(self) -> AsyncIterator[Trips]:
        """Round trips made on any of the pool's connections while the block runs (filled in at its end)."""
        trips = Trips()
        self._open = True
        for conn in self._seen.values():
            self._start(conn)
        try:
            yield trips
        finally:
            self._open = False
            for key, f in self._files.items():
                self._seen[key].pgconn.untrace()  # flushes libpq's FILE buffer
                f.seek(0)
                got = parse_trace(f.read().decode(errors="replace"), self._named.setdefault(key, {}))
                f.close()
                trips.statements += got.statements
                trips.prepares += got.prepares
            self._files.clear()
