"""The NIP-AR write path: the one service that writes artifact revisions.

`accept_revision` checks in kind 9's order (buzz.access.policy: "Relays apply these checks the
same way, and at the same point, as for a kind-9 message"): the token's scope, then, for an
envelope that doesn't parse, the h tag and the sender's standing (a ban, a timeout, a dead token)
before the envelope's own reason. Then, without a transaction (each write is one statement):

  create: ONE statement, one round trip: the policy's facts for h with decide_post's condition
    (buzz.access.policy), the root anchor, the identity claimed (INSERT ... ON CONFLICT DO NOTHING)
    with the revision, the current-tag index, new mentions and the channel's stored event, whether d
    was taken and whether this revision was accepted before. A taken d is answered before a bad root:
    the spec's ensure flow starts with "Sends create ... On conflict, reads the head".
  edit: ONE read of the artifact row, the policy's facts for the artifact's home and for h (a move's
    destination), the root anchor and the resubmission check (no lock), the checks, then ONE statement
    that advances the head by compare-and-set (UPDATE ... WHERE head_id = prev: two competing edits
    can't both succeed), guarded by the policy's facts for the home and h read again in it (access is
    decided where the write happens, as for kind 9), and only then inserts the revision, replaces the
    current-tag index, records new mentions and, for a move, stores the relay-signed kind-45011 removal.
    An edit that loses the compare-and-set to a concurrent one, or whose access changed since the read,
    is checked again against the state that won.
  update (the common edit: same channel, same type): ONE statement, one round trip (_UPDATE): the
    edit's read and its compare-and-set, the write guarded in SQL by every check `_judge_edit` makes
    of an update, which then answers on the returned row as for any edit. An update it accepts that
    wrote nothing (a concurrent edit won) is read and advanced again as above.
After commit it signals live subscribers of every channel the change touches.

Non-disclosure: an edit of an artifact the sender can't read gets the same answer as an edit of a
missing one (HEAD_UNAVAILABLE), and a create of a taken d says only that. Up to that answer both edit
paths send the same statements in the same order and neither takes a lock (a row lock would give
one of them a transaction id and a WAL flush at commit), so the time of the answer tells nothing
either (tests/artifacts/test_artifact_statement_parity.py, bench/artifact_timing.py).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, TypeAlias

import psycopg
from django.conf import settings
from psycopg import AsyncConnection

from artifacts import incremental
from artifacts.envelope import (
    DEFAULT_LIMITS,
    ENVELOPE_VERSION,
    KIND_ARTIFACT,
    KIND_REMOVAL,
    Envelope,
    match_tags,
    parse_envelope,
)
from artifacts.query import MODES, QUERY_LIMITS
from buzz.access.policy import (
    ARCHIVED,
    FACT_COLUMNS,
    NOT_A_MEMBER,
    SCOPE_WRITE,
    TOKEN_CHANNEL,
    access_facts_sql,
    access_from_row,
    access_params,
    check_post,
    decide_post,
    decide_read,
    has_scope,
    post_allowed_sql,
)
from buzz.chat.messages import deadline_push_sql, mentioned, named_pubkeys
from buzz.events.ingest import WriteResult
from buzz.events.store import insert_ctes, insert_params
from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo
from buzz.limits import limits
from buzz.live import signals
from buzz.nostr import Event, ProtocolError, Signer, verify_owner_attestation
from buzz.runtime import runtime
from buzz.sqlarrays import IntArray, TextArray
from buzz.sqltext import hot_statement, raw_statement

log = logging.getLogger(__name__)

# What a change's live signals carry: each stored event with its channel and that channel's access epoch as the
# statement that wrote the event read it (buzz.live.signals.EVENT).
_Published: TypeAlias = list[tuple[uuid.UUID, Event, int]]

HEAD_UNAVAILABLE = "conflict: head unavailable"
DUPLICATE = "duplicate: already accepted"  # the text buzz.events.ingest answers a resubmission with
IDENTITY_TAKEN = "conflict: artifact identity is taken"
HEAD_CHANGED = "conflict: head changed; fetch the current revision and reapply your change"
ANCHOR_INVALID = "invalid: root must be an existing, undeleted message in the artifact's channel"
# "Replies belong to that conversation, not to an artifact revision": a kind-9 reply rooted at a revision
# or a removal is refused (buzz.chat.messages) with this reason.
ROOT_IS_REVISION = (
    "invalid: a reply's root can't be an artifact revision; replies belong to the artifact's conversation,"
    " so reply to its root message instead"
)

# Kinds that anchor a conversation an artifact can be attached to.
ANCHOR_KINDS = (9,)


def _owner(event: Event) -> str | None:
    attestation = verify_owner_attestation(event)
    return attestation.owner if attestation is not None else None


def _hidden(reason: str) -> bool:
    """Denials that would tell the sender something about where an existing artifact lives."""
    return reason in (NOT_A_MEMBER, TOKEN_CHANNEL)


def _channel_bound(reason: str) -> bool:
    """Denials that depend on the channel checked; the others depend on the sender alone."""
    return _hidden(reason) or reason == ARCHIVED


# Is this event a revision accepted before? (A resubmission is answered "duplicate:" whatever else holds.)
_SEEN = (
    "EXISTS (SELECT 1 FROM artifacts_revision s"
    " WHERE s.id = %(id)s AND s.community_id IS NOT DISTINCT FROM %(community)s::bigint)"
)


async def _revision_exists(conn: AsyncConnection[Any], community_id: int, event_id: str) -> bool:
    row = await (await conn.execute(f"SELECT {_SEEN}", {"community": community_id, "id": event_id})).fetchone()
    return bool(row and row[0])


async def already_accepted(actor: Actor, event: Event) -> bool:
    """Resubmission: the revision id is the event id. Says nothing beyond "you sent this before"."""
    pool = await runtime.pool()
    async with pool.connection() as conn:
        return await _revision_exists(conn, actor.community.id, event.id)


# Is %(root)s an existing, undeleted conversation anchor in %(h)s? (true when there is no root)
# Every exact lookup of the write path compares the community (and the channel) without searching on
# them: the one index it can use is the unique key led by it (migrations buzz 0012, artifacts 0011), so a
# generic plan made on empty or never-analyzed tables can't scan a channel (tests/chat/test_hot_plans.py).
# The root's deletion and kind are judged on the row found, behind OFFSET 0 (PostgreSQL neither flattens
# such a subquery nor pushes conditions into it): in the lookup itself they made the partial index on
# (community, channel, kind, time, id) WHERE deleted_at IS NULL a covering one, and a generic plan read
# that whole index with the id as its condition.
_ANCHOR_OK = """(%(root)s::varchar IS NULL OR EXISTS (
  SELECT 1 FROM (
    SELECT e.deleted_at, e.kind FROM buzz_storedevent e
    WHERE e.id = %(root)s AND e.community_id IS NOT DISTINCT FROM %(community)s::bigint
      AND e.channel_id IS NOT DISTINCT FROM %(h)s::uuid
    OFFSET 0
  ) r WHERE r.deleted_at IS NULL AND r.kind = ANY(%(anchor_kinds)s::int[])))"""

# The one read of an edit: the artifact row whether d exists or not (a LEFT JOIN), the policy's facts for
# the channel it lives in (h for a missing d) and for h, the anchor answer and whether this event was
# accepted before, as two rows (one per channel). A missing d and an unreadable one run this same statement.
# No lock: the compare-and-set in _ADVANCE decides between competing edits.
_EDIT_READ_CTES = f"""WITH art AS (
  SELECT a.id, a.type, a.head_id, a.home, a.root, a.deleted, a.p_tags
  FROM (VALUES (1)) AS one (x)
  LEFT JOIN artifacts_artifact a ON a.d = %(d)s AND a.community_id IS NOT DISTINCT FROM %(community)s::bigint
), facts AS (
{access_facts_sql("ARRAY[(SELECT coalesce(art.home, %(h)s::uuid) FROM art), %(h)s::uuid]")}
)"""  # noqa: S608 - composed from code, values are placeholders
_READ = hot_statement(f"""
{_EDIT_READ_CTES}
SELECT f.*, art.*, {_ANCHOR_OK}, {_SEEN}
FROM facts f, art
""")  # noqa: S608 - composed from code, values are placeholders

# A create in one statement: the policy's facts for h and its decision as a condition (buzz.access.policy),
# the anchor, the identity claimed with the revision and everything that goes with it; the answer's reason
# is decide_post's on the returned facts. Raw (buzz.sqltext): longer than psycopg's conversion cache takes.
_CREATE = raw_statement(f"""
WITH facts AS (
{access_facts_sql()}
), anchor AS (
  SELECT {_ANCHOR_OK} AS ok
), art AS (
  INSERT INTO artifacts_artifact (community_id, d, type, head_id, home, root, deleted, retired, p_tags, created_at,
                                  changed_at)
  SELECT %(community)s, %(d)s, %(type)s, %(id)s, %(h)s, %(root)s, false, false, %(p_tags)s::varchar[], now(),
         clock_timestamp()
  FROM anchor, facts f WHERE anchor.ok AND {post_allowed_sql("f")}
  ON CONFLICT (community_id, d) DO NOTHING RETURNING id
), rev AS (
  INSERT INTO artifacts_revision (id, community_id, artifact_id, op, channel, prev, root, pubkey, created_at, raw,
                                  seq, accepted_at)
  SELECT %(id)s, %(community)s, art.id, %(op)s, %(h)s, NULL, %(root)s, %(pubkey)s, %(created_at)s, %(raw)s,
         nextval('artifacts_accept_seq'), clock_timestamp()
  FROM art RETURNING seq
), tags AS (
  INSERT INTO artifacts_currenttag (artifact_id, name, value)
  SELECT art.id, t.n, t.v FROM art, unnest(%(tag_names)s::text[], %(tag_values)s::text[]) AS t(n, v)
), mentions AS (
  INSERT INTO buzz_mention (community_id, pubkey, event_id, channel_id, kind, created_at)
  SELECT %(community)s, p, %(id)s, %(h)s, %(kind)s, now() FROM art, unnest(%(mentions)s::text[]) AS p
  ON CONFLICT DO NOTHING
), ttl AS (
  -- A write into a TTL channel pushes its deadline forward, as kind 9 does. By the primary key the facts
  -- found: a generic plan may search (community, uuid) through the community's index and read every channel
  -- (tests/chat/test_hot_plans.py).
  {deadline_push_sql("(SELECT f.channel_pk FROM facts f)", written="art")}
),
-- The channel's stored event (a NIP-01 replay of the channel returns it), never counted as a message.
{insert_ctes("stored", "ev", source="art")}
SELECT f.*, (SELECT seq FROM rev), (SELECT ok FROM anchor),
       EXISTS (SELECT 1 FROM artifacts_artifact t
               WHERE t.d = %(d)s AND t.community_id IS NOT DISTINCT FROM %(community)s::bigint), {_SEEN}
