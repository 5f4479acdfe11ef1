"""NIP-42 AUTH event checks (buzz.nostr.nip42)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from buzz.nostr import (
    AUTH_EVENT_KIND,
    Event,
    ProtocolError,
    Signer,
    parse_event,
    verify_auth_event,
)
from buzz.nostr.url import normalize_url

SIGNER = Signer("00" * 31 + "07")
NOW = 1_700_000_000
CHALLENGE = "3f5e1c0a-challenge"
RELAY = "wss://relay.example.com/"


def auth_event(
    *,
    challenge: str = CHALLENGE,
    relay: str = RELAY,
    created_at: int = NOW,
    kind: int = AUTH_EVENT_KIND,
    tags: Sequence[Sequence[str]] | None = None,
) -> Event:
    if tags is None:
        tags = [["relay", relay], ["challenge", challenge]]
    return SIGNER.sign_event(kind=kind, tags=tags, content="", created_at=created_at)


def verify(ev: Event, *, relay_url: str = RELAY, now: int = NOW, window: int = 600) -> str:
    return verify_auth_event(ev, challenge=CHALLENGE, relay_url=relay_url, now=now, window=window)


def reason(ev: Event, **kwargs: object) -> str:
    with pytest.raises(ProtocolError) as info:
        verify(ev, **kwargs)  # type: ignore[arg-type]
    return info.value.reason


def test_valid_auth_returns_pubkey() -> None:
    assert verify(auth_event()) == SIGNER.pubkey


def test_extra_tags_and_order_do_not_matter() -> None:
    ev = auth_event(tags=[["challenge", CHALLENGE], ["client", "x"], ["relay", RELAY]])
    assert verify(ev) == SIGNER.pubkey


# ---------------------------------------------------------------- kind


def test_wrong_kind() -> None:
    assert reason(auth_event(kind=1)) == "invalid: auth event must be kind 22242"
    assert reason(auth_event(kind=22243)) == "invalid: auth event must be kind 22242"


# ---------------------------------------------------------------- challenge


@pytest.mark.parametrize("answer", ["wrong", CHALLENGE + "x", CHALLENGE.upper(), "", " " + CHALLENGE])
def test_challenge_mismatch(answer: str) -> None:
    assert reason(auth_event(challenge=answer)) == "auth-required: challenge mismatch"


def test_challenge_tag_without_value() -> None:
    ev = auth_event(tags=[["relay", RELAY], ["challenge"]])
    assert reason(ev) == "auth-required: challenge mismatch"


@pytest.mark.parametrize(
    "tags",
    [
        [["relay", RELAY]],
        [["relay", RELAY], ["challenge", CHALLENGE], ["challenge", CHALLENGE]],
        [["relay", RELAY], ["challenge", "other"], ["challenge", CHALLENGE]],
    ],
)
def test_challenge_tag_must_be_single(tags: list[list[str]]) -> None:
    assert reason(auth_event(tags=tags)) == "auth-required: auth event must have exactly one challenge tag"


# ---------------------------------------------------------------- relay url


@pytest.mark.parametrize(
    "signed",
    [
        "wss://relay.example.com/",
        "wss://relay.example.com",
        "WSS://Relay.Example.COM/",
        "wss://relay.example.com:443/",
        "wss://relay.example.com:443",
        "wss://relay.example.com//",
    ],
)
def test_relay_url_equivalents(signed: str) -> None:
    assert verify(auth_event(relay=signed)) == SIGNER.pubkey


@pytest.mark.parametrize(
    ("configured", "signed"),
    [
        ("ws://localhost:8000", "ws://localhost:8000/"),
        ("ws://127.0.0.1:80/", "ws://127.0.0.1"),
        ("wss://relay.example.com/nostr", "wss://relay.example.com/nostr/"),
        ("wss://[::1]:7777/", "wss://[::1]:7777"),
    ],
)
def test_relay_url_equivalents_other_configs(configured: str, signed: str) -> None:
    assert verify(auth_event(relay=signed), relay_url=configured) == SIGNER.pubkey


@pytest.mark.parametrize(
    "signed",
    [
        "wss://other.example.com/",
        "wss://relay.example.com.evil.com/",
        "wss://evil.com/relay.example.com",
        "ws://relay.example.com/",
        "https://relay.example.com/",
        "wss://relay.example.com:444/",
        "wss://relay.example.com:80/",
        "wss://relay.example.com/other",
        "wss://relay.example.com/?x=1",
        "wss://user@relay.example.com/",
        "wss://relay.example.com:notaport/",
        "wss://relay.exa mple.com/",
        "wss://relay.example.com/\n",
        "relay.example.com",
        "",
    ],
)
def test_relay_url_mismatch(signed: str) -> None:
    assert reason(auth_event(relay=signed)) == "auth-required: relay url mismatch"


def test_relay_tag_without_value() -> None:
    ev = auth_event(tags=[["relay"], ["challenge", CHALLENGE]])
    assert reason(ev) == "auth-required: relay url mismatch"


@pytest.mark.parametrize(
    "tags",
    [
        [["challenge", CHALLENGE]],
        [["relay", RELAY], ["relay", RELAY], ["challenge", CHALLENGE]],
    ],
)
def test_relay_tag_must_be_single(tags: list[list[str]]) -> None:
    assert reason(auth_event(tags=tags)) == "auth-required: auth event must have exactly one relay tag"


def test_unparsable_configured_url_never_matches() -> None:
    assert reason(auth_event(), relay_url="not a url") == "auth-required: relay url mismatch"


# ---------------------------------------------------------------- time window


@pytest.mark.parametrize("offset", [-600, -1, 0, 1, 600])
def test_time_window_inside(offset: int) -> None:
    assert verify(auth_event(created_at=NOW + offset)) == SIGNER.pubkey


@pytest.mark.parametrize("offset", [-601, 601, -10_000, 10_000])
def test_time_window_outside(offset: int) -> None:
    assert reason(auth_event(created_at=NOW + offset)) == "auth-required: auth event too old or in the future"


def test_custom_window() -> None:
    ev = auth_event(created_at=NOW - 30)
    assert verify(ev, window=30) == SIGNER.pubkey
    assert reason(ev, window=29) == "auth-required: auth event too old or in the future"


# ---------------------------------------------------------------- id and signature


def test_bad_signature() -> None:
    d = auth_event().to_dict()
    d["sig"] = Signer("00" * 31 + "08").sign_digest(bytes.fromhex(d["id"]))
    assert reason(parse_event(d)) == "invalid: bad signature"


def test_id_mismatch() -> None:
    d = auth_event().to_dict()
    d["tags"] = [["relay", RELAY], ["challenge", CHALLENGE], ["extra", "tag"]]
    assert reason(parse_event(d)) == "invalid: event id does not match its content"


# ---------------------------------------------------------------- normalize_url


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("WSS://Relay.Example.com:443/", "wss://relay.example.com"),
        ("ws://relay.example.com:80/a/", "ws://relay.example.com/a"),
        ("ws://relay.example.com:8080", "ws://relay.example.com:8080"),
        ("wss://relay.example.com/A?b=C#d", "wss://relay.example.com/A?b=C#d"),
        ("wss://[::1]/", "wss://[::1]"),
    ],
)
def test_normalize_url_ignoring_trailing_slash(url: str, key: str) -> None:
    assert normalize_url(url, ignore_trailing_slash=True) == key


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("HTTPS://API.example.com:443", "https://api.example.com/"),
        ("https://api.example.com/a/", "https://api.example.com/a/"),
        ("http://api.example.com:80/a?x=1&y=2", "http://api.example.com/a?x=1&y=2"),
        ("http://api.example.com:8443/a%2Fb", "http://api.example.com:8443/a%2Fb"),
    ],
)
def test_normalize_url_exact_path(url: str, key: str) -> None:
    assert normalize_url(url, ignore_trailing_slash=False) == key


@pytest.mark.parametrize(
    "url",
    ["", "/relative", "wss://", "wss://a b", "wss://x\t/", "wss://u:p@x/", "wss://x:99999/", "x"],
)
def test_normalize_url_refuses(url: str) -> None:
    assert normalize_url(url, ignore_trailing_slash=True) is None
