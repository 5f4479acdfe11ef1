"""The text of statements the relay runs on every write: compacted once, at import, so that psycopg
keeps their conversion.

psycopg turns a query's `%(name)s` placeholders into `$n` on each execute, and caches the result only
for a query of at most CACHED_QUERY_BYTES bytes with at most CACHED_QUERY_PARAMS parameters (its
MAX_CACHED_STATEMENT_LENGTH and MAX_CACHED_STATEMENT_PARAMS; tests/test_sqltext.py checks the two
agree). A longer query is split again on every execute, prepared or not: measured here, 0.5 ms of
relay CPU per execute of a 6 KB statement, about a quarter of what a kind-9 message cost the relay.
The write statements are long because they are commented and indented for people to read, so
`hot_statement` drops the comments and the runs of whitespace (never inside a quoted literal or
identifier) and refuses, when the module defining the statement is imported, a text that psycopg
would still not cache.
"""

from __future__ import annotations

import re
from typing import Final

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