FROM facts f
""")  # noqa: S608 - composed from code, values are placeholders


def _head_change_ctes(*, artifact: str, allowed: str, mentions: str, channel_pk: str) -> str:
    """The CTEs of an edit's compare-and-set and everything that goes with it, from `head` (the UPDATE of
    the artifact `artifact` whose head is still prev, when the SQL condition `allowed` holds) to the stored
    event; `mentions` filters the mentioned pubkeys `p`, and `channel_pk` is h's primary key."""
    return f"""head AS (
  UPDATE artifacts_artifact SET head_id = %(id)s, home = %(h)s, root = %(root)s, deleted = %(deleted)s,
         retired = false, p_tags = %(p_tags)s::varchar[], changed_at = clock_timestamp()
  WHERE id = {artifact} AND head_id = %(prev)s AND {allowed}
  RETURNING id
), rev AS (
  INSERT INTO artifacts_revision (id, community_id, artifact_id, op, channel, prev, root, pubkey, created_at, raw,
                                  seq, accepted_at)
  SELECT %(id)s, %(community)s, head.id, %(op)s, %(h)s, %(prev)s, %(root)s, %(pubkey)s, %(created_at)s,
         %(raw)s, nextval('artifacts_accept_seq'), clock_timestamp()
  FROM head RETURNING seq
), tags_now AS MATERIALIZED (
  -- The current tags become the new head's: only the pairs that differ are deleted and inserted (an edit
  -- usually keeps most of them). Read in the statement's snapshot, where they are prev's: the
  -- compare-and-set wins only when no other head change committed since. The table is read by the
  -- artifact's key only: the differences are computed between the two small sets.
  SELECT c.id, c.name, c.value FROM artifacts_currenttag c WHERE c.artifact_id = (SELECT id FROM head)
), tags_next AS MATERIALIZED (
  SELECT t.n, t.v FROM unnest(%(tag_names)s::text[], %(tag_values)s::text[]) AS t(n, v)
), old_tags AS (
  DELETE FROM artifacts_currenttag c WHERE c.artifact_id = (SELECT id FROM head) AND c.id = ANY(ARRAY(
    SELECT o.id FROM tags_now o WHERE NOT EXISTS (SELECT 1 FROM tags_next t WHERE t.n = o.name AND t.v = o.value)))
), new_tags AS (
  INSERT INTO artifacts_currenttag (artifact_id, name, value)
  SELECT head.id, t.n, t.v FROM head, tags_next t
  WHERE NOT EXISTS (SELECT 1 FROM tags_now o WHERE o.name = t.n AND o.value = t.v)
), mentions AS (
  INSERT INTO buzz_mention (community_id, pubkey, event_id, channel_id, kind, created_at)
  SELECT %(community)s, p, %(id)s, %(h)s, %(kind)s, now() FROM head, unnest(%(mentions)s::text[]) AS p
  WHERE {mentions}
  ON CONFLICT DO NOTHING
), ttl AS (
  -- A write into a TTL channel pushes its deadline forward, as kind 9 does. By the primary key of h that the
  -- policy's facts found (see _CREATE).
  {deadline_push_sql(channel_pk, written="head")}
),
-- The revision is a stored event in its channel too.
{insert_ctes("stored", "ev", source="head")}"""  # noqa: S608 - composed from code, values are placeholders


