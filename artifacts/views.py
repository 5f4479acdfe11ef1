"""POST /query and POST /count: NIP-AR views over NIP-98-signed (or bearer) HTTP. Thin views.

The execution budget (BUZZ_QUERY_BUDGET_MS) bounds the whole request: authentication, the
access reads and the view's statement. Every failure is JSON (buzz.web.errors.json_failures):
an overrun, a pool timeout or a database failure is an `error:` reason with 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from artifacts import incremental, selectors
from artifacts.query import QUERY_LIMITS, ArtifactQuery, QueryError, parse_query_body
from buzz.errors import Refused
from buzz.identity.actor import Actor
from buzz.identity.httpauth import authenticate, bearer_header
from buzz.nostr import strictjson
from buzz.web.errors import error_response, json_failures, status_of
from buzz.web.views import community_of

# Room for every filter within the advertised limits, however it is encoded: JSON may spell each
# predicate byte as a six-character escape (\u0001), plus the filter's own syntax. Past it, 413.
MAX_BODY = 6 * QUERY_LIMITS.max_total_bytes + 64 * 1024

# A `current` or `history` answer that fills its page (exactly `limit` rows) says so: the body stays a
# JSON array, and a full page may have more after it (NIP-AR: no incomplete result presented as
# complete). `head` always answers for every named artifact, so its pages are never cut.
PAGE_FULL_HEADER: Final = "Buzz-Page-Full"
# With a full page: the offset of the next page, while it is within max_offset.
NEXT_OFFSET_HEADER: Final = "Buzz-Next-Offset"

T = TypeVar("T")


def _transport_error(request: HttpRequest) -> JsonResponse | None:
    if request.method != "POST":
        return error_response("invalid: use POST", status=405)
    if len(request.body) > MAX_BODY:
        return error_response(f"invalid: body larger than {MAX_BODY} bytes", status=413)
    return None


async def _within_budget(request: HttpRequest, read: Callable[[Actor, ArtifactQuery, float], Awaitable[T]]) -> T:
    """Authenticate, parse and read, all within the budget; raises Refused (a QueryError past it)."""
    deadline = asyncio.get_running_loop().time() + selectors.budget_seconds()
    budget = asyncio.timeout_at(deadline)
    try:
        async with budget:
            body = request.body
            actor = await authenticate(request, community_of(request), body)
            try:
                decoded = strictjson.loads(body)
            except strictjson.DuplicateKey as err:
                raise QueryError(err.reason) from None
            except (ValueError, RecursionError):
                # RecursionError: nesting deeper than the decoder recurses is no filter either.
                raise QueryError("invalid: body is not JSON") from None
            return await read(actor, parse_query_body(decoded), deadline)
    except TimeoutError:
        if not budget.expired():
            raise  # not the budget's: json_failures answers it
        raise QueryError(selectors.BUDGET_EXCEEDED) from None


@csrf_exempt
@json_failures()
async def query(request: HttpRequest) -> HttpResponse:
    if request.method == "POST" and is_incremental(request.body):
        return await _incremental(request)
    refused = _transport_error(request)
    if refused is not None:
        return refused

    async def read(actor: Actor, q: ArtifactQuery, deadline: float) -> tuple[ArtifactQuery, list[str]]:
        return q, await selectors.query_events(actor, q, deadline=deadline)

    q, rows = await _within_budget(request, read)
    # Stored events are canonical JSON text already: join them instead of decoding and encoding again.
    response = HttpResponse("[" + ",".join(rows) + "]", content_type="application/json")
    full = q.mode != "head" and len(rows) == q.limit
    response[PAGE_FULL_HEADER] = "true" if full else "false"
    if full and q.offset + q.limit <= QUERY_LIMITS.max_offset:
        response[NEXT_OFFSET_HEADER] = str(q.offset + q.limit)
    return response


@csrf_exempt
@json_failures()
async def count(request: HttpRequest) -> HttpResponse:
    refused = _transport_error(request)
    if refused is not None:
        return refused

    async def read(actor: Actor, q: ArtifactQuery, deadline: float) -> int:
        return await selectors.count_events(actor, q, deadline=deadline)

    return JsonResponse({"count": await _within_budget(request, read)})


def _incremental_failure(err: incremental.IncrementalError) -> JsonResponse:
    return JsonResponse(err.body(), status=err.status)


# Refusals from authentication and the policy keep their NIP-01 meaning, in the incremental error shape.
_REFUSAL_CODES: Final = {"auth-required": "auth_required", "restricted": "restricted", "blocked": "blocked"}


def _refusal(err: Refused) -> JsonResponse:
    prefix = err.reason.split(":", 1)[0]
    if prefix == "error":
        # Authentication's services (the replay guard in Redis, the relay-member lookup), not only the database.
        return _incremental_failure(incremental.unavailable(err.reason, "service"))
    code = _REFUSAL_CODES.get(prefix)
    if code is None:
        return _incremental_failure(incremental.invalid(err.reason))
    return JsonResponse({"error": code, "reason": None, "message": err.reason}, status=status_of(err.reason))


def is_incremental(body: bytes) -> bool:
    """Is this POST /query body an incremental read this relay serves?"""
    return incremental.enabled() and incremental.looks_incremental(body)


def any_body(body: bytes) -> bool:
    """The front's predicate for POST /query and /count (ArtifactsConfig.ready): the views serve every body
    (each answers a bad one itself)."""
    return True


async def _incremental(request: HttpRequest) -> HttpResponse:
    """NIP-AR incremental reads (artifacts.incremental): authentication, the request and the read, all in
    one operation slot and budget. Every failure is a JSON {"error", "reason", "message"}; none carries
    a cursor or a checkpoint."""
    if len(request.body) > MAX_BODY:
        # Every valid request is far smaller: an invalid request (400), not a result too large (413, which
        # tells a client to split its batch).
        return _incremental_failure(incremental.invalid(f"body larger than {MAX_BODY} bytes"))
    deadline = asyncio.get_running_loop().time() + incremental.OPERATION_BUDGET_SECONDS

    async def work() -> str:
        body = request.body
        community = community_of(request)
        try:
            parsed = incremental.parse_request(incremental.decode_body(body))
        except incremental.IncrementalError:
            async with incremental.statement(deadline):
                await authenticate(request, community, body)  # a credential's refusal comes first
            raise
        header = bearer_header(request)
        # A bearer token is checked in the read's own first round trip; NIP-98 before it (its replay guard),
        # within a statement budget of its own.
        who: Actor | incremental.Bearer
        if header is not None:
            who = incremental.Bearer(community, header)
        else:
            async with incremental.statement(deadline):
                who = await authenticate(request, community, body)
        if parsed.ids is not None:
            return await incremental.read_current(who, parsed, deadline)
        return await incremental.read_page(who, parsed, deadline)

    try:
        text = await incremental.within_operation(deadline, work)
    except incremental.IncrementalError as err:
        return _incremental_failure(err)
    except Refused as err:
        return _refusal(err)
    return HttpResponse(text, content_type="application/json")
