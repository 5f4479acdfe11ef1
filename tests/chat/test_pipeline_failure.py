"""A failed pipeline never leaves a poisoned connection behind (buzz.runtime.pipeline).

psycopg 3.3 records a statement as prepared when it sends the statement's first PREPARE. In a pipeline that
an earlier statement's error aborts, the server skips that PREPARE, and every later execution of the
statement on that connection fails ("prepared statement ... does not exist"); a ROLLBACK clears psycopg's
record only if it is the first since the last clear. The first test shows that on the real server with
psycopg's own pipeline (if a psycopg upgrade fixes it, that test says so, and the workaround can go). The
others show buzz.runtime.pipeline closing such a connection, and only such a one. Found by
tests/incremental/test_incremental_errors.py::test_a_database_failure_is_503_and_advances_nothing: after
one failed read, every read on that connection failed until it was closed.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from buzz.runtime import pipeline

STATEMENT = "SELECT %s::int + 1"


@pytest_asyncio.fixture
async def conn() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    # As the relay's pools open theirs: autocommit, statements prepared from their third execution.
    connection = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True, prepare_threshold=2)
    try:
        yield connection
    finally:
        await connection.close()


async def _warm(conn: psycopg.AsyncConnection[Any]) -> None:
    """A connection as the relay's are after a while: it has rolled back before (psycopg forgets its prepared
    statements on the first ROLLBACK since it last did, not on later ones), and STATEMENT has run up to its
    prepare threshold, so its next execution sends its first PREPARE."""
    await conn.execute("ROLLBACK")  # outside a transaction: a warning, nothing else
    for i in range(2):
        assert await (await conn.execute(STATEMENT, [i])).fetchone() == (i + 1,)


async def _fail_in_a_pipeline(conn: psycopg.AsyncConnection[Any], *, wrapped: bool, transaction: bool = True) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        async with pipeline(conn) if wrapped else conn.pipeline():
            if transaction:
                await conn.execute("BEGIN")
            await conn.execute("SELECT 1 / 0")
            await conn.execute(STATEMENT, [1])  # its first PREPARE, skipped by the server
            if transaction:
                await conn.execute("COMMIT")


@pytest.mark.asyncio
async def test_psycopgs_own_pipeline_leaves_the_statement_unusable(conn: psycopg.AsyncConnection[Any]) -> None:
    await _warm(conn)
    await _fail_in_a_pipeline(conn, wrapped=False)
    await conn.execute("ROLLBACK")
    for i in range(3):
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            await conn.execute(STATEMENT, [i])


@pytest.mark.asyncio
@pytest.mark.parametrize("transaction", [True, False])
async def test_a_pipeline_the_server_failed_closes_its_connection(
    conn: psycopg.AsyncConnection[Any], transaction: bool
) -> None:
    await _warm(conn)
    await _fail_in_a_pipeline(conn, wrapped=True, transaction=transaction)
    assert conn.closed  # its pool replaces it
    async with await psycopg.AsyncConnection.connect(
        os.environ["DATABASE_URL"], autocommit=True, prepare_threshold=2
    ) as fresh:
        for i in range(4):  # past the threshold: prepared, then used
            assert await (await fresh.execute(STATEMENT, [i])).fetchone() == (i + 1,)


class Refused(Exception):
    pass


@pytest.mark.asyncio
async def test_a_refusal_of_the_callers_own_keeps_the_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    await _warm(conn)
    with pytest.raises(Refused):
        async with pipeline(conn):
            await conn.execute("BEGIN")
            await conn.execute(STATEMENT, [1])
            raise Refused  # decided between statements, nothing failed on the server
    assert not conn.closed
    await conn.execute("ROLLBACK")
    for i in range(3):
        assert await (await conn.execute(STATEMENT, [i])).fetchone() == (i + 1,)
