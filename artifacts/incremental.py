"""NIP-AR incremental reads: POST /query {"artifact": "incremental", "query": {...}} (artifacts.incremental).

A client keeps an eventually consistent local store of one current-view query. A pass is a run of
pages under one database start time (startedAt): the initial pass pages through the current heads
that existed at that time; a later pass (a checkpoint) pages through what changed from the previous
start minus the 120 s overlap through its own start, inclusive. Every page is ordered by
(change timestamp, source, stable identity):

  source 0  membership removals of this reader          -> removeChannel (when it cost read access,
                                                           or the reader has joined again since)
  source 1  head changes (Artifact.changed_at)            -> upsert or remove
  source 2  this reader's grants (Membership.joined_at)   -> upsert of each current head in the channel
  source 3  move-source records (MoveRemoval.accepted_at) -> upsert or remove

Every candidate is answered from the current state at the time of the page read (readable,
permanent channel, live, matching), never from the change itself, so a replay gives the same answer
and the order between candidates of one artifact never matters. All four stamps are database
clock_timestamp() values.

Cursors and checkpoints are django.core.signing tokens (HMAC-SHA256 with BUZZ_INCREMENTAL_SIGNING_KEY,
each kind with its own salt). They bind the community, a digest of the reader (pubkey and token), a
digest of the exact query, the community's policy stamp and the pass's start time; a cursor also the
window's start and the last page position. Nothing is kept on the server. Relevant access changes
advance the policy stamp in their own transaction (buzz.access.changes): a token minted before one is
answered 409 incremental_reset, reason policy_changed.

Bounds: at most four operations at a time per process, each within an eight-second budget whose
statements each get at most two seconds; pages shrink to the response byte bound, and one result
larger than it is 413. A failure never returns a cursor or a checkpoint: no progress advances.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import json
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import psycopg
import psycopg.errors
import psycopg_pool
from django.conf import settings
from django.core import signing
from psycopg import AsyncConnection

from artifacts.query import ArtifactQuery, QueryError, parse_query
from artifacts.selectors import HEAD_JOIN, current_where, current_where_in, reads_tag_index
from buzz.access.policy import (
    FACT_COLUMNS,
    READER_STANDING_COLUMNS,
    WIDE_SCOPE_COLUMNS,
    Denied,
    access_of,
    access_statement,
    decide_read,
    policy_stamp_sql,
    reader_standing_of,
    reader_standing_statement,
    wide_scope_of,
    wide_scope_statement,
)
from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo
from buzz.identity.httpauth import BEARER_REFUSED, AuthFailure
from buzz.identity.tokens import BEARER_LOOKUP, BEARER_LOOKUP_COLUMNS, bearer_actor, bearer_lookup
from buzz.nostr import strictjson, utf8_size
from buzz.runtime import pipeline, runtime
from buzz.sqlarrays import UuidArray
from buzz.sqltext import hot_statement

VERSION: Final = 1
OVERLAP_SECONDS: Final = 120
CHECKPOINT_LIFETIME_SECONDS: Final = 30 * 86400
CURRENT_ROWS: Final = 100
MAX_ID_BYTES: Final = 256
MAX_CONCURRENT: Final = 4
STATEMENT_BUDGET_MS: Final = 2000
OPERATION_BUDGET_SECONDS: Final = 8.0
# A token longer than this is not one of ours (ours are a few hundred characters).
MAX_TOKEN_CHARS: Final = 2048
# Room in a page for everything but its changes: the envelope, startedAt and a cursor or a checkpoint (a
# page carries one of them, never both, and `sign_token` never makes one past MAX_TOKEN_CHARS).
_ENVELOPE_BYTES: Final = MAX_TOKEN_CHARS + 256
#: The smallest BUZZ_INCREMENTAL_RESPONSE_BYTES (buzz.settings checks it): a page's envelope, and room.
MIN_RESPONSE_BYTES: Final = 2 * _ENVELOPE_BYTES

_SALTS: Final = {
    "cursor": "buzz.artifacts.incremental.cursor.v1",
    "checkpoint": "buzz.artifacts.incremental.checkpoint.v1",
}
_REQUEST_KEYS: Final = frozenset({"artifact", "query", "checkpoint", "cursor", "action", "artifactIds"})

# Sources, in their order within one timestamp.
SRC_REMOVAL, SRC_HEAD, SRC_GRANT, SRC_MOVE = 0, 1, 2, 3


def enabled() -> bool:
    return bool(settings.BUZZ_INCREMENTAL["enabled"])


def page_rows() -> int:
    return int(settings.BUZZ_INCREMENTAL["page_rows"])


def response_bytes() -> int:
    return int(settings.BUZZ_INCREMENTAL["response_bytes"])


def nip11() -> dict[str, Any]:
    """NIP-11 `artifacts.incremental`, exactly the spec's object (with the configured page and byte bounds)."""
    return {
        "version": VERSION,
        "overlapSeconds": OVERLAP_SECONDS,
        "pageRows": page_rows(),
        "currentRows": CURRENT_ROWS,
        "responseBytes": response_bytes(),
        "permanentChannelsOnly": True,
        "checkpointLifetimeSeconds": CHECKPOINT_LIFETIME_SECONDS,
    }


# --- errors -----------------------------------------------------------------------------------


class IncrementalError(Exception):
    """An answer that is not a page: HTTP `status` with {"error": code, "reason": reason, "message": message}."""

    def __init__(self, status: int, code: str, reason: str | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.reason = reason
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "reason": self.reason, "message": self.message}


def invalid(message: str, reason: str = "request") -> IncrementalError:
    return IncrementalError(400, "incremental_invalid", reason, message)


def unavailable(message: str, reason: str) -> IncrementalError:
    return IncrementalError(503, "incremental_unavailable", reason, message)


POLICY_CHANGED: Final = "policy_changed"
CHECKPOINT_EXPIRED: Final = "checkpoint_expired"


def reset(reason: str) -> IncrementalError:
    # Never names a channel: the stamp is the whole community's.
    text = {
        POLICY_CHANGED: "access in this community changed since this token was issued; run a new initial read",
        CHECKPOINT_EXPIRED: "this checkpoint is older than 30 days; run a new initial read",
    }[reason]
    return IncrementalError(409, "incremental_reset", reason, text)


# --- the request ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    query: ArtifactQuery
    digest: str  # of the exact query
    checkpoint: str | None = None
    cursor: str | None = None
    ids: tuple[str, ...] | None = None  # a current-ID read


def looks_incremental(body: bytes) -> bool:
    """Is this /query body meant as an incremental read? Any filter of it (an array's, or a bare object) that
    says "artifact": "incremental" makes it one, so a malformed incremental request is answered as one (400
    incremental_invalid), not as an ordinary query. Cheap: most bodies spell neither the word nor an escape."""
    if b"incremental" not in body and b"\\u" not in body:
        return False
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError):
        return False
    filters = decoded if isinstance(decoded, list) else [decoded]
    return any(isinstance(f, dict) and f.get("artifact") == "incremental" for f in filters)


def decode_body(body: bytes) -> Any:
    """An incremental request's body (one `looks_incremental` accepts). Raises IncrementalError (400): an
    object that names a key twice is refused (buzz.nostr.strictjson)."""
    try:
        return strictjson.loads(body)
    except strictjson.DuplicateKey as err:
        raise invalid(str(err)) from None


