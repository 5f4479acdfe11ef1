"""Kind-9 chat messages: the service behind that kind.

A kind-9 message is one SQL statement, one round trip (the policy's facts and its
decision as a condition, buzz.access.policy; the stored event and its tag index from
buzz.events.store, the channel counter, the thread counter, the author's read mark,
mentions, the TTL deadline), then a live signal after commit. The answer's reason is
decide_post's, on the facts the statement returns.

A reply's NIP-10 root must be a conversation message: a stored event of a kind
registered with a root refusal (NIP-AR revisions and move removals: "Replies belong
to that conversation, not to an artifact revision") is refused in the same
statement. Only in the reply's own channel, which the sender may read: a root in
another channel counts nowhere and is answered like an unknown one.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg

from buzz.access.policy import (
    FACT_COLUMNS,
    SCOPE_WRITE,
    access_facts_sql,
    access_from_row,
    access_params,
    channel_of,
    check_post,
    decide_post,
    has_scope,
    owner_of_agent,
    post_allowed_sql,
)
from buzz.chat.counters import message_count_sql
from buzz.events.ingest import WriteResult, register_kind, root_refusals
from buzz.events.store import insert_ctes, insert_params, stored_as
from buzz.identity.actor import Actor
from buzz.live import signals
from buzz.models import MESSAGE_COUNTER_SHARDS
from buzz.nostr import Event
from buzz.runtime import runtime
from buzz.sqlarrays import IntArray, TextArray
from buzz.sqltext import raw_statement

KIND_MESSAGE = 9

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")


def deadline_push_sql(channel_pk: str, *, written: str) -> str:
    """The UPDATE with which a write into a TTL channel (primary key `channel_pk`, an SQL expression) pushes its
    deadline a TTL ahead, when the CTE `written` wrote a row: kind 9 here, and every NIP-AR revision
    (artifacts.services). Never once the channel is archived: a write whose check ran before a concurrent
    archive (the TTL reaper's) waits for its row lock and then sees archived_at set. A deadline pushed past
    the archive would make the reaper take the channel for one archived by hand, and never delete it."""
    return (
        "UPDATE buzz_channel SET deadline = now() + make_interval(secs => ttl_seconds)"  # noqa: S608 - from code
        f" WHERE id = {channel_pk} AND ttl_seconds IS NOT NULL AND archived_at IS NULL"
        f" AND EXISTS (SELECT 1 FROM {written})"
    )


# One statement decides and writes: the policy's facts for h (buzz.access.policy), its decision as a
# condition, and everything else only when it holds. Every lookup is by an exact key, and the root's only
# when there is one (a generic plan must not fall back to scanning the channel: tests/chat/test_hot_plans.py).
# Longer than psycopg's conversion cache takes, it runs on a raw cursor (buzz.sqltext.raw_statement).
_POST = raw_statement(f"""
WITH facts AS (
{access_facts_sql()}
), allowed AS (
  SELECT f.channel_pk FROM facts f WHERE {post_allowed_sql("f")}
), root AS (
  -- The root in the reply's own channel, looked up only when the message names one, by its id: the
  -- community and the channel are compared, not searched on, so only stored_event_identity (id,
  -- community) serves it.
  SELECT r.kind, r.deleted_at FROM buzz_storedevent r
  WHERE %(root)s::varchar IS NOT NULL AND r.id = %(root)s
    AND r.community_id IS NOT DISTINCT FROM %(community)s::bigint
    AND r.channel_id IS NOT DISTINCT FROM %(channel)s::uuid
), bad_root AS (
  SELECT kind FROM root WHERE deleted_at IS NULL AND kind = ANY(%(unrooted)s::int[])
), root_ok AS (
  SELECT 1 FROM allowed WHERE NOT EXISTS (SELECT 1 FROM bad_root)
), {insert_ctes("ins", "ev", source="root_ok")}, stats AS (
  -- One shard of the channel's count, the session's own (buzz.models.MessageCounter): concurrent writers
  -- in one channel don't wait for each other's commits on one row.
  INSERT INTO buzz_messagecounter (channel_id, shard, message_count, last_message_at)
  SELECT channel_pk, pg_backend_pid() %% {MESSAGE_COUNTER_SHARDS}, 1, now() FROM allowed
  WHERE EXISTS (SELECT 1 FROM ins)
  ON CONFLICT (channel_id, shard)
  DO UPDATE SET message_count = buzz_messagecounter.message_count + 1, last_message_at = now()
  RETURNING 1
), mark AS (
  -- Posting marks the channel read for the author: the count this statement sees, with its own message.
  UPDATE buzz_membership SET read_mark = 1 + {message_count_sql("(SELECT channel_pk FROM allowed)")}
  WHERE channel_id = (SELECT channel_pk FROM allowed) AND pubkey = %(pubkey)s AND removed_at IS NULL
    AND EXISTS (SELECT 1 FROM stats)
), thread AS (
  INSERT INTO buzz_threadstats (community_id, root_id, channel_id, reply_count, last_reply_at)
  SELECT %(community)s, %(root)s, %(channel)s, 1, now() FROM ins
  WHERE EXISTS (SELECT 1 FROM root WHERE kind <> ALL(%(unrooted)s::int[]))
  ON CONFLICT (community_id, root_id)
  DO UPDATE SET reply_count = buzz_threadstats.reply_count + 1, last_reply_at = now()
), mentions AS (
  INSERT INTO buzz_mention (community_id, pubkey, event_id, channel_id, kind, created_at)
  SELECT %(community)s, p, ins.id, %(channel)s, %(kind)s, now() FROM ins, unnest(%(mentions)s::text[]) AS p
  ON CONFLICT DO NOTHING
), ttl AS (
  {deadline_push_sql("(SELECT channel_pk FROM allowed)", written="ins")}
)
SELECT f.*, (SELECT count(*) FROM ins), (SELECT min(kind) FROM bad_root) FROM facts f
""")  # noqa: S608 - composed from code, values are placeholders


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


def post_params(actor: Actor, event: Event, channel: uuid.UUID) -> dict[str, Any]:
    """The parameters of the kind-9 statement (tests/chat/test_hot_plans.py explains it with them)."""
    return {
        **access_params(actor, [channel], owner=owner_of_agent(event)),
        **insert_params("ev", community_id=actor.community.id, event=event, channel=channel),
        "community": actor.community.id,
        "pubkey": event.pubkey,
        "kind": event.kind,
        "channel": channel,
        "root": thread_root(event),
        "mentions": TextArray(mentioned(event)),
        "unrooted": IntArray(sorted(root_refusals())),
    }


async def post_message(actor: Actor, event: Event) -> WriteResult:
    if not has_scope(actor, SCOPE_WRITE):
        # Answered before anything is read (and before the h tag).
        _, refused = await check_post(actor, event)
        return WriteResult.rejected(refused.reason)
    channel = channel_of(event)
    # The write pool (buzz.runtime): reads holding the main pool never make a write wait.
    pool = await runtime.write_pool()
    async with pool.connection() as conn:
        # A raw cursor: the statement is longer than psycopg's conversion cache takes (buzz.sqltext).
        cursor = psycopg.AsyncRawCursor(conn)
        await cursor.execute(_POST.text, _POST.args(post_params(actor, event, channel)))
        row = await cursor.fetchone()
    if row is None:
        raise RuntimeError("the message statement returned no row")
    _, access = access_from_row(row)
    decision = decide_post(actor, channel, access)
    stored, bad_root = row[FACT_COLUMNS], row[FACT_COLUMNS + 1]
    if not decision.ok:
        if stored:
            # The statement's condition and decide_post disagree: a bug, never an answer.
            raise RuntimeError("the policy's SQL condition allowed a message decide_post refuses")
        return WriteResult.rejected(decision.reason)
    if bad_root is not None:
        return WriteResult.rejected(root_refusals()[bad_root])
    if not stored:
        return WriteResult.accepted("duplicate: already have this event")
    await signals.publish_committed(actor.community.id, [(channel, signals.event_message(event, access.epoch))])
    return WriteResult.accepted()


async def _accepted_before(actor: Actor, event: Event) -> bool:
    """Whether this message was accepted here (removed since or not: its id still answers duplicate)."""
    return await stored_as(actor.community.id, event.id) is not None


def register() -> None:
    # The statement answers an immediate resubmission itself; a late, backed-up or throttled one is answered
    # duplicate by buzz.events.ingest with this look-up.
    register_kind(KIND_MESSAGE, post_message, already_accepted=_accepted_before)
