"""HTTP answers for refusals: the one table from NIP-01 reason prefix to HTTP status."""

from __future__ import annotations

from typing import Final

from django.http import JsonResponse

from buzz.errors import Refused

STATUS_BY_PREFIX: Final = {
    "invalid": 400,
    "auth-required": 401,
    "restricted": 403,
    "blocked": 403,
    "conflict": 409,
    "rate-limited": 429,
    # The relay could not do it now (database, Redis, budget): the client may retry.
    "error": 503,
    # A resubmission of something accepted before is a success.
    "duplicate": 200,
}


def status_of(reason: str) -> int:
    """The HTTP status of a NIP-01 reason; an unknown or missing prefix is a 400."""
    return STATUS_BY_PREFIX.get(reason.split(":", 1)[0], 400)


def error_response(reason: str, *, status: int | None = None) -> JsonResponse:
    """`{"error": reason}` with the status of its prefix (or an explicit transport status: 405, 413)."""
    return JsonResponse({"error": reason}, status=status if status is not None else status_of(reason))


def refusal_response(err: Refused) -> JsonResponse:
    return error_response(err.reason)