def query_digest(raw: dict[str, Any]) -> str:
    """A fixed-size digest of the exact query (its JSON with sorted keys, UTF-8)."""
    text = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(b"nip-ar-incremental-query\0" + text.encode("utf-8")).hexdigest()


def _utf8_size(value: str) -> int | None:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def parse_request(decoded: Any) -> Request:
    """The one filter of an incremental /query body. Raises IncrementalError (400 incremental_invalid)."""
    if not isinstance(decoded, list) or len(decoded) != 1 or not isinstance(decoded[0], dict):
        raise invalid("the body must be a JSON array with exactly one filter")
    raw = decoded[0]
    unknown = [k for k in raw if k not in _REQUEST_KEYS]
    if unknown:
        raise invalid(f"unsupported key {str(unknown[0])[:64]!r}")
    if raw.get("artifact") != "incremental":
        raise invalid('the filter needs "artifact": "incremental"')
    q = raw.get("query")
    if not isinstance(q, dict) or q.get("artifact") != "current":
        raise invalid('query must be a current-view filter ({"artifact": "current", ...})')
    try:
        query = parse_query(q)
    except QueryError as err:
        raise invalid(f"query: {err.reason}") from None
    if query.paged:
        raise invalid("query takes no limit or offset: the relay pages an incremental read")
    digest = query_digest(q)
    checkpoint, cursor = raw.get("checkpoint"), raw.get("cursor")
    for name, token in (("checkpoint", checkpoint), ("cursor", cursor)):
        # Present means a token: a null one is not "none" (a client that lost its checkpoint would be served an
        # initial read, which never reports removals).
        if name in raw and (not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS):
            raise invalid(f"{name} must be the opaque string the relay returned", reason="token")
    if "action" in raw:
        if raw["action"] != "current":
            raise invalid('action must be "current"')
        if checkpoint is not None or cursor is not None:
            raise invalid("a current-ID read takes no checkpoint or cursor")
        return Request(query=query, digest=digest, ids=_parse_ids(raw.get("artifactIds")))
    if "artifactIds" in raw:
        raise invalid('artifactIds needs "action": "current"')
    if checkpoint is not None and cursor is not None:
        raise invalid("send a checkpoint (a later read) or a cursor (a continuation), not both")
    return Request(query=query, digest=digest, checkpoint=checkpoint, cursor=cursor)


