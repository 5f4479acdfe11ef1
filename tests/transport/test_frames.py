"""The NIP-01 frame router's parser: every input gets a typed frame or an exact reply, never a crash."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from buzz.ws.frames import (
    AuthFrame,
    CloseFrame,
    CountFrame,
    EventFrame,
    Filter,
    FrameError,
    FrameLimits,
    ReqFrame,
    parse_frame,
)

LIMITS = FrameLimits(
    max_message_length=4096, max_subid_length=64, max_filters=4, max_limit=100, default_limit=20, max_filter_values=8
)
HEX = "ab" * 32

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=25,
)


def reply_of(text: str | bytes) -> list[Any]:
    with pytest.raises(FrameError) as info:
        parse_frame(text, LIMITS)
    return info.value.reply


@given(st.text(max_size=300))
@settings(max_examples=300)
def test_arbitrary_text_never_crashes(text: str) -> None:
    try:
        parse_frame(text, LIMITS)
    except FrameError as err:
        assert err.reply[0] in ("NOTICE", "CLOSED")
        assert err.reply[-1].split(":", 1)[0] == "invalid"


@given(json_values)
@settings(max_examples=300)
def test_arbitrary_json_never_crashes(value: object) -> None:
    try:
        frame = parse_frame(json.dumps(value), LIMITS)
    except FrameError as err:
        assert err.reply[0] in ("NOTICE", "CLOSED")
        json.dumps(err.reply)  # every reply is serializable as sent
    else:
        assert isinstance(frame, EventFrame | AuthFrame | ReqFrame | CountFrame | CloseFrame)


@given(
    st.sampled_from(["REQ", "COUNT"]), st.text(min_size=1, max_size=64), st.lists(json_values, min_size=1, max_size=4)
)
@settings(max_examples=300)
def test_req_with_arbitrary_filters(verb: str, sub_id: str, filters: list[object]) -> None:
    text = json.dumps([verb, sub_id, *filters])
    try:
        frame = parse_frame(text, LIMITS)
    except FrameError as err:
        # Once the subscription id is known, errors are CLOSED on that id (NIP-01).
        if len(text.encode()) <= LIMITS.max_message_length:
            assert err.reply[:2] == ["CLOSED", sub_id]
    else:
        assert isinstance(frame, ReqFrame | CountFrame)
        assert all(isinstance(f, dict) for f in filters)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    try:
        parse_frame(data, LIMITS)
    except FrameError as err:
        assert err.reply[0] in ("NOTICE", "CLOSED")


def test_oversize_message_is_a_notice() -> None:
    reply = reply_of(json.dumps(["REQ", "x", {"#t": ["a" * 5000]}]))
    assert reply[0] == "NOTICE" and "limit is 4096" in reply[1]


def test_malformed_json_and_shapes() -> None:
    assert reply_of("{") == ["NOTICE", "invalid: message is not valid JSON"]
    assert reply_of("{}") == ["NOTICE", "invalid: message must be a non-empty JSON array"]
    assert reply_of("[]") == ["NOTICE", "invalid: message must be a non-empty JSON array"]
    assert reply_of("[1]") == ["NOTICE", "invalid: message type must be a string"]
    assert reply_of('["HELLO"]') == ["NOTICE", "invalid: unknown message type 'HELLO'"]
    # NIP-01 answers every EVENT with OK, a malformed frame too (with its event's id when it has one).
    assert reply_of('["EVENT"]') == ["OK", "", False, "invalid: EVENT takes exactly one event"]
    assert reply_of('["EVENT", {}, {}]') == ["OK", "", False, "invalid: EVENT takes exactly one event"]
    assert reply_of('["EVENT", {"id": "' + "ab" * 32 + '"}, 1]') == [
        "OK",
        "ab" * 32,
        False,
        "invalid: EVENT takes exactly one event",
    ]
    # NIP-42 answers AUTH with OK "like any EVENT": a malformed AUTH frame too.
    assert reply_of('["AUTH"]') == ["OK", "", False, "invalid: AUTH takes exactly one event"]
    assert reply_of('["AUTH", {"id": "' + "cd" * 32 + '"}, "x"]') == [
        "OK",
        "cd" * 32,
        False,
        "invalid: AUTH takes exactly one event",
    ]
    assert reply_of('["CLOSE"]')[0] == "NOTICE"
    assert reply_of('["REQ", 5, {}]')[0] == "NOTICE"
    assert reply_of('["REQ", "", {}]') == ["NOTICE", "invalid: subscription id must not be empty"]


def test_subscription_id_length_limit() -> None:
    assert isinstance(parse_frame(json.dumps(["REQ", "s" * 64, {}]), LIMITS), ReqFrame)
    assert "longer than 64" in reply_of(json.dumps(["REQ", "s" * 65, {}]))[1]


def test_filter_count_limit() -> None:
    assert isinstance(parse_frame(json.dumps(["REQ", "s", *([{}] * 4)]), LIMITS), ReqFrame)
    assert reply_of(json.dumps(["REQ", "s", *([{}] * 5)])) == ["CLOSED", "s", "invalid: at most 4 filters per REQ"]
    assert reply_of(json.dumps(["REQ", "s"])) == ["CLOSED", "s", "invalid: REQ needs at least one filter"]


def test_filter_values_are_strict() -> None:
    assert reply_of(json.dumps(["REQ", "s", {"ids": ["AB" * 32]}]))[2].startswith("invalid: filter ids")
    assert reply_of(json.dumps(["REQ", "s", {"ids": ["ab"]}]))[2].startswith("invalid: filter ids")
    assert reply_of(json.dumps(["REQ", "s", {"authors": "x"}]))[2] == "invalid: filter authors must be an array"
    assert reply_of(json.dumps(["REQ", "s", {"kinds": [True]}]))[2].startswith("invalid: filter kinds")
    assert reply_of(json.dumps(["REQ", "s", {"kinds": [70000]}]))[2].startswith("invalid: filter kinds")
    assert reply_of(json.dumps(["REQ", "s", {"since": 1.5}]))[2].startswith("invalid: filter since")
    assert reply_of(json.dumps(["REQ", "s", {"limit": -1}]))[2].startswith("invalid: filter limit")
    assert reply_of(json.dumps(["REQ", "s", {"#e": [1]}]))[2] == "invalid: filter #e must hold strings"
    for value in ("a\u0000b", "\ud800", "x\udfffy"):  # PostgreSQL text can't hold either
        reason = "invalid: filter #t values can't contain U+0000 or unpaired surrogates"
        assert reply_of(json.dumps(["REQ", "s", {"#t": ["ok", value]}]))[2] == reason, value
        assert reply_of(json.dumps(["COUNT", "s", {"#t": [value]}]))[2] == reason, value
    assert reply_of(json.dumps(["REQ", "s", {"kinds": list(range(9))}]))[2].startswith("invalid: filter kinds has more")


def test_unknown_keys_are_refused_not_ignored() -> None:
    assert reply_of(json.dumps(["REQ", "s", {"search": "x"}])) == [
        "CLOSED",
        "s",
        "invalid: unsupported filter key 'search'",
    ]
    # Multi-character tag names belong to NIP-AR queries, not to generic NIP-01 filters.
    assert reply_of(json.dumps(["REQ", "s", {"#type": ["buzz.task"]}]))[2].startswith("invalid: unsupported filter key")


def test_valid_filter_is_parsed_exactly() -> None:
    frame = parse_frame(
        json.dumps(["REQ", "s", {"ids": [HEX], "kinds": [9, 1], "#h": ["c"], "since": 5, "until": 9, "limit": 500}]),
        LIMITS,
    )
    assert isinstance(frame, ReqFrame)
    assert frame.filters == (
        Filter(ids=(HEX,), kinds=(9, 1), tags=(("h", ("c",)),), since=5, until=9, limit=100),  # clamped to max_limit
    )
    default = parse_frame(json.dumps(["REQ", "s", {}]), LIMITS)
    assert isinstance(default, ReqFrame) and default.filters[0].limit == 20


def test_event_auth_close_count_frames() -> None:
    assert parse_frame(json.dumps(["EVENT", {"a": 1}]), LIMITS) == EventFrame({"a": 1})
    assert parse_frame(json.dumps(["AUTH", {"a": 1}]), LIMITS) == AuthFrame({"a": 1})
    assert parse_frame(json.dumps(["CLOSE", "s"]), LIMITS) == CloseFrame("s")
    assert isinstance(parse_frame(json.dumps(["COUNT", "c", {"kinds": [9]}]), LIMITS), CountFrame)


def test_an_object_that_names_a_key_twice_is_refused_not_read_one_way() -> None:
    # json.loads would keep the last value: a narrower filter, or an event other software reads otherwise. The
    # refusal is answered as the verb is: OK for EVENT and AUTH, CLOSED for REQ (which ends an open
    # subscription of that id) and COUNT, NOTICE for the rest.
    for text, answer, replacing in (
        ('["REQ", "s", {"#h": ["a"], "#h": ["b"]}]', ["CLOSED", "s"], "s"),
        ('["REQ", "t", {"artifact": "current", "#h": ["a"], "#type": ["x"], "#type": ["y"]}]', ["CLOSED", "t"], "t"),
        ('["EVENT", {"id": "x", "content": "a", "content": "b"}]', ["OK", "x", False], None),
        ('["AUTH", {"id": "y", "kind": 22242, "kind": 1}]', ["OK", "y", False], None),
        ('["COUNT", "c", {"kinds": [9], "kinds": [1]}]', ["CLOSED", "c"], None),
        ('["CLOSE", "s", {"a": 1, "a": 2}]', ["NOTICE"], None),
        ('{"a": 1, "a": 2}', ["NOTICE"], None),
    ):
        with pytest.raises(FrameError) as info:
            parse_frame(text, LIMITS)
        reply = info.value.reply
        assert reply[: len(answer)] == answer and reply[-1].startswith("invalid: duplicate key"), (text, reply)
        assert info.value.replacing == replacing, text
