"""Property-based tests (Hypothesis) for event parsing and the canonical serialization."""

from __future__ import annotations

import json
from typing import Any

import nostr_sdk
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from buzz.nostr import (
    MAX_CREATED_AT,
    Event,
    ProtocolError,
    Signer,
    canonical_json,
    compute_id,
    parse_and_verify,
    parse_event,
)

FIELDS = ("id", "pubkey", "created_at", "kind", "tags", "content", "sig")
SIGNERS = [Signer("00" * 31 + f"{i:02x}") for i in (1, 2, 3)]
VALID = SIGNERS[0].sign_event(
    kind=1, tags=[["e", "ab" * 32], ["t", "x", "y"]], content="hello", created_at=1_700_000_000
)

# Any code point, lone surrogates included: json.loads can produce them.
any_char = st.characters() | st.characters(categories=["Cs"])
any_text = st.text(any_char, max_size=20)
# Every code point a well-formed string can hold (no surrogates).
scalar_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-1, max_value=2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text
    | st.sampled_from(["ab" * 32, "ab" * 64, VALID.id, VALID.sig, VALID.pubkey])
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(FIELDS) | any_text, children, max_size=8)
    ),
    max_leaves=10,
)
# Per field: usually a well-formed value, sometimes a near miss, sometimes
# anything at all, so that parsing gets past the first checks and every check
# is reached.
WELL_FORMED = {
    "id": st.just(VALID.id),
    "pubkey": st.sampled_from([s.pubkey for s in SIGNERS]),
    "sig": st.just(VALID.sig),
    "created_at": st.integers(min_value=0, max_value=MAX_CREATED_AT),
    "kind": st.integers(min_value=0, max_value=65535),
    "tags": st.lists(st.lists(st.text(max_size=5), min_size=1, max_size=3), max_size=4),
    "content": st.text(max_size=30),
}
NEAR_MISS = {
    "id": st.sampled_from(["AB" * 32, "ab" * 31, "ab" * 33, VALID.id + "\n"]) | any_text,
    "pubkey": st.sampled_from([VALID.pubkey.upper(), VALID.sig]) | any_text,
    "sig": st.sampled_from(["AB" * 64, "ab" * 63, VALID.id]) | any_text,
    "created_at": st.sampled_from([-1, MAX_CREATED_AT + 1, True, 1.0, "1"]),
    "kind": st.sampled_from([-1, 65536, False, 1.0, "1"]),
    "tags": st.lists(st.lists(any_text | json_scalars, max_size=3), max_size=4),
    "content": any_text | st.text(min_size=17, max_size=70),
}


@st.composite
def event_shaped(draw: st.DrawFn) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for field in FIELDS:
        pick = draw(st.integers(min_value=0, max_value=9))
        source = WELL_FORMED if pick < 7 else NEAR_MISS if pick < 9 else None
        obj[field] = draw(source[field] if source else json_values)
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        obj["tags"] = [["t", str(i)] for i in range(draw(st.integers(15, 18)))]
    return obj


def accepts_or_protocol_error(obj: object) -> Event | None:
    try:
        ev = parse_event(obj, max_tags=16, max_content_bytes=64)
    except ProtocolError as exc:
        assert exc.reason.startswith("invalid: ")
        event(exc.reason)  # --hypothesis-show-statistics: which checks were reached
        return None
    event("accepted")
    return ev


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_parse_event_only_raises_protocol_error(obj: object) -> None:
    accepts_or_protocol_error(obj)


@settings(max_examples=300, deadline=None)
@given(event_shaped())
def test_parse_event_on_event_shaped_values(obj: dict[str, Any]) -> None:
    ev = accepts_or_protocol_error(obj)
    if ev is not None:
        # Whatever was accepted has the NIP-01 shape exactly.
        assert ev.to_dict() == {**obj, "tags": [list(tag) for tag in obj["tags"]]}


