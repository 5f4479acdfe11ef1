"""Signed HTTP endpoints (NIP-98 or bearer token): POST /events, and a member's counters.

Views are thin: authenticate, call one service or selector, answer JSON with the
same reason texts as the WebSocket. Every failure is JSON too (buzz.web.errors.json_failures):
a database or Redis failure is an `error:` reason with 503, never Django's HTML 500.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from buzz.access.policy import check_read, parse_channel_id
from buzz.chat import counters
from buzz.errors import Refused
from buzz.events.ingest import event_id_of, ingest_detached
from buzz.identity.actor import Actor
from buzz.identity.httpauth import authenticate
from buzz.nostr import strictjson
from buzz.web.errors import error_response, json_failures, refusal_response, status_of
from buzz.web.views import community_of

MAX_BODY = 1024 * 1024
_EVENT_ID_RE = re.compile(r"[0-9a-f]{64}")


async def _actor_or_error(request: HttpRequest, body: bytes) -> Actor | JsonResponse:
    try:
        return await authenticate(request, community_of(request), body)
    except Refused as err:
        return refusal_response(err)


def _write_reply(event_id: str, ok: bool, message: str, status: int) -> JsonResponse:
    """POST /events always answers in one shape, like an OK frame."""
    return JsonResponse({"event_id": event_id, "accepted": ok, "message": message}, status=status)


def _write_failure(reason: str, status: int) -> HttpResponse:
    return _write_reply("", False, reason, status)


@csrf_exempt
@json_failures(_write_failure)
async def post_event(request: HttpRequest) -> JsonResponse:
    if request.method != "POST":
        return _write_reply("", False, "invalid: use POST", 405)
    body = request.body
    if len(body) > MAX_BODY:
        return _write_reply("", False, f"invalid: body larger than {MAX_BODY} bytes", 413)
    refusal = "invalid: body is not JSON"
    try:
        raw = strictjson.loads(body)
    except strictjson.DuplicateKey as err:
        raw, refusal = None, err.reason
    except (ValueError, RecursionError):
        # RecursionError: nesting deeper than the decoder recurses (100,000 `[`) is not JSON we read.
        raw = None
    try:
        actor = await authenticate(request, community_of(request), body)
    except Refused as err:
        return _write_reply(event_id_of(raw), False, err.reason, status_of(err.reason))
    if raw is None:
        return _write_reply("", False, refusal, 400)
    event_id, result = await ingest_detached(actor, raw)
    return _write_reply(event_id, result.ok, result.message, 200 if result.ok else status_of(result.message))


async def _readable_channel(request: HttpRequest, channel_id: str) -> tuple[Any, uuid.UUID | None]:
    # NIP-98 signs the body's hash: check it against the body actually sent (POST .../read may have one).
    actor = await _actor_or_error(request, request.body)
    if isinstance(actor, JsonResponse):
        return actor, None
    channel = parse_channel_id(channel_id)
    if channel is None:
        return error_response("invalid: channel id must be a lowercase UUID"), None
    decision = await check_read(actor, channel)
    if not decision.ok:
        # The same answer for a missing and an unreadable channel.
        return error_response(decision.reason), None
    return actor, channel


@json_failures()
async def channel_counts(request: HttpRequest, channel_id: str) -> JsonResponse:
    """Messages in the channel, and the caller's unread count there."""
    if request.method != "GET":
        return error_response("invalid: use GET", status=405)
    actor, channel = await _readable_channel(request, channel_id)
    if channel is None:
        return actor  # type: ignore[no-any-return]
    return JsonResponse(await counters.channel_counts(actor, channel))


@csrf_exempt
@json_failures()
async def mark_read(request: HttpRequest, channel_id: str) -> JsonResponse:
    if request.method != "POST":
        return error_response("invalid: use POST", status=405)
    actor, channel = await _readable_channel(request, channel_id)
    if channel is None:
        return actor  # type: ignore[no-any-return]
    return JsonResponse(await counters.mark_read(actor, channel))


@json_failures()
async def thread_counts(request: HttpRequest, channel_id: str, root_id: str) -> JsonResponse:
    if request.method != "GET":
        return error_response("invalid: use GET", status=405)
    actor, channel = await _readable_channel(request, channel_id)
    if channel is None:
        return actor  # type: ignore[no-any-return]
    if not _EVENT_ID_RE.fullmatch(root_id):
        return error_response("invalid: root must be an event id (64 lowercase hex characters)")
    return JsonResponse(await counters.thread_counts(actor, channel, root_id))


@json_failures()
async def unread(request: HttpRequest) -> JsonResponse:
    """Unread counts for every channel the caller is a member of."""
    if request.method != "GET":
        return error_response("invalid: use GET", status=405)
    actor = await _actor_or_error(request, request.body)
    if isinstance(actor, JsonResponse):
        return actor
    return JsonResponse({"channels": await counters.unread_counts(actor)})


@json_failures()
async def mentions(request: HttpRequest) -> JsonResponse:
    """The caller's mention records, newest first, only from channels it can still read."""
    if request.method != "GET":
        return error_response("invalid: use GET", status=405)
    actor = await _actor_or_error(request, request.body)
    if isinstance(actor, JsonResponse):
        return actor
    try:
        limit = min(max(int(request.GET.get("limit", "100")), 1), 1000)
    except ValueError:
        return error_response("invalid: limit must be an integer")
    return JsonResponse({"mentions": await counters.mentions_for(actor, limit=limit)})
