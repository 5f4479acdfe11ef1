"""The access policy: the ONE place that decides who may read a channel and who may post in it.

Posting follows the kind-9 order of the existing Buzz relay (REFERENCE.md),
after the checks every event gets in buzz.events.ingest (signature, time window, size,
pubkey = authenticated identity):

  5. scope: messages:write          6. ban (also the owner's ban of an agent), timeout
  7. h tag; a channel-limited token must cover it
  8. member, or an open channel     9. not archived

Before step 6 come a live token and relay admission: AUTH admits only relay members of a
members-only community, and every decision checks it again, so a member removed while
connected is refused from then on.

Facts are loaded in one round trip (`load_access_many`, any number of channels)
and decided by pure functions (`decide_post`, `decide_read`, `decide_manage`), so
kind 9, NIP-29, REQ and COUNT, the counters, NIP-AR writes (which load the facts
inside their own transaction and call `decide_post`) and every read share one
decision path. `reader_scope` is the one definition of the channels a read covers.
A channel that does not exist and a channel the actor can't read get the same
answer, so errors are never an existence oracle.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from psycopg import AsyncConnection

from buzz.errors import Refused
from buzz.identity.actor import Actor
from buzz.nostr import Event, ProtocolError, verify_owner_attestation
from buzz.runtime import fetch_all
from buzz.sqlarrays import TextArray, UuidArray

SCOPE_READ = "messages:read"
SCOPE_WRITE = "messages:write"
SCOPE_CHANNELS_READ = "channels:read"
SCOPE_CHANNELS_WRITE = "channels:write"
SCOPE_ADMIN_CHANNELS = "admin:channels"
KNOWN_SCOPES = frozenset(
    {
        SCOPE_READ,
        SCOPE_WRITE,
        SCOPE_CHANNELS_READ,
        SCOPE_CHANNELS_WRITE,
        SCOPE_ADMIN_CHANNELS,
        "users:read",
        "users:write",
        "admin:users",
    }
)

# The scope an API token needs for each NIP-29 event, as the Buzz relay asks: membership changes by others and
# a group's deletion are administration, joining and leaving need only channels:read, and deleting a message
# is a message write (the channel roles are checked after, by the channel services).
_GROUP_EVENT_SCOPES: Final = {
    9000: SCOPE_ADMIN_CHANNELS,  # put-user
    9001: SCOPE_ADMIN_CHANNELS,  # remove-user
    9002: SCOPE_CHANNELS_WRITE,  # edit-metadata (archiving: see group_event_scope)
    9005: SCOPE_WRITE,  # delete-event
    9007: SCOPE_CHANNELS_WRITE,  # create-group
    9008: SCOPE_ADMIN_CHANNELS,  # delete-group
    9021: SCOPE_CHANNELS_READ,  # join
    9022: SCOPE_CHANNELS_READ,  # leave
}


def group_event_scope(event: Event) -> str:
    """The scope a token needs to send this NIP-29 group event; archiving or unarchiving is administration."""
    if event.kind == 9002 and event.tag_values("archived"):
        return SCOPE_ADMIN_CHANNELS
    return _GROUP_EVENT_SCOPES.get(event.kind, SCOPE_CHANNELS_WRITE)


# One text for "no such channel" and "you can't see this channel".
NOT_A_MEMBER = "restricted: not a channel member"
ARCHIVED = "invalid: channel is archived"
BANNED = "blocked: this pubkey is banned from the community"
# Checked at AUTH (buzz.identity.communities.admitted) and again on every decision, so a member removed
# while connected is refused from then on.
NOT_ADMITTED = "restricted: not a relay member"
MISSING_H = "invalid: event needs an h tag naming its channel"
BAD_H = "invalid: h tag must be a lowercase channel UUID"
TOKEN_INVALID = "auth-required: this token is revoked or expired"  # noqa: S105 - a message, not a secret
TOKEN_CHANNEL = "restricted: this token does not cover that channel"  # noqa: S105 - a message

WRITER_ROLES = frozenset({"owner", "admin", "member", "guest", "bot"})
MANAGER_ROLES = frozenset({"owner", "admin"})


class Denied(Refused):
    """The reader or writer may not do this; `reason` is the policy's text (one text for missing and unreadable)."""