# Everything hangs on `head`, the compare-and-set: when the head is no longer prev it updates no row and
# nothing else is written. Under READ COMMITTED an UPDATE that waited for a competing edit re-checks
# head_id against the row that edit committed. The caller decided on _READ's row; mentions exclude the
# p tags the last revision that is not a deletion carried (computed from that row). The write is also
# guarded by the policy's facts for the artifact's home and for h, read again in this statement, as kind 9
# decides at the point it writes: a ban, a removal, an archive or a deletion that committed after _READ
# makes it write nothing, and the edit is read and judged again (`_edit`). Longer than psycopg's conversion
# cache takes, it runs on a raw cursor (buzz.sqltext.raw_statement).
_ADVANCE_ALLOWED = f"(SELECT bool_and({post_allowed_sql('f')}) FROM facts f)"  # noqa: S608 - from code
_ADVANCE_CHANGE = _head_change_ctes(
    artifact="%(artifact)s", allowed=_ADVANCE_ALLOWED, mentions="true", channel_pk="%(h_pk)s::bigint"
)
_ADVANCE = raw_statement(f"""
WITH facts AS (
{access_facts_sql("ARRAY[%(home)s::uuid, %(h)s::uuid]")}
), {_ADVANCE_CHANGE},
removal AS (
  INSERT INTO artifacts_moveremoval (id, community_id, artifact_id, source, replaced, move_id, raw, seq, accepted_at)
  SELECT %(removal_id)s::varchar, %(community)s, head.id, %(source)s, %(prev)s, %(id)s, %(removal_raw)s::text,
         nextval('artifacts_accept_seq'), clock_timestamp()
  FROM head WHERE %(removal_id)s::varchar IS NOT NULL
),
-- A move's removal is a stored event in the source.
{insert_ctes("stored_removal", "rm", source="head")}
SELECT rev.seq, f.channel, f.epoch FROM rev, facts f
""")  # noqa: S608 - composed from code, values are placeholders