@st.composite
def mutated_events(draw: st.DrawFn) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(VALID.to_json())
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        op = draw(st.sampled_from(["replace", "delete", "add", "tag", "tag_item", "flip"]))
        field = draw(st.sampled_from(FIELDS))
        if op == "replace":
            d[field] = draw(json_values)
        elif op == "delete":
            d.pop(field, None)
        elif op == "add":
            d[draw(any_text)] = draw(json_values)
        elif op == "tag" and isinstance(d.get("tags"), list):
            d["tags"].append(draw(json_values))
        elif op == "tag_item" and isinstance(d.get("tags"), list) and d["tags"]:
            tag = d["tags"][0]
            if isinstance(tag, list) and tag:
                tag[draw(st.integers(0, len(tag) - 1))] = draw(json_values)
        elif op == "flip" and isinstance(d.get(field), str) and d[field]:
            text = d[field]
            at = draw(st.integers(0, len(text) - 1))
            d[field] = text[:at] + draw(any_char) + text[at + 1 :]
    return d


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_events())
def test_mutated_valid_events(obj: dict[str, Any]) -> None:
    accepts_or_protocol_error(obj)
    try:
        ev = parse_and_verify(obj)
    except ProtocolError as exc:
        assert exc.reason.startswith("invalid: ")
    else:
        # Only a mutation that changed nothing signed can still verify.
        assert (ev.pubkey, ev.created_at, ev.kind, ev.tags, ev.content, ev.sig) == (
            VALID.pubkey,
            VALID.created_at,
            VALID.kind,
            VALID.tags,
            VALID.content,
            VALID.sig,
        )


tags_strategy = st.lists(st.lists(scalar_text, min_size=1, max_size=4), max_size=5)
created_at_strategy = st.integers(min_value=0, max_value=MAX_CREATED_AT)
kind_strategy = st.integers(min_value=0, max_value=65535)

_TWO_CHAR = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def nip01_string(text: str) -> str:
    # Independent statement of the rule: the seven escapes of NIP-01, \u00xx for
    # the remaining C0 controls, every other character verbatim.
    out = []
    for ch in text:
        if ch in _TWO_CHAR:
            out.append(_TWO_CHAR[ch])
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


@settings(max_examples=300, deadline=None)
@given(created_at_strategy, kind_strategy, tags_strategy, scalar_text)
def test_canonical_json_round_trips(created_at: int, kind: int, tags: list[list[str]], content: str) -> None:
    pk = VALID.pubkey
    out = canonical_json(pk, created_at, kind, tags, content)
    assert json.loads(out.decode("utf-8")) == [0, pk, created_at, kind, tags, content]
    assert not any(byte < 0x20 for byte in out)
    tag_text = ",".join("[" + ",".join(nip01_string(item) for item in tag) + "]" for tag in tags)
    expected = f'[0,"{pk}",{created_at},{kind},[{tag_text}],{nip01_string(content)}]'
    assert out == expected.encode("utf-8")


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(SIGNERS), created_at_strategy, kind_strategy, tags_strategy, scalar_text)
def test_ids_match_nostr_sdk(signer: Signer, created_at: int, kind: int, tags: list[list[str]], content: str) -> None:
    sdk_id = nostr_sdk.EventId.compute(
        nostr_sdk.PublicKey.parse(signer.pubkey),
        nostr_sdk.Timestamp.from_secs(created_at),
        nostr_sdk.Kind(kind),
        [nostr_sdk.Tag.parse(tag) for tag in tags],
        content,
    ).to_hex()
    assert compute_id(signer.pubkey, created_at, kind, tags, content) == sdk_id


@settings(max_examples=50, deadline=None)
@given(kind_strategy, tags_strategy, scalar_text)
def test_signed_events_parse_and_verify(kind: int, tags: list[list[str]], content: str) -> None:
    ev = SIGNERS[1].sign_event(kind=kind, tags=tags, content=content, created_at=1)
    assert parse_and_verify(json.loads(ev.to_json())) == ev
