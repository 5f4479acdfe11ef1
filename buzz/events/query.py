"""Stored events: the one writer (store_event) and the NIP-01 filter reader (query_events).

Both run on async psycopg (buzz.runtime). Access is decided by the caller
through `readable_channels`; an event bound to a channel is returned only when
its channel is in that set.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from psycopg import AsyncConnection

from buzz.access.policy import parse_channel_id
from buzz.nostr import Event
from buzz.runtime import runtime
from buzz.ws.frames import Filter

_INSERT = (
    "INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw, received_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, now()) ON CONFLICT (id) DO NOTHING"
)
_INSERT_TAGS = (
    "INSERT INTO buzz_eventtag (event_id, name, value) SELECT %s, n, v FROM unnest(%s::text[], %s::text[]) AS t(n, v)"
)


def event_json(event: Event) -> str:
    return json.dumps(event.to_dict(), ensure_ascii=False, separators=(",", ":"))


def indexed_tags(event: Event) -> tuple[list[str], list[str]]:
    """Single-letter tags with their first value: what a NIP-01 `#x` filter matches."""
    names: list[str] = []
    values: list[str] = []
    seen: set[tuple[str, str]] = set()
    for tag in event.tags:
        if len(tag) >= 2 and len(tag[0]) == 1 and tag[0].isascii() and tag[0].isalpha():
            key = (tag[0], tag[1])
            if key not in seen:
                seen.add(key)
                names.append(tag[0])
                values.append(tag[1])
    return names, values


async def store_event(
    conn: AsyncConnection[Any], *, community_id: int, event: Event, channel_id: uuid.UUID | None
) -> bool:
    """Insert one event and its tag index inside the caller's transaction. False if already stored."""
    cur = await conn.execute(
        _INSERT,
        (event.id, community_id, event.pubkey, event.kind, event.created_at, channel_id, event_json(event)),
    )
    if cur.rowcount == 0:
        return False
    names, values = indexed_tags(event)
    if names:
        await conn.execute(_INSERT_TAGS, (event.id, names, values))
    return True


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
            "EXISTS (SELECT 1 FROM buzz_eventtag t WHERE t.event_id = e.id AND t.name = %s AND t.value = ANY(%s))"
        )
        args.extend([name, list(values)])
    return " AND ".join(where), args


def _matches_nothing(f: Filter) -> bool:
    """A filter with an empty list matches nothing (NIP-01)."""
    return any(v is not None and len(v) == 0 for v in (f.ids, f.authors, f.kinds)) or any(
        not values for _, values in f.tags
    )


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
        if f.limit == 0 or _matches_nothing(f):
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
        if _matches_nothing(f):
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
