"""Authentication of HTTP requests: NIP-98 signed requests, or `Authorization: Bearer <api token>`.

NIP-98 checks every field (buzz.nostr.verify_http_auth: kind, signature, URL,
method, time window, payload hash) and this module adds the replay guard: an
authorization event id is accepted once, across every node (Redis SET NX).
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from django.conf import settings
from django.http import HttpRequest

from buzz.access.policy import NOT_ADMITTED
from buzz.errors import Refused
from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo, admitted
from buzz.identity.tokens import authenticate_bearer, bearer_credential
from buzz.limits import limits
from buzz.nostr import ProtocolError, verify_http_auth
from buzz.runtime import runtime


class AuthFailure(Refused):
    """The request carries no valid credential (auth-required:), or one the community doesn't admit."""


BEARER_REFUSED = "auth-required: unknown, revoked or expired token"
# An event is usable for 2 windows (created_at up to a window either side of now). The guard keeps its id that
# long plus this, for the clocks of the nodes that share the guard: one that runs behind by up to this still
# finds the id while it would accept the event.
REPLAY_CLOCK_SLACK = 60


def bearer_header(request: HttpRequest) -> str | None:
    """The Authorization header when it is a bearer credential (`authenticate` checks it as a token), else None."""
    header = request.headers.get("Authorization")
    return header if bearer_credential(header) is not None else None


def _request_target(request: HttpRequest) -> str:
    """The path and query as the client sent them. NIP-98's u tag is the URL exactly as requested:
    Django's get_full_path() decodes the path and quotes path and query again, so a URL signed as sent
    ("/x?q={a}", "/api/ch/%61bc") would not compare equal to it."""
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict) or not isinstance(scope.get("raw_path"), bytes) or not scope["raw_path"]:
        return request.get_full_path()  # not served over ASGI (a test's RequestFactory)
    query = scope.get("query_string") or b""
    target = scope["raw_path"].decode("latin-1")
    return f"{target}?{query.decode('latin-1')}" if query else target


def request_url(request: HttpRequest, community: CommunityInfo) -> str:
    """The absolute URL the client signed: the community's public scheme and host, and this path and query."""
    public = urlsplit(community.public_url)
    scheme = "https" if public.scheme == "wss" else "http"
    return f"{scheme}://{public.netloc}{_request_target(request)}"


async def authenticate(request: HttpRequest, community: CommunityInfo, body: bytes) -> Actor:
    """The request's actor, or AuthFailure (401 without a valid credential, 403 for a non-member)."""
    header = request.headers.get("Authorization")
    if bearer_header(request) is not None:
        actor = await authenticate_bearer(community, header)
        if actor is None:
            raise AuthFailure(BEARER_REFUSED)
        return actor
    lim = limits()
    try:
        auth = verify_http_auth(
            header,
            url=request_url(request, community),
            method=request.method or "GET",
            body=body,
            now=int(time.time()),
            window=lim.http_auth_window,
        )
    except ProtocolError as err:
        raise AuthFailure(err.reason) from None
    # One key per event, whatever the community: two communities may share a public URL (nothing makes it
    # unique), and an event accepted by one must not be accepted again by the other.
    key = f"{settings.BUZZ_REDIS_PREFIX}nip98:{auth.event_id}"
    try:
        fresh = await runtime.redis().set(key, b"1", nx=True, ex=2 * lim.http_auth_window + REPLAY_CLOCK_SLACK)
    except Exception:
        raise AuthFailure("error: could not check the authorization, try again") from None
    if not fresh:
        # NIP-98 events are deterministic: the same request signed twice in one second is the same event.
        raise AuthFailure(
            "auth-required: replayed authorization event (its id was already used);"
            " sign a new one for each request, e.g. with a nonce tag"
        )
    if not await admitted(community, auth.pubkey):
        raise AuthFailure(NOT_ADMITTED)
    return Actor(community=community, pubkey=auth.pubkey)
