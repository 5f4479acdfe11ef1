"""Stored events: the NIP-01 filter reader (REQ and COUNT). The writer is buzz.events.store.

Reads run on async psycopg (buzz.runtime). Access is decided by the caller
through `readable_channels`; an event bound to a channel is returned only when
its channel is in that set.

The statement budget. Every statement runs on the main pool, whose sessions cancel a statement past
BUZZ_READ_STATEMENT_BUDGET_MS: a page or a COUNT cut short that way raises ReadOverBudget, and the REQ or
COUNT ends with CLOSED "error: ..." (no EOSE, no count), never with what it read so far as if it were all.

Read slots. Each statement (a page of a REQ, a COUNT) runs holding a slot of its
connection (`BUZZ_READS_PER_CONNECTION`, 2) and one of the process (`BUZZ_READ_SLOTS`),
so a few clients with many large REQs can't take every database connection and stall
everyone else: a read beyond the bound waits, and after READ_SLOT_WAIT seconds it fails
with `ReadsBusy` (the REQ or COUNT is CLOSED with `rate-limited:`). A slot is held only
while a statement runs, never while a page waits for the client.

Indexes (migration 0004_req_page_indexes): a filter naming one channel (and one kind) is
written with `=`, so that PostgreSQL walks (community, channel, kind, created_at DESC, id)
in the page's order and stops at the page's limit; `= ANY` of one value would not.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import psycopg
from django.conf import settings

from buzz.access.policy import parse_channel_id
from buzz.nostr.filters import Filter
from buzz.runtime import runtime

# Seconds a read waits for a slot before it gives up (rate-limited:).
READ_SLOT_WAIT = 10.0
RATE_LIMITED = "rate-limited: too many stored reads at once on this relay, try again"


class ReadsBusy(Exception):
    """No read slot came free within READ_SLOT_WAIT; nothing was read."""


class ReadOverBudget(Exception):
    """PostgreSQL cancelled a stored read's statement past BUZZ_READ_STATEMENT_BUDGET_MS (the main pool's
    statement_timeout, buzz.runtime.read_session_options). Its text is the CLOSED reason."""

    def __init__(self) -> None:
        super().__init__(
            f"error: the query ran past the relay's {int(settings.BUZZ_READ_STATEMENT_BUDGET_MS)} ms statement"
            " budget; narrow the filter and try again"
        )


class ReadSlots:
    """The process's bound on concurrent stored reads, with each connection's own bound inside it."""

    def __init__(self, per_process: int) -> None:
        if per_process < 1:
            raise ValueError("at least one read slot")
        self.size = per_process
        self._process = asyncio.Semaphore(per_process)
        self.in_use = 0
        #: The most slots held at once since the start (what a test checks against the bound).
        self.peak = 0

    @contextlib.asynccontextmanager
    async def hold(self, connection: asyncio.Semaphore | None, *, wait: float = READ_SLOT_WAIT) -> AsyncIterator[None]:
        """One slot of `connection` (if given), then one of the process; ReadsBusy past `wait` seconds."""
        async with contextlib.AsyncExitStack() as stack:
            try:
                async with asyncio.timeout(wait):
                    if connection is not None:
                        await connection.acquire()
                        stack.callback(connection.release)
                    await self._process.acquire()
            except TimeoutError:
                raise ReadsBusy(RATE_LIMITED) from None
            stack.callback(self._release)
            self.in_use += 1
            self.peak = max(self.peak, self.in_use)
            yield

    def _release(self) -> None:
        self.in_use -= 1
        self._process.release()


def read_slots() -> ReadSlots:
    """The process's read slots (one per event loop, owned by the runtime)."""
    return runtime.shared("buzz.read_slots", lambda: ReadSlots(settings.BUZZ_READ_SLOTS))


def connection_reads() -> asyncio.Semaphore:
    """A new connection's own bound on its concurrent stored reads."""
    return asyncio.Semaphore(settings.BUZZ_READS_PER_CONNECTION)


@contextlib.asynccontextmanager
async def _within_budget() -> AsyncIterator[None]:
    """A stored read's statement, cancelled by PostgreSQL past the statement budget: ReadOverBudget."""
    try:
        yield
    except psycopg.errors.QueryCanceled:
        raise ReadOverBudget() from None


def _any(column: str, values: Sequence[Any]) -> str:
    # One value as `=`: the planner then reads an index in order (see the module doc).
    return f"{column} = %s" if len(values) == 1 else f"{column} = ANY(%s)"


def _arg(values: Sequence[Any]) -> Any:
    return values[0] if len(values) == 1 else list(values)