# An update (op=update: same channel, same type) in ONE statement: _READ's row, and the compare-and-set
# guarded by every check `_judge_edit` makes of an update, so it writes only what that decision accepts.
# The answer is still `_judge_edit`'s, on the returned row; when it accepts and nothing was written (a
# concurrent edit won the compare-and-set), the edit is read and advanced again (`_edit`).
_UPDATE_CHANGE = _head_change_ctes(
    artifact="(SELECT id FROM allowed)",
    allowed="EXISTS (SELECT 1 FROM allowed)",
    mentions="NOT (p = ANY(coalesce((SELECT p_tags FROM allowed), ARRAY[]::varchar[])))",
    channel_pk="(SELECT channel_pk FROM allowed)",
)
_UPDATE = raw_statement(f"""
{_EDIT_READ_CTES}, checks AS MATERIALIZED (
  SELECT {_ANCHOR_OK} AS anchor_ok, {_SEEN} AS seen
), allowed AS MATERIALIZED (
  SELECT art.id, art.p_tags, f.channel_pk FROM art, checks, facts f
  WHERE f.channel = %(h)s::uuid AND art.home = %(h)s::uuid AND {post_allowed_sql("f")} AND NOT checks.seen
    AND art.head_id = %(prev)s AND art.type = %(type)s AND NOT art.deleted
    AND (art.root IS NOT DISTINCT FROM %(root)s::varchar OR checks.anchor_ok)
  LIMIT 1
), {_UPDATE_CHANGE}
SELECT f.*, art.*, checks.anchor_ok, checks.seen, (SELECT seq FROM rev) FROM facts f, art, checks
""")  # noqa: S608 - composed from code, values are placeholders