def _parse_ids(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= CURRENT_ROWS:
        raise invalid(f"artifactIds must be an array of 1 to {CURRENT_ROWS} strings")
    seen: set[str] = set()
    for v in value:
        if not isinstance(v, str) or not v:
            raise invalid("artifactIds must be nonempty strings")
        size = _utf8_size(v)
        if size is None or size > MAX_ID_BYTES:
            raise invalid(f"each artifactId is at most {MAX_ID_BYTES} UTF-8 bytes of text")
        if v in seen:
            raise invalid("artifactIds must be unique")
        seen.add(v)
    return tuple(value)


def canonical_uuid(value: str) -> uuid.UUID | None:
    """An artifact id as tags spell it (lowercase, hyphenated), else None."""
    if len(value) != 36:
        return None
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return None
    return parsed if str(parsed) == value else None


# --- tokens -----------------------------------------------------------------------------------


def _key() -> str:
    return str(settings.BUZZ_INCREMENTAL["signing_key"])


def reader_digest(actor: Actor) -> str:
    """Who reads: the pubkey and the credential (a token limits channels and scopes; NIP-98 is None)."""
    text = f"{actor.community.id}\0{actor.pubkey}\0{actor.token_id if actor.token_id is not None else ''}"
    return hashlib.sha256(b"nip-ar-incremental-reader\0" + text.encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=8)
def _signer(key: str, kind: str) -> signing.TimestampSigner:
    """The signer of one kind of token under `key` (the format of `signing.dumps`). It has no fallback keys:
    Django's would be settings.SECRET_KEY_FALLBACKS, retired keys of another identity, and a token one of
    them signed would verify. Kept, not made per token: a page signs one token and opens one."""
    return signing.TimestampSigner(key=key, salt=_SALTS[kind], fallback_keys=[])


def sign_token(kind: str, payload: dict[str, Any]) -> str:
    token = _signer(_key(), kind).sign_object(payload, compress=True)
    if len(token) > MAX_TOKEN_CHARS:  # never: the payloads are a few short fields (and a page reserves this)
        raise RuntimeError(f"a {kind} of {len(token)} characters, past MAX_TOKEN_CHARS")
    return token


_OPENED_MAX: Final = 1024


def open_token(kind: str, token: str) -> dict[str, Any]:
    """The payload of a token this relay (any instance sharing the key) signed as `kind`. Raises 400.
    The payload is shared with later calls for the same token: callers only read it."""
    return _verified(_key(), kind, token)


# A page opens its cursor up to three times (the one-trip guess, then `resume` twice), and a signature's
# verdict under one key never changes: verified payloads are kept, by (key, kind, token). lru_cache keeps
# no exception, so a refused token is checked again every time.
@functools.lru_cache(maxsize=_OPENED_MAX)
def _verified(key: str, kind: str, token: str) -> dict[str, Any]:
    try:
        payload = _signer(key, kind).unsign_object(token)
    except (signing.BadSignature, ValueError, UnicodeDecodeError):
        raise invalid(f"this {kind} was not issued by this relay, or was altered", reason="token") from None
    if not isinstance(payload, dict) or payload.get("v") != VERSION:
        raise invalid(f"this {kind} was not issued by this relay, or was altered", reason="token")
    return payload


def micros(t: dt.datetime) -> int:
    delta = t - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(us: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)


def rfc3339(t: dt.datetime) -> str:
    """RFC 3339 in UTC with microseconds: 2026-10-21T12:00:00.123456Z."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Position:
    ts: int  # microseconds
    src: int
    ident: str

    def as_list(self) -> list[Any]:
        return [self.ts, self.src, self.ident]


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass: its start (the database clock when it began), the window start (None: an initial read),
    the policy stamp it runs under, and where its next page begins (None: the first page)."""

    start: int
    since: int | None
    stamp: int
    after: Position | None = None


def _bound(payload: dict[str, Any], actor: Actor, request: Request) -> None:
    if payload.get("c") != actor.community.id or payload.get("r") != reader_digest(actor):
        raise invalid("this token was issued to another reader", reason="token")
    if payload.get("q") != request.digest:
        raise invalid("this token was issued for another query", reason="token")


def _int(payload: dict[str, Any], key: str) -> int:
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid("malformed token", reason="token")
    return value


def _optional_int(payload: dict[str, Any], key: str) -> int | None:
    return None if payload.get(key) is None else _int(payload, key)


def mint_checkpoint(actor: Actor, request: Request, *, stamp: int, start: int) -> str:
    return sign_token(
        "checkpoint",
        {"v": VERSION, "c": actor.community.id, "r": reader_digest(actor), "q": request.digest, "p": stamp, "s": start},
    )


def _mint_cursor(actor: Actor, request: Request, run: Pass, at: Position) -> str:
    return sign_token(
        "cursor",
        {
            "v": VERSION,
            "c": actor.community.id,
            "r": reader_digest(actor),
            "q": request.digest,
            "p": run.stamp,
            "s": run.start,
            "f": run.since,
            "k": at.as_list(),
        },
    )


def resume(actor: Actor, request: Request, *, now: dt.datetime, stamp: int) -> Pass:
    """The pass this request continues or starts, checked against the current policy stamp and the clock.
    Pure (given the database's now and stamp). Raises IncrementalError."""
    now_us = micros(now)
    lifetime_us = CHECKPOINT_LIFETIME_SECONDS * 1_000_000
    if request.cursor is not None:
        payload = open_token("cursor", request.cursor)
        _bound(payload, actor, request)
        start = _int(payload, "s")
        since = _optional_int(payload, "f")
        key = payload.get("k")
        if (
            not isinstance(key, list)
            or len(key) != 3
            or not isinstance(key[0], int)
            or not isinstance(key[1], int)
            or not isinstance(key[2], str)
        ):
            raise invalid("malformed cursor", reason="token")
        if payload.get("p") != stamp:
            raise reset(POLICY_CHANGED)
        if now_us - start > lifetime_us:
            # The checkpoint this pass ends with would carry its start: older than a checkpoint lives, it could
            # only be refused. The window's own start was checked when the pass began (its checkpoint).
            raise reset(CHECKPOINT_EXPIRED)
        return Pass(start=start, since=since, stamp=stamp, after=Position(key[0], key[1], key[2]))
    if request.checkpoint is not None:
        payload = open_token("checkpoint", request.checkpoint)
        _bound(payload, actor, request)
        saved = _int(payload, "s")
        if payload.get("p") != stamp:
            raise reset(POLICY_CHANGED)
        if now_us - saved > lifetime_us:
            raise reset(CHECKPOINT_EXPIRED)
        return Pass(start=now_us, since=saved, stamp=stamp)
    return Pass(start=now_us, since=None, stamp=stamp)


# --- reading ----------------------------------------------------------------------------------

_active = 0
_T = TypeVar("_T")


async def within_operation(deadline: float, work: Callable[[], Awaitable[_T]]) -> _T:
    """`work()` in one of MAX_CONCURRENT operation slots of this process (past them, 503 at once: nothing
    queues), answered by `deadline` (loop time, the operation budget), with the answers for every failure.

    The work runs as a task of its own that holds the slot until it has ended. At the deadline it is
    cancelled and the answer is 503 operation_budget at once: psycopg waits up to ten more seconds for a
    database that stopped answering to take a cancel, and the client should not wait with it."""
    global _active
    if _active >= MAX_CONCURRENT:
        raise unavailable(f"at most {MAX_CONCURRENT} incremental reads run at once here; retry", "concurrency")
    _active += 1
    task = asyncio.ensure_future(_answered(work))
    task.add_done_callback(_ended)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
    except asyncio.CancelledError:
        task.cancel()  # the client went away: so does the read
        raise
    if task in done:
        return task.result()
    task.cancel()
    raise unavailable(f"the read exceeded its {OPERATION_BUDGET_SECONDS:g} s budget; retry", "operation_budget")


def _ended(task: asyncio.Future[Any]) -> None:
    global _active
    _active -= 1
    if not task.cancelled():
        task.exception()  # retrieved: a read cancelled at its deadline may still end in an error


async def _answered(work: Callable[[], Awaitable[_T]]) -> _T:
    try:
        return await work()
    except TimeoutError:
        raise unavailable("the database is busy; retry", "database") from None
    except psycopg.errors.QueryCanceled:
        raise _statement_overrun() from None
    except (psycopg_pool.PoolTimeout, psycopg.Error):
        raise unavailable("the database is unavailable; retry", "database") from None


@contextlib.asynccontextmanager
async def statement(deadline: float) -> AsyncIterator[None]:
    """The statement budget for work outside the read's own transaction (NIP-98 authentication: its replay
    guard and its admission lookup): past it, 503 statement_budget. The relay's timer cancels the lookup,
    and psycopg cancels a cancelled statement on the server."""
    budget = asyncio.timeout(_statement_ms(deadline) / 1000)
    try:
        async with budget:
            yield
    except TimeoutError:
        if not budget.expired():
            raise
        raise _statement_overrun() from None


def _statement_overrun() -> IncrementalError:
    return unavailable(
        f"a statement exceeded its {STATEMENT_BUDGET_MS} ms budget; retry or narrow the query", "statement_budget"
    )


def _statement_ms(deadline: float) -> int:
    left = int((deadline - asyncio.get_running_loop().time()) * 1000)
    return max(1, min(STATEMENT_BUDGET_MS, left))


@dataclass(frozen=True, slots=True)
class Bearer:
    """An `Authorization: Bearer` credential that the read checks in its first round trip, inside its
    transaction, with the statement authenticate_bearer runs (buzz.identity.tokens)."""

    community: CommunityInfo
    header: str


# Token hash -> (token id, pubkey), as its row says: a token's holder never changes, so knowing it before
# the lookup lets the first round trip carry the scope read too. Whether the token is live, admitted and
# what it covers is read fresh every time; a hit is only used when the lookup returns the same holder.
_HOLDERS: Final[OrderedDict[tuple[int, str], tuple[int, str, frozenset[str] | None]]] = OrderedDict()
_HOLDERS_MAX: Final = 4096


def _holder(key: tuple[int, str]) -> tuple[int, str, frozenset[str] | None] | None:
    found = _HOLDERS.get(key)
    if found is not None:
        _HOLDERS.move_to_end(key)
    return found


def holder_of(actor: Actor) -> tuple[str, int | None]:
    return actor.pubkey, actor.token_id


def _known_reader(who: Actor | Bearer, params: dict[str, Any] | None) -> Actor | None:
    """The reader before any statement runs: an Actor as it is, a token's holder when this process has seen the
    token (`params`, its lookup's; its scopes and liveness are read fresh in the round trip), else None."""
    if params is None:
        return who if isinstance(who, Actor) else None
    holder = _holder((int(who.community.id), str(params["hash"])))
    if holder is None:
        return None
    return Actor(community=who.community, pubkey=holder[1], token_id=holder[0], channels=holder[2])


def _remember_holder(key: tuple[int, str], actor: Actor) -> None:
    if actor.token_id is None:
        return
    _HOLDERS[key] = (actor.token_id, actor.pubkey, actor.channels)
    _HOLDERS.move_to_end(key)
    while len(_HOLDERS) > _HOLDERS_MAX:
        _HOLDERS.popitem(last=False)


@dataclass(frozen=True, slots=True)
class ScopeRows:
    """What a read's scope statements returned: the policy's wide scope row for a read without #h; with #h
    the reader's standing row and the named channels' facts (None when #h names none)."""

    row: Any
    facts: list[Any] | None = None


@dataclass(slots=True)
class Snapshot:
    conn: AsyncConnection[Any]
    now: dt.datetime  # the database clock
    stamp: int  # the community's policy stamp
    ttl: frozenset[uuid.UUID]  # the community's TTL channels
    actor: Actor  # who reads (a Bearer credential's holder, checked in this transaction)
    scope_rows: ScopeRows | None = None  # the scope statements' rows, when the first round trip read them
    finished: bool = False  # committed by `finish`


# Incremental reads run on connections of their own (`_connection`), at most one per operation slot, whose
# sessions start REPEATABLE READ and READ ONLY by default, with the statement budget as their
# statement_timeout. So a read of one round trip (`_page_in_one_trip`) is the pipeline's implicit
# transaction in that mode (its statements up to the pipeline's Sync, which commits it: the pool's
# connections are autocommit, so psycopg sends no BEGIN), and needs neither BEGIN nor COMMIT nor a
# statement that sets its mode; every statement, the first included, is within the budget.
# tests/incremental/test_round_trips.py checks what PostgreSQL makes of it.
SESSION_OPTIONS: Final = (
    r"-c default_transaction_isolation=repeatable\ read -c default_transaction_read_only=on"
    f" -c statement_timeout={STATEMENT_BUDGET_MS}"
)
# A read of several round trips opens its transaction with BEGIN (in the same mode, said again) and ends it
# with COMMIT.
_BEGIN: Final = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"


async def read_pool() -> psycopg_pool.AsyncConnectionPool[AsyncConnection[Any]]:
    """The incremental reads' pool (SESSION_OPTIONS): MAX_CONCURRENT connections at most, as many as the
    operation slots, so a read never waits for one."""
    return await runtime.session_pool("incremental", max_size=MAX_CONCURRENT, options=SESSION_OPTIONS)


@contextlib.asynccontextmanager
async def _connection() -> AsyncIterator[AsyncConnection[Any]]:
    async with (await read_pool()).connection() as conn:
        yield conn


@dataclass(frozen=True, slots=True)
class Plans:
    """How a read's transaction plans its page statement: plan_cache_mode, and whether the page statement may
    sort (both set right before it, `_plans_columns`)."""

    cache_mode: str
    sort: bool


# A later page's scans are bounded by the window and the page whatever the query: column predicates (type,
# d) only decide each candidate's answer, and the page's size is in the statement's text (LIMIT). So one plan
# made without the parameters is the plan for every page: planned once, generically, not again for every
# page, which cost more than running it (bench/incremental.py's later pages of 100 changes: 2.2-2.7 ms a
# page statement with custom plans, 1.3-1.5 ms generic, in the same runs).
# An initial page with no predicate but type reads heads in change order from an index and stops at the
# page's last row: over at most MERGED_CHANNELS channels, each channel's heads (artifact_home_changes),
# merged; over more (a wide read: every readable channel the reader joined or can list, usually most of the
# community), the community's (artifact_change_order), keeping the reader's. It is planned once, generically,
# and may not sort: without statistics PostgreSQL took every readable head, joined them to their revisions
# and sorted them, on every page (custom plans too), and planning it anew cost more than a page saved
# (bench/incremental.py's database, same runs: 1.32 ms a page custom, 1.02 ms generic, 0.97 ms the
# hand-written statement). A page naming more channels, or ids, is the planner's to choose (read them and
# sort, or walk). tests/incremental/test_page_plans.py checks these generic plans on never-analyzed tables.
# A tag predicate is a subquery per candidate, whose plan (a probe per row, or a hash of every artifact with
# the tag) depends on how common the value is: planned for its parameters every time, initial or later.
CUSTOM_PLANS: Final = Plans("force_custom_plan", sort=True)
LATER_PLANS: Final = Plans("force_generic_plan", sort=True)
WALK_PLANS: Final = Plans("force_generic_plan", sort=False)
# The most channels whose heads an initial page reads channel by channel, merged (one index scan each).
MERGED_CHANNELS: Final = 16


def _walks(query: ArtifactQuery) -> bool:
    """Do this query's initial pages read heads in change order from an index (no predicate but type)?"""
    return all(name in ("h", "type") for name, _ in query.predicates)


def _plans(query: ArtifactQuery, *, later: bool) -> Plans:
    """The plans of a page of `query`, in a later pass or an initial one."""
    if reads_tag_index(query):
        return CUSTOM_PLANS
    if later:
        return LATER_PLANS
    named = query.channels()
    if _walks(query) and (named is None or len(named) <= MERGED_CHANNELS):
        return WALK_PLANS
    return CUSTOM_PLANS


def _plans_for(request: Request) -> Plans:
    """The plans of a page of this request (a token that doesn't open is answered by `resume`)."""
    later = request.checkpoint is not None
    if request.cursor is not None:
        try:
            later = open_token("cursor", request.cursor).get("f") is not None
        except IncrementalError:
            later = False
    return _plans(request.query, later=later)


# The page statement's plan mode and, for a page planned without a sort (WALK_PLANS), enable_sort off, as
# columns of the statement sent right before it, in its round trip (the head, `_head_sql`, or a statement of
# their own, `_send_last`). Both are SET LOCAL and the page is the transaction's last statement, so they hold
# for that statement only, never for the access statements before it, whose plans the pool's connections
# keep for everyone.
def _plans_columns(sort: bool) -> str:
    no_sort = "" if sort else ", set_config('enable_sort', 'off', true)"
    return f"set_config('plan_cache_mode', %(plan_cache_mode)s, true){no_sort}"


# The head of a read: the first statement of its transaction, one row (or, with the named channels' facts,
# one per channel, each with the same head). Its first columns, _HEAD_COLUMNS of them: the statement budget
# (set_config(..., true) is SET LOCAL, so it bounds every later statement), the database clock, the policy
# stamp and the TTL channels; the clock is also kept for the rest of the transaction as buzz.pass_start,
# where a first page's statement sent in the same round trip reads it as its start (_HEAD_CLOCK_SQL): the
# same instant as the clock returned here (a timestamptz's text reads back exactly in the same session).
# Then, as its subqueries, in this order and each when the read sends it (`_head_sql`): a bearer token's
# lookup and its holder's admission (BEARER_LOOKUP; NULLs for no live token), the policy's scope statements
# for a reader known before the round trip (`_scope_parts`), and the page's plan settings when the page
# statement follows it at once (`_plans_columns`: the head is planned before any of its own set_config
# calls run, so they are for the statements after it). One statement instead of one each: every statement
# a page sends costs the relay a psycopg execute and the server a bind and an execute.
_HEAD_COLUMNS: Final = 5
_HEAD_CLOCK_SQL: Final = "current_setting('buzz.pass_start')::timestamptz"


@functools.lru_cache(maxsize=32)
def _head_sql(token: bool, scope: str | None, facts: str | None, plans: bool | None) -> str:
    """The head's text: with a token's lookup, with the scope's statement `scope` and its facts statement
    `facts`, with the page's plan settings (`plans` is their `sort`, None for none)."""
    columns = [
        "set_config('statement_timeout', %(budget)s, true)",
        "head_clock.t",
        policy_stamp_sql("%(community)s"),
        "ARRAY(SELECT uuid FROM buzz_channel WHERE community_id = %(community)s AND ttl_seconds IS NOT NULL)",
        "set_config('buzz.pass_start', head_clock.t::text, true)",
    ]
    joins = ""
    if token:
        columns.append("head_token.*")
        joins += f" LEFT JOIN LATERAL ({BEARER_LOOKUP}) AS head_token ON true"
    scope_columns, scope_joins = _scope_joins(scope, facts)
    columns += scope_columns
    if plans is not None:
        columns.append(_plans_columns(plans))
    return hot_statement(
        f"SELECT {', '.join(columns)} FROM (SELECT clock_timestamp() AS t) AS head_clock{joins}{scope_joins}"  # noqa: S608
    )


def _scope_joins(scope: str | None, facts: str | None) -> tuple[list[str], str]:
    """The columns and the joins that embed the scope's statement and its facts statement (`_scope_parts`) in
    a statement: the scope's one row, then with the facts one row per named channel."""
    columns: list[str] = []
    joins = ""
    if scope is not None:
        columns.append("head_scope.*")
        joins += f" CROSS JOIN LATERAL ({scope}) AS head_scope"
    if facts is not None:
        columns.append("head_facts.*")
        joins += f" CROSS JOIN LATERAL ({facts}) AS head_facts"
    return columns, joins


def _scope_parts(reader: Actor, named: list[uuid.UUID] | None) -> tuple[str, dict[str, Any], int, str | None]:
    """The policy's statements that decide what `reader` reads (buzz.access.policy), as the head embeds them:
    for a read without #h its wide scope; with #h the reader's standing, then the facts of each named channel
    (one row each). Returns the scope's text, the parameters of both, its columns and the facts' text (None
    when #h names none)."""
    if named is None:
        sql, params = wide_scope_statement(reader)
        return sql, params, WIDE_SCOPE_COLUMNS, None
    sql, params = reader_standing_statement(reader)
    if not named:
        return sql, params, READER_STANDING_COLUMNS, None
    facts_sql, facts_params = access_statement(reader, named)
    return sql, {**params, **facts_params}, READER_STANDING_COLUMNS, facts_sql


def _merged(into: dict[str, Any], params: dict[str, Any]) -> None:
    """The parameters of an embedded statement added to the head's; a name both use has the same value."""
    for name, value in params.items():
        if name in into and into[name] != value:
            raise ValueError(f"the head's statements disagree on %({name})s")
        into[name] = value


@dataclass(frozen=True, slots=True)
class Head:
    """A read's head as its rows say: the clock, the stamp, the TTL channels, the token's row (None for no
    live token, or none looked up) and the scope statements' rows (None when not sent)."""

    now: dt.datetime
    stamp: int
    ttl: frozenset[uuid.UUID]
    token: Any
    scope: ScopeRows | None


@dataclass(frozen=True, slots=True)
class _Sent:
    """The head `_begin` sent: its cursor and where its parts are in its rows."""

    cursor: psycopg.AsyncCursor[Any]
    token: bool  # the token's columns follow the head's
    scope: int | None  # the columns of the scope's row after them; None: no scope
    facts: bool  # then the facts of one named channel in each row

    async def read(self) -> Head:
        rows = await self.cursor.fetchall()
        if not rows:
            raise unavailable("the database did not answer; retry", "database")
        first = rows[0]
        at = _HEAD_COLUMNS
        token = None
        if self.token:
            token = first[at : at + BEARER_LOOKUP_COLUMNS]
            at += BEARER_LOOKUP_COLUMNS
            if token[0] is None:  # the LEFT JOIN's NULLs: no live token of this hash
                token = None
        scope = _scope_rows(rows, at, self.scope, self.facts) if self.scope is not None else None
        return Head(first[1], int(first[2] or 0), frozenset(first[3]), token, scope)


def _scope_rows(rows: list[Any], at: int, columns: int, facts: bool) -> ScopeRows:
    """The scope statements' rows from the rows of a statement that embeds them from column `at` on
    (`_scope_parts`): the scope's `columns`, then with `facts` a named channel's facts in each row."""
    standing = rows[0][at : at + columns]
    return ScopeRows(standing, [row[at + columns : at + columns + FACT_COLUMNS] for row in rows] if facts else None)


@functools.lru_cache(maxsize=8)
def _scope_text(scope: str, facts: str | None) -> str:
    """The scope statements alone, as one statement (for a reader not known before the head)."""
    columns, joins = _scope_joins(scope, facts)
    return hot_statement(f"SELECT {', '.join(columns)} FROM (VALUES (1)) AS one{joins}")  # noqa: S608 - from code


def _scope_of(actor: Actor, query: ArtifactQuery, rows: ScopeRows, ttl: frozenset[uuid.UUID]) -> list[uuid.UUID]:
    """`scope` decided on its statements' rows (see `scope`)."""
    named = query.channels()
    if named is None:
        return sorted(c for c in wide_scope_of(actor, rows.row) if c not in ttl)
    standing = reader_standing_of(actor, rows.row)
    if not standing.ok:
        raise Denied(standing.reason)
    facts = access_of(rows.facts or [])
    return sorted(c for c in named if c not in ttl and decide_read(actor, c, facts[c]).ok)


async def _begin(
    conn: AsyncConnection[Any],
    deadline: float,
    community_id: int,
    params: dict[str, Any] | None,
    scope: tuple[Actor, list[uuid.UUID] | None] | None,
    *,
    implicit: bool = False,
    plans: Plans | None = None,
) -> _Sent:
    """Inside a pipeline: BEGIN (with `implicit`, none: the pipeline's implicit transaction, SESSION_OPTIONS),
    then the head (`_head_sql`): the statement budget, the database clock, the policy stamp, the TTL
    channels, for a bearer token its lookup, for `scope` (a reader and the channels #h names, or None) that
    reader's scope statements, and with `plans` the settings of the page statement sent next. Nothing is
    read yet. The head runs under PostgreSQL's own plan mode (the page's is set by it, for what follows): its
    plan is PostgreSQL's choice, generic once it has made five, rather than made again for every page
    (about 0.1-0.2 ms of a page)."""
    if not implicit:
        await conn.execute(_BEGIN)
    args: dict[str, Any] = {"budget": str(_statement_ms(deadline)), "community": community_id}
    if params is not None:
        _merged(args, params)
    scope_sql = facts_sql = None
    columns: int | None = None
    if scope is not None:
        scope_sql, scope_args, columns, facts_sql = _scope_parts(*scope)
        _merged(args, scope_args)
    if plans is not None:
        args["plan_cache_mode"] = plans.cache_mode
    sql = _head_sql(params is not None, scope_sql, facts_sql, None if plans is None else plans.sort)
    cursor = await conn.execute(sql, args)
    return _Sent(cursor, params is not None, columns, facts_sql is not None)


@contextlib.asynccontextmanager
async def _transaction(deadline: float, who: Actor | Bearer, query: ArtifactQuery) -> AsyncIterator[Snapshot]:
    """A read-only REPEATABLE READ transaction on the writer, its budget set, and the database clock, the
    policy stamp, the TTL channels and, for a Bearer credential, the token and its holder's admission
    read: one round trip (a pipeline: BEGIN and the head). With a reader known before the round trip (an
    Actor, or a token whose holder this process has seen), the policy's statements of the query's scope are
    read in it too. Commit is sent with the last statement (`finish`). Raises AuthFailure for a token it
    doesn't accept, Denied."""
    community = who.community
    params = bearer_lookup(community, who.header) if isinstance(who, Bearer) else None
    if isinstance(who, Bearer) and params is None:
        raise AuthFailure(BEARER_REFUSED)  # no token of ours: no statement needed
    key = (int(community.id), str(params["hash"])) if params is not None else None
    known = _known_reader(who, params)
    async with _connection() as conn:
        community_id = int(community.id)
        try:
            async with pipeline(conn):
                scope_of = (known, query.channels()) if known is not None else None
                sent = await _begin(conn, deadline, community_id, params, scope_of)
            head = await sent.read()
            actor = bearer_actor(community, head.token) if params is not None else who
            if not isinstance(actor, Actor):
                raise AuthFailure(BEARER_REFUSED)
            if key is not None:
                _remember_holder(key, actor)
            snap = Snapshot(conn, head.now, head.stamp, head.ttl, actor)
            # The scope statements' parameters are the same for `known` and for `actor` when the holder is;
            # `scope` decides on their rows with the token's fresh scopes and channels, after the token checks.
            if head.scope is not None and known is not None and (known.pubkey, known.token_id) == holder_of(actor):
                snap.scope_rows = head.scope
            yield snap
            if not snap.finished:
                await conn.execute("COMMIT")
        except BaseException:
            # A failed or cancelled read: the pool rolls back a connection it gets back in a transaction.
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.ACTIVE:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("ROLLBACK")
            raise


async def _send_last(
    conn: AsyncConnection[Any], sql: str, args: list[Any], plans: Plans | None, *, implicit: bool = False
) -> psycopg.AsyncCursor[Any]:
    """Inside a pipeline: the transaction's last statement, planned as `plans` says (None: the head that
    precedes it in the same pipeline set them), and its COMMIT (with `implicit`, as `_begin` opened it, none:
    the pipeline's Sync commits it). Returns the statement's cursor; nothing is read yet."""
    if plans is not None:
        await conn.execute(f"SELECT {_plans_columns(plans.sort)}", {"plan_cache_mode": plans.cache_mode})
    cursor = await conn.execute(sql, args)  # type: ignore[arg-type]
    if not implicit:
        await conn.execute("COMMIT")
    return cursor


async def finish(snap: Snapshot, sql: str, args: list[Any], plans: Plans = CUSTOM_PLANS) -> list[Any]:
    """The transaction's last statement, planned as `plans` says, and its COMMIT, in one round trip (a
    pipeline)."""
    async with pipeline(snap.conn):
        cursor = await _send_last(snap.conn, sql, args, plans)
    snap.finished = True
    return await cursor.fetchall()


async def scope(snap: Snapshot, query: ArtifactQuery) -> list[uuid.UUID]:
    """The permanent channels this read covers, sorted (the policy decides readability).

    Without #h: what an ordinary read covers (joined or listed readable channels). With #h: the named
    channels the reader can read now; one it can't read is left out, not refused, so a pass after a
    removal can still report it (removeChannel) and the answer is the same for missing channels.
    TTL channels contribute nothing. Raises Denied for the reader's standing (ban, admission, token).
    """
    if snap.scope_rows is None:
        # The reader was not known before the first round trip (a token this process has not seen): one more.
        sql, params, columns, facts = _scope_parts(snap.actor, query.channels())
        rows = await (await snap.conn.execute(_scope_text(sql, facts), params)).fetchall()
        if not rows:
            raise unavailable("the database did not answer; retry", "database")
        snap.scope_rows = _scope_rows(rows, 0, columns, facts is not None)
    return _scope_of(snap.actor, query, snap.scope_rows, snap.ttl)


def _upsert(d: uuid.UUID | str, raw: str) -> str:
    return f'{{"type":"upsert","artifactId":"{d}","event":{raw}}}'


def _remove(d: uuid.UUID | str) -> str:
    return json.dumps({"type": "remove", "artifactId": str(d)}, separators=(",", ":"))


def _remove_channel(channel: str) -> str:
    return f'{{"type":"removeChannel","channelId":"{channel}"}}'


def _after(column_ts: str, column_ident: str, src: int, after: Position | None, args: list[Any]) -> str:
    """The keyset condition of one source's rows: after `after` in (ts, src, ident) order."""
    if after is None:
        return ""
    if src > after.src:
        args.append(from_micros(after.ts))
        return f" AND {column_ts} >= %s"
    if src < after.src:
        args.append(from_micros(after.ts))
        return f" AND {column_ts} > %s"
    args.extend([from_micros(after.ts), after.ident])
    return f" AND ({column_ts}, {column_ident}) > (%s, %s)"


def _micros(column: str) -> str:
    """A page row's change time as integer microseconds since the epoch (exact: extract returns numeric),
    the unit cursors keep: loading a hundred timestamptz values (and converting them to the session's zone)
    cost the relay more than the rest of the page's rows."""
    return f"(extract(epoch FROM {column}) * 1000000)::int8"


def _limit(n: int) -> int:
    """A page statement's LIMIT, written into its text: a generic plan knows how few rows it returns (with
    `LIMIT $n` PostgreSQL plans for a tenth of the table, and chose parallel scans for a page of 101)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"a page of {n!r} rows")
    return n


def _start(run: Pass, start_sql: bool) -> tuple[str, list[Any]]:
    """The pass's start in a page statement: a parameter, or with `start_sql` (a first page sent in the round
    trip that reads the clock) the head's buzz.pass_start."""
    return (_HEAD_CLOCK_SQL, []) if start_sql else ("%s", [from_micros(run.start)])


