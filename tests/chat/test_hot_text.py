"""The write statements' text is short enough for psycopg to cache its conversion (buzz.sqltext), and
compacting it changes no token of the statement; a raw statement (too long for that cache) is numbered
exactly as psycopg numbers it."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg import _queries
from psycopg.adapt import Transformer

from artifacts.services import _ADVANCE, _CREATE, _READ, _UPDATE
from buzz.chat.messages import _POST
from buzz.sqltext import (
    CACHED_QUERY_BYTES,
    CACHED_QUERY_PARAMS,
    compact,
    hot_statement,
    parameter_names,
    raw_statement,
)

HOT = {"artifact read": _READ}
# Statements longer than psycopg's cache takes: converted once, run on a raw cursor.
RAW = {"kind 9": _POST, "artifact create": _CREATE, "artifact update": _UPDATE, "artifact advance": _ADVANCE}

# A lexer of its own: quoted tokens, words (placeholders included), numbers, operator runs, punctuation;
# whitespace and comments are not tokens.
_LEX = re.compile(
    r"""(?P<q>'(?:[^']|'')*'|"(?:[^"]|"")*")|(?P<c>--[^\n]*|/\*.*?\*/)|(?P<s>\s+)"""
    r"""|(?P<t>%\(\w+\)s|[A-Za-z_][\w$]*|\d+(?:\.\d+)?|::|[-+*/<>=~!@#%^&|`?]+|[(),;.\[\]:])""",
    re.DOTALL,
)


def tokens(sql: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(sql):
        match = _LEX.match(sql, pos)
        assert match is not None, f"unlexable text at {sql[pos : pos + 20]!r}"
        if match.lastgroup in ("q", "t"):
            out.append(match.group())
        pos = match.end()
    return out


def test_the_limits_are_psycopgs() -> None:
    assert CACHED_QUERY_BYTES == _queries.MAX_CACHED_STATEMENT_LENGTH
    assert CACHED_QUERY_PARAMS == _queries.MAX_CACHED_STATEMENT_PARAMS


@pytest.mark.parametrize("name", sorted(HOT))
def test_hot_statements_are_cached_by_psycopg(name: str) -> None:
    sql = HOT[name]
    assert len(sql.encode()) <= CACHED_QUERY_BYTES
    assert len(parameter_names(sql)) <= CACHED_QUERY_PARAMS
    # psycopg's cached converter is what an execute of this text uses.
    query = _queries.PostgresQuery(Transformer())
    before = _queries._query2pg.cache_info().hits
    for _ in range(2):
        query.convert(sql, dict.fromkeys(parameter_names(sql)))
    assert _queries._query2pg.cache_info().hits > before


def test_compacting_keeps_every_token() -> None:
    sql = """
    WITH a AS (  -- a comment, with a 'quote' in it
      SELECT x , 'it''s -- not a comment' AS "odd  name" /* block
      comment */ FROM t WHERE y >= %(y)s::int AND z = ANY (%(z)s)
    ) SELECT * FROM a
    """
    out = compact(sql)
    assert tokens(out) == tokens(sql)
    assert "'it''s -- not a comment'" in out and '"odd  name"' in out
    assert "comment," not in out and "block" not in out and "\n" not in out


def test_the_write_statements_keep_their_tokens() -> None:
    for sql in HOT.values():
        assert compact(sql) == sql  # compacted already, and compacting is idempotent
        assert tokens(sql)


def test_a_statement_psycopg_would_not_cache_is_refused() -> None:
    with pytest.raises(RuntimeError, match="bytes compacted"):
        hot_statement("SELECT " + " + ".join(f"%(p{i})s" for i in range(600)))
    with pytest.raises(RuntimeError, match="parameters"):
        hot_statement("SELECT " + ",".join(f"%(p{i})s" for i in range(CACHED_QUERY_PARAMS + 1)))


_word = st.sampled_from(["SELECT", "a", "b_1", "%(p)s", "42", "(", ")", ",", "=", ">=", "::", "int", "AND"])
_quoted = st.text(alphabet=" ab'-*/\n\"", max_size=12).map(lambda s: "'" + s.replace("'", "''") + "'")
_gap = st.sampled_from([" ", "  ", "\n", "\t", " -- note 'x'\n", " /* c */ ", "\n  "])


@given(st.lists(st.tuples(st.one_of(_word, _quoted), _gap), min_size=1, max_size=40))
def test_compacting_random_text_keeps_its_tokens(parts: list[tuple[str, str]]) -> None:
    sql = "".join(token + gap for token, gap in parts)
    assert tokens(compact(sql)) == tokens(sql)


def _psycopg_numbering(named: str) -> tuple[str, list[str]]:
    """psycopg's own conversion of a named query: its $n text, and the names in parameter order."""
    names = sorted(parameter_names(named))
    query = _queries.PostgresQuery(Transformer())
    query.convert(named, {name: f"v{i}" for i, name in enumerate(names)})  # each value names its parameter
    assert query.params is not None
    order = [names[int(bytes(p or b"")[1:].decode())] for p in query.params]
    return query.query.decode(), order


@pytest.mark.parametrize("name", sorted(RAW))
def test_raw_statements_are_numbered_as_psycopg_numbers_them(name: str) -> None:
    statement = RAW[name]
    text, order = _psycopg_numbering(statement.named)
    assert statement.text == text and list(statement.names) == order
    assert statement.named == compact(statement.named) and tokens(statement.named)
    assert len(statement.named.encode()) > CACHED_QUERY_BYTES  # why it is raw


@given(st.lists(st.sampled_from(["a", "b", "c", "%%", "x = ", " AND ", "'%%'"]), max_size=30), st.data())
def test_raw_numbering_matches_psycopg_on_random_text(parts: list[str], data: st.DataObject) -> None:
    pieces = [p if p in ("%%", "'%%'") or data.draw(st.booleans()) else f"%({p.strip(' =AND') or 'q'})s" for p in parts]
    sql = "SELECT " + " ".join(pieces)
    raw = raw_statement(sql)
    if raw.names:
        text, order = _psycopg_numbering(raw.named)
        assert raw.text == text and list(raw.names) == order
    else:
        assert raw.text == raw.named.replace("%%", "%")
    assert raw.args({name: name.upper() for name in raw.names}) == [name.upper() for name in raw.names]


def test_a_raw_statement_takes_named_placeholders_only() -> None:
    for bad in ("SELECT %s", "SELECT %(a)b", "SELECT 5 % 2"):
        with pytest.raises(ValueError, match="placeholders only"):
            raw_statement(bad)