@dataclass(frozen=True, slots=True)
class ChannelAccess:
    """What the policy read about one actor and one channel, in one round trip."""

    channel_pk: int | None
    visibility: str | None
    type: str | None
    archived: bool
    deleted: bool
    role: str | None
    banned: bool
    timeout_until: dt.datetime | None
    token_ok: bool = True
    admitted: bool = True
    # The channel's effective access epoch in the snapshot these facts were read in: its own access epoch
    # (Channel.access_epoch: its members, visibility, deletion) plus the community's policy stamp
    # (PolicyStamp: bans, relay admission, token revocations, listing, TTL; buzz.access.changes). Both only
    # grow, so every change of who may read the channel advances it. A write's stored event carries it in its
    # live signal, and a live REQ that decided its reader's access at a lower epoch decides it again before
    # delivering (buzz.ws.req).
    epoch: int = 0

    @property
    def exists(self) -> bool:
        return self.channel_pk is not None and not self.deleted

    @property
    def is_member(self) -> bool:
        return self.role is not None


@dataclass(frozen=True, slots=True)
class Decision:
    ok: bool
    reason: str = ""
    access: ChannelAccess | None = None

    @classmethod
    def deny(cls, reason: str, access: ChannelAccess | None = None) -> Decision:
        return cls(False, reason, access)


def policy_stamp_sql(community: str) -> str:
    """The community's policy stamp (buzz.models.PolicyStamp; 0 before its first access change) as an SQL
    expression, `community` an SQL expression of its id: what incremental tokens bind, what a sync compares,
    and half of every channel's effective access epoch (ChannelAccess.epoch)."""
    return f"coalesce((SELECT stamp FROM buzz_policystamp WHERE community_id = {community}), 0)"  # noqa: S608


def admitted_sql(community: str, pubkey: str) -> str:
    """Relay admission as an SQL condition on the community's row as it is now (not a copy of its mode taken
    when a connection authenticated): an open community admits every pubkey, a members-only one its relay
    members. An operator who closes a community is obeyed by every later check, and the connections' live
    subscriptions re-check on the community's standing signal (buzz.live.signals)."""
    # Unqualified names are the nearest FROM's: the member's pubkey and community, the community's own id.
    # OFFSET 0 keeps the lookup one probe of relay_member_unique per check: without it PostgreSQL may run
    # the EXISTS as a hashed subplan, which reads every relay member of every community with that pubkey
    # filter on each write (it did, on tables never analyzed: tests/chat/test_hot_plans.py).
    member = f"SELECT FROM buzz_relaymember WHERE community_id = co.id AND pubkey = {pubkey} OFFSET 0"
    admits = f"admission = 'open' OR EXISTS ({member})"
    return f"EXISTS (SELECT FROM buzz_community co WHERE id = {community} AND ({admits}))"


# One row per asked channel; the ban, timeout, token and admission facts are the actor's, computed once.
# Admission: a members-only community admits its relay members only (the rule AUTH applies).
# The parameters are `acc_`-prefixed (`access_params`) so that a write statement can embed the facts as a CTE
# beside parameters of its own; `channels` is an SQL expression of type uuid[].
def access_facts_sql(channels: str = "%(acc_channels)s::uuid[]") -> str:
    """The facts' SELECT, one row per channel in `channels`; its columns are read by `access_from_row`.

    Each lookup is a LATERAL subquery with LIMIT 1, which the planner can't flatten: the channel is found
    by (community, uuid) for each channel asked about, then the membership by (channel, pubkey). Plain
    LEFT JOINs let a plan made on never-analyzed tables join every channel of the community with every
    membership of the pubkey first and match the channels asked about last: 94 ms per write in a
    community of 1,000 channels (tests/chat/test_hot_plans.py has that shape)."""
    # Unqualified column names in the EXISTS subqueries are their own table's: the artifact create and read
    # statements that embed these facts must stay short enough for psycopg's conversion cache
    # (buzz.sqltext.hot_statement).
    return f"""SELECT q.u AS channel,
  EXISTS (SELECT FROM buzz_ban WHERE community_id = %(acc_community)s AND pubkey = ANY(%(acc_subjects)s)
          AND lifted_at IS NULL AND (expires_at IS NULL OR expires_at > now())) AS banned,
  (SELECT max(t.until) FROM buzz_timeout t WHERE t.community_id = %(acc_community)s AND t.pubkey = %(acc_pubkey)s
          AND t.until > now()) AS timeout_until,
  c.id AS channel_pk, c.visibility, c.type AS ctype, c.archived IS NOT NULL AS archived,
  c.deleted IS NOT NULL AS deleted, m.role,
  c.epoch + {policy_stamp_sql("%(acc_community)s")} AS epoch,
  (%(acc_token)s::bigint IS NULL OR EXISTS (SELECT FROM buzz_apitoken WHERE id = %(acc_token)s
          AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now()))) AS token_ok,
  {admitted_sql("%(acc_community)s", "%(acc_pubkey)s")} AS admitted
FROM unnest({channels}) AS q(u)
LEFT JOIN LATERAL (
  SELECT c.id, c.visibility, c.type, c.archived_at AS archived, c.deleted_at AS deleted, c.access_epoch AS epoch
  FROM buzz_channel c
  WHERE c.community_id = %(acc_community)s AND c.uuid = q.u LIMIT 1) c ON true
LEFT JOIN LATERAL (
  SELECT m.role FROM buzz_membership m
  WHERE m.channel_id = c.id AND m.pubkey = %(acc_pubkey)s AND m.removed_at IS NULL LIMIT 1) m ON true"""  # noqa: S608


