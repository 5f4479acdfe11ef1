"""Interop with an independent implementation: nostr-sdk (rust-nostr) 0.45.1 Python bindings."""

from __future__ import annotations

import hashlib
import json

import nostr_sdk
import pytest

from buzz.nostr import (
    Event,
    ProtocolError,
    Signer,
    compute_id,
    parse_and_verify,
    verify_owner_attestation,
    verify_schnorr,
)
from buzz.nostr.nipoa import make_auth_tag

CONTENTS = [
    "",
    "plain",
    'quote " and backslash \\',
    "lines\n\r\ttab\bbs\fff",
    "".join(chr(c) for c in range(0x20)),
    "del \x7f and nul \x00",
    "caf\u00e9 \u4e2d\u6587 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "\U0001f600\U0001f44d\U0001f3fd\U0001d11e",
    "\u2028\u2029\ufeff\ufffe",
    '{"json":"in content","n":[1,2]}',
    "x" * 5000,
]
TAGS = [
    [],
    [["e", "ab" * 32, "wss://relay.example.com", "reply"], ["p", "cd" * 32]],
    [["t", "nostr"], ["t", "\x00\n\u2028"], ["d"], ["", ""]],
    [["h", "c0ffee00-0000-4000-8000-000000000001"], ["custom", 'a"b\\c', "\U0001f600"]],
]
CASES = [(content, tags) for content in CONTENTS for tags in TAGS[:2]] + [
    (content, tags) for content in CONTENTS[:4] for tags in TAGS[2:]
]
CASE_IDS = [f"case{i}" for i in range(len(CASES))]
KINDS = [0, 1, 7, 22242, 30023, 45010, 65535]


def sdk_sign(keys: nostr_sdk.Keys, kind: int, tags: list[list[str]], content: str, created_at: int) -> str:
    builder = (
        nostr_sdk.EventBuilder(nostr_sdk.Kind(kind), content)
        .tags([nostr_sdk.Tag.parse(tag) for tag in tags])
        .custom_created_at(nostr_sdk.Timestamp.from_secs(created_at))
    )
    text: str = keys.sign_event(builder.finalize_unsigned(keys.public_key())).as_json()
    return text


@pytest.fixture(scope="module")
def sdk_keys() -> nostr_sdk.Keys:
    return nostr_sdk.Keys.generate()


@pytest.mark.parametrize(("content", "tags"), CASES, ids=CASE_IDS)
def test_sdk_signed_events_verify_here(sdk_keys: nostr_sdk.Keys, content: str, tags: list[list[str]]) -> None:
    text = sdk_sign(sdk_keys, 1, tags, content, 1_700_000_000)
    ev = parse_and_verify(json.loads(text))
    assert ev.pubkey == sdk_keys.public_key().to_hex()
    assert ev.content == content
    assert [list(tag) for tag in ev.tags] == tags
    assert ev.id == compute_id(ev.pubkey, ev.created_at, ev.kind, ev.tags, ev.content)


@pytest.mark.parametrize("kind", KINDS)
def test_sdk_kinds_and_timestamps(sdk_keys: nostr_sdk.Keys, kind: int) -> None:
    for created_at in (0, 1, 1_700_000_000, 2**32, 2**53 - 1):
        ev = parse_and_verify(json.loads(sdk_sign(sdk_keys, kind, [], "k", created_at)))
        assert (ev.kind, ev.created_at) == (kind, created_at)


def test_sdk_signed_event_tampered_is_rejected_here(sdk_keys: nostr_sdk.Keys) -> None:
    d = json.loads(sdk_sign(sdk_keys, 1, [["t", "x"]], "original", 1_700_000_000))
    with pytest.raises(ProtocolError, match=r"^invalid: event id does not match its content$"):
        parse_and_verify({**d, "content": "forged"})
    other = Signer.generate().sign_digest(bytes.fromhex(d["id"]))
    with pytest.raises(ProtocolError, match=r"^invalid: bad signature$"):
        parse_and_verify({**d, "sig": other})


@pytest.mark.parametrize(("content", "tags"), CASES, ids=CASE_IDS)
def test_events_signed_here_verify_in_sdk(content: str, tags: list[list[str]]) -> None:
    ev = Signer.generate().sign_event(kind=1, tags=tags, content=content, created_at=1_700_000_000)
    sdk_event = nostr_sdk.Event.from_json(ev.to_json())
    assert sdk_event.verify()
    assert sdk_event.id().to_hex() == ev.id
    assert sdk_event.author().to_hex() == ev.pubkey
    assert sdk_event.content() == content
    # And the same text read back here is the same event.
    assert parse_and_verify(json.loads(sdk_event.as_json())) == ev


def test_events_signed_here_tampered_fail_in_sdk() -> None:
    ev = Signer.generate().sign_event(kind=1, tags=[], content="original", created_at=1)
    d = ev.to_dict()
    assert not nostr_sdk.Event.from_json(json.dumps({**d, "content": "forged"})).verify()
    assert not nostr_sdk.Event.from_json(json.dumps({**d, "sig": "00" * 64})).verify_signature()


def test_same_secret_same_pubkey() -> None:
    signer = Signer.generate()
    keys = nostr_sdk.Keys(nostr_sdk.SecretKey.parse(signer.secret_hex))
    assert keys.public_key().to_hex() == signer.pubkey
    keys2 = nostr_sdk.Keys.generate()
    assert Signer(keys2.secret_key().to_hex()).pubkey == keys2.public_key().to_hex()


def test_schnorr_signatures_cross_verify() -> None:
    signer = Signer.generate()
    keys = nostr_sdk.Keys(nostr_sdk.SecretKey.parse(signer.secret_hex))
    msg = hashlib.sha256(b"interop").digest()
    assert verify_schnorr(signer.pubkey, msg, keys.sign_schnorr(msg))


def test_nip_oa_tag_survives_the_sdk(sdk_keys: nostr_sdk.Keys) -> None:
    owner = Signer.generate()
    tag = list(make_auth_tag(owner, sdk_keys.public_key().to_hex(), "kind=1"))
    ev: Event = parse_and_verify(json.loads(sdk_sign(sdk_keys, 1, [tag], "agent", 1_700_000_000)))
    attestation = verify_owner_attestation(ev)
    assert attestation is not None and attestation.owner == owner.pubkey
