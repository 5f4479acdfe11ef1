"""Kind-9 chat messages: the service behind that kind.

A kind-9 message is one policy read and one SQL statement (the stored event and
its tag index from buzz.events.store, the channel counter, the thread counter, the
author's read mark, mentions, the TTL deadline), then a live signal after commit.

A reply's NIP-10 root must be a conversation message: a stored event of a kind
registered with a root refusal (NIP-AR revisions and move removals: "Replies belong
to that conversation, not to an artifact revision") is refused in the same
statement. Only in the reply's own channel, which the sender may read: a root in
another channel counts nowhere and is answered like an unknown one.
"""

from __future__ import annotations

import re

from buzz.access.policy import (
    NOT_A_MEMBER,
    check_post,
)
from buzz.events.ingest import WriteResult, register_kind, root_refusals
from buzz.events.store import insert_ctes, insert_params
from buzz.identity.actor import Actor
from buzz.live import signals
from buzz.nostr import Event
from buzz.runtime import runtime

KIND_MESSAGE = 9

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")

_POST_SQL = f"""
WITH bad_root AS (
  SELECT r.kind FROM buzz_storedevent r
  WHERE r.community_id = %(community)s AND r.id = %(root)s AND r.channel_id = %(channel)s
    AND r.deleted_at IS NULL AND r.kind = ANY(%(unrooted)s::int[])
), root_ok AS (
  SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM bad_root)
), {insert_ctes("ins", "ev", source="root_ok")}, stats AS (
  UPDATE buzz_channelstats SET message_count = message_count + 1, last_message_at = now()
  WHERE channel_id = %(channel_pk)s AND EXISTS (SELECT 1 FROM ins) RETURNING message_count
), mark AS (
  -- Posting marks the channel read for the author.
  UPDATE buzz_membership SET read_mark = (SELECT message_count FROM stats)
  WHERE channel_id = %(channel_pk)s AND pubkey = %(pubkey)s AND removed_at IS NULL AND EXISTS (SELECT 1 FROM stats)
), thread AS (
  INSERT INTO buzz_threadstats (community_id, root_id, channel_id, reply_count, last_reply_at)
  SELECT %(community)s, r.id, r.channel_id, 1, now() FROM ins
  JOIN buzz_storedevent r ON r.id = %(root)s AND r.community_id = %(community)s AND r.channel_id = %(channel)s
    AND r.kind <> ALL(%(unrooted)s::int[])
  ON CONFLICT (community_id, root_id)
  DO UPDATE SET reply_count = buzz_threadstats.reply_count + 1, last_reply_at = now()
), mentions AS (
  INSERT INTO buzz_mention (community_id, pubkey, event_id, channel_id, kind, created_at)
  SELECT %(community)s, p, ins.id, %(channel)s, %(kind)s, now() FROM ins, unnest(%(mentions)s::text[]) AS p
  ON CONFLICT DO NOTHING
), ttl AS (
  UPDATE buzz_channel SET deadline = now() + make_interval(secs => ttl_seconds)
  WHERE id = %(channel_pk)s AND ttl_seconds IS NOT NULL AND EXISTS (SELECT 1 FROM ins)
)
SELECT (SELECT count(*) FROM ins), (SELECT min(kind) FROM bad_root)
"""  # noqa: S608 - composed from code, values are placeholders


def thread_root(event: Event) -> str | None:
    """NIP-10: the `e` tag marked root names the thread this event replies in."""
    for tag in event.tags:
        if len(tag) >= 4 and tag[0] == "e" and tag[3] == "root" and _HEX64.match(tag[1]):
            return tag[1]
    return None


def named_pubkeys(event: Event) -> list[str]:
    """Pubkeys named by `p` tags (64 lowercase hex), each once, in tag order."""
    out: list[str] = []
    for p in event.tag_values("p"):
        if _HEX64.match(p) and p not in out:
            out.append(p)
    return out


def mentioned(event: Event, *, exclude: frozenset[str] | list[str] = frozenset()) -> list[str]:
    """Pubkeys named by `p` tags, each once, never the author, minus `exclude`."""
    return [p for p in named_pubkeys(event) if p != event.pubkey and p not in exclude]


async def post_message(actor: Actor, event: Event) -> WriteResult:
    channel, decision = await check_post(actor, event)
    if not decision.ok:
        return WriteResult.rejected(decision.reason)
    if decision.access is None or decision.access.channel_pk is None:
        return WriteResult.rejected(NOT_A_MEMBER)
    refusals = root_refusals()
    params = {
        **insert_params("ev", community_id=actor.community.id, event=event, channel=channel),
        "community": actor.community.id,
        "pubkey": event.pubkey,
        "kind": event.kind,
        "channel": channel,
        "channel_pk": decision.access.channel_pk,
        "root": thread_root(event),
        "mentions": mentioned(event),
        "unrooted": sorted(refusals),
    }
    pool = await runtime.pool()
    async with pool.connection() as conn:
        row = await (await conn.execute(_POST_SQL, params)).fetchone()
    if row is not None and row[1] is not None:
        return WriteResult.rejected(refusals[row[1]])
    if not row or row[0] == 0:
        return WriteResult.accepted("duplicate: already have this event")
    await signals.publish_committed(actor.community.id, [(channel, signals.event_message(event))])
    return WriteResult.accepted()


def register() -> None:
    register_kind(KIND_MESSAGE, post_message)
