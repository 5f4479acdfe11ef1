"""Selectors for message counters: channel totals, unread, thread replies, mentions.

Unread is derived: the channel's message count (the sum of its MessageCounter shards) minus the member's
read_mark.
Only kind-9 messages move these numbers (buzz.chat.messages); NIP-AR revisions never do.
"""

from __future__ import annotations

import uuid
from typing import Any

from buzz.access.policy import readable_channels
from buzz.identity.actor import Actor
from buzz.runtime import runtime


def message_count_sql(channel_pk: str) -> str:
    """A channel's message count as an SQL expression: the sum of its shards (buzz.models.MessageCounter)."""
    return f"(SELECT coalesce(sum(s.message_count), 0)::bigint FROM buzz_messagecounter s WHERE s.channel_id = {channel_pk})"  # noqa: S608,E501


_COUNT = message_count_sql("c.id")

_CHANNEL = f"""
SELECT {_COUNT}, m.read_mark
FROM buzz_channel c
LEFT JOIN buzz_membership m ON m.channel_id = c.id AND m.pubkey = %s AND m.removed_at IS NULL
WHERE c.community_id = %s AND c.uuid = %s
"""  # noqa: S608 - composed from constants

_MARK = f"""
UPDATE buzz_membership m SET read_mark = {_COUNT}
FROM buzz_channel c
WHERE m.channel_id = c.id AND c.community_id = %s AND c.uuid = %s AND m.pubkey = %s AND m.removed_at IS NULL
RETURNING m.read_mark
"""  # noqa: S608 - composed from constants

_UNREAD = f"""
SELECT c.uuid, {_COUNT}, m.read_mark
FROM buzz_membership m JOIN buzz_channel c ON c.id = m.channel_id
WHERE m.pubkey = %s AND m.removed_at IS NULL AND c.community_id = %s AND c.deleted_at IS NULL
ORDER BY c.uuid
"""  # noqa: S608 - composed from constants

_THREAD = "SELECT reply_count FROM buzz_threadstats WHERE community_id = %s AND root_id = %s AND channel_id = %s"

_MENTIONS = """
SELECT event_id, channel_id, kind, created_at FROM buzz_mention
WHERE community_id = %s AND pubkey = %s AND channel_id = ANY(%s)
ORDER BY created_at DESC, id DESC LIMIT %s
"""


async def _one(sql: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    pool = await runtime.pool()
    async with pool.connection() as conn:
        row: tuple[Any, ...] | None = await (await conn.execute(sql, args)).fetchone()
    return row


async def channel_counts(actor: Actor, channel: uuid.UUID) -> dict[str, Any]:
    row = await _one(_CHANNEL, (actor.pubkey, actor.community.id, channel))
    total, mark = (row[0], row[1]) if row else (0, None)
    return {
        "channel": str(channel),
        "messages": total,
        "member": mark is not None,
        "unread": max(0, total - mark) if mark is not None else None,
    }


async def mark_read(actor: Actor, channel: uuid.UUID) -> dict[str, Any]:
    row = await _one(_MARK, (actor.community.id, channel, actor.pubkey))
    return {"channel": str(channel), "marked": row is not None, "unread": 0 if row is not None else None}


async def thread_counts(actor: Actor, channel: uuid.UUID, root_id: str) -> dict[str, Any]:
    row = await _one(_THREAD, (actor.community.id, root_id, channel))
    return {"channel": str(channel), "root": root_id, "replies": row[0] if row else 0}


async def unread_counts(actor: Actor) -> list[dict[str, Any]]:
    # Only channels the actor may read now: readable_channels applies the scope, a ban,
    # the token's state and its channel limit, like every other read.
    readable = set(await readable_channels(actor))
    if not readable:
        return []
    pool = await runtime.pool()
    async with pool.connection() as conn:
        rows = await (await conn.execute(_UNREAD, (actor.pubkey, actor.community.id))).fetchall()
    return [
        {"channel": str(c), "messages": total, "unread": max(0, total - mark)}
        for c, total, mark in rows
        if c in readable
    ]


async def mentions_for(actor: Actor, *, limit: int) -> list[dict[str, Any]]:
    channels = await readable_channels(actor)
    if not channels:
        return []
    pool = await runtime.pool()
    async with pool.connection() as conn:
        rows = await (await conn.execute(_MENTIONS, (actor.community.id, actor.pubkey, channels, limit))).fetchall()
    return [{"event_id": e, "channel": str(c), "kind": k, "created_at": int(t.timestamp())} for e, c, k, t in rows]