def _initial_sql(
    actor: Actor, query: ArtifactQuery, channels: list[uuid.UUID], run: Pass, n: int, *, start_sql: bool = False
) -> tuple[str, list[Any]]:
    limit = _limit(n)
    upto, at = _start(run, start_sql)
    keyset = ""
    if run.after is not None:
        keyset = " AND (a.changed_at, a.d) > (%s, %s::uuid)"
        at.extend([from_micros(run.after.ts), run.after.ident])
    if _walks(query) and len(channels) <= MERGED_CHANNELS:
        # Each channel's heads in change order (artifact_home_changes), merged: a page reads about a page.
        arms: list[str] = []
        args: list[Any] = []
        for channel in channels:
            where, arm_args = current_where_in(actor, query, channel)
            arms.append(
                f"SELECT * FROM (SELECT a.changed_at, a.d, a.head_id, a.community_id FROM artifacts_artifact a"  # noqa: S608
                f" WHERE {where} AND a.changed_at <= {upto}{keyset} ORDER BY a.changed_at, a.d LIMIT {limit}) AS c"
            )
            args += [*arm_args, *at]
        sql = (
            f"SELECT {_micros('p.changed_at')}, {SRC_HEAD}, p.d::text, NULL::text, p.d::text, r.raw"  # noqa: S608
            f" FROM ({' UNION ALL '.join(arms)} ORDER BY 1, 2 LIMIT {limit}) AS p"
            " JOIN artifacts_revision r ON r.community_id = p.community_id AND r.id = p.head_id"
            " ORDER BY p.changed_at, p.d"
        )
        return sql, args
    where, args = current_where(actor, query, channels)
    sql = (
        f"SELECT {_micros('a.changed_at')}, {SRC_HEAD}, a.d::text, NULL::text, a.d::text, r.raw FROM {HEAD_JOIN}"  # noqa: S608
        f" WHERE {where} AND a.changed_at <= {upto}{keyset} ORDER BY a.changed_at, a.d LIMIT {limit}"
    )
    return sql, [*args, *at]