# How many leading columns of a statement's row `access_from_row` reads.
FACT_COLUMNS = 12
_ACCESS_SQL = access_facts_sql()


def access_params(actor: Actor, channels: Sequence[uuid.UUID] = (), *, owner: str | None = None) -> dict[str, Any]:
    """The parameters of `access_facts_sql` and `post_allowed_sql`. `channels` fills %(acc_channels)s; a
    statement that computes its channels itself still passes the ones it may ask about, for the token's cover."""
    return {
        "acc_community": actor.community.id,
        "acc_subjects": TextArray([actor.pubkey] if owner is None else [actor.pubkey, owner]),
        "acc_pubkey": actor.pubkey,
        "acc_channels": UuidArray(channels),
        "acc_token": actor.token_id,
        "acc_may_write": has_scope(actor, SCOPE_WRITE),
        # None: the credential covers every channel; else the channels it covers (parse_channel_id drops junk).
        "acc_covered": None
        if actor.channels is None
        else UuidArray(sorted(c for c in (parse_channel_id(v) for v in actor.channels) if c is not None)),
    }


def access_from_row(row: Sequence[Any]) -> tuple[uuid.UUID, ChannelAccess]:
    """The channel and its facts from the first FACT_COLUMNS columns of a row of `access_facts_sql`."""
    channel, banned, timeout_until, pk, visibility, ctype, archived, deleted, role, epoch, token_ok, ok = row[
        :FACT_COLUMNS
    ]
    return channel, ChannelAccess(
        token_ok=bool(token_ok),
        admitted=bool(ok),
        channel_pk=pk,
        visibility=visibility,
        type=ctype,
        archived=bool(archived),
        deleted=bool(deleted),
        role=role,
        banned=bool(banned),
        timeout_until=timeout_until,
        epoch=epoch or 0,
    )


def post_allowed_sql(facts: str) -> str:
    """`decide_post(...).ok` as an SQL condition on a row `facts` of `access_facts_sql` (with the parameters
    of `access_params`), for a write statement that decides and writes in one round trip. The statement
    returns the facts too, and the caller answers with `decide_post` on them, so the reason is always the
    Python decision's; tests/access/test_policy_sql.py pins that the two agree on every combination."""
    roles = ", ".join(f"'{role}'" for role in sorted(WRITER_ROLES))
    f = facts
    return f"""coalesce(%(acc_may_write)s::boolean AND {f}.token_ok AND {f}.admitted AND NOT {f}.banned
  AND {f}.timeout_until IS NULL
  AND (%(acc_covered)s::uuid[] IS NULL OR {f}.channel = ANY(%(acc_covered)s::uuid[]))
  AND {f}.channel_pk IS NOT NULL AND NOT {f}.deleted
  AND CASE WHEN {f}.role IS NOT NULL THEN {f}.role IN ({roles})
           ELSE {f}.visibility = 'open' AND {f}.ctype <> 'dm' END
  AND NOT {f}.archived, false)"""


def parse_channel_id(value: str) -> uuid.UUID | None:
    """A channel id is a non-nil lowercase hyphenated UUID; anything else is None."""
    if len(value) != 36 or value != value.lower():
        return None
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return None
    if parsed.int == 0 or str(parsed) != value:
        return None
    return parsed


