"""Array parameters of the hot statements, each dumped as one text literal in one pass.

psycopg's list dumper is generic: for every list it is given it finds the element type, checks for
nesting and None, and dumps each element through its own dumper, in Python. That costs about 5 µs per
list, so about 30 of the 38 µs it took to convert a kind-9 message's parameters (seven arrays), per
message, on the relay's event loop. The write path's arrays are flat and typed by construction, so they
are passed as `TextArray`, `UuidArray` or `IntArray`. Their dumpers (registered on psycopg's global
adapters when this module is imported) write the PostgreSQL array literal directly. Each one is sent
with the type psycopg itself would send:

* text: no type (unknown), so PostgreSQL types it from the statement, as it does a list of str;
* uuid: uuid[];
* int: the smallest of int2[], int4[] and int8[] that holds every element.

They are still lists. Where these dumpers are not registered (an adapters context copied before this
module was imported), psycopg's own list dumper takes them and sends the same values.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any, Final

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

_TYPES: Final = psycopg.adapters.types


class TextArray(list[str]):
    """A flat array of text (no None, no NUL): a tag's names or values, pubkeys."""

    __slots__ = ()


class UuidArray(list[uuid.UUID]):
    """A flat array of UUIDs (no None): channel ids."""

    __slots__ = ()


class IntArray(list[int]):
    """A flat array of integers (no None, no bool): event kinds."""

    __slots__ = ()


def _quoted(value: str) -> str:
    # Always quoted: an element may hold commas, braces, spaces, quotes or spell NULL.
    if "\x00" in value:
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    if "\\" in value or '"' in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{value}"'


class _ArrayDumper(Dumper):
    format = Format.TEXT

    def literal(self, obj: Any) -> str:
        raise NotImplementedError

    def dump(self, obj: Any) -> bytes:
        text = self.literal(obj)
        if text.isascii():  # every client encoding PostgreSQL has spells ASCII the same way
            return text.encode("ascii")
        return text.encode(self.connection.info.encoding if self.connection is not None else "utf-8")


class _TextArrayDumper(_ArrayDumper):
    oid = 0  # unknown: as psycopg sends a list of str

    def literal(self, obj: Iterable[str]) -> str:
        return "{" + ",".join([_quoted(v) for v in obj]) + "}"


class _UuidArrayDumper(_ArrayDumper):
    oid = _TYPES["uuid"].array_oid

    def literal(self, obj: Iterable[uuid.UUID]) -> str:
        return "{" + ",".join([str(v) for v in obj]) + "}"


_INT_ARRAYS: Final = (
    (2**15, _TYPES["int2"].array_oid),
    (2**31, _TYPES["int4"].array_oid),
    (2**63, _TYPES["int8"].array_oid),
)


class _IntArrayDumper(_ArrayDumper):
    oid = _TYPES["int2"].array_oid

    def get_key(self, obj: Any, format: Any) -> Any:
        return (self.cls, _int_array_oid(obj))

    def upgrade(self, obj: Any, format: Any) -> Dumper:
        oid = _int_array_oid(obj)
        if oid == self.oid:
            return self
        dumper = type(self)(self.cls, self.connection)
        dumper.oid = oid
        return dumper

    def literal(self, obj: Iterable[int]) -> str:
        return "{" + ",".join([str(int(v)) for v in obj]) + "}"


def _int_array_oid(obj: Iterable[int]) -> int:
    top = max((v if v >= 0 else -v - 1 for v in obj), default=0)
    for bound, oid in _INT_ARRAYS:
        if top < bound:
            return oid
    raise psycopg.DataError("an IntArray element is out of the int8 range")


psycopg.adapters.register_dumper(TextArray, _TextArrayDumper)
psycopg.adapters.register_dumper(UuidArray, _UuidArrayDumper)
psycopg.adapters.register_dumper(IntArray, _IntArrayDumper)