def _later_sql(
    actor: Actor,
    query: ArtifactQuery,
    channels: list[uuid.UUID],
    run: Pass,
    since: int,
    n: int,
    *,
    start_sql: bool = False,
) -> tuple[str, list[Any]]:
    lo = from_micros(since) - dt.timedelta(seconds=OVERLAP_SECONDS)
    upto, hi = _start(run, start_sql)
    community = actor.community.id
    # Arrays dumped in one pass each (buzz.sqlarrays): a later page sends eight of them.
    listed = query.channels()
    named = None if listed is None else UuidArray(listed)
    token_channels = None if actor.channels is None else UuidArray(sorted(uuid.UUID(c) for c in actor.channels))
    channels = UuidArray(channels)
    after = run.after
    limit = _limit(n)
    args: list[Any] = []

    args += [community, channels, lo, *hi]
    heads = (
        f'(SELECT a.changed_at AS ts, {SRC_HEAD} AS src, a.d::text COLLATE "C" AS ident, a AS art,'  # noqa: S608
        " NULL::text AS chan FROM artifacts_artifact a"
        f" WHERE a.community_id = %s AND a.home = ANY(%s) AND a.changed_at >= %s AND a.changed_at <= {upto}"
    )
    if after is not None and after.src == SRC_HEAD:
        heads += " AND (a.changed_at, a.d) > (%s, %s::uuid)"
        args += [from_micros(after.ts), after.ident]
    else:
        heads += _after("a.changed_at", "", SRC_HEAD, after, args)
    heads += f" ORDER BY a.changed_at, a.d LIMIT {limit})"

    args += [community, channels, lo, *hi]
    moves = (
        f'(SELECT m.accepted_at, {SRC_MOVE}, a.d::text COLLATE "C", a, NULL::text'  # noqa: S608
        " FROM artifacts_moveremoval m JOIN artifacts_artifact a ON a.id = m.artifact_id"
        f" WHERE m.community_id = %s AND m.source = ANY(%s) AND m.accepted_at >= %s AND m.accepted_at <= {upto}"
    )
    moves += _after("m.accepted_at", 'a.d::text COLLATE "C"', SRC_MOVE, after, args)
    moves += f" ORDER BY 1, 3 LIMIT {limit})"

    args += [community, actor.pubkey, channels, lo, *hi]
    # Each granted channel's live heads in d order from its index (artifact_home), so a page of a grant's
    # replay reads a page of the channel, not the whole channel sorted. Ordered by (joined_at, channel, d):
    # the identity "channel d" compares as that triple (fixed-length UUID texts).
    granted = (
        "SELECT mb.joined_at, c.uuid, c.community_id FROM buzz_membership mb JOIN buzz_channel c"  # noqa: S608
        " ON c.id = mb.channel_id WHERE c.community_id = %s AND mb.pubkey = %s AND c.uuid = ANY(%s)"
        f" AND mb.joined_at >= %s AND mb.joined_at <= {upto}"
    )
    heads_of = (
        "SELECT a.d, a AS art FROM artifacts_artifact a WHERE a.community_id = g.community_id AND a.home = g.uuid"
        " AND NOT a.deleted AND NOT a.retired"
    )
    if after is not None and after.src == SRC_GRANT:
        at_channel, _, at_d = after.ident.partition(" ")
        at = from_micros(after.ts)
        granted += " AND (mb.joined_at, c.uuid) >= (%s, %s::uuid)"
        args += [at, at_channel]
        # In the position's own grant, the heads after its d (an index bound); in later grants, all of them.
        heads_of += (
            " AND a.d >= CASE WHEN g.joined_at = %s AND g.uuid = %s::uuid THEN %s::uuid"
            " ELSE '00000000-0000-0000-0000-000000000000'::uuid END"
            " AND NOT (g.joined_at = %s AND g.uuid = %s::uuid AND a.d = %s::uuid)"
        )
        g_args = [at, at_channel, at_d, at, at_channel, at_d]
    else:
        granted += _after("mb.joined_at", "", SRC_GRANT, after, args)
        g_args = []
    heads_of += f" ORDER BY a.d LIMIT {limit}"
    args += g_args
    grants = (
        f"(SELECT g.joined_at, {SRC_GRANT}, (g.uuid::text || ' ' || h.d::text) COLLATE \"C\", h.art, NULL::text"  # noqa: S608
        f" FROM ({granted}) AS g CROSS JOIN LATERAL ({heads_of}) AS h ORDER BY 1, 3 LIMIT {limit})"
    )

    args += [community, actor.pubkey, lo, *hi, channels, named, named, token_channels, token_channels]
    removals = (
        f'(SELECT mb.removed_at, {SRC_REMOVAL}, c.uuid::text COLLATE "C", NULL::artifacts_artifact, c.uuid::text'  # noqa: S608
        " FROM buzz_membership mb JOIN buzz_channel c ON c.id = mb.channel_id"
        f" WHERE c.community_id = %s AND mb.pubkey = %s AND mb.removed_at >= %s AND mb.removed_at <= {upto}"
        " AND c.ttl_seconds IS NULL"
        # Reported when it cost read access, or when the reader has joined the channel again since: the pages
        # read while it was out left the channel out (a deletion there, a move out, an edit that no longer
        # matches), and a later pass's window may no longer hold them; the new membership's grant, after
        # this removal in the order, replays what is live. Not for a channel readable without membership (an
        # open one): nothing would replay the rows it removes.
        " AND (NOT (c.uuid = ANY(%s)) OR EXISTS (SELECT FROM buzz_membership again WHERE again.channel_id = c.id"
        " AND again.pubkey = mb.pubkey AND again.removed_at IS NULL AND again.joined_at > mb.removed_at))"
        " AND (%s::uuid[] IS NULL OR c.uuid = ANY(%s::uuid[]))"
        " AND (%s::uuid[] IS NULL OR c.uuid = ANY(%s::uuid[]))"
    )
    removals += _after("mb.removed_at", 'c.uuid::text COLLATE "C"', SRC_REMOVAL, after, args)
    removals += f" ORDER BY 1, 3 LIMIT {limit})"

    visible, vargs = current_where(actor, query, channels)
    args += vargs
    sql = (
        f"WITH u AS ({heads} UNION ALL {moves} UNION ALL {grants} UNION ALL {removals}),"  # noqa: S608
        f' p AS (SELECT * FROM u ORDER BY u.ts, u.src, u.ident COLLATE "C" LIMIT {limit})'
        f" SELECT {_micros('p.ts')}, p.src, p.ident, p.chan, a.d::text,"
        f" CASE WHEN a.id IS NOT NULL AND {visible} THEN r.raw END"
        " FROM p CROSS JOIN LATERAL (SELECT (p.art).*) AS a"
        " LEFT JOIN artifacts_revision r ON r.community_id = a.community_id AND r.id = a.head_id"
        ' ORDER BY p.ts, p.src, p.ident COLLATE "C"'
    )
    return sql, args


