"""NIP-01 event parsing, canonical serialization, ids and verification (buzz.nostr.event)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from typing import Any

import nostr_sdk
import pytest

from buzz.nostr import (
    MAX_CREATED_AT,
    Event,
    ProtocolError,
    Signer,
    canonical_json,
    compute_id,
    parse_and_verify,
    parse_event,
    verify_event,
)

# Secret key 1: its x-only pubkey is the generator's x coordinate.
SIGNER = Signer("00" * 31 + "01")
PK = SIGNER.pubkey
CREATED_AT = 1700000000


VALID = SIGNER.sign_event(kind=1, tags=[["e", "ab" * 32], ["t", "x"]], content="hello", created_at=CREATED_AT)


def valid_dict(**overrides: Any) -> dict[str, Any]:
    return {**VALID.to_dict(), **overrides}


def reason_of(obj: object, **limits: Any) -> str:
    with pytest.raises(ProtocolError) as info:
        parse_event(obj, **limits)
    return info.value.reason


# ---------------------------------------------------------------- ProtocolError


def test_protocol_error_carries_reason() -> None:
    err = ProtocolError("invalid: bad event id")
    assert isinstance(err, ValueError)
    assert err.reason == "invalid: bad event id"
    assert str(err) == err.reason
    assert err.prefix == "invalid"


# ---------------------------------------------------------------- parse_event


def test_parse_valid_event() -> None:
    d = valid_dict()
    ev = parse_event(d)
    assert ev == Event(
        id=d["id"],
        pubkey=PK,
        created_at=CREATED_AT,
        kind=1,
        tags=(("e", "ab" * 32), ("t", "x")),
        content="hello",
        sig=d["sig"],
    )
    assert ev.to_dict() == d
    assert json.loads(ev.to_json()) == d


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        ([], "invalid: event must be a JSON object"),
        ("event", "invalid: event must be a JSON object"),
        (None, "invalid: event must be a JSON object"),
    ],
)
def test_parse_rejects_non_objects(obj: object, reason: str) -> None:
    assert reason_of(obj) == reason


@pytest.mark.parametrize("field", ["id", "pubkey", "created_at", "kind", "tags", "content", "sig"])
def test_parse_rejects_missing_field(field: str) -> None:
    d = valid_dict()
    del d[field]
    assert reason_of(d) == f"invalid: event has no {field} field"


def test_parse_rejects_extra_field() -> None:
    assert reason_of(valid_dict(extra=1)) == "invalid: event has fields other than the seven NIP-01 ones"


HEX_REASON = {
    "id": "invalid: id must be 64 lowercase hex characters",
    "pubkey": "invalid: pubkey must be 64 lowercase hex characters",
    "sig": "invalid: sig must be 128 lowercase hex characters",
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", "AB" * 32),
        ("id", "ab" * 31),
        ("id", "ab" * 33),
        ("id", "zz" * 32),
        ("id", "ab" * 32 + "\n"),
        ("id", None),
        ("id", 5),
        ("pubkey", PK.upper()),
        ("pubkey", PK[:-1]),
        ("pubkey", " " + PK[1:]),
        ("pubkey", ["ab"]),
        ("sig", "AB" * 64),
        ("sig", "ab" * 63),
        ("sig", "ab" * 32),
        ("sig", False),
    ],
)
def test_parse_rejects_bad_hex(field: str, value: object) -> None:
    assert reason_of(valid_dict(**{field: value})) == HEX_REASON[field]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (True, "invalid: created_at must be an integer"),
        (1700000000.0, "invalid: created_at must be an integer"),
        ("1700000000", "invalid: created_at must be an integer"),
        (None, "invalid: created_at must be an integer"),
        (-1, f"invalid: created_at must be between 0 and {MAX_CREATED_AT}"),
        (MAX_CREATED_AT + 1, f"invalid: created_at must be between 0 and {MAX_CREATED_AT}"),
        (10**400, f"invalid: created_at must be between 0 and {MAX_CREATED_AT}"),
    ],
)
def test_parse_rejects_bad_created_at(value: object, reason: str) -> None:
    assert reason_of(valid_dict(created_at=value)) == reason


@pytest.mark.parametrize("value", [0, MAX_CREATED_AT])
def test_parse_accepts_created_at_bounds(value: int) -> None:
    assert parse_event(valid_dict(created_at=value)).created_at == value


@pytest.mark.parametrize("value", [-1, 65536, True, False, 1.0, "1", None])
def test_parse_rejects_bad_kind(value: object) -> None:
    assert reason_of(valid_dict(kind=value)) == "invalid: kind must be an integer between 0 and 65535"


@pytest.mark.parametrize("value", [0, 65535])
def test_parse_accepts_kind_bounds(value: int) -> None:
    assert parse_event(valid_dict(kind=value)).kind == value


@pytest.mark.parametrize(
    ("tags", "reason"),
    [
        ({}, "invalid: tags must be an array"),
        ("e", "invalid: tags must be an array"),
        (None, "invalid: tags must be an array"),
        (["e"], "invalid: each tag must be an array of strings"),
        ([{"e": 1}], "invalid: each tag must be an array of strings"),
        ([[]], "invalid: empty tag"),
        ([["e", 1]], "invalid: tag elements must be strings"),
        ([["e", None]], "invalid: tag elements must be strings"),
        ([["e", ["x"]]], "invalid: tag elements must be strings"),
        ([["e", "\ud800"]], "invalid: tag contains an unpaired surrogate"),
        ([["\udfff"]], "invalid: tag contains an unpaired surrogate"),
    ],
)
def test_parse_rejects_bad_tags(tags: object, reason: str) -> None:
    assert reason_of(valid_dict(tags=tags)) == reason


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "invalid: content must be a string"),
        (1, "invalid: content must be a string"),
        (["x"], "invalid: content must be a string"),
        ("ok\ud83d", "invalid: content contains an unpaired surrogate"),
        ("\ude00ok", "invalid: content contains an unpaired surrogate"),
    ],
)
def test_parse_rejects_bad_content(content: object, reason: str) -> None:
    assert reason_of(valid_dict(content=content)) == reason


def test_lone_surrogate_from_json_text_is_rejected() -> None:
    # json.loads turns the escape "\ud800" into a lone surrogate code point.
    d = json.loads(json.dumps(valid_dict()).replace('"hello"', '"\\ud800"'))
    assert reason_of(d) == "invalid: content contains an unpaired surrogate"


def test_surrogate_pair_from_json_text_is_one_character() -> None:
    d = json.loads(json.dumps(valid_dict()).replace('"hello"', '"\\ud83d\\ude00"'))
    assert parse_event(d).content == "\U0001f600"


def test_max_tags_limit() -> None:
    d = valid_dict(tags=[["t", str(i)] for i in range(5)])
    assert len(parse_event(d, max_tags=5).tags) == 5
    assert reason_of(d, max_tags=4) == "invalid: too many tags (max 4)"


def test_max_content_bytes_counts_utf8_bytes() -> None:
    content = "é" * 10  # 20 UTF-8 bytes, 10 code points
    assert parse_event(valid_dict(content=content), max_content_bytes=20).content == content
    assert reason_of(valid_dict(content=content), max_content_bytes=19) == "invalid: content too long (max 19 bytes)"
    assert parse_event(valid_dict(content="a" * 8), max_content_bytes=8).content == "a" * 8
    assert reason_of(valid_dict(content="a" * 9), max_content_bytes=8) == "invalid: content too long (max 8 bytes)"
    assert reason_of(valid_dict(content="\U0001f600" * 3), max_content_bytes=11) == (
        "invalid: content too long (max 11 bytes)"
    )


def test_parse_accepts_tuples_and_does_not_verify() -> None:
    d = valid_dict(tags=(("t", "x"),), content="not what was signed")
    ev = parse_event(d)
    assert ev.tags == (("t", "x"),)
    with pytest.raises(ProtocolError):
        verify_event(ev)


# ---------------------------------------------------------------- Event helpers


def test_tag_helpers() -> None:
    ev = parse_event(valid_dict(tags=[["p", "1"], ["d"], ["p", "2", "relay"], ["e", "3"]]))
    assert ev.first_tag("p") == ("p", "1")
    assert ev.first_tag("d") == ("d",)
    assert ev.first_tag("zz") is None
    assert ev.tag_values("p") == ["1", "2"]
    assert ev.tag_values("d") == []
    assert ev.single_tag_value("e") == "3"
    assert ev.single_tag_value("d") == ""
    assert ev.single_tag_value("p") is None
    assert ev.single_tag_value("zz") is None


def test_event_is_frozen_and_hashable() -> None:
    ev = parse_event(valid_dict())
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.content = "x"  # type: ignore[misc]
    assert hash(ev) == hash(parse_event(valid_dict()))


# ---------------------------------------------------------------- canonical_json


@pytest.mark.parametrize(
    ("content", "encoded"),
    [
        ('"', b'"\\""'),
        ("\\", b'"\\\\"'),
        ("\n", b'"\\n"'),
        ("\r", b'"\\r"'),
        ("\t", b'"\\t"'),
        ("\b", b'"\\b"'),
        ("\f", b'"\\f"'),
        ("\x00", b'"\\u0000"'),
        ("\x01", b'"\\u0001"'),
        ("\x0b", b'"\\u000b"'),
        ("\x1b", b'"\\u001b"'),
        ("\x1f", b'"\\u001f"'),
        ("\x7f", b'"\x7f"'),
        ("/", b'"/"'),
        ("é", '"é"'.encode()),
        ("\u2028\u2029", '"\u2028\u2029"'.encode()),
        ("\U0001f600", b'"\xf0\x9f\x98\x80"'),
        ("\ufeff", '"\ufeff"'.encode()),
    ],
)
def test_canonical_json_string_escapes(content: str, encoded: bytes) -> None:
    prefix = f'[0,"{PK}",1,2,[],'.encode()
    assert canonical_json(PK, 1, 2, [], content) == prefix + encoded + b"]"


def test_canonical_json_every_c0_control() -> None:
    two_char = {0x08: b"\\b", 0x09: b"\\t", 0x0A: b"\\n", 0x0C: b"\\f", 0x0D: b"\\r"}
    for code in range(0x20):
        expected = two_char.get(code, b"\\u%04x" % code)
        out = canonical_json(PK, 0, 0, [[chr(code)]], chr(code))
        assert out == f'[0,"{PK}",0,0,[["'.encode() + expected + b'"]],"' + expected + b'"]'


def test_canonical_json_layout() -> None:
    out = canonical_json(PK, 1700000000, 30023, [["d", "x"], ["t"]], "hi")
    assert out == f'[0,"{PK}",1700000000,30023,[["d","x"],["t"]],"hi"]'.encode()
    assert canonical_json(PK, 1, 1, (("a", "b"),), "") == canonical_json(PK, 1, 1, [["a", "b"]], "")


def test_canonical_json_lone_surrogate_is_protocol_error() -> None:
    with pytest.raises(ProtocolError, match=r"^invalid: "):
        canonical_json(PK, 1, 1, [], "\ud800")


# Ids computed with nostr-sdk 0.45.1 (EventId.compute), pubkey PK, created_at
# 1700000000, kind 1. test_known_ids_come_from_nostr_sdk recomputes them there.
KNOWN_IDS: list[tuple[str, str, list[list[str]], str]] = [
    ("empty", "", [], "1868e8ad4ca66b7a9bb6ddaaecde6e5cc5d11682e87abb650a6ce8853854ef05"),
    ("quote", 'say "hi"', [], "9ad2517bbb5f2121352e445c6c9965d0b402e1fb0d52d218ab6eb64144330ec4"),
    ("backslash", "a\\b", [], "c8583a6102f940a2f16f22e8eecff476d14f70df3260265293177906195bd13e"),
    ("newline", "a\nb", [], "d4e99bdfdb83b5b3ff543040d1a156a572a3865e676ae1f10e963e3e16e29a1e"),
    ("cr", "a\rb", [], "8ad9dd2de86d9d0dcf8683a556af0c2a37c03ff1715dabd52a69cc30d3d413a9"),
    ("tab", "a\tb", [], "6e888600220048a3c089eff65142735e972e311dcc3dbea72119ef1dae1ee891"),
    ("backspace", "a\bb", [], "7717adde511f4ff4bb8cc8efa89f979042810f1ae32a66075464c3b45c0da4ec"),
    ("form_feed", "a\fb", [], "f33f6cfd1e6db877672cf1eca4004081d2bd4407b13a32e9799ab30246479ddc"),
    (
        "all_c0_controls",
        "".join(chr(c) for c in range(0x20)),
        [],
        "d295475e4fc2b49765adcb57c4cb0147270ff233984f6cd850ed0c57ffef55e1",
    ),
    ("delete", "a\x7fb", [], "5c57e5ce69a3ac95521918989e281bd2f0e53d3ab06844c78d87e3a4ab060507"),
    (
        "slash_and_html",
        "</script>&<>'",
        [],
        "82d6be59da79b4f68804a192be9ce51b9b06788dd4860ecc701c0fe276801944",
    ),
    (
        "latin1_cjk",
        "caf\u00e9 \u4e2d\u6587",
        [],
        "22662b66d6236ad50d4e387713e961da478aff37e5e71184c029c40609561948",
    ),
    (
        "emoji",
        "\U0001f600\U0001f44d\U0001f3fd",
        [],
        "2f367e4b40e8d967556b728352c86fce02a5fe0a75cffd1e30188a584cb55403",
    ),
    ("non_bmp", "\U0001d11e", [], "288dad3f23799b11c73df53d8ec9cdecdd45d02e9e3275ede0438326d2bb40f6"),
    (
        "line_separators",
        "a\u2028b\u2029c",
        [],
        "8981b492ec269409acc7605512a8fd07fd579dfedec36e8067b8cfe98a6ec4ed",
    ),
    (
        "bom_and_nonchars",
        "\ufeff\ufffe\uffff",
        [],
        "4802c4d8ef7d4bc5aa6a41dd7a9ec2d623adacdf6a243c1b7f48c165fdb4e725",
    ),
    (
        "tags_with_escapes",
        "",
        [["e", 'q"\\\n'], ["t", "\x00\x1f\x7f\u2028\U0001f600"], ["x"]],
        "19dfc34bc8be410679cbba31208eb81663c286fd275b2ea0f44cfe9eac6cc22d",
    ),
]


@pytest.mark.parametrize(("name", "content", "tags", "expected"), KNOWN_IDS)
def test_known_ids(name: str, content: str, tags: list[list[str]], expected: str) -> None:
    assert compute_id(PK, 1700000000, 1, tags, content) == expected
    assert hashlib.sha256(canonical_json(PK, 1700000000, 1, tags, content)).hexdigest() == expected


@pytest.mark.parametrize(("name", "content", "tags", "expected"), KNOWN_IDS)
def test_known_ids_come_from_nostr_sdk(name: str, content: str, tags: list[list[str]], expected: str) -> None:
    sdk_id = nostr_sdk.EventId.compute(
        nostr_sdk.PublicKey.parse(PK),
        nostr_sdk.Timestamp.from_secs(1700000000),
        nostr_sdk.Kind(1),
        [nostr_sdk.Tag.parse(tag) for tag in tags],
        content,
    )
    assert sdk_id.to_hex() == expected


# ---------------------------------------------------------------- verify_event


def test_verify_valid_event() -> None:
    ev = parse_and_verify(valid_dict())
    verify_event(ev)
    assert ev.pubkey == PK


@pytest.mark.parametrize(
    "change",
    [
        {"content": "hellO"},
        {"created_at": CREATED_AT + 1},
        {"kind": 2},
        {"tags": [["e", "ab" * 32]]},
        {"pubkey": Signer("00" * 31 + "02").pubkey},
        {"id": "00" * 32},
    ],
)
def test_verify_rejects_id_mismatch(change: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_and_verify(valid_dict(**change))
    assert info.value.reason == "invalid: event id does not match its content"


def test_verify_rejects_bad_signature() -> None:
    d = valid_dict()
    flipped = d["sig"][:-1] + ("0" if d["sig"][-1] != "0" else "1")
    for sig in (flipped, "00" * 64, "ff" * 64):
        with pytest.raises(ProtocolError) as info:
            parse_and_verify(valid_dict(sig=sig))
        assert info.value.reason == "invalid: bad signature"


def test_verify_rejects_signature_by_other_key() -> None:
    d = valid_dict()
    other = Signer("00" * 31 + "02").sign_digest(bytes.fromhex(d["id"]))
    with pytest.raises(ProtocolError, match=r"^invalid: bad signature$"):
        parse_and_verify(valid_dict(sig=other))


@pytest.mark.parametrize(
    "pubkey",
    [
        # BIP-340 vector 5: no point on the curve has this x
        "eefdea4cdb677750a420fee807eacf21eb9898ae79b9768766e4faa04a2d4a34",
        # not below the field size p
        "fffffffffffffffffffffffffffffffffffffffffffffffffffffffefffffc30",
        "ff" * 32,
        "00" * 32,
    ],
)
def test_invalid_xonly_pubkey_is_a_rejection_not_a_crash(pubkey: str) -> None:
    d = valid_dict(pubkey=pubkey)
    d["id"] = compute_id(pubkey, d["created_at"], d["kind"], d["tags"], d["content"])
    with pytest.raises(ProtocolError) as info:
        parse_and_verify(d)
    assert info.value.reason == "invalid: bad signature"


def test_verify_event_built_by_hand_with_surrogate() -> None:
    ev = Event("00" * 32, PK, 1, 1, (), "\udc00", "00" * 64)
    with pytest.raises(ProtocolError, match=r"^invalid: "):
        verify_event(ev)


def test_parse_and_verify_applies_limits() -> None:
    with pytest.raises(ProtocolError, match=r"^invalid: too many tags \(max 1\)$"):
        parse_and_verify(valid_dict(), max_tags=1)
    with pytest.raises(ProtocolError, match=r"^invalid: content too long \(max 4 bytes\)$"):
        parse_and_verify(valid_dict(), max_content_bytes=4)


# ---------------------------------------------------------------- Signer.sign_event


def test_sign_event_defaults_to_now_and_verifies() -> None:
    before = int(time.time())
    ev = SIGNER.sign_event(kind=7, tags=[], content="+")
    assert before <= ev.created_at <= int(time.time())
    assert ev.pubkey == PK
    assert parse_and_verify(ev.to_dict()) == ev


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"kind": 70000}, "invalid: kind must be an integer between 0 and 65535"),
        ({"tags": [[]]}, "invalid: empty tag"),
        ({"content": "\ud800"}, "invalid: content contains an unpaired surrogate"),
        ({"created_at": -5}, f"invalid: created_at must be between 0 and {MAX_CREATED_AT}"),
    ],
)
def test_sign_event_refuses_invalid_fields(fields: dict[str, Any], reason: str) -> None:
    args: dict[str, Any] = {"kind": 1, "tags": [], "content": "", "created_at": 1, **fields}
    with pytest.raises(ProtocolError) as info:
        SIGNER.sign_event(**args)
    assert info.value.reason == reason
