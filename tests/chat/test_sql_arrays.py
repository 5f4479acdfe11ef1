"""The write path's array parameters (buzz.sqlarrays) reach PostgreSQL as the same values, with the same
parameter types, as psycopg's own list dumper sends them: checked on the real server, for any text (quotes,
backslashes, braces, commas, spaces, the word NULL, non-ASCII), any UUIDs and any integer in int8's range."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

from buzz.sqlarrays import IntArray, TextArray, UuidArray

# Text PostgreSQL can hold: anything but NUL, and no lone surrogate (UTF-8 can't spell one; the relay refuses
# them in events before any write: tests/transport/test_hostile_unicode.py). Skewed towards what an array
# literal must quote or escape.
_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from("\"\\{},; \t\nNULLnull'é日"),
        st.characters(codec="utf-8", blacklist_characters="\x00"),
    ),
    max_size=12,
)
_INT8 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@pytest.fixture(scope="module")
def conn() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as connection:
        yield connection


def _sent(conn: psycopg.Connection[Any], value: Any) -> tuple[int, bytes | None]:
    """The parameter type and bytes psycopg sends for `value` on this connection."""
    query = PostgresQuery(Transformer(conn))
    query.convert("SELECT %s", [value])
    assert query.params is not None
    raw = query.params[0]
    return query.types[0], None if raw is None else bytes(raw)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(_TEXT, max_size=6))
def test_text_arrays_arrive_as_sent(conn: psycopg.Connection[Any], values: list[str]) -> None:
    row = conn.execute(
        "SELECT %s::text[], %s::text[] = %s::text[]", [TextArray(values), TextArray(values), values]
    ).fetchone()
    assert row == (values, True)
    # No type, as psycopg sends a list of str: PostgreSQL takes the one the statement gives.
    assert _sent(conn, TextArray(values))[0] == _sent(conn, values)[0] == 0


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.uuids(), max_size=5))
def test_uuid_arrays_arrive_as_sent(conn: psycopg.Connection[Any], values: list[uuid.UUID]) -> None:
    row = conn.execute("SELECT %s, %s = %s", [UuidArray(values), UuidArray(values), values]).fetchone()
    assert row == (values, True)
    assert _sent(conn, UuidArray(values))[0] == conn.adapters.types["uuid"].array_oid


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(
        st.one_of(_INT8, st.sampled_from([2**15 - 1, -(2**15), 2**15, 2**31 - 1, -(2**31) - 1])), max_size=5
    )
)
def test_int_arrays_arrive_as_sent_with_psycopgs_type(conn: psycopg.Connection[Any], values: list[int]) -> None:
    # Untyped in the statement: the parameter's own type decides, and it is the one psycopg picks.
    row = conn.execute("SELECT %s", [IntArray(values)]).fetchone()
    assert row == (values,)
    if values:  # psycopg sends an empty list untyped; an empty IntArray is int2[], which reads the same
        assert _sent(conn, IntArray(values))[0] == _sent(conn, values)[0]


def test_nul_is_refused_before_anything_is_sent(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.DataError):
        conn.execute("SELECT %s::text[]", [TextArray(["a\x00b"])])
    with pytest.raises(psycopg.DataError):
        conn.execute("SELECT %s::text[]", [["a\x00b"]])  # as psycopg's own dumper does
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_an_integer_past_int8_is_refused(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.DataError):
        conn.execute("SELECT %s", [IntArray([2**63])])
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_literal_is_quoted_and_escaped(conn: psycopg.Connection[Any]) -> None:
    assert _sent(conn, TextArray(['a"b', "c\\d", "NULL", ""])) == (0, b'{"a\\"b","c\\\\d","NULL",""}')
    assert conn.execute("SELECT %s::text[]", [TextArray(["NULL"])]).fetchone() == (["NULL"],)