def _page_body(started: str, changes: list[str], next_cursor: str | None, checkpoint: str | None) -> str:
    head = f'{{"version":{VERSION},"startedAt":"{started}","overlapSeconds":{OVERLAP_SECONDS},"changes":['
    tail = f'],"nextCursor":{json.dumps(next_cursor)}'
    if checkpoint is not None:
        tail += f',"checkpoint":{json.dumps(checkpoint)}'
    return head + ",".join(changes) + tail + "}"


def _entry(src: int, chan: str | None, d: str | None, raw: str | None) -> str | None:
    if src == SRC_REMOVAL and chan is not None:
        return _remove_channel(chan)
    if d is None:
        return None
    if raw is not None:
        return _upsert(d, raw)
    # A grant replays readable heads; one that doesn't match the query is nothing to this reader.
    return None if src == SRC_GRANT else _remove(d)


async def read_page(who: Actor | Bearer, request: Request, deadline: float) -> str:
    """One page of a pass: the response body. Raises IncrementalError, Denied, AuthFailure."""
    n = page_rows()
    fast = await _page_in_one_trip(who, request, deadline, n)
    if fast is not None:
        return _page(*fast, n)
    plans = _plans_for(request)
    async with _transaction(deadline, who, request.query) as snap:
        actor = snap.actor
        run = resume(actor, request, now=snap.now, stamp=snap.stamp)
        channels = await scope(snap, request.query)
        _remember_scope(actor, request, channels)
        if run.since is None:
            rows: list[Any] = []
            if channels:
                sql, args = _initial_sql(actor, request.query, channels, run, n + 1)
                rows = await finish(snap, sql, args, plans)
        else:
            # With no readable channel there are no heads, grants or moves, but removals still count.
            sql, args = _later_sql(actor, request.query, channels, run, run.since, n + 1)
            rows = await finish(snap, sql, args, plans)
    return _page(actor, request, run, rows, n)