def removal_event(community: CommunityInfo, *, d: uuid.UUID, source: uuid.UUID, replaced: str) -> Event:
    """The relay-signed kind-45011 a move stores in its source: the artifact, the source, the replaced
    revision, and nothing about the destination."""
    return Signer(community.relay_secret).sign_event(
        kind=KIND_REMOVAL,
        tags=[["ar", "1"], ["d", str(d)], ["h", str(source)], ["reason", "moved"], ["prev", replaced]],
        content="",
    )


def _tag_arrays(event: Event) -> tuple[TextArray, TextArray]:
    pairs = match_tags(event)
    return TextArray([n for n, _ in pairs]), TextArray([v for _, v in pairs])


async def accept_revision(actor: Actor, event: Event) -> WriteResult:
    if not has_scope(actor, SCOPE_WRITE):
        # A resubmission is a duplicate whatever else holds; then kind 9 answers the scope before reading.
        if await already_accepted(actor, event):
            return WriteResult.accepted(DUPLICATE)
        _, decision = await check_post(actor, event)
        return WriteResult.rejected(decision.reason)
    try:
        envelope = parse_envelope(event)
    except ProtocolError as err:
        return await _refuse_malformed(actor, event, err.reason)
    owner = _owner(event)
    # The write pool (buzz.runtime): reads holding the main pool never make a write wait.
    pool = await runtime.write_pool()
    # No transaction around the statements: a create is one atomic statement, and an edit's one write is
    # the compare-and-set statement (its read takes no lock, so a transaction would add BEGIN and COMMIT
    # round trips and nothing else).
    async with pool.connection() as conn:
        if envelope.is_create:
            result, published = await _create(conn, actor, event, envelope, owner)
        else:
            result, published = await _edit(conn, actor, event, envelope, owner)
    if result.ok and published:
        messages = [(ch, signals.event_message(ev, epoch)) for ch, ev, epoch in published]
        await signals.publish_committed(actor.community.id, messages)
    return result


async def _refuse_malformed(actor: Actor, event: Event, reason: str) -> WriteResult:
    """An envelope that doesn't parse gets kind 9's answers first: to its h tag (ProtocolError, raised here
    for buzz.events.ingest to answer), then to the sender's standing. A channel-bound denial (not a member,
    a token limited to other channels, archived) is not answered: for an edit it would be about h, not
    about the channel the artifact lives in, so only the envelope's reason is."""
    _, decision = await check_post(actor, event)
    if not decision.ok and not _channel_bound(decision.reason):
        return WriteResult.rejected(decision.reason)
    return WriteResult.rejected(reason)


def create_params(actor: Actor, event: Event, env: Envelope, owner: str | None) -> dict[str, Any]:
    """The parameters of the create statement (tests/chat/test_hot_plans.py explains it with them)."""
    names, values = _tag_arrays(event)
    return {
        **access_params(actor, [env.h], owner=owner),
        "community": actor.community.id,
        "d": env.d,
        "type": env.type,
        "id": event.id,
        "h": env.h,
        "root": env.root,
        "anchor_kinds": IntArray(ANCHOR_KINDS),
        "op": env.op,
        "pubkey": event.pubkey,
        "created_at": event.created_at,
        "raw": event.to_json(),
        "tag_names": names,
        "tag_values": values,
        "mentions": TextArray(mentioned(event)),
        "p_tags": TextArray(named_pubkeys(event)),
        "kind": KIND_ARTIFACT,
        **insert_params("ev", community_id=actor.community.id, event=event, channel=env.h),
    }


async def _create(
    conn: AsyncConnection[Any], actor: Actor, event: Event, env: Envelope, owner: str | None
) -> tuple[WriteResult, _Published]:
    cursor = psycopg.AsyncRawCursor(conn)
    await cursor.execute(_CREATE.text, _CREATE.args(create_params(actor, event, env, owner)))
    row = await cursor.fetchone()
    if row is None:
        raise RuntimeError("the create statement returned no row")
    _, access = access_from_row(row)
    decision = decide_post(actor, env.h, access)
    seq, anchor_ok, taken, seen = row[FACT_COLUMNS:]
    if seq is not None:
        if not decision.ok:
            raise RuntimeError("the policy's SQL condition allowed a revision decide_post refuses")
        return WriteResult.accepted(), [(env.h, event, access.epoch)]
    if seen:
        # A resubmission says only "you sent this before", before any other answer.
        return WriteResult.accepted(DUPLICATE), []
    if not decision.ok:
        return WriteResult.rejected(decision.reason), []
    # Identity before root. Not inserted with a good root: d was taken by a create that committed meanwhile.
    if taken or anchor_ok:
        # A retry that raced its own first attempt (committed after this statement's snapshot) is a
        # duplicate, not a conflict: looked up again only on this failure path.
        if await _revision_exists(conn, actor.community.id, event.id):
            return WriteResult.accepted(DUPLICATE), []
        # A deleted d stays reserved too: the identity row is never removed.
        return WriteResult.rejected(IDENTITY_TAKEN), []
    return WriteResult.rejected(ANCHOR_INVALID), []


