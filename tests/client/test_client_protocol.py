"""The client's own copies of NIP-01 ids and BIP-340 signatures, NIP-42 and NIP-98, checked against the
relay's verifiers (buzz.nostr), which tests/unit pins against nostr-sdk; and its small value types.

The client may not import buzz; its tests may, to show the two agree.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from artifacts.client import Event, EventError, FilterError, Keys, RelayUrl, SyncFilter, nip98_header
from artifacts.client.events import event_id
from artifacts.client.httpapi import RelayUrlError
from buzz.nostr import ProtocolError, Signer, compute_id, parse_event, verify_event, verify_http_auth

KEYS = Keys("00" * 31 + "07")
# Any well-formed string: control characters, quotes, backslashes, non-ASCII, astral code points.
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
tags = st.lists(st.lists(text, min_size=1, max_size=4), max_size=6)


@given(tags, text, st.integers(min_value=0, max_value=2**40), st.integers(min_value=0, max_value=65535))
def test_ids_and_signatures_agree_with_the_relay(t: list[list[str]], content: str, created_at: int, kind: int) -> None:
    event = KEYS.sign(kind, t, content, created_at=created_at)
    assert event.id == compute_id(KEYS.pubkey, created_at, kind, t, content)
    verify_event(parse_event(event.to_dict()))  # the relay accepts the client's signature
    signed = Signer(KEYS.secret_hex).sign_event(kind=kind, tags=t, content=content, created_at=created_at)
    Event.from_dict(signed.to_dict()).verify()  # and the client the relay's


def test_a_tampered_event_fails_verification() -> None:
    event = KEYS.sign(1, [["t", "x"]], "hello")
    raw = event.to_dict()
    for field, value in (("content", "hello!"), ("sig", "0" * 128), ("pubkey", Keys.generate().pubkey)):
        with pytest.raises(EventError):
            Event.from_dict({**raw, field: value}).verify()
    with pytest.raises(EventError, match="no 'sig' field"):
        Event.from_dict({k: v for k, v in raw.items() if k != "sig"})
    with pytest.raises(EventError, match="tags"):
        Event.from_dict({**raw, "tags": [["t", 1]]})
    assert event_id(event.pubkey, event.created_at, 1, [["t", "x"]], "hello") == event.id


def test_nip98_header_is_accepted_by_the_relay_for_that_url_method_and_body_only() -> None:
    body = b'[{"artifact":"head","#d":["x"]}]'
    header = nip98_header(KEYS, "http://127.0.0.1:7777/query", "POST", body)
    now = int(time.time())
    auth = verify_http_auth(header, url="http://127.0.0.1:7777/query", method="POST", body=body, now=now)
    assert auth.pubkey == KEYS.pubkey
    for url, method, other in (
        ("http://127.0.0.1:7778/query", "POST", body),
        ("http://127.0.0.1:7777/query", "GET", body),
        ("http://127.0.0.1:7777/query", "POST", body + b" "),
    ):
        with pytest.raises(ProtocolError):
            verify_http_auth(header, url=url, method=method, body=other, now=now)
    # Two identical requests get two authorization events (relays accept each one once).
    again = nip98_header(KEYS, "http://127.0.0.1:7777/query", "POST", body)
    assert auth_event_id(again) != auth_event_id(header)


def auth_event_id(header: str) -> str:
    return str(json.loads(base64.b64decode(header.split(" ", 1)[1]))["id"])


def test_relay_urls_give_the_http_base() -> None:
    assert RelayUrl.parse("ws://127.0.0.1:7777/").http == "http://127.0.0.1:7777"
    assert RelayUrl.parse("wss://relay.example").http == "https://relay.example"
    assert RelayUrl.parse("wss://relay.example:8443/nostr").http == "https://relay.example:8443"
    for bad, why in (
        ("http://relay.example/", "must start with ws:// or wss://"),
        ("ws://", "needs a host"),
        ("ws://u@relay.example/", "needs a host"),
        ("ws://relay.example/?a=1", "no query"),
        ("ws://relay.example:99999/", "not a URL"),
    ):
        with pytest.raises(RelayUrlError, match=why):
            RelayUrl.parse(bad)


def test_key_files(tmp_path: Path) -> None:
    good = tmp_path / "k"
    good.write_text(f"  {KEYS.secret_hex.upper()}\n")
    assert Keys.from_file(good).pubkey == KEYS.pubkey
    assert KEYS.secret_hex not in repr(Keys.from_file(good))
    for content, why in (
        ("nothex", "64 hex characters"),
        ("00" * 32, "zero or not below the curve order"),
        ("ff" * 32, "zero or not below the curve order"),
    ):
        bad = tmp_path / "bad"
        bad.write_text(content)
        with pytest.raises(ValueError, match=why):
            Keys.from_file(bad)
    with pytest.raises(ValueError, match="does not exist"):
        Keys.from_file(tmp_path / "missing")


def test_sync_filters() -> None:
    flt = SyncFilter.of(["c1", "c2", "c1"], types=["buzz.task"], tags={"status": ["open", "open", "done"]})
    assert flt.to_json() == {
        "artifact": "current",
        "#h": ["c1", "c2"],
        "#type": ["buzz.task"],
        "#status": ["open", "done"],
    }
    with pytest.raises(FilterError, match="at least one channel"):
        SyncFilter.of([])
    with pytest.raises(FilterError, match="give them as channels"):
        SyncFilter.of(["c1"], tags=[("h", "c2")])
