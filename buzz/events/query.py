"""Stored events: the NIP-01 filter reader (REQ and COUNT). The writer is buzz.events.store.

Reads run on async psycopg (buzz.runtime). Access is decided by the caller
through `readable_channels`; an event bound to a channel is returned only when
its channel is in that set.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from buzz.access.policy import parse_channel_id
from buzz.nostr.filters import Filter
from buzz.runtime import runtime


def _where(community_id: int, f: Filter, readable_channels: Sequence[uuid.UUID]) -> tuple[str, list[Any]]:
    where = ["e.community_id = %s", "e.deleted_at IS NULL"]
    args: list[Any] = [community_id]
    where.append("(e.channel_id IS NULL OR e.channel_id = ANY(%s))")
    args.append(list(readable_channels))
    if f.ids is not None:
        where.append("e.id = ANY(%s)")
        args.append(list(f.ids))
    if f.authors is not None:
        where.append("e.pubkey = ANY(%s)")
        args.append(list(f.authors))
    if f.kinds is not None:
        where.append("e.kind = ANY(%s)")
        args.append(list(f.kinds))
    if f.since is not None:
        where.append("e.created_at >= %s")
        args.append(f.since)
    if f.until is not None:
        where.append("e.created_at <= %s")
        args.append(f.until)
    for name, values in f.tags:
        if name == "h":
            # Every h-tagged stored event lives in the channel its h names (buzz.policy.channel_of), so the
            # indexed channel column narrows the scan; the tag test below still decides the match.
            where.append("e.channel_id = ANY(%s)")
            args.append([c for c in (parse_channel_id(v) for v in values) if c is not None])
        where.append(
            "EXISTS (SELECT 1 FROM buzz_eventtag t WHERE t.event_key = e.key AND t.name = %s AND t.value = ANY(%s))"
        )
        args.extend([name, list(values)])
    return " AND ".join(where), args


PAGE_ROWS = 100


async def query_events(
    community_id: int, filters: Iterable[Filter], *, readable_channels: Sequence[uuid.UUID] = ()
) -> AsyncIterator[tuple[str, str]]:
    """(id, raw JSON) of stored events matching any filter, newest first per filter, each event once.

    Rows come in keyset pages of PAGE_ROWS, and a pooled connection is held only
    while a page is read: a slow reader holds one page in memory, never a whole
    result, and never a database connection.
    """
    seen: set[str] = set()
    pool = await runtime.pool()
    for f in filters:
        if f.limit == 0 or f.matches_nothing():
            continue
        where, args = _where(community_id, f, readable_channels)
        remaining = f.limit
        after: tuple[int, str] | None = None
        while remaining > 0:
            page = min(PAGE_ROWS, remaining)
            keyset = ""
            page_args = list(args)
            if after is not None:
                keyset = " AND (e.created_at < %s OR (e.created_at = %s AND e.id > %s))"
                page_args += [after[0], after[0], after[1]]
            sql = (
                f"SELECT e.raw, e.id, e.created_at FROM buzz_storedevent e WHERE {where}{keyset}"  # noqa: S608
                " ORDER BY e.created_at DESC, e.id LIMIT %s"
            )
            async with pool.connection() as conn:
                rows = await (await conn.execute(sql, [*page_args, page])).fetchall()
            for raw, event_id, created_at in rows:
                after = (created_at, event_id)
                if event_id not in seen:
                    seen.add(event_id)
                    yield event_id, raw
            remaining -= len(rows)
            if len(rows) < page:
                break


async def count_events(
    community_id: int, filters: Iterable[Filter], *, readable_channels: Sequence[uuid.UUID] = ()
) -> int:
    """NIP-45 COUNT: distinct events matching any filter (limits do not apply to a count)."""
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
    async with pool.connection() as conn:
        union = " UNION ".join(parts)
        cur = await conn.execute(f"SELECT count(*) FROM ({union}) AS m", args)  # noqa: S608 - placeholders only
        row = await cur.fetchone()
    return int(row[0]) if row else 0