async def _edit(
    conn: AsyncConnection[Any], actor: Actor, event: Event, env: Envelope, owner: str | None
) -> tuple[WriteResult, _Published]:
    # An update is decided and written in one statement (_UPDATE); any other edit is read, then advanced.
    # A second pass follows a compare-and-set lost to a concurrent edit; its prev is no longer the head
    # then, so it answers without writing.
    passes = 2
    if env.op == "update":
        result = await _update_once(conn, actor, event, env, owner)
        if result is not None:
            return result
        passes = 1
    for _ in range(passes):
        result = await _edit_once(conn, actor, event, env, owner)
        if result is not None:
            return result
    # Every compare-and-set lost: the answer is the one the edit gets on the state as it now is (a change of
    # access that committed after the last read is answered with its reason), read once more without writing.
    # Only when that state would accept the edit again is the answer to fetch the head and retry.
    judged = await _read_and_judge(conn, actor, event, env, owner)
    return (judged if isinstance(judged, WriteResult) else WriteResult.rejected(HEAD_CHANGED)), []


def read_params(actor: Actor, event: Event, env: Envelope, owner: str | None) -> dict[str, Any]:
    """The parameters of an edit's read (tests/chat/test_hot_plans.py explains it with them)."""
    return {
        **access_params(actor, [env.h], owner=owner),
        "community": actor.community.id,
        "d": env.d,
        "id": event.id,
        "root": env.root,
        "h": env.h,
        "anchor_kinds": IntArray(ANCHOR_KINDS),
    }


def _head_change_params(actor: Actor, event: Event, env: Envelope) -> dict[str, Any]:
    """The parameters of `_head_change_ctes` that come from the event alone."""
    community = actor.community.id
    names, values = _tag_arrays(event)
    return {
        "community": community,
        "id": event.id,
        "op": env.op,
        "h": env.h,
        "prev": env.prev,
        "root": env.root,
        "pubkey": event.pubkey,
        "created_at": event.created_at,
        "raw": event.to_json(),
        "deleted": env.op == "delete",
        "tag_names": names,
        "tag_values": values,
        "kind": KIND_ARTIFACT,
        **insert_params("ev", community_id=community, event=event, channel=env.h),
    }


def advance_params(
    actor: Actor,
    event: Event,
    env: Envelope,
    *,
    artifact: int,
    channel_pk: int,
    carried: list[str],
    removal: Event | None,
    source: uuid.UUID | None,
    owner: str | None = None,
) -> dict[str, Any]:
    """The parameters of the compare-and-set statement; `channel_pk` is h's primary key (the read's facts), and
    the policy's facts are read again for the artifact's home (a move's source, else h) and h."""
    home = source if source is not None else env.h
    return {
        **access_params(actor, [home, env.h], owner=owner),
        **_head_change_params(actor, event, env),
        "home": home,
        "artifact": artifact,
        "h_pk": channel_pk,
        # Mentions only for p tags the last revision that is not a deletion did not carry (a deletion
        # carries none, and keeps the set for the restore to be compared with).
        "mentions": TextArray(mentioned(event, exclude=carried)),
        "p_tags": TextArray(carried if env.op == "delete" else named_pubkeys(event)),
        "removal_id": removal.id if removal else None,
        "removal_raw": removal.to_json() if removal else None,
        "source": source,
        **insert_params("rm", community_id=actor.community.id, event=removal, channel=source),
    }


def update_params(actor: Actor, event: Event, env: Envelope, owner: str | None) -> dict[str, Any]:
    """The parameters of the one-statement update (_UPDATE): the read's and the advance's. The statement
    leaves out the mentions that the current head carries (an update's head is never a deletion)."""
    return {
        **read_params(actor, event, env, owner),
        **_head_change_params(actor, event, env),
        "type": env.type,
        "mentions": TextArray(mentioned(event)),
        "p_tags": TextArray(named_pubkeys(event)),
    }


@dataclass(frozen=True, slots=True)
class _Accepted:
    """An edit `_judge_edit` accepts, and what its compare-and-set needs from the read."""

    artifact: int
    channel_pk: int
    carried: list[str]
    source: uuid.UUID | None
    removal: Event | None
    # Each channel's access epoch in the read's facts (ChannelAccess.epoch).
    epochs: dict[uuid.UUID, int]


