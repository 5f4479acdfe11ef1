"""POST /query and POST /count: NIP-AR views over NIP-98-signed (or bearer) HTTP. Thin views."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from artifacts import selectors
from artifacts.query import QUERY_LIMITS, ArtifactQuery, QueryError, parse_query_body
from buzz.errors import Refused
from buzz.identity.actor import Actor
from buzz.identity.httpauth import authenticate
from buzz.web.errors import error_response, refusal_response
from buzz.web.views import community_of

# Room for every filter within the advertised limits, however it is encoded: JSON may spell each
# predicate byte as a six-character escape (\u0001), plus the filter's own syntax. Past it, 413.
MAX_BODY = 6 * QUERY_LIMITS.max_total_bytes + 64 * 1024


async def _parse(request: HttpRequest) -> tuple[Actor, ArtifactQuery] | JsonResponse:
    """Authenticate and parse; raises Refused (a query or auth refusal), or answers a transport error."""
    if request.method != "POST":
        return error_response("invalid: use POST", status=405)
    body = request.body
    if len(body) > MAX_BODY:
        return error_response(f"invalid: body larger than {MAX_BODY} bytes", status=413)
    actor = await authenticate(request, community_of(request), body)
    try:
        decoded = json.loads(body)
    except ValueError:
        raise QueryError("invalid: body is not JSON") from None
    return actor, parse_query_body(decoded)


@csrf_exempt
async def query(request: HttpRequest) -> HttpResponse:
    try:
        parsed = await _parse(request)
        if isinstance(parsed, JsonResponse):
            return parsed
        rows = await selectors.query_events(*parsed)
    except Refused as err:
        return refusal_response(err)
    # Stored events are canonical JSON text already: join them instead of decoding and encoding again.
    return HttpResponse("[" + ",".join(rows) + "]", content_type="application/json")


@csrf_exempt
async def count(request: HttpRequest) -> HttpResponse:
    try:
        parsed = await _parse(request)
        if isinstance(parsed, JsonResponse):
            return parsed
        n = await selectors.count_events(*parsed)
    except Refused as err:
        return refusal_response(err)
    return JsonResponse({"count": n})