def channel_of(event: Event) -> uuid.UUID:
    """The event's channel from its single h tag. Raises ProtocolError."""
    values = event.tag_values("h")
    if not values:
        raise ProtocolError(MISSING_H)
    if len(values) > 1:
        raise ProtocolError("invalid: event must have exactly one h tag")
    channel = parse_channel_id(values[0])
    if channel is None:
        raise ProtocolError(BAD_H)
    return channel


async def load_access_many(
    actor: Actor,
    channels: Sequence[uuid.UUID],
    *,
    owner: str | None = None,
    conn: AsyncConnection[Any] | None = None,
) -> dict[uuid.UUID, ChannelAccess]:
    """The facts about the actor and each channel, in one round trip."""
    sql, params = access_statement(actor, channels, owner=owner)
    rows = await fetch_all(sql, params, conn=conn)
    return access_of(rows)


def access_statement(
    actor: Actor, channels: Sequence[uuid.UUID], *, owner: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The statement of `load_access_many` and its parameters: a caller may send it with statements of its
    own (in one pipeline) and read its rows with `access_of`."""
    return _ACCESS_SQL, access_params(actor, channels, owner=owner)


def access_of(rows: Sequence[Sequence[Any]]) -> dict[uuid.UUID, ChannelAccess]:
    """Each channel's facts from the rows of `access_statement`."""
    return dict(access_from_row(row) for row in rows)


# The effective access epoch (ChannelAccess.epoch) of channels of one community: params (community, channels).
EPOCHS_SQL: Final = (
    f"SELECT uuid, access_epoch + {policy_stamp_sql('c.community_id')}"  # noqa: S608 - composed from code
    " FROM buzz_channel c WHERE community_id = %s AND uuid = ANY(%s)"
)


async def channel_epochs(
    community_id: int, channels: Sequence[uuid.UUID], *, conn: AsyncConnection[Any] | None = None
) -> dict[uuid.UUID, int]:
    """The access epoch of each channel that exists (ChannelAccess.epoch), now."""
    rows = await fetch_all(EPOCHS_SQL, (community_id, UuidArray(channels)), conn=conn)
    return {channel: epoch for channel, epoch in rows}


async def load_access(
    actor: Actor, channel: uuid.UUID, *, owner: str | None = None, conn: AsyncConnection[Any] | None = None
) -> ChannelAccess:
    return (await load_access_many(actor, [channel], owner=owner, conn=conn))[channel]


def has_scope(actor: Actor, scope: str) -> bool:
    return actor.scopes is None or scope in actor.scopes


def token_covers(actor: Actor, channel: uuid.UUID) -> bool:
    return actor.channels is None or str(channel) in actor.channels


def owner_of_agent(event: Event) -> str | None:
    """The owner named by a valid NIP-OA auth tag (whose ban also bans the agent); invalid tags are rejected
    by the caller's parse."""
    attestation = verify_owner_attestation(event)
    return attestation.owner if attestation is not None else None


def _standing(actor: Actor, channel: uuid.UUID, access: ChannelAccess, *, writing: bool) -> str | None:
    """The credential and moderation checks (steps 6-7): the denial reason, or None."""
    if not access.token_ok:
        return TOKEN_INVALID
    if not access.admitted:
        return NOT_ADMITTED
    if access.banned:
        return BANNED
    if writing and access.timeout_until is not None:
        return f"restricted: timed out until {int(access.timeout_until.timestamp())}"
    if not token_covers(actor, channel):
        return TOKEN_CHANNEL
    return None


def _visible(access: ChannelAccess) -> bool:
    """Step 8: a member, or anyone in an open (non-DM) channel. A deleted channel is nobody's."""
    if not access.exists:
        return False
    if access.is_member:
        return access.role in WRITER_ROLES
    return access.visibility == "open" and access.type != "dm"


def decide_post(actor: Actor, channel: uuid.UUID, access: ChannelAccess) -> Decision:
    """Steps 5-9 on facts already loaded. Pure: the unit tests drive it directly."""
    if not has_scope(actor, SCOPE_WRITE):
        return Decision.deny(f"restricted: this token lacks the {SCOPE_WRITE} scope", access)
    reason = _standing(actor, channel, access, writing=True)
    if reason is None and not _visible(access):
        reason = NOT_A_MEMBER
    if reason is None and access.archived:
        reason = ARCHIVED
    return Decision(reason is None, reason or "", access)


def decide_read(actor: Actor, channel: uuid.UUID, access: ChannelAccess) -> Decision:
    """Read permission: scope, ban, token channel limit, membership or an open channel. Archive doesn't matter."""
    if not has_scope(actor, SCOPE_READ):
        return Decision.deny(f"restricted: this token lacks the {SCOPE_READ} scope", access)
    reason = _standing(actor, channel, access, writing=False)
    if reason is None and not _visible(access):
        reason = NOT_A_MEMBER
    return Decision(reason is None, reason or "", access)


def decide_manage(actor: Actor, channel: uuid.UUID, access: ChannelAccess, *, scope: str, creating: bool) -> Decision:
    """NIP-29 group events: scope, standing, and (unless creating) a visible channel."""
    if not has_scope(actor, scope):
        return Decision.deny(f"restricted: this token lacks the {scope} scope", access)
    reason = _standing(actor, channel, access, writing=True)
    if reason is None and not creating and not _visible(access):
        reason = NOT_A_MEMBER
    return Decision(reason is None, reason or "", access)


async def check_post(
    actor: Actor, event: Event, *, conn: AsyncConnection[Any] | None = None
) -> tuple[uuid.UUID, Decision]:
    """Can actor post `event` (kind 9, or anything that follows kind-9 rules) in its h channel?"""
    if not has_scope(actor, SCOPE_WRITE):
        return uuid.UUID(int=0), Decision.deny(f"restricted: this token lacks the {SCOPE_WRITE} scope")
    channel = channel_of(event)
    owner = owner_of_agent(event)
    access = await load_access(actor, channel, owner=owner, conn=conn)
    return channel, decide_post(actor, channel, access)


async def check_manage(
    actor: Actor, event: Event, *, scope: str, creating: bool = False, conn: AsyncConnection[Any] | None = None
) -> tuple[uuid.UUID, Decision]:
    """Channel roles (who may add, remove, edit, delete) are then checked by the channel
    services under the channel's row lock, with the rules in buzz.channels."""
    if not has_scope(actor, scope):
        return uuid.UUID(int=0), Decision.deny(f"restricted: this token lacks the {scope} scope")
    channel = channel_of(event)
    access = await load_access(actor, channel, owner=owner_of_agent(event), conn=conn)
    return channel, decide_manage(actor, channel, access, scope=scope, creating=creating)


async def check_read(actor: Actor, channel: uuid.UUID, *, conn: AsyncConnection[Any] | None = None) -> Decision:
    """Read permission on `channel`, now; the decision carries the facts it was made on (Decision.access, with
    the epoch they were read at)."""
    access = await load_access(actor, channel, conn=conn)
    return decide_read(actor, channel, access)


_READABLE_SQL = f"""
SELECT c.uuid FROM buzz_channel c
WHERE c.community_id = %(community)s AND c.deleted_at IS NULL
  AND {admitted_sql("%(community)s", "%(pubkey)s")}
  AND (%(token)s::bigint IS NULL OR EXISTS (SELECT 1 FROM buzz_apitoken k WHERE k.id = %(token)s
       AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())))
  AND NOT EXISTS (SELECT 1 FROM buzz_ban b WHERE b.community_id = %(community)s AND b.pubkey = %(pubkey)s
                  AND b.lifted_at IS NULL AND (b.expires_at IS NULL OR b.expires_at > now()))
  AND (EXISTS (SELECT 1 FROM buzz_membership m WHERE m.channel_id = c.id AND m.pubkey = %(pubkey)s
               AND m.removed_at IS NULL)
       OR (c.visibility = 'open' AND c.type <> 'dm' AND c.listed))
"""  # noqa: S608 - composed from code, values are placeholders


_STANDING_SQL = f"""
SELECT
  {admitted_sql("%(community)s", "%(pubkey)s")},
  EXISTS (SELECT 1 FROM buzz_ban b WHERE b.community_id = %(community)s AND b.pubkey = %(pubkey)s
          AND b.lifted_at IS NULL AND (b.expires_at IS NULL OR b.expires_at > now())),
  (%(token)s::bigint IS NULL OR EXISTS (SELECT 1 FROM buzz_apitoken k WHERE k.id = %(token)s AND k.revoked_at IS NULL
          AND (k.expires_at IS NULL OR k.expires_at > now())))
"""  # noqa: S608 - composed from code, values are placeholders


async def check_reader(actor: Actor, *, conn: AsyncConnection[Any] | None = None) -> Decision:
    """Reading without naming channels: the scope, a live token, relay admission and no ban.

    The per-channel checks follow. This is also what a live subscription re-checks on a standing signal.
    """
    if not has_scope(actor, SCOPE_READ):
        return Decision.deny(f"restricted: this token lacks the {SCOPE_READ} scope")
    sql, params = reader_standing_statement(actor)
    rows = await fetch_all(sql, params, conn=conn)
    row = rows[0] if rows else None
    return reader_standing_of(actor, row)


# The columns of a row of `reader_standing_statement` and of `wide_scope_statement` (the standing's, then the
# readable channels), for a statement that embeds them.
READER_STANDING_COLUMNS = 3
WIDE_SCOPE_COLUMNS = READER_STANDING_COLUMNS + 1


def reader_standing_statement(actor: Actor) -> tuple[str, dict[str, Any]]:
    """The statement of `check_reader` and its parameters: a caller may send it with statements of its own
    (in one pipeline) and decide on its row with `reader_standing_of`."""
    return _STANDING_SQL, _actor_params(actor)


def reader_standing_of(actor: Actor, row: Sequence[Any] | None) -> Decision:
    """`check_reader`'s decision on a row of `reader_standing_statement(actor)`."""
    if not has_scope(actor, SCOPE_READ):
        return Decision.deny(f"restricted: this token lacks the {SCOPE_READ} scope")
    if row is None or not row[2]:
        return Decision.deny(TOKEN_INVALID)
    if not row[0]:
        return Decision.deny(NOT_ADMITTED)
    if row[1]:
        return Decision.deny(BANNED)
    return Decision(True)


def _actor_params(actor: Actor) -> dict[str, Any]:
    return {
        "community": actor.community.id,
        "pubkey": actor.pubkey,
        "token": actor.token_id,
    }


async def readable_channels(actor: Actor, *, conn: AsyncConnection[Any] | None = None) -> list[uuid.UUID]:
    """Channels a REQ without #h covers: memberships and listed open channels (unlisted need an explicit #h)."""
    if not has_scope(actor, SCOPE_READ):
        return []
    params = _actor_params(actor)
    rows = await fetch_all(_READABLE_SQL, params, conn=conn)
    return [r[0] for r in rows if token_covers(actor, r[0])]


# The standing checks and the channels a read without #h covers, in one statement (readable_scope).
_STANDING_AND_READABLE_SQL = _STANDING_SQL.rstrip() + ",\n  ARRAY(" + _READABLE_SQL.strip() + ")\n"


# The same with each of those channels' access epoch, aggregated once, and the policy stamp: the row's
# standing, the channels, their Channel.access_epoch in the same order, the stamp (`wide_epochs_of`).
_READABLE_WITH_EPOCHS_SQL = _READABLE_SQL.replace("SELECT c.uuid FROM", "SELECT c.uuid, c.access_epoch FROM", 1)
if _READABLE_WITH_EPOCHS_SQL == _READABLE_SQL:  # _READABLE_SQL no longer starts as this expects
    raise RuntimeError("_READABLE_WITH_EPOCHS_SQL could not add the access epoch to _READABLE_SQL")
_STANDING_READABLE_AND_EPOCHS_SQL = f"""{_STANDING_SQL.rstrip()},
  coalesce(r.channels, ARRAY[]::uuid[]), coalesce(r.epochs, ARRAY[]::bigint[]), {policy_stamp_sql("%(community)s")}
FROM (SELECT array_agg(x.uuid ORDER BY x.uuid) AS channels, array_agg(x.access_epoch::bigint ORDER BY x.uuid) AS epochs
      FROM ({_READABLE_WITH_EPOCHS_SQL.strip()}) x) r
"""  # noqa: S608 - composed from code, values are placeholders


def wide_scope_statement(actor: Actor, *, epochs: bool = False) -> tuple[str, dict[str, Any]]:
    """The statement of reader_scope's wide scope and its parameters: a caller may send it with statements of
    its own (in one pipeline) and read its row with `wide_scope_of`. With `epochs`, the row also holds each
    channel's effective access epoch (`wide_epochs_of`)."""
    return (_STANDING_READABLE_AND_EPOCHS_SQL if epochs else _STANDING_AND_READABLE_SQL), _actor_params(actor)


def wide_epochs_of(row: Sequence[Any] | None) -> dict[uuid.UUID, int]:
    """The effective access epoch (ChannelAccess.epoch) of each channel of a row of
    `wide_scope_statement(actor, epochs=True)`: its own access epoch plus the policy stamp."""
    if row is None:
        return {}
    channels, epochs, stamp = row[READER_STANDING_COLUMNS : READER_STANDING_COLUMNS + 3]
    return {channel: int(epoch) + int(stamp or 0) for channel, epoch in zip(channels, epochs, strict=True)}


def wide_scope_of(actor: Actor, row: Sequence[Any] | None) -> list[uuid.UUID]:
    """The scope from a row of `wide_scope_statement(actor)`: Denied as check_reader decides it."""
    standing = reader_standing_of(actor, row)
    if not standing.ok:
        raise Denied(standing.reason)
    return sorted(c for c in (row[READER_STANDING_COLUMNS] if row is not None else ()) if token_covers(actor, c))


async def _wide_row(actor: Actor, *, epochs: bool, conn: AsyncConnection[Any] | None) -> Sequence[Any] | None:
    """The row of `wide_scope_statement(actor, epochs=epochs)`, for `wide_scope_of` (and `wide_epochs_of`): the
    reader's standing and the channels it joined or that are listed, in one statement, where check_reader
    and readable_channels are two. Raises Denied for a token without the read scope (nothing is sent)."""
    if not has_scope(actor, SCOPE_READ):
        raise Denied(f"restricted: this token lacks the {SCOPE_READ} scope")
    sql, params = wide_scope_statement(actor, epochs=epochs)
    rows = await fetch_all(sql, params, conn=conn)
    return rows[0] if rows else None


async def reader_scope(
    actor: Actor,
    *,
    named: Sequence[uuid.UUID] = (),
    wide: bool = False,
    optional: Sequence[uuid.UUID] = (),
    conn: AsyncConnection[Any] | None = None,
) -> list[uuid.UUID]:
    """The channels a read covers, sorted: the one definition REQ, COUNT, the NIP-AR views and sync share.

    `named` (an explicit #h): every one must be readable, else Denied with the first denial's reason, one
    text for missing and unreadable channels. `wide` (no #h): every channel the reader can read that it
    joined or that is listed; unlisted open channels need to be named. `optional`: added when readable,
    skipped without a word otherwise (so the answer is no existence oracle). Raises Denied.
    """
    channels, _ = await reader_scope_and_epochs(actor, named=named, wide=wide, optional=optional, conn=conn)
    return channels


async def reader_scope_and_epochs(
    actor: Actor,
    *,
    named: Sequence[uuid.UUID] = (),
    wide: bool = False,
    optional: Sequence[uuid.UUID] = (),
    epochs_of: Sequence[uuid.UUID] = (),
    conn: AsyncConnection[Any] | None = None,
) -> tuple[list[uuid.UUID], dict[uuid.UUID, int]]:
    """`reader_scope`, and the effective access epoch (ChannelAccess.epoch) of each channel of `epochs_of`
    that is in the scope, read in the statement that decides the channel: a named or optional channel's with
    its facts, a wide scope's with its channels (`wide_scope_statement(epochs=True)`). The same statements
    as reader_scope, none more. Raises Denied."""
    wanted = sorted(set(named))
    epochs: dict[uuid.UUID, int] = {}
    channels: set[uuid.UUID] = set()
    if wanted:
        facts = await load_access_many(actor, wanted, conn=conn)
        for channel in wanted:  # the first denial, in channel order
            decision = decide_read(actor, channel, facts[channel])
            if not decision.ok:
                raise Denied(decision.reason)
        channels.update(wanted)
        epochs.update((c, facts[c].epoch) for c in wanted)
    if wide:
        row = await _wide_row(actor, epochs=bool(epochs_of), conn=conn)
        channels.update(wide_scope_of(actor, row))
        if epochs_of:
            epochs.update(wide_epochs_of(row))
        extra = sorted(set(optional) - channels)
        if extra:
            more = await load_access_many(actor, extra, conn=conn)
            readable = [c for c in extra if decide_read(actor, c, more[c]).ok]
            channels.update(readable)
            epochs.update((c, more[c].epoch) for c in readable)
    return sorted(channels), {c: epochs[c] for c in epochs_of if c in channels}
