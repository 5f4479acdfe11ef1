"""NIP-98 HTTP Authorization checks (buzz.nostr.nip98)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import pytest

from buzz.nostr import HTTP_AUTH_KIND, HttpAuth, ProtocolError, Signer, verify_http_auth
from buzz.nostr.nip98 import MAX_AUTH_HEADER_CHARS

SIGNER = Signer("00" * 31 + "09")
NOW = 1_700_000_000
URL = "https://relay.example.com/events?community=a&x=1"
BODY = b'{"kind":1}'
BODY_HASH = hashlib.sha256(BODY).hexdigest()
EMPTY_HASH = hashlib.sha256(b"").hexdigest()


def event_dict(
    *,
    url: str = URL,
    method: str = "POST",
    payload: str | None = BODY_HASH,
    created_at: int = NOW,
    kind: int = HTTP_AUTH_KIND,
    tags: Sequence[Sequence[str]] | None = None,
) -> dict[str, Any]:
    if tags is None:
        tags = [["u", url], ["method", method]]
        if payload is not None:
            tags.append(["payload", payload])
    return SIGNER.sign_event(kind=kind, tags=tags, content="", created_at=created_at).to_dict()


def header_for(obj: object) -> str:
    return "Nostr " + base64.b64encode(json.dumps(obj).encode()).decode()


def header(**kwargs: Any) -> str:
    return header_for(event_dict(**kwargs))


def verify(
    value: str | None,
    *,
    url: str = URL,
    method: str = "POST",
    body: bytes | None = BODY,
    now: int = NOW,
    window: int = 60,
) -> HttpAuth:
    return verify_http_auth(value, url=url, method=method, body=body, now=now, window=window)


def reason(value: str | None, **kwargs: Any) -> str:
    with pytest.raises(ProtocolError) as info:
        verify(value, **kwargs)
    assert info.value.reason.startswith("auth-required: ")
    return info.value.reason


# ---------------------------------------------------------------- passing cases


def test_valid_post_with_payload() -> None:
    d = event_dict()
    auth = verify(header_for(d))
    assert auth == HttpAuth(pubkey=SIGNER.pubkey, event_id=d["id"], created_at=NOW)


def test_valid_get_without_body_or_payload() -> None:
    value = header(method="GET", payload=None)
    assert verify(value, method="GET", body=None).pubkey == SIGNER.pubkey
    assert verify(value, method="GET", body=b"").pubkey == SIGNER.pubkey


def test_empty_body_with_empty_payload_hash() -> None:
    value = header(method="DELETE", payload=EMPTY_HASH)
    assert verify(value, method="DELETE", body=b"").pubkey == SIGNER.pubkey
    assert verify(value, method="DELETE", body=None).pubkey == SIGNER.pubkey


def test_payload_hash_hex_case() -> None:
    assert verify(header(payload=BODY_HASH.upper())).pubkey == SIGNER.pubkey


@pytest.mark.parametrize(("signed", "requested"), [("post", "POST"), ("POST", "post"), ("Post", "pOST")])
def test_method_case_insensitive(signed: str, requested: str) -> None:
    assert verify(header(method=signed), method=requested).pubkey == SIGNER.pubkey


@pytest.mark.parametrize(
    "signed",
    [
        "HTTPS://Relay.Example.com/events?community=a&x=1",
        "https://relay.example.com:443/events?community=a&x=1",
    ],
)
def test_url_scheme_host_port_equivalents(signed: str) -> None:
    assert verify(header(url=signed)).pubkey == SIGNER.pubkey


def test_empty_path_is_root() -> None:
    value = header(url="https://relay.example.com", method="GET", payload=None)
    assert verify(value, url="https://relay.example.com/", method="GET", body=None)


@pytest.mark.parametrize(
    "value",
    [
        "nostr " + header()[6:],
        "NOSTR " + header()[6:],
        "  Nostr   " + header()[6:] + "  ",
        "Nostr " + header()[6:].rstrip("="),
        "Nostr " + base64.urlsafe_b64encode(json.dumps(event_dict()).encode()).decode(),
    ],
)
def test_header_spelling_tolerated(value: str) -> None:
    assert verify(value).pubkey == SIGNER.pubkey


@pytest.mark.parametrize("offset", [-60, 0, 60])
def test_time_window_inside(offset: int) -> None:
    assert verify(header(created_at=NOW + offset)).pubkey == SIGNER.pubkey


# ---------------------------------------------------------------- header, base64, json


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "auth-required: missing Authorization header"),
        ("", "auth-required: missing Authorization header"),
        ("Bearer abc", "auth-required: Authorization scheme must be Nostr"),
        ("Basic " + header()[6:], "auth-required: Authorization scheme must be Nostr"),
        ("Nostr" + header()[6:], "auth-required: Authorization scheme must be Nostr"),
        ("Nostr", "auth-required: Authorization header has no token"),
        ("Nostr    ", "auth-required: Authorization header has no token"),
        ("Nostr !!!notbase64", "auth-required: Authorization token is not valid base64"),
        ("Nostr abc$def", "auth-required: Authorization token is not valid base64"),
        ("Nostr a", "auth-required: Authorization token is not valid base64"),
        (
            "Nostr " + "A" * MAX_AUTH_HEADER_CHARS,
            "auth-required: Authorization header too large",
        ),
    ],
)
def test_malformed_header(value: str | None, expected: str) -> None:
    assert reason(value) == expected


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"{", b"\xff\xfe{}", b"[" * 5000 + b"]" * 5000, b""],
)
def test_token_not_json(raw: bytes) -> None:
    value = "Nostr " + base64.b64encode(raw).decode()
    if not raw:
        assert reason(value) == "auth-required: Authorization header has no token"
    else:
        assert reason(value) == "auth-required: Authorization token is not a JSON event"


@pytest.mark.parametrize(
    ("obj", "detail"),
    [
        ([1, 2], "invalid: event must be a JSON object"),
        ({**event_dict(), "extra": 1}, "invalid: event has fields other than the seven NIP-01 ones"),
        ({**event_dict(), "sig": "00"}, "invalid: sig must be 128 lowercase hex characters"),
    ],
)
def test_token_not_an_event(obj: object, detail: str) -> None:
    assert reason(header_for(obj)) == f"auth-required: invalid auth event ({detail})"


# ---------------------------------------------------------------- kind and time


def test_wrong_kind() -> None:
    assert reason(header(kind=22242)) == "auth-required: auth event must be kind 27235"


@pytest.mark.parametrize("offset", [-61, 61, -3600])
def test_time_window_outside(offset: int) -> None:
    assert reason(header(created_at=NOW + offset)) == "auth-required: auth event too old or in the future"


def test_custom_window() -> None:
    value = header(created_at=NOW - 100)
    assert verify(value, window=100).pubkey == SIGNER.pubkey
    assert reason(value, window=99) == "auth-required: auth event too old or in the future"


# ---------------------------------------------------------------- u tag


@pytest.mark.parametrize(
    "signed",
    [
        "https://relay.example.com/events",  # query missing
        "https://relay.example.com/events?x=1&community=a",  # query reordered
        "https://relay.example.com/events/?community=a&x=1",  # trailing slash
        "https://relay.example.com/Events?community=a&x=1",  # path case
        "http://relay.example.com/events?community=a&x=1",  # scheme
        "https://relay.example.com:8443/events?community=a&x=1",  # port
        "https://other.example.com/events?community=a&x=1",  # host
        "https://relay.example.com/events?community=a&x=1#frag",
        "https://relay.example.com/query?community=a&x=1",
        "/events?community=a&x=1",  # not absolute
        "",
    ],
)
def test_url_mismatch(signed: str) -> None:
    assert reason(header(url=signed)) == "auth-required: auth event u tag does not match the request url"


@pytest.mark.parametrize(
    "tags",
    [
        [["method", "POST"], ["payload", BODY_HASH]],
        [["u", URL], ["u", URL], ["method", "POST"], ["payload", BODY_HASH]],
    ],
)
def test_u_tag_must_be_single(tags: list[list[str]]) -> None:
    assert reason(header(tags=tags)) == "auth-required: auth event must have exactly one u tag"


def test_u_tag_without_value() -> None:
    tags = [["u"], ["method", "POST"], ["payload", BODY_HASH]]
    assert reason(header(tags=tags)) == "auth-required: auth event u tag does not match the request url"


# ---------------------------------------------------------------- method tag


@pytest.mark.parametrize(("signed", "requested"), [("GET", "POST"), ("PUT", "POST"), ("", "POST")])
def test_method_mismatch(signed: str, requested: str) -> None:
    assert reason(header(method=signed), method=requested) == (
        "auth-required: auth event method tag does not match the request method"
    )


@pytest.mark.parametrize(
    "tags",
    [
        [["u", URL], ["payload", BODY_HASH]],
        [["u", URL], ["method", "POST"], ["method", "POST"], ["payload", BODY_HASH]],
    ],
)
def test_method_tag_must_be_single(tags: list[list[str]]) -> None:
    assert reason(header(tags=tags)) == "auth-required: auth event must have exactly one method tag"


# ---------------------------------------------------------------- payload tag


def test_payload_missing_for_body() -> None:
    assert reason(header(payload=None)) == "auth-required: auth event has no payload tag for a request with a body"


@pytest.mark.parametrize("payload", [EMPTY_HASH, hashlib.sha256(BODY + b" ").hexdigest(), "", "zz", BODY_HASH[:-1]])
def test_payload_wrong(payload: str) -> None:
    assert reason(header(payload=payload)) == "auth-required: auth event payload tag does not match the request body"


def test_payload_for_other_body() -> None:
    assert reason(header(), body=BODY + b"\n") == (
        "auth-required: auth event payload tag does not match the request body"
    )


@pytest.mark.parametrize("body", [None, b""])
def test_payload_on_empty_body_must_hash_empty(body: bytes | None) -> None:
    assert reason(header(payload=BODY_HASH), body=body) == (
        "auth-required: auth event payload tag does not match the empty request body"
    )


def test_payload_tag_must_be_single() -> None:
    tags = [["u", URL], ["method", "POST"], ["payload", BODY_HASH], ["payload", BODY_HASH]]
    assert reason(header(tags=tags)) == "auth-required: auth event must have at most one payload tag"


# ---------------------------------------------------------------- id and signature


def test_bad_signature() -> None:
    d = event_dict()
    d["sig"] = Signer("00" * 31 + "0a").sign_digest(bytes.fromhex(d["id"]))
    assert reason(header_for(d)) == "auth-required: invalid auth event (invalid: bad signature)"


def test_id_mismatch() -> None:
    d = event_dict()
    d["content"] = "changed"
    assert reason(header_for(d)) == "auth-required: invalid auth event (invalid: event id does not match its content)"


def test_replay_is_the_callers_job() -> None:
    """verify_http_auth keeps no state: the same signed event is accepted every time it is shown, with the
    event id a caller needs to refuse a second use. The HTTP layer does refuse it (buzz.identity.httpauth):
    tests/identity/test_httpauth.py::test_a_nip98_authorization_is_accepted_once, and over a relay
    tests/chat/test_counters_http.py::test_counter_endpoints_need_a_reading_credential and
    tests/artifacts/test_artifact_http.py::test_post_events_statuses_and_ws_texts."""
    d = event_dict()
    value = header_for(d)
    expected = HttpAuth(pubkey=SIGNER.pubkey, event_id=d["id"], created_at=NOW)
    assert [verify(value), verify(value), verify(value, now=NOW + 30)] == [expected, expected, expected]
