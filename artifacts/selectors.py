"""NIP-AR read views: current, history and head, and their counts.

Every read is scoped by channel read permission from buzz.access.policy, applied in SQL
before matching, ordering, paging and counting. Each request runs in one read-only
REPEATABLE READ transaction: the access reads and the view's statement see one snapshot,
and each statement runs under what is left of the execution budget (SET LOCAL
statement_timeout). An overrun is an explicit 503, never a partial result. The views bound
the whole request by the same budget (artifacts.views).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import Callable
from typing import Any, Final

import psycopg.errors
from django.conf import settings
from psycopg import AsyncConnection

from artifacts.query import ArtifactQuery, QueryError
from buzz.access.policy import NOT_A_MEMBER, Denied, reader_scope
from buzz.identity.actor import Actor
from buzz.runtime import pipeline, runtime
from buzz.sqlarrays import UuidArray

BUDGET_EXCEEDED: Final = "error: the query exceeded its execution budget; narrow it and try again"

# Predicates answered from columns of the head row rather than the tag index.
_COLUMN_PREDICATES = {"d": "a.d", "type": "a.type"}


async def scope(actor: Actor, query: ArtifactQuery, *, conn: AsyncConnection[Any] | None = None) -> list[uuid.UUID]:
    """The channels a query covers (buzz.access.policy.reader_scope). #h names them, each of which must be
    readable; without #h it is every channel the reader can read that is joined or listed. Raises Denied."""
    named = query.channels()
    if named is not None and len(named) != len(query.values("h") or ()):
        # A value that is no channel id names no channel: the same answer as a missing one.
        raise Denied(NOT_A_MEMBER)
    return await reader_scope(actor, named=named or (), wide=named is None, conn=conn)


def _md5(value: str) -> str:
    return hashlib.md5(value.encode("utf-8"), usedforsecurity=False).hexdigest()


def reads_tag_index(query: ArtifactQuery) -> bool:
    """Does `current_where` match a predicate of this query through the tag index (a subquery)?"""
    return any(name != "h" and name not in _COLUMN_PREDICATES for name, _ in query.predicates)


def current_where(actor: Actor, query: ArtifactQuery, channels: list[uuid.UUID]) -> tuple[str, list[Any]]:
    """The current view's WHERE over `artifacts_artifact a` joined to its head `r`: scope, then predicates.
    Sync's snapshot reads the same rows (artifacts.sync)."""
    return _current_where(actor, query, "a.home = ANY(%s)", UuidArray(channels))


def current_where_in(actor: Actor, query: ArtifactQuery, channel: uuid.UUID) -> tuple[str, list[Any]]:
    """`current_where` over one channel, named as an equality (`a.home = %s`), which an index leading with
    (community, home) can serve in the order of its next columns; `home = ANY(...)` can't promise that."""
    return _current_where(actor, query, "a.home = %s", channel)


def _current_where(actor: Actor, query: ArtifactQuery, home: str, scope: Any) -> tuple[str, list[Any]]:
    where = ["a.community_id = %s", home, "NOT a.deleted", "NOT a.retired"]
    args: list[Any] = [actor.community.id, scope]
    for name, values in query.predicates:
        if name == "h":
            continue  # the scope above is #h already
        column = _COLUMN_PREDICATES.get(name)
        if column == "a.d":
            where.append("a.d = ANY(%s)")
            args.append(UuidArray(_uuids(values)))
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
# An artifact and its head revision (revisions are keyed by (community, event id)). Sync reads the same join.
HEAD_JOIN = "artifacts_artifact a JOIN artifacts_revision r ON r.community_id = a.community_id AND r.id = a.head_id"
_FROM = {
    "current": (HEAD_JOIN, "a.d"),
    "head": (HEAD_JOIN, "a.d"),
    "history": ("artifacts_revision r JOIN artifacts_artifact a ON a.id = r.artifact_id", "r.seq"),
}


def _where(actor: Actor, query: ArtifactQuery, channels: list[uuid.UUID]) -> tuple[str, list[Any]]:
    if query.mode == "current":
        return current_where(actor, query, channels)
    if query.mode == "history":
        return _history_where(actor, query, channels)
    return _head_where(actor, query, channels)


def budget_seconds() -> float:
    return int(settings.BUZZ_QUERY_BUDGET_MS) / 1000


def _remaining_ms(deadline: float | None) -> int:
    """What is left of the request's budget (the whole budget without a deadline), at least 1 ms."""
    budget_ms = int(settings.BUZZ_QUERY_BUDGET_MS)
    if deadline is None:
        return budget_ms
    left = int((deadline - asyncio.get_running_loop().time()) * 1000)
    return max(1, min(budget_ms, left))


Statement = Callable[[list[uuid.UUID]], tuple[str, list[Any]]]


async def _read(actor: Actor, query: ArtifactQuery, statement: Statement, deadline: float | None) -> list[Any] | None:
    """Scope, then the view's statement, in one budgeted read-only snapshot. None: no channel in scope.

    Two round trips, in psycopg's pipeline mode: BEGIN, the transaction's settings and the policy's read
    of the scope go in one; the view's statement and COMMIT in the other. The pool's connections are in
    autocommit, so the transaction is opened and closed here, by hand."""
    pool = await runtime.pool()
    try:
        async with pool.connection() as conn:
            try:
                async with pipeline(conn):
                    await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    # Custom plans: a generic plan for these array predicates ignores how selective each
                    # value is, and measured 5-27x slower than one hand-written statement
                    # (bench/query_current.py).
                    await conn.execute(
                        "SELECT set_config('statement_timeout', %s, true),"
                        " set_config('plan_cache_mode', 'force_custom_plan', true)",
                        [str(_remaining_ms(deadline))],
                    )
                    # The access reads are part of the query: inside its budget and its snapshot.
                    channels = await scope(actor, query, conn=conn)
                    cursor = None
                    if channels:
                        sql, args = statement(channels)
                        cursor = await conn.execute(sql, args)
                    await conn.execute("COMMIT")
                # The pipeline's end sent them and read every result: the rows are here.
                rows = await cursor.fetchall() if cursor is not None else None
            except BaseException:
                # A broken connection can't roll back; the pool discards it then.
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("ROLLBACK")
                raise
            return rows
    except psycopg.errors.QueryCanceled:
        raise QueryError(BUDGET_EXCEEDED) from None


async def query_events(actor: Actor, query: ArtifactQuery, *, deadline: float | None = None) -> list[str]:
    """The raw events of one page of a view, in the view's order. `deadline`: the loop time the request's
    budget ends at."""
    table, order = _FROM[query.mode]

    def statement(channels: list[uuid.UUID]) -> tuple[str, list[Any]]:
        where, args = _where(actor, query, channels)
        sql = f"SELECT r.raw FROM {table} WHERE {where} ORDER BY {order} LIMIT %s OFFSET %s"  # noqa: S608
        return sql, [*args, query.limit, query.offset]

    rows = await _read(actor, query, statement, deadline)
    return [row[0] for row in rows or ()]


async def count_events(actor: Actor, query: ArtifactQuery, *, deadline: float | None = None) -> int:
    """How many the view holds for this reader, after access checks (no paging)."""
    table, _ = _FROM[query.mode]

    def statement(channels: list[uuid.UUID]) -> tuple[str, list[Any]]:
        where, args = _where(actor, query, channels)
        return f"SELECT count(*) FROM {table} WHERE {where}", args  # noqa: S608

    rows = await _read(actor, query, statement, deadline)
    return int(rows[0][0]) if rows else 0
