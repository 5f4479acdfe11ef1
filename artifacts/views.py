"""POST /query and POST /count: NIP-AR views over NIP-98-signed (or bearer) HTTP. Thin views."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from artifacts import selectors
from artifacts.query import QUERY_LIMITS, ArtifactQuery, QueryError, parse_query_body
from buzz.events.ingest import Actor
from buzz.identity.httpauth import AuthFailure, authenticate
from buzz.web.views import community_of

# Room for every filter within the advertised limits, however it is encoded: JSON may spell each
# predicate byte as a six-character escape (\u0001), plus the filter's own syntax. Past it, 413.
MAX_BODY = 6 * QUERY_LIMITS.max_total_bytes + 64 * 1024


async def _parse(request: HttpRequest) -> tuple[Actor, ArtifactQuery]:
    """Authenticate and parse, or raise QueryError with the reason and HTTP status."""
    if request.method != "POST":
        raise QueryError("invalid: use POST", 405)
    body = request.body
    if len(body) > MAX_BODY:
        raise QueryError(f"invalid: body larger than {MAX_BODY} bytes", 413)
    try:
        actor = await authenticate(request, community_of(request), body)
    except AuthFailure as err:
        raise QueryError(err.reason, err.status) from None
    try:
        decoded = json.loads(body)
    except ValueError:
        raise QueryError("invalid: body is not JSON") from None
    return actor, parse_query_body(decoded)


@csrf_exempt
async def query(request: HttpRequest) -> HttpResponse:
    try:
        actor, parsed = await _parse(request)
        rows = await selectors.query_events(actor, parsed)
    except QueryError as err:
        return JsonResponse({"error": err.reason}, status=err.status)
    # Stored events are canonical JSON text already: join them instead of decoding and encoding again.
    return HttpResponse("[" + ",".join(rows) + "]", content_type="application/json")


@csrf_exempt
async def count(request: HttpRequest) -> HttpResponse:
    try:
        actor, parsed = await _parse(request)
        n = await selectors.count_events(actor, parsed)
    except QueryError as err:
        return JsonResponse({"error": err.reason}, status=err.status)
    return JsonResponse({"count": n})
