"""The NIP-AR write path: the one service that writes artifact revisions.

`accept_revision` runs one transaction per revision:
  lock the head row (SELECT ... FOR UPDATE; a create is INSERT ... ON CONFLICT DO NOTHING),
  check write access with the kind-9 policy, compare prev with the current head,
  then ONE statement inserts the revision, advances the head, replaces the current-tag
  index, records new mentions and, for a move, stores the relay-signed kind-45011 removal.
After commit it signals live subscribers of every channel the change touches.

Non-disclosure: an edit of an artifact the sender can't read gets the same answer as
an edit of a missing one (HEAD_UNAVAILABLE), and a create of a taken d says only that.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from django.conf import settings
from psycopg import AsyncConnection

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
from buzz.access.policy import ARCHIVED, NOT_A_MEMBER, TOKEN_CHANNEL, ChannelAccess, decide_post, load_access
from buzz.chat.channels import ChannelError
from buzz.chat.messages import mentioned
from buzz.chat.removals import DELETE_REFUSED, Removal
from buzz.events.ingest import WriteResult
from buzz.events.store import insert_ctes, insert_params
from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo
from buzz.live import signals
from buzz.nostr import Event, Signer, verify_owner_attestation
from buzz.runtime import runtime

log = logging.getLogger(__name__)

HEAD_UNAVAILABLE = "conflict: head unavailable"
DUPLICATE = "duplicate: already accepted"  # the text buzz.events.ingest answers a resubmission with
IDENTITY_TAKEN = "conflict: artifact identity is taken"
HEAD_CHANGED = "conflict: head changed; fetch the current revision and reapply your change"
ANCHOR_INVALID = "invalid: root must be an existing, undeleted message in the artifact's channel"

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


async def _revision_exists(conn: AsyncConnection[Any], community_id: int, event_id: str) -> bool:
    row = await (
        await conn.execute(
            "SELECT 1 FROM artifacts_revision WHERE id = %s AND community_id = %s", (event_id, community_id)
        )
    ).fetchone()
    return row is not None


async def already_accepted(actor: Actor, event: Event) -> bool:
    """Resubmission: the revision id is the event id. Says nothing beyond "you sent this before"."""
    pool = await runtime.pool()
    async with pool.connection() as conn:
        return await _revision_exists(conn, actor.community.id, event.id)


async def _anchor_ok(conn: AsyncConnection[Any], community_id: int, root: str, channel: uuid.UUID) -> bool:
    row = await (
        await conn.execute(
            "SELECT 1 FROM buzz_storedevent WHERE id = %s AND community_id = %s AND channel_id = %s"
            " AND deleted_at IS NULL AND kind = ANY(%s)",
            (root, community_id, channel, list(ANCHOR_KINDS)),
        )
    ).fetchone()
    return row is not None


async def _write_access(
    actor: Actor, channel: uuid.UUID, owner: str | None, conn: AsyncConnection[Any]
) -> tuple[bool, str, ChannelAccess]:
    access = await load_access(actor, channel, owner=owner, conn=conn)
    decision = decide_post(actor, channel, access)
    return decision.ok, decision.reason, access


# The artifact row alone: under READ COMMITTED a writer that waited for this lock re-checks the row it
# locked, and a join in this statement would be re-checked against the head row it read before the wait,
# dropping the artifact (a false "head unavailable"). The head's tags are read by a later statement.
_LOCK = """
SELECT a.id, a.type, a.head_id, a.home, a.root, a.deleted
FROM artifacts_artifact a
WHERE a.community_id = %s AND a.d = %s
FOR UPDATE
"""

_HEAD_RAW = "SELECT raw FROM artifacts_revision WHERE id = %s"

_CREATE = f"""
WITH art AS (
  INSERT INTO artifacts_artifact (community_id, d, type, head_id, home, root, deleted, retired, created_at, changed_at)
  VALUES (%(community)s, %(d)s, %(type)s, %(id)s, %(h)s, %(root)s, false, false, now(), clock_timestamp())
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
),
-- The channel's stored event (a NIP-01 replay of the channel returns it), never counted as a message.
{insert_ctes("stored", "ev", source="art")}
SELECT (SELECT seq FROM rev)
"""  # noqa: S608 - composed from code, values are placeholders

_ADVANCE = f"""
WITH rev AS (
  INSERT INTO artifacts_revision (id, community_id, artifact_id, op, channel, prev, root, pubkey, created_at, raw,
                                  seq, accepted_at)
  VALUES (%(id)s, %(community)s, %(artifact)s, %(op)s, %(h)s, %(prev)s, %(root)s, %(pubkey)s, %(created_at)s,
          %(raw)s, nextval('artifacts_accept_seq'), clock_timestamp())
  RETURNING seq
), head AS (
  UPDATE artifacts_artifact SET head_id = %(id)s, home = %(h)s, root = %(root)s, deleted = %(deleted)s,
         retired = false, changed_at = clock_timestamp()
  WHERE id = %(artifact)s
), old_tags AS (
  DELETE FROM artifacts_currenttag WHERE artifact_id = %(artifact)s
), new_tags AS (
  INSERT INTO artifacts_currenttag (artifact_id, name, value)
  SELECT %(artifact)s, t.n, t.v FROM unnest(%(tag_names)s::text[], %(tag_values)s::text[]) AS t(n, v)
), mentions AS (
  INSERT INTO buzz_mention (community_id, pubkey, event_id, channel_id, kind, created_at)
  SELECT %(community)s, p, %(id)s, %(h)s, %(kind)s, now() FROM unnest(%(mentions)s::text[]) AS p
  ON CONFLICT DO NOTHING
), removal AS (
  INSERT INTO artifacts_moveremoval (id, community_id, artifact_id, source, replaced, move_id, raw, seq, accepted_at)
  SELECT %(removal_id)s::varchar, %(community)s, %(artifact)s, %(source)s, %(prev)s, %(id)s, %(removal_raw)s::text,
         nextval('artifacts_accept_seq'), clock_timestamp()
  WHERE %(removal_id)s::varchar IS NOT NULL
),
-- Both are stored events: the revision in its channel, and a move's removal in the source.
{insert_ctes("stored", "ev")},
{insert_ctes("stored_removal", "rm")}
SELECT seq FROM rev
"""  # noqa: S608 - composed from code, values are placeholders


def removal_event(community: CommunityInfo, *, d: uuid.UUID, source: uuid.UUID, replaced: str) -> Event:
    """The relay-signed kind-45011 a move stores in its source: the artifact, the source, the replaced
    revision, and nothing about the destination."""
    return Signer(community.relay_secret).sign_event(
        kind=KIND_REMOVAL,
        tags=[["ar", "1"], ["d", str(d)], ["h", str(source)], ["reason", "moved"], ["prev", replaced]],
        content="",
    )


def _tag_arrays(event: Event) -> tuple[list[str], list[str]]:
    pairs = match_tags(event)
    return [n for n, _ in pairs], [v for _, v in pairs]


def _p_tags(tags: list[list[str]]) -> frozenset[str]:
    return frozenset(t[1] for t in tags if len(t) >= 2 and t[0] == "p")


async def accept_revision(actor: Actor, event: Event) -> WriteResult:
    envelope = parse_envelope(event)
    owner = _owner(event)
    pool = await runtime.pool()
    async with pool.connection() as conn, conn.transaction():
        if envelope.is_create:
            result, published = await _create(conn, actor, event, envelope, owner)
        else:
            result, published = await _advance(conn, actor, event, envelope, owner)
    if result.ok and published:
        await signals.publish_committed(actor.community.id, [(ch, signals.event_message(ev)) for ch, ev in published])
    return result


async def _create(
    conn: AsyncConnection[Any], actor: Actor, event: Event, env: Envelope, owner: str | None
) -> tuple[WriteResult, list[tuple[uuid.UUID, Event]]]:
    ok, reason, _ = await _write_access(actor, env.h, owner, conn)
    if not ok:
        return WriteResult.rejected(reason), []
    if env.root is not None and not await _anchor_ok(conn, actor.community.id, env.root, env.h):
        return WriteResult.rejected(ANCHOR_INVALID), []
    names, values = _tag_arrays(event)
    row = await (
        await conn.execute(
            _CREATE,
            {
                "community": actor.community.id,
                "d": env.d,
                "type": env.type,
                "id": event.id,
                "h": env.h,
                "root": env.root,
                "op": env.op,
                "pubkey": event.pubkey,
                "created_at": event.created_at,
                "raw": event.to_json(),
                "tag_names": names,
                "tag_values": values,
                "mentions": mentioned(event),
                "kind": KIND_ARTIFACT,
                **insert_params("ev", community_id=actor.community.id, event=event, channel=env.h),
            },
        )
    ).fetchone()
    if row is None or row[0] is None:
        # A retry that raced its own first attempt is a duplicate, not a conflict.
        if await _revision_exists(conn, actor.community.id, event.id):
            return WriteResult.accepted(DUPLICATE), []
        # A deleted d stays reserved too: the identity row is never removed.
        return WriteResult.rejected(IDENTITY_TAKEN), []
    return WriteResult.accepted(), [(env.h, event)]


async def _advance(
    conn: AsyncConnection[Any], actor: Actor, event: Event, env: Envelope, owner: str | None
) -> tuple[WriteResult, list[tuple[uuid.UUID, Event]]]:
    row = await (await conn.execute(_LOCK, (actor.community.id, env.d))).fetchone()
    if row is None:
        # The sender's own standing (scope, ban, timeout, a dead token) denies an edit of an existing
        # artifact below; it must deny a missing one alike, or the answer would tell that d exists.
        ok, reason, _ = await _write_access(actor, env.h, owner, conn)
        return WriteResult.rejected(reason if not ok and not _channel_bound(reason) else HEAD_UNAVAILABLE), []
    pk, type_name, head_id, home, root, deleted = row
    # A copy of this event that committed while this one waited for the lock (a retry in flight): like the
    # duplicate answer buzz.events.ingest gives before any check, it says only "you sent this before".
    if head_id == event.id or (env.prev != head_id and await _revision_exists(conn, actor.community.id, event.id)):
        return WriteResult.accepted(DUPLICATE), []
    # Checked before anything else: can the sender write where the artifact lives now?
    ok, reason, _ = await _write_access(actor, home, owner, conn)
    if not ok:
        return WriteResult.rejected(HEAD_UNAVAILABLE if _hidden(reason) else reason), []
    if env.prev != head_id:
        return WriteResult.rejected(HEAD_CHANGED), []
    if env.type != type_name:
        return WriteResult.rejected("invalid: type is immutable"), []
    if deleted and env.op != "restore":
        return WriteResult.rejected("invalid: the artifact is deleted; only restore is accepted"), []
    if not deleted and env.op == "restore":
        return WriteResult.rejected("invalid: only a deleted artifact can be restored"), []
    source: uuid.UUID | None = None
    if env.op == "move":
        if env.h == home:
            return WriteResult.rejected("invalid: a move changes h; use update to stay in the channel"), []
        ok, reason, _ = await _write_access(actor, env.h, owner, conn)
        if not ok:
            return WriteResult.rejected(reason), []
        if env.root is not None and not await _anchor_ok(conn, actor.community.id, env.root, env.h):
            return WriteResult.rejected("invalid: a move's root must be absent or a message in the destination"), []
        source = home
    else:
        if env.h != home:
            return WriteResult.rejected(f"invalid: {env.op} keeps h; changing the channel is a move"), []
        if env.op == "delete":
            if env.root != root:
                return WriteResult.rejected("invalid: a delete keeps the artifact's root"), []
        elif (
            # A root that is kept needs no anchor any more; a new one must exist now.
            env.root is not None
            and env.root != root
            and not await _anchor_ok(conn, actor.community.id, env.root, env.h)
        ):
            return WriteResult.rejected(ANCHOR_INVALID), []
    head_raw = await (await conn.execute(_HEAD_RAW, (head_id,))).fetchone()
    if head_raw is None:
        raise RuntimeError(f"artifact {env.d} has no head revision row")
    previous_p = _p_tags(json.loads(head_raw[0])["tags"])
    removal = removal_event(actor.community, d=env.d, source=source, replaced=head_id) if source else None
    names, values = _tag_arrays(event)
    seq = await (
        await conn.execute(
            _ADVANCE,
            {
                "community": actor.community.id,
                "artifact": pk,
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
                # Mentions only for p tags the previous revision did not carry.
                "mentions": mentioned(event, exclude=previous_p),
                "kind": KIND_ARTIFACT,
                "removal_id": removal.id if removal else None,
                "removal_raw": removal.to_json() if removal else None,
                "source": source,
                **insert_params("ev", community_id=actor.community.id, event=event, channel=env.h),
                **insert_params("rm", community_id=actor.community.id, event=removal, channel=source),
            },
        )
    ).fetchone()
    if seq is None:
        raise RuntimeError("revision insert returned no row")
    published = [(env.h, event)]
    if removal is not None and source is not None:
        published.append((source, removal))
    return WriteResult.accepted(), published


async def reject_removal(actor: Actor, event: Event) -> WriteResult:
    return WriteResult.rejected("invalid: kind 45011 removals are written by the relay, never by clients")


def refuse_removal(removal: Removal) -> None:
    """9005 on a revision or a move removal: refused (with the one 9005 refusal text) until redaction."""
    raise ChannelError(DELETE_REFUSED)


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
    connection runs: BUZZ_SYNC_ENABLED says so for the deployment."""
    section: dict[str, Any] = {
        "version": 1,
        "envelope": ENVELOPE_VERSION,
        "modes": list(MODES),
        "limits": {**DEFAULT_LIMITS.nip11(), **QUERY_LIMITS.nip11()},
        "query_budget_ms": settings.BUZZ_QUERY_BUDGET_MS,
    }
    if settings.BUZZ_SYNC["enabled"]:
        section["sync"] = {"version": 1, "max_events": settings.BUZZ_SYNC["max_events"]}
    return section


def nip11_query_extensions(community: CommunityInfo) -> bool | None:
    """NIP-11 `websocket_query_extensions`: REQ takes the artifact filter (sync)."""
    return True if settings.BUZZ_SYNC["enabled"] else None
