"""Client frames of NIP-01 (and NIP-42 AUTH), parsed strictly. Pure: no Django, no I/O.

Every malformed frame becomes a FrameError that carries the exact reply to send
(a NOTICE, a CLOSED, or an OK false), so the connection keeps working.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from buzz.nostr import strictjson
from buzz.nostr.filters import Filter, FilterError, parse_filter


@dataclass(frozen=True, slots=True)
class FrameLimits:
    max_message_length: int
    max_subid_length: int
    max_filters: int
    max_limit: int
    default_limit: int
    max_filter_values: int = 1000
    # Filter keys that select a REQ mode registered by an app (buzz.ws.modes).
    modes: frozenset[str] = frozenset()


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


@dataclass(frozen=True, slots=True)
class ModeReqFrame:
    """A REQ for a registered mode: its filters go to the mode unparsed (it has its own grammar)."""

    sub_id: str
    mode: str
    filters: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class CountFrame:
    sub_id: str
    filters: tuple[Filter, ...]


@dataclass(frozen=True, slots=True)
class CloseFrame:
    sub_id: str


Frame = EventFrame | AuthFrame | ReqFrame | ModeReqFrame | CountFrame | CloseFrame


class FrameError(Exception):
    """A frame refused while parsing: `reply` answers it. `replacing` names the subscription id of a REQ
    refused here: NIP-01 ends an open subscription of that id too (a REQ with its id replaces it)."""

    def __init__(self, reply: list[Any], *, replacing: str | None = None) -> None:
        super().__init__(reply[-1])
        self.reply = reply
        self.replacing = replacing


def notice(reason: str) -> FrameError:
    return FrameError(["NOTICE", reason])


def closed(sub_id: str, reason: str) -> FrameError:
    return FrameError(["CLOSED", sub_id, reason])


def parse_frame(text: str | bytes, limits: FrameLimits) -> Frame:
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_message_length:
        raise notice(f"invalid: message is {size} bytes, the limit is {limits.max_message_length}")
    try:
        value = strictjson.loads(text)
    except strictjson.DuplicateKey as err:
        raise _duplicate_key(text, err.reason, limits) from None
    except (ValueError, RecursionError):
        raise notice("invalid: message is not valid JSON") from None
    if not isinstance(value, list) or not value:
        raise notice("invalid: message must be a non-empty JSON array")
    verb = value[0]
    if not isinstance(verb, str):
        raise notice("invalid: message type must be a string")
    if verb in ("EVENT", "AUTH"):
        if len(value) != 2:
            raise _event_refusal(value, f"invalid: {verb} takes exactly one event")
        return EventFrame(value[1]) if verb == "EVENT" else AuthFrame(value[1])
    if verb in ("REQ", "COUNT"):
        sub_id = _sub_id(value, limits)
        try:
            return _req_or_count(verb, sub_id, value[2:], limits)
        except FrameError as err:
            if verb == "REQ":
                err.replacing = sub_id
            raise
    if verb == "CLOSE":
        if len(value) != 2:
            raise notice("invalid: CLOSE takes exactly one subscription id")
        return CloseFrame(_sub_id(value, limits))
    raise notice(f"invalid: unknown message type {verb[:32]!r}")


def _duplicate_key(text: str | bytes, reason: str, limits: FrameLimits) -> FrameError:
    """The refusal of a message that names a key twice, answered as its verb is: EVENT and AUTH with OK, REQ
    and COUNT with CLOSED (a REQ's also ends an open subscription of that id), anything else with NOTICE. The
    verb and ids come from a lenient read of the same text (the last of a repeated key)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return notice(reason)
    verb = value[0] if isinstance(value, list) and value else None
    if verb in ("EVENT", "AUTH"):
        return _event_refusal(value, reason)
    if verb in ("REQ", "COUNT"):
        try:
            sub_id = _sub_id(value, limits)
        except FrameError as refused:
            return refused
        answer = closed(sub_id, reason)
        if verb == "REQ":
            answer.replacing = sub_id
        return answer
    return notice(reason)


def _event_refusal(value: list[Any], reason: str) -> FrameError:
    """NIP-01 answers every EVENT with OK, and NIP-42 every AUTH "like any EVENT": a malformed frame too, with
    its event's id when it carries one."""
    return FrameError(["OK", _id_of(value[1] if len(value) > 1 else None), False, reason])


def _id_of(raw: object) -> str:
    """The id to echo in OK, from a raw event that carries one (as buzz.events.ingest echoes it)."""
    value = raw.get("id") if isinstance(raw, dict) else None
    return value if isinstance(value, str) and len(value) <= 64 and is_unicode(value) else ""


def _req_or_count(verb: str, sub_id: str, raw: list[Any], limits: FrameLimits) -> Frame:
    if not raw:
        raise closed(sub_id, f"invalid: {verb} needs at least one filter")
    if len(raw) > limits.max_filters:
        raise closed(sub_id, f"invalid: at most {limits.max_filters} filters per {verb}")
    mode = _mode_of(raw, limits)
    if mode is not None:
        if verb == "COUNT":
            raise closed(sub_id, f"invalid: COUNT does not take {mode!r} filters")
        return ModeReqFrame(sub_id, mode, tuple(raw))
    filters = tuple(_filter(sub_id, f, limits) for f in raw)
    if verb == "REQ":
        return ReqFrame(sub_id, filters)
    return CountFrame(sub_id, filters)


def _sub_id(value: list[Any], limits: FrameLimits) -> str:
    if len(value) < 2 or not isinstance(value[1], str):
        raise notice(f"invalid: {value[0]} needs a subscription id string")
    sub_id: str = value[1]
    if not sub_id:
        raise notice("invalid: subscription id must not be empty")
    if len(sub_id) > limits.max_subid_length:
        raise notice(f"invalid: subscription id longer than {limits.max_subid_length} characters")
    if not is_unicode(sub_id):
        # A lone surrogate (JSON "\ud800") can't be sent back as UTF-8; the reply echoes it escaped.
        raise closed(sub_id, "invalid: subscription id is not valid Unicode (a lone surrogate)")
    return sub_id


def is_unicode(text: str) -> bool:
    """False when `text` holds a lone surrogate, which no UTF-8 frame can carry."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _mode_of(raw: list[Any], limits: FrameLimits) -> str | None:
    """The registered mode any filter names by one of its keys (the mode then judges every filter)."""
    for f in raw:
        if isinstance(f, dict):
            for key in f:
                if key in limits.modes:
                    return str(key)
    return None


def _filter(sub_id: str, raw: object, limits: FrameLimits) -> Filter:
    try:
        return parse_filter(
            raw, max_values=limits.max_filter_values, max_limit=limits.max_limit, default_limit=limits.default_limit
        )
    except FilterError as err:
        raise closed(sub_id, err.reason) from None