# (community, reader digest, query digest) -> the channels the reader's last page of this query covered
# (permanent, sorted). A page whose reader is known (a continuation, or the first page of a pass) sends its
# page statement with them in its first round trip (`_page_in_one_trip`); the answer is used only when the
# scope read in the same snapshot is the same, else the page is read again. Never a permission: a guess
# that is checked.
_SCOPES: Final[OrderedDict[tuple[int, str, str], list[uuid.UUID]]] = OrderedDict()
_SCOPES_MAX: Final = 4096


def _scope_key(actor: Actor, request: Request) -> tuple[int, str, str]:
    return (int(actor.community.id), reader_digest(actor), request.digest)


def _remember_scope(actor: Actor, request: Request, channels: list[uuid.UUID]) -> None:
    key = _scope_key(actor, request)
    _SCOPES[key] = channels
    _SCOPES.move_to_end(key)
    while len(_SCOPES) > _SCOPES_MAX:
        _SCOPES.popitem(last=False)


async def _page_in_one_trip(
    who: Actor | Bearer, request: Request, deadline: float, n: int
) -> tuple[Actor, Request, Pass, list[Any]] | None:
    """A page in one round trip, when its reader is known (an Actor, or a token whose holder this process has
    seen) and so is the scope of the reader's last page of this query: two statements in one pipeline, in its
    implicit transaction (SESSION_OPTIONS), so one snapshot: the head (budget, clock, stamp and TTL channels,
    the token, the scope statements and the page's plan settings) and the page statement over the remembered
    scope. A continuation's page is planned from its cursor; a first page (an initial or a later pass) from the
    request, with the pass's start left to the database clock read in the same round trip (_HEAD_CLOCK_SQL).
    Then every check runs as `read_page` runs it, in its order (the token, the pass against the clock and the
    policy stamp, the reader's standing), and the page is the answer only when the reader, the pass and the
    scope are the ones the statement was built for.
    None: not such a request, or a guess that didn't hold (`read_page` reads it the usual way)."""
    community = who.community
    params = bearer_lookup(community, who.header) if isinstance(who, Bearer) else None
    known = _known_reader(who, params)
    if known is None:
        return None
    guess = _SCOPES.get(_scope_key(known, request))
    if not guess:
        return None
    first = request.cursor is None
    try:
        if request.cursor is not None:
            payload = open_token("cursor", request.cursor)
            # The cursor's own clock and stamp: `resume` checks them against the database's below.
            planned = resume(known, request, now=from_micros(_int(payload, "s")), stamp=_int(payload, "p"))
        else:
            # The stamp the checkpoint carries (an initial pass takes the database's) and this process's clock:
            # `resume` checks the pass against the database's below.
            stamp = _int(open_token("checkpoint", request.checkpoint), "p") if request.checkpoint is not None else 0
            planned = resume(known, request, now=dt.datetime.now(dt.UTC), stamp=stamp)
    except IncrementalError:
        return None  # `read_page` answers it, after the token check
    since = planned.since
    if since is None:
        sql, args = _initial_sql(known, request.query, guess, planned, n + 1, start_sql=first)
    else:
        sql, args = _later_sql(known, request.query, guess, planned, since, n + 1, start_sql=first)
    async with _connection() as conn:
        community_id = int(community.id)
        try:
            plans = _plans(request.query, later=since is not None)
            async with pipeline(conn):
                sent = await _begin(
                    conn, deadline, community_id, params, (known, request.query.channels()), implicit=True, plans=plans
                )
                page = await _send_last(conn, sql, args, None, implicit=True)
            head = await sent.read()
            rows = await page.fetchall()
        except BaseException:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.ACTIVE:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("ROLLBACK")
            raise
    if head.scope is None:
        raise unavailable("the database did not answer; retry", "database")
    actor = bearer_actor(community, head.token) if params is not None else who
    if not isinstance(actor, Actor):
        raise AuthFailure(BEARER_REFUSED)
    if params is not None:
        _remember_holder((int(community.id), str(params["hash"])), actor)
    run = resume(actor, request, now=head.now, stamp=head.stamp)
    if (actor.pubkey, actor.token_id, actor.channels) != (known.pubkey, known.token_id, known.channels):
        return None  # the scope statements were another reader's: decide nothing on them
    channels = _scope_of(actor, request.query, head.scope, head.ttl)
    _remember_scope(actor, request, channels)
    # A first page's statement read up to the database clock of this round trip: its start is the pass's.
    expected = dataclasses.replace(planned, start=run.start, stamp=run.stamp) if first else planned
    if channels != guess or run != expected:
        return None
    return actor, request, run, rows