def _judge_edit(actor: Actor, env: Envelope, rows: list[Any]) -> WriteResult | _Accepted:
    """The answer to an edit from the read's rows (_READ's, or _UPDATE's with its seq after them)."""
    if not rows:
        raise RuntimeError("the artifact read returned no row")
    facts = dict(access_from_row(r) for r in rows)
    pk, type_name, head_id, home, root, deleted, p_tags, anchor_ok, seen = rows[0][FACT_COLUMNS : FACT_COLUMNS + 9]
    # A resubmission (or a copy of this event that committed meanwhile, a retry in flight) says only
    # "you sent this before", before any other answer, as buzz.events.ingest's duplicate answer did.
    if seen:
        return WriteResult.accepted(DUPLICATE)
    # The same policy facts on both paths: the channel the artifact lives in (or h for a missing d), and h.
    checked = home if pk is not None else env.h
    decision = decide_post(actor, checked, facts[checked])
    if pk is None:
        # The sender's own standing (scope, ban, timeout, a dead token) denies an edit of an existing
        # artifact below; it must deny a missing one alike, or the answer would tell that d exists.
        denied = not decision.ok and not _channel_bound(decision.reason)
        return WriteResult.rejected(decision.reason if denied else HEAD_UNAVAILABLE)
    # A sender who may post in the home but not read it (a token without messages:read) learns nothing of the
    # artifact from a refusal ("Errors MUST NOT disclose inaccessible artifact details"): every refusal below
    # depends on the artifact, so each is then what a missing d gets, and only an edit that holds succeeds.
    unreadable = not decide_read(actor, home, facts[home]).ok
    if not decision.ok:
        hide = _hidden(decision.reason) or (unreadable and _channel_bound(decision.reason))
        return WriteResult.rejected(HEAD_UNAVAILABLE if hide else decision.reason)

    def refuse(reason: str) -> WriteResult:
        return WriteResult.rejected(HEAD_UNAVAILABLE if unreadable else reason)

    if env.op == "move" and env.h != home:
        # A move needs write in both channels, and both are checked where a kind-9 message's channel is:
        # before anything about the artifact or the edit (NIP-AR Access: "at the same point").
        destination = decide_post(actor, env.h, facts[env.h])
        if not destination.ok:
            return refuse(destination.reason)
    if env.prev != head_id:
        return refuse(HEAD_CHANGED)
    if env.type != type_name:
        return refuse("invalid: type is immutable")
    if deleted and env.op != "restore":
        return refuse("invalid: the artifact is deleted; only restore is accepted")
    if not deleted and env.op == "restore":
        return refuse("invalid: only a deleted artifact can be restored")
    source: uuid.UUID | None = None
    if env.op == "move":
        if env.h == home:
            return refuse("invalid: a move changes h; use update to stay in the channel")
        if not anchor_ok:
            return refuse("invalid: a move's root must be absent or a message in the destination")
        source = home
    else:
        if env.h != home:
            return refuse(f"invalid: {env.op} keeps h; changing the channel is a move")
        if env.op == "delete":
            if env.root != root:
                return refuse("invalid: a delete keeps the artifact's root")
        elif env.root != root and not anchor_ok:
            # A root that is kept needs no anchor any more; a new one must exist now.
            return refuse(ANCHOR_INVALID)
    removal = removal_event(actor.community, d=env.d, source=source, replaced=head_id) if source else None
    h_pk = facts[env.h].channel_pk
    if h_pk is None:  # decide_post allowed a post to h, so h exists
        raise RuntimeError("the artifact read found no channel for an allowed edit")
    epochs = {channel: access.epoch for channel, access in facts.items()}
    return _Accepted(
        artifact=pk, channel_pk=h_pk, carried=list(p_tags or []), source=source, removal=removal, epochs=epochs
    )


def _published(event: Event, env: Envelope, accepted: _Accepted, epochs: dict[uuid.UUID, int]) -> _Published:
    """What the edit's signals carry: the revision in h and, for a move, the removal in the source, each with
    its channel's access epoch as the statement that wrote them read it."""
    published = [(env.h, event, epochs[env.h])]
    if accepted.removal is not None and accepted.source is not None:
        published.append((accepted.source, accepted.removal, epochs[accepted.source]))
    return published


