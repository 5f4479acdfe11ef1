"""The text of statements the relay runs on every write: compacted once, at import, so that psycopg
keeps their conversion.

psycopg turns a query's `%(name)s` placeholders into `$n` on each execute, and caches the result only
for a query of at most CACHED_QUERY_BYTES bytes with at most CACHED_QUERY_PARAMS parameters (its
MAX_CACHED_STATEMENT_LENGTH and MAX_CACHED_STATEMENT_PARAMS; tests/chat/test_hot_text.py checks the two
agree). A longer query is split again on every execute, prepared or not: measured here, 0.5 ms of
relay CPU per execute of a 6 KB statement, about a quarter of what a kind-9 message cost the relay.
The write statements are long because they are commented and indented for people to read, so
`hot_statement` drops the comments and the runs of whitespace (never inside a quoted literal or
identifier) and refuses, when the module defining the statement is imported, a text that psycopg
would still not cache. A statement that can't be made that short is a `raw_statement`: converted to
`$n` placeholders once, and run on a raw cursor.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

CACHED_QUERY_BYTES: Final = 4096
CACHED_QUERY_PARAMS: Final = 50

# A quoted literal or identifier (kept as it is), or a comment (dropped).
_TOKEN: Final = re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*")|(--[^\n]*|/\*.*?\*/)""", re.DOTALL)
# No space is needed next to these.
_TIGHT: Final = re.compile(r" ?([(),]) ?")


def compact(sql: str) -> str:
    """`sql` without comments, each run of whitespace outside quotes made one space, or none next to a
    parenthesis or a comma. The statement means the same."""
    pieces: list[tuple[bool, str]] = []  # (quoted, text); a comment counts as a space
    pos = 0
    for match in _TOKEN.finditer(sql):
        pieces.append((False, sql[pos : match.start()]))
        quoted = match.group(1)
        pieces.append((True, quoted) if quoted is not None else (False, " "))
        pos = match.end()
    pieces.append((False, sql[pos:]))
    out: list[str] = []
    plain: list[str] = []
    for quoted, text in pieces:
        if quoted:
            out.append(_tight("".join(plain)))
            plain = []
            out.append(text)
        else:
            plain.append(text)
    out.append(_tight("".join(plain)))
    return "".join(out).strip()


def _tight(plain: str) -> str:
    return _TIGHT.sub(r"\1", re.sub(r"\s+", " ", plain))


def parameter_names(sql: str) -> set[str]:
    """The `%(name)s` placeholders of a statement."""
    return set(re.findall(r"%\((\w+)\)s", sql))


def hot_statement(sql: str) -> str:
    """`compact(sql)`, which must be short enough for psycopg to cache its conversion; raises
    RuntimeError (at import of the defining module) otherwise."""
    text = compact(sql)
    size = len(text.encode())
    if size > CACHED_QUERY_BYTES:
        raise RuntimeError(f"a hot statement is {size} bytes compacted; psycopg caches at most {CACHED_QUERY_BYTES}")
    if len(parameter_names(text)) > CACHED_QUERY_PARAMS:
        raise RuntimeError(f"a hot statement has more than {CACHED_QUERY_PARAMS} parameters")
    return text


# A placeholder psycopg would convert: `%%` (a percent sign), `%(name)s`, or anything else after a `%`.
_PLACEHOLDER: Final = re.compile(r"%(?:(%)|\((\w+)\)s|(.))", re.DOTALL)


@dataclass(frozen=True, slots=True)
class RawStatement:
    """A hot statement converted once, at import, to PostgreSQL's `$n` placeholders, for a statement too
    long for psycopg's conversion cache: run it on a raw cursor (psycopg.AsyncRawCursor) with
    `args(params)`, and nothing is converted per execute, whatever its length."""

    named: str  # compact, with the %(name)s placeholders (what tests EXPLAIN with named parameters)
    text: str  # the same, with $n for the n-th name in order of first appearance
    names: tuple[str, ...]

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        """The positional parameters of `text` from named ones (KeyError for a missing name)."""
        return [params[name] for name in self.names]


def raw_statement(sql: str) -> RawStatement:
    """`compact(sql)` with its `%(name)s` placeholders numbered as psycopg numbers them (tests compare the
    two). Raises ValueError for a placeholder that is not `%(name)s` or `%%`."""
    named = compact(sql)
    order: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        percent, name, other = match.groups()
        if percent is not None:
            return "%"
        if name is None:
            raise ValueError(f"a raw statement takes %(name)s placeholders only, not %{other}")
        if name not in order:
            order[name] = len(order) + 1
        return f"${order[name]}"

    text = _PLACEHOLDER.sub(number, named)
    return RawStatement(named=named, text=text, names=tuple(order))