def _where(community_id: int, f: Filter, readable_channels: Sequence[uuid.UUID]) -> tuple[str, list[Any]]:
    where = ["e.community_id = %s", "e.deleted_at IS NULL"]
    args: list[Any] = [community_id]
    where.append("(e.channel_id IS NULL OR e.channel_id = ANY(%s))")
    args.append(list(readable_channels))
    if f.ids is not None:
        where.append(_any("e.id", f.ids))
        args.append(_arg(f.ids))
    if f.authors is not None:
        where.append(_any("e.pubkey", f.authors))
        args.append(_arg(f.authors))
    if f.kinds is not None:
        where.append(_any("e.kind", f.kinds))
        args.append(_arg(f.kinds))
    if f.since is not None:
        where.append("e.created_at >= %s")
        args.append(f.since)
    if f.until is not None:
        where.append("e.created_at <= %s")
        args.append(f.until)
    for name, values in f.tags:
        if name == "h":
            # Every h-tagged stored event lives in the channel its h names (buzz.policy.channel_of), so the
            # indexed channel column narrows the scan; the test below still decides the match.
            channels = [c for c in (parse_channel_id(v) for v in values) if c is not None]
            where.append(_any("e.channel_id", channels) if channels else "e.channel_id = ANY(%s)")
            args.append(_arg(channels) if channels else [])
            # An event whose h names its own channel has no h row in the tag index (buzz.events.store):
            # it matches when the channel's id, as its h tag spells it, is one of the values asked for.
            # Other rows (stored before h_is_channel) are probed by key; OFFSET 0 keeps that probe per row,
            # where PostgreSQL would otherwise hash every h row of the tag index for an EXISTS under OR.
            where.append(
                "((e.h_is_channel AND e.channel_id::text = ANY(%s)) OR EXISTS (SELECT 1 FROM buzz_eventtag t"
                " WHERE t.event_key = e.key AND t.name = %s AND t.value = ANY(%s) OFFSET 0))"
            )
            args.extend([list(values), name, list(values)])
            continue
        where.append(
            "EXISTS (SELECT 1 FROM buzz_eventtag t WHERE t.event_key = e.key AND t.name = %s AND t.value = ANY(%s))"
        )
        args.extend([name, list(values)])
    return " AND ".join(where), args


PAGE_ROWS = 100


def page_statement(
    community_id: int,
    f: Filter,
    readable_channels: Sequence[uuid.UUID],
    *,
    after: tuple[int, str] | None,
    rows: int,
) -> tuple[str, list[Any]]:
    """The statement of one keyset page of a filter: `rows` events older than `after` (created_at, id)."""
    where, args = _where(community_id, f, readable_channels)
    keyset = ""
    if after is not None:
        # The bound on created_at alone is an index condition: the walk starts at the page, not the top.
        keyset = " AND e.created_at <= %s AND (e.created_at < %s OR e.id > %s)"
        args += [after[0], after[0], after[1]]
    sql = (
        f"SELECT e.raw, e.id, e.created_at FROM buzz_storedevent e WHERE {where}{keyset}"  # noqa: S608
        " ORDER BY e.created_at DESC, e.id LIMIT %s"
    )
    return sql, [*args, rows]


async def query_events(
    community_id: int,
    filters: Iterable[Filter],
    *,
    readable_channels: Sequence[uuid.UUID] = (),
    reads: asyncio.Semaphore | None = None,
) -> AsyncIterator[tuple[str, str]]:
    """(id, raw JSON) of stored events matching any filter, newest first per filter, each event once.

    Rows come in keyset pages of PAGE_ROWS, and a pooled connection (and a read slot, of
    the process and of `reads`, the connection's) is held only while a page is read: a slow
    reader holds one page in memory, never a whole result, and never a database connection.
    Raises ReadsBusy when no slot comes free in time.
    """
    seen: set[str] = set()
    slots = read_slots()
    pool = await runtime.pool()
    for f in filters:
        if f.limit == 0 or f.matches_nothing():
            continue
        remaining = f.limit
        after: tuple[int, str] | None = None
        while remaining > 0:
            page = min(PAGE_ROWS, remaining)
            sql, page_args = page_statement(community_id, f, readable_channels, after=after, rows=page)
            async with slots.hold(reads), pool.connection() as conn, _within_budget():
                rows = await (await conn.execute(sql, page_args)).fetchall()
            for raw, event_id, created_at in rows:
                after = (created_at, event_id)
                if event_id not in seen:
                    seen.add(event_id)
                    yield event_id, raw
            remaining -= len(rows)
            if len(rows) < page:
                break


async def count_events(
    community_id: int,
    filters: Iterable[Filter],
    *,
    readable_channels: Sequence[uuid.UUID] = (),
    reads: asyncio.Semaphore | None = None,
) -> int:
    """NIP-45 COUNT: distinct events matching any filter (limits do not apply to a count).

    Holds a read slot like a page of `query_events`; raises ReadsBusy when none comes free in time.
    """
    parts: list[str] = []
    args: list[Any] = []
    for f in filters:
        if f.matches_nothing():
            continue
        where, a = _where(community_id, f, readable_channels)
        parts.append(f"SELECT e.id FROM buzz_storedevent e WHERE {where}")  # noqa: S608 - placeholders only
        args.extend(a)
    if not parts:
        return 0
    pool = await runtime.pool()
    async with read_slots().hold(reads), pool.connection() as conn, _within_budget():
        union = " UNION ".join(parts)
        cur = await conn.execute(f"SELECT count(*) FROM ({union}) AS m", args)  # noqa: S608 - placeholders only
        row = await cur.fetchone()
    return int(row[0]) if row else 0
