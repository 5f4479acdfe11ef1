"""Client frames of NIP-01 (and NIP-42 AUTH), parsed strictly. Pure: no Django, no I/O.

Every malformed frame becomes a FrameError that carries the exact reply to send
(a NOTICE, a CLOSED, or an OK false), so the connection keeps working.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_TAG_KEY = re.compile(r"^#[A-Za-z]\Z")
_MAX_INT = 2**53 - 1


@dataclass(frozen=True, slots=True)
class FrameLimits:
    max_message_length: int
    max_subid_length: int
    max_filters: int
    max_limit: int
    default_limit: int
    max_filter_values: int = 1000


@dataclass(frozen=True, slots=True)
class Filter:
    ids: tuple[str, ...] | None = None
    authors: tuple[str, ...] | None = None
    kinds: tuple[int, ...] | None = None
    tags: tuple[tuple[str, tuple[str, ...]], ...] = ()
    since: int | None = None
    until: int | None = None
    limit: int = 0

    def tag_values(self, letter: str) -> tuple[str, ...] | None:
        for name, values in self.tags:
            if name == letter:
                return values
        return None


@dataclass(frozen=True, slots=True)
class EventFrame:
    event: object  # the decoded JSON value; buzz.nostr parses it


@dataclass(frozen=True, slots=True)
class AuthFrame:
    event: object


@dataclass(frozen=True, slots=True)
class ReqFrame:
    sub_id: str
    filters: tuple[Filter, ...]
    raw_filters: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class CountFrame:
    sub_id: str
    filters: tuple[Filter, ...]
    raw_filters: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class CloseFrame:
    sub_id: str


Frame = EventFrame | AuthFrame | ReqFrame | CountFrame | CloseFrame


class FrameError(Exception):
    def __init__(self, reply: list[Any]) -> None:
        super().__init__(reply[-1])
        self.reply = reply


def notice(reason: str) -> FrameError:
    return FrameError(["NOTICE", reason])


def closed(sub_id: str, reason: str) -> FrameError:
    return FrameError(["CLOSED", sub_id, reason])


def parse_frame(text: str | bytes, limits: FrameLimits) -> Frame:
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_message_length:
        raise notice(f"invalid: message is {size} bytes, the limit is {limits.max_message_length}")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise notice("invalid: message is not valid JSON") from None
    if not isinstance(value, list) or not value:
        raise notice("invalid: message must be a non-empty JSON array")
    verb = value[0]
    if not isinstance(verb, str):
        raise notice("invalid: message type must be a string")
    if verb == "EVENT":
        if len(value) != 2:
            raise notice("invalid: EVENT takes exactly one event")
        return EventFrame(value[1])
    if verb == "AUTH":
        if len(value) != 2:
            raise notice("invalid: AUTH takes exactly one event")
        return AuthFrame(value[1])
    if verb in ("REQ", "COUNT"):
        sub_id = _sub_id(value, limits)
        raw = value[2:]
        if not raw:
            raise closed(sub_id, f"invalid: {verb} needs at least one filter")
        if len(raw) > limits.max_filters:
            raise closed(sub_id, f"invalid: at most {limits.max_filters} filters per {verb}")
        filters = tuple(_filter(sub_id, f, limits) for f in raw)
        if verb == "REQ":
            return ReqFrame(sub_id, filters, tuple(raw))
        return CountFrame(sub_id, filters, tuple(raw))
    if verb == "CLOSE":
        if len(value) != 2:
            raise notice("invalid: CLOSE takes exactly one subscription id")
        return CloseFrame(_sub_id(value, limits))
    raise notice(f"invalid: unknown message type {verb[:32]!r}")


def _sub_id(value: list[Any], limits: FrameLimits) -> str:
    if len(value) < 2 or not isinstance(value[1], str):
        raise notice(f"invalid: {value[0]} needs a subscription id string")
    sub_id: str = value[1]
    if not sub_id:
        raise notice("invalid: subscription id must not be empty")
    if len(sub_id) > limits.max_subid_length:
        raise notice(f"invalid: subscription id longer than {limits.max_subid_length} characters")
    return sub_id


def _int(sub_id: str, key: str, v: object, lo: int = 0, hi: int = _MAX_INT) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise closed(sub_id, f"invalid: filter {key} must be an integer from {lo} to {hi}")
    return v


def _values(sub_id: str, key: str, v: object, limits: FrameLimits) -> list[Any]:
    if not isinstance(v, list):
        raise closed(sub_id, f"invalid: filter {key} must be an array")
    if len(v) > limits.max_filter_values:
        raise closed(sub_id, f"invalid: filter {key} has more than {limits.max_filter_values} values")
    return v


def _filter(sub_id: str, raw: object, limits: FrameLimits) -> Filter:
    if not isinstance(raw, dict):
        raise closed(sub_id, "invalid: a filter must be a JSON object")
    ids = authors = None
    kinds = None
    tags: list[tuple[str, tuple[str, ...]]] = []
    since = until = None
    limit = limits.default_limit
    for key, v in raw.items():
        if key in ("ids", "authors"):
            items = _values(sub_id, key, v, limits)
            if not all(isinstance(x, str) and _HEX64.match(x) for x in items):
                raise closed(sub_id, f"invalid: filter {key} must hold 64-character lowercase hex strings")
            if key == "ids":
                ids = tuple(items)
            else:
                authors = tuple(items)
        elif key == "kinds":
            items = _values(sub_id, key, v, limits)
            kinds = tuple(_int(sub_id, "kinds", k, 0, 65535) for k in items)
        elif key == "since":
            since = _int(sub_id, key, v)
        elif key == "until":
            until = _int(sub_id, key, v)
        elif key == "limit":
            # NIP-11 max_limit: the relay clamps a larger limit to this value.
            limit = min(_int(sub_id, key, v), limits.max_limit)
        elif _TAG_KEY.match(key):
            items = _values(sub_id, key, v, limits)
            if not all(isinstance(x, str) for x in items):
                raise closed(sub_id, f"invalid: filter {key} must hold strings")
            tags.append((key[1], tuple(items)))
        else:
            # No predicate is silently ignored: an unknown key would widen the result.
            raise closed(sub_id, f"invalid: unsupported filter key {key[:64]!r}")
    return Filter(ids=ids, authors=authors, kinds=kinds, tags=tuple(tags), since=since, until=until, limit=limit)
