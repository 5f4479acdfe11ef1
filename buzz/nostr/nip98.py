"""NIP-98: HTTP requests authorized by a kind-27235 event in the Authorization header."""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Final

from . import strictjson
from .event import ProtocolError, parse_event, verify_event
from .url import normalize_url

HTTP_AUTH_KIND: Final = 27235
# The event carries a u, a method and maybe a payload tag: a few hundred bytes.
# The bound keeps base64/JSON decoding of a hostile header cheap.
MAX_AUTH_HEADER_CHARS: Final = 16384
_EMPTY_BODY_SHA256: Final = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True, slots=True)
class HttpAuth:
    """Who signed a verified NIP-98 request, and the event that says so."""

    pubkey: str
    event_id: str
    created_at: int


def _fail(detail: str) -> ProtocolError:
    return ProtocolError(f"auth-required: {detail}")


def _decode_token(token: str) -> bytes:
    # Standard base64 as NIP-98 says; the URL-safe alphabet and missing
    # padding are tolerated (the signature covers the content, not its encoding).
    token = token.replace("-", "+").replace("_", "/")
    token += "=" * (-len(token) % 4)
    try:
        return base64.b64decode(token, validate=True)
    except (binascii.Error, ValueError):
        raise _fail("Authorization token is not valid base64") from None


def verify_http_auth(
    header: str | None,
    *,
    url: str,
    method: str,
    body: bytes | None,
    now: int,
    window: int = 60,
) -> HttpAuth:
    """Verify a NIP-98 `Authorization: Nostr <base64 event>` header for one request.

    `header` is the whole header value, `url` the absolute URL of the request
    as the server sees it (scheme, host, path and query), `body` its body.
    Checks, in order:
    - the scheme is "Nostr" (case-insensitive, RFC 9110 section 11.1) and the
      token is base64 of UTF-8 JSON;
    - the JSON is a NIP-01 event (parse_event) of kind 27235;
    - |now - created_at| <= window;
    - exactly one "u" tag naming `url`. NIP-98 wants the exact absolute URL
      including the query, so only normalize_url's RFC 3986 equivalences are
      applied (scheme/host case, default port, empty path = "/"); the path,
      its trailing slash and the query string must match byte for byte;
    - exactly one "method" tag equal to `method`, compared case-insensitively;
    - the "payload" tag (at most one): required when `body` is non-empty and
      then equal to sha256(body) hex; when there is no body, if present it
      must be sha256 of the empty string;
    - id and signature (verify_event).

    Every failure raises ProtocolError("auth-required: ..."), to be answered
    with 401. Replays are NOT detected here: the caller must remember
    `HttpAuth.event_id` for at least the window and refuse an id seen before.
    """
    if not header:
        raise _fail("missing Authorization header")
    if len(header) > MAX_AUTH_HEADER_CHARS:
        raise _fail("Authorization header too large")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "nostr":
        raise _fail("Authorization scheme must be Nostr")
    token = token.strip()
    if not token:
        raise _fail("Authorization header has no token")

    raw = _decode_token(token)
    try:
        obj: object = strictjson.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _fail("Authorization token is not a JSON event") from None
    try:
        ev = parse_event(obj)
    except ProtocolError as exc:
        raise _fail(f"invalid auth event ({exc.reason})") from None

    if ev.kind != HTTP_AUTH_KIND:
        raise _fail(f"auth event must be kind {HTTP_AUTH_KIND}")
    if abs(now - ev.created_at) > window:
        raise _fail("auth event too old or in the future")

    signed_url = ev.single_tag_value("u")
    if signed_url is None:
        raise _fail("auth event must have exactly one u tag")
    expected_url = normalize_url(url, ignore_trailing_slash=False)
    if expected_url is None or normalize_url(signed_url, ignore_trailing_slash=False) != expected_url:
        raise _fail("auth event u tag does not match the request url")

    signed_method = ev.single_tag_value("method")
    if signed_method is None:
        raise _fail("auth event must have exactly one method tag")
    if not signed_method or signed_method.upper() != method.upper():
        raise _fail("auth event method tag does not match the request method")

    if len([tag for tag in ev.tags if tag[0] == "payload"]) > 1:
        raise _fail("auth event must have at most one payload tag")
    payload = ev.single_tag_value("payload")
    if body:
        if payload is None:
            raise _fail("auth event has no payload tag for a request with a body")
        if payload.lower() != hashlib.sha256(body).hexdigest():
            raise _fail("auth event payload tag does not match the request body")
    elif payload is not None and payload.lower() != _EMPTY_BODY_SHA256:
        raise _fail("auth event payload tag does not match the empty request body")

    try:
        verify_event(ev)
    except ProtocolError as exc:
        raise _fail(f"invalid auth event ({exc.reason})") from None
    return HttpAuth(pubkey=ev.pubkey, event_id=ev.id, created_at=ev.created_at)