async def _read_and_judge(
    conn: AsyncConnection[Any], actor: Actor, event: Event, env: Envelope, owner: str | None
) -> WriteResult | _Accepted:
    """An edit's read (_READ, no lock) and `_judge_edit`'s answer on it."""
    rows = await (await conn.execute(_READ, read_params(actor, event, env, owner))).fetchall()
    return _judge_edit(actor, env, rows)


async def _edit_once(
    conn: AsyncConnection[Any], actor: Actor, event: Event, env: Envelope, owner: str | None
) -> tuple[WriteResult, _Published] | None:
    """One pass of an edit; None when the compare-and-set found the head changed since it was read."""
    judged = await _read_and_judge(conn, actor, event, env, owner)
    if isinstance(judged, WriteResult):
        return judged, []
    params = advance_params(
        actor,
        event,
        env,
        artifact=judged.artifact,
        channel_pk=judged.channel_pk,
        carried=judged.carried,
        removal=judged.removal,
        source=judged.source,
        owner=owner,
    )
    cursor = psycopg.AsyncRawCursor(conn)
    await cursor.execute(_ADVANCE.text, _ADVANCE.args(params))
    # One row per channel of the statement's facts (home and h) when it wrote, none when it did not.
    rows = await cursor.fetchall()
    if not rows:
        return None
    return WriteResult.accepted(), _published(event, env, judged, {channel: epoch for _, channel, epoch in rows})


async def _update_once(
    conn: AsyncConnection[Any], actor: Actor, event: Event, env: Envelope, owner: str | None
) -> tuple[WriteResult, _Published] | None:
    """An update in one statement; None when `_judge_edit` accepts it and the statement wrote nothing (a
    concurrent edit won the compare-and-set): `_edit` reads it again."""
    # A raw cursor: the statement is longer than psycopg's conversion cache takes (buzz.sqltext).
    cursor = psycopg.AsyncRawCursor(conn)
    await cursor.execute(_UPDATE.text, _UPDATE.args(update_params(actor, event, env, owner)))
    rows = await cursor.fetchall()
    judged = _judge_edit(actor, env, rows)
    written = rows[0][FACT_COLUMNS + 9] is not None
    if isinstance(judged, WriteResult):
        if written:
            # The statement's guard and _judge_edit disagree: a bug, never an answer.
            raise RuntimeError("the update statement wrote an edit that _judge_edit refuses")
        return judged, []
    if not written:
        return None
    return WriteResult.accepted(), _published(event, env, judged, judged.epochs)


async def reject_removal(actor: Actor, event: Event) -> WriteResult:
    return WriteResult.rejected("invalid: kind 45011 removals are written by the relay, never by clients")


KIND5_REFUSED = (
    "invalid: kind 5 deletion requests are not accepted; an artifact is deleted with op=delete and a revision"
    " is redacted by a moderator with NIP-29 kind 9005"
)


async def reject_kind5(actor: Actor, event: Event) -> WriteResult:
    """NIP-AR: kind 5 on an artifact revision is refused with an explicit reason. The same reason answers
    every kind 5, so it never tells whether an id is an artifact revision the sender can't read."""
    return WriteResult.rejected(KIND5_REFUSED)


def nip11_section(community: CommunityInfo) -> dict[str, Any]:
    """NIP-11 `artifacts`: the envelope version, every limit the write path and the views enforce, and sync
    (with `max_events`) when this relay runs it. A relay advertises only what every backend serving the
    connection runs: BUZZ_SYNC_ENABLED says so for the deployment, for sync and for the head view (the spec
    advertises the two together)."""
    sync = bool(settings.BUZZ_SYNC["enabled"])
    section: dict[str, Any] = {
        "version": 1,
        "envelope": ENVELOPE_VERSION,
        "modes": [mode for mode in MODES if sync or mode != "head"],
        # A revision passes the relay's event checks first (BUZZ_MAX_EVENT_TAGS), then the envelope's: the
        # smaller bound is the one a client meets.
        "limits": {
            **DEFAULT_LIMITS.nip11(),
            "max_tags": min(DEFAULT_LIMITS.max_tags, limits().max_event_tags),
            **QUERY_LIMITS.nip11(),
        },
        "query_budget_ms": settings.BUZZ_QUERY_BUDGET_MS,
    }
    if sync:
        section["sync"] = {"version": 1, "max_events": settings.BUZZ_SYNC["max_events"]}
    if incremental.enabled():
        section["incremental"] = incremental.nip11()
    return section


def nip11_query_extensions(community: CommunityInfo) -> bool | None:
    """NIP-11 `websocket_query_extensions`: REQ takes the artifact filter (sync)."""
    return True if settings.BUZZ_SYNC["enabled"] else None
