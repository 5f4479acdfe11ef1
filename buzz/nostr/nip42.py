"""NIP-42: checking the kind-22242 event a client sends in AUTH."""

from __future__ import annotations

from typing import Final

from .event import Event, ProtocolError, verify_event
from .url import normalize_url

AUTH_EVENT_KIND: Final = 22242


def verify_auth_event(ev: Event, *, challenge: str, relay_url: str, now: int, window: int = 600) -> str:
    """Check an AUTH event against this connection's challenge and return the authenticated pubkey.

    In order (cheap checks before the signature):
    - kind is 22242;
    - exactly one "challenge" tag, whose value equals `challenge`;
    - exactly one "relay" tag, whose value names `relay_url`: both are compared
      after normalize_url(..., ignore_trailing_slash=True), i.e. scheme and
      host case-insensitive, default port (80 ws/http, 443 wss/https) optional,
      trailing slash ignored, path and query otherwise exact;
    - |now - created_at| <= window seconds;
    - id and signature (verify_event).

    Raises ProtocolError with "invalid: ..." for a wrong kind or a bad
    id/signature and "auth-required: ..." for an event that does not answer
    this challenge on this relay now.
    """
    if ev.kind != AUTH_EVENT_KIND:
        raise ProtocolError(f"invalid: auth event must be kind {AUTH_EVENT_KIND}")

    answered = ev.single_tag_value("challenge")
    if answered is None:
        raise ProtocolError("auth-required: auth event must have exactly one challenge tag")
    if not answered or answered != challenge:
        raise ProtocolError("auth-required: challenge mismatch")

    relay = ev.single_tag_value("relay")
    if relay is None:
        raise ProtocolError("auth-required: auth event must have exactly one relay tag")
    expected = normalize_url(relay_url, ignore_trailing_slash=True)
    if expected is None or normalize_url(relay, ignore_trailing_slash=True) != expected:
        raise ProtocolError("auth-required: relay url mismatch")

    if abs(now - ev.created_at) > window:
        raise ProtocolError("auth-required: auth event too old or in the future")

    verify_event(ev)
    return ev.pubkey