def _page(actor: Actor, request: Request, run: Pass, rows: list[Any], n: int) -> str:
    """The page's body from its rows (at most n + 1: one more says there is more)."""
    bound = response_bytes()
    changes: list[str] = []
    size = _ENVELOPE_BYTES
    last: Position | None = None
    cut = len(rows) > n
    last_row: Any = None
    for consumed, row in enumerate(rows[:n]):
        _, src, _, chan, d, raw = row
        entry = _entry(src, chan, d, raw)
        if entry is not None:
            grown = size + utf8_size(entry) + 1
            if grown > bound:
                if consumed == 0:
                    raise IncrementalError(
                        413,
                        "incremental_limit",
                        "response_bytes",
                        f"one result is larger than the {bound}-byte response bound",
                    )
                cut = True
                break
            size = grown
            changes.append(entry)
        last_row = row
    if last_row is not None:
        last = Position(last_row[0], last_row[1], last_row[2])
    started = rfc3339(from_micros(run.start))
    if cut and last is not None:
        return _page_body(started, changes, _mint_cursor(actor, request, run, last), None)
    return _page_body(started, changes, None, mint_checkpoint(actor, request, stamp=run.stamp, start=run.start))


async def read_current(who: Actor | Bearer, request: Request, deadline: float) -> str:
    """A current-ID read on the writer: exactly one upsert or remove per id, in request order, never cut.
    Raises IncrementalError, Denied, AuthFailure."""
    ids = request.ids or ()
    parsed = [canonical_uuid(v) for v in ids]
    wanted = [p for p in parsed if p is not None]
    async with _transaction(deadline, who, request.query) as snap:
        now, actor = snap.now, snap.actor
        channels = await scope(snap, request.query)
        found: dict[uuid.UUID, str] = {}
        if channels and wanted:
            where, args = current_where(actor, request.query, channels)
            sql = f"SELECT a.d, r.raw FROM {HEAD_JOIN} WHERE {where} AND a.d = ANY(%s)"  # noqa: S608
            rows = await finish(snap, sql, [*args, wanted])
            found = {row[0]: row[1] for row in rows}
    changes = []
    for value, d in zip(ids, parsed, strict=True):
        raw = found.get(d) if d is not None else None
        changes.append(_upsert(d, raw) if d is not None and raw is not None else _remove(value))
    body = f'{{"version":{VERSION},"startedAt":"{rfc3339(now)}","changes":[' + ",".join(changes) + "]}"
    if len(body.encode("utf-8")) > response_bytes():
        raise IncrementalError(
            413,
            "incremental_limit",
            "response_bytes",
            f"the answer is larger than the {response_bytes()}-byte response bound; split the batch",
        )
    return body
