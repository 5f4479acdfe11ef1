"""NIP-AR read views: current, history and head, and their counts.

Every read is scoped by channel read permission from buzz.access.policy, applied in SQL
before matching, ordering, paging and counting. Each query runs in its own
read-only transaction under an execution budget (SET LOCAL statement_timeout);
an overrun is an explicit 503, never a partial result.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import psycopg.errors
from django.conf import settings

from artifacts.query import ArtifactQuery, QueryError
from buzz.access.policy import NOT_A_MEMBER, Denied, reader_scope
from buzz.identity.actor import Actor
from buzz.runtime import runtime

# Predicates answered from columns of the head row rather than the tag index.
_COLUMN_PREDICATES = {"d": "a.d", "type": "a.type"}


async def scope(actor: Actor, query: ArtifactQuery) -> list[uuid.UUID]:
    """The channels a query covers (buzz.access.policy.reader_scope). #h names them, each of which must be
    readable; without #h it is every channel the reader can read that is joined or listed. Raises Denied."""
    named = query.channels()
    if named is not None and len(named) != len(query.values("h") or ()):
        # A value that is no channel id names no channel: the same answer as a missing one.
        raise Denied(NOT_A_MEMBER)
    return await reader_scope(actor, named=named or (), wide=named is None)


def _md5(value: str) -> str:
    return hashlib.md5(value.encode("utf-8"), usedforsecurity=False).hexdigest()


def _current_where(actor: Actor, query: ArtifactQuery, channels: list[uuid.UUID]) -> tuple[str, list[Any]]:
    where = ["a.community_id = %s", "a.home = ANY(%s)", "NOT a.deleted", "NOT a.retired"]
    args: list[Any] = [actor.community.id, channels]
    for name, values in query.predicates:
        if name == "h":
            continue  # the scope above is #h already
        column = _COLUMN_PREDICATES.get(name)
        if column == "a.d":
            where.append("a.d = ANY(%s)")
            args.append(_uuids(values))
        elif column is not None:
            where.append(f"{column} = ANY(%s)")
            args.append(list(values))
        else:
            # The tag and its FIRST value, on the current head only (the index holds nothing else).
            where.append(
                "a.id IN (SELECT t.artifact_id FROM artifacts_currenttag t"
                " WHERE t.name = %s AND md5(t.value) = ANY(%s) AND t.value = ANY(%s))"
            )
            args.extend([name, [_md5(v) for v in values], list(values)])
    return " AND ".join(where), args


def _uuids(values: tuple[str, ...]) -> list[uuid.UUID]:
    out = []
    for v in values:
        try:
            parsed = uuid.UUID(v)
        except ValueError:
            continue
        if str(parsed) == v:
            out.append(parsed)
    return out


def _history_where(actor: Actor, query: ArtifactQuery, channels: list[uuid.UUID]) -> tuple[str, list[Any]]:
    # Each revision under its own channel's access: a move never opens the source's revisions.
    where = [
        "r.community_id = %s",
        "r.channel = ANY(%s)",
        "r.redacted_at IS NULL",
        "r.expired_at IS NULL",
    ]
    args: list[Any] = [actor.community.id, channels]
    d = query.values("d")
    if d is not None:
        where.append("a.d = ANY(%s)")
        args.append(_uuids(d))
    types = query.values("type")
    if types is not None:
        where.append("a.type = ANY(%s)")
        args.append(list(types))
    return " AND ".join(where), args


def _head_where(actor: Actor, query: ArtifactQuery, channels: list[uuid.UUID]) -> tuple[str, list[Any]]:
    # Deletions included; a redacted (retired) head is withheld like every redacted revision.
    where = ["a.community_id = %s", "a.home = ANY(%s)", "a.d = ANY(%s)", "r.redacted_at IS NULL"]
    return " AND ".join(where), [actor.community.id, channels, _uuids(query.values("d") or ())]


# A revision is keyed by (community, id): the same signed event may be a revision in two communities.
_HEAD = "artifacts_artifact a JOIN artifacts_revision r ON r.community_id = a.community_id AND r.id = a.head_id"
_FROM = {
    "current": (_HEAD, "a.d"),
    "head": (_HEAD, "a.d"),
    "history": ("artifacts_revision r JOIN artifacts_artifact a ON a.id = r.artifact_id", "r.seq"),
}


def _where(actor: Actor, query: ArtifactQuery, channels: list[uuid.UUID]) -> tuple[str, list[Any]]:
    if query.mode == "current":
        return _current_where(actor, query, channels)
    if query.mode == "history":
        return _history_where(actor, query, channels)
    return _head_where(actor, query, channels)


async def _run(sql: str, args: list[Any]) -> list[tuple[Any, ...]]:
    budget_ms = int(settings.BUZZ_QUERY_BUDGET_MS)
    pool = await runtime.pool()
    try:
        async with pool.connection() as conn, conn.transaction():
            # One round trip. Custom plans: a generic plan for these array predicates ignores how selective
            # each value is, and measured 5-27x slower than one hand-written statement (bench/query_current.py).
            await conn.execute(
                "SET TRANSACTION READ ONLY;"
                f" SET LOCAL statement_timeout = {budget_ms};"
                " SET LOCAL plan_cache_mode = force_custom_plan"
            )
            return await (await conn.execute(sql, args)).fetchall()
    except psycopg.errors.QueryCanceled:
        raise QueryError("error: the query exceeded its execution budget; narrow it and try again") from None


async def query_events(actor: Actor, query: ArtifactQuery) -> list[str]:
    """The raw events of one page of a view, in the view's order."""
    channels = await scope(actor, query)
    if not channels:
        return []
    where, args = _where(actor, query, channels)
    table, order = _FROM[query.mode]
    sql = f"SELECT r.raw FROM {table} WHERE {where} ORDER BY {order} LIMIT %s OFFSET %s"  # noqa: S608
    rows = await _run(sql, [*args, query.limit, query.offset])
    return [row[0] for row in rows]


async def count_events(actor: Actor, query: ArtifactQuery) -> int:
    """How many the view holds for this reader, after access checks (no paging)."""
    channels = await scope(actor, query)
    if not channels:
        return 0
    where, args = _where(actor, query, channels)
    table, _ = _FROM[query.mode]
    rows = await _run(f"SELECT count(*) FROM {table} WHERE {where}", args)  # noqa: S608
    return int(rows[0][0])
