"""HTTP answers for refusals and failures: the one table from NIP-01 reason prefix to HTTP status.

`json_failures` wraps a view so that nothing it raises becomes Django's HTML 500: a
refusal is answered with its reason, a failing dependency (pool timeout, database,
Redis) with an `error:` reason and 503, and anything else with `error:` and 500.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import django.db
import psycopg
import psycopg_pool
import redis.exceptions
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse

from buzz.errors import Refused

log = logging.getLogger(__name__)

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

DATABASE_BUSY: Final = "error: the database is busy, try again"
DATABASE_FAILED: Final = "error: the database is unavailable, try again"
REDIS_FAILED: Final = "error: redis is unavailable, try again"
INTERNAL: Final = "error: internal error"


def status_of(reason: str) -> int:
    """The HTTP status of a NIP-01 reason; an unknown or missing prefix is a 400."""
    return STATUS_BY_PREFIX.get(reason.split(":", 1)[0], 400)


def error_response(reason: str, *, status: int | None = None) -> JsonResponse:
    """`{"error": reason}` with the status of its prefix (or an explicit transport status: 405, 413)."""
    return JsonResponse({"error": reason}, status=status if status is not None else status_of(reason))


def refusal_response(err: Refused) -> JsonResponse:
    return error_response(err.reason)


def dependency_failure(exc: BaseException) -> str | None:
    """The `error:` reason for a failure of a service the relay depends on, or None when it is none."""
    # PoolTimeout is an OperationalError: test it first, its answer is more precise.
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return DATABASE_BUSY
    if isinstance(exc, psycopg.Error | django.db.Error):
        return DATABASE_FAILED
    if isinstance(exc, redis.exceptions.RedisError):
        return REDIS_FAILED
    return None


# A dependency that is down fails every request: log it once per interval, not once per request.
LOG_INTERVAL: Final = 10.0
_last_logged: dict[str, float] = {}


def _log_dependency(reason: str, exc: BaseException) -> None:
    now = time.monotonic()
    if now - _last_logged.get(reason, -LOG_INTERVAL) >= LOG_INTERVAL:
        _last_logged[reason] = now
        log.warning("%s (%s: %s); logged once per %.0f s", reason, type(exc).__name__, exc, LOG_INTERVAL)


# The schemes that authenticate a request here: NIP-98 and API tokens.
AUTH_SCHEMES: Final = "Nostr, Bearer"


def _challenging(response: HttpResponse) -> HttpResponse:
    """A 401 names the schemes that would authenticate the request (RFC 9110 section 15.5.2)."""
    if response.status_code == 401 and not response.has_header("WWW-Authenticate"):
        response["WWW-Authenticate"] = AUTH_SCHEMES
    return response


Shape = Callable[[str, int], HttpResponse]
V = TypeVar("V", bound=Callable[..., Awaitable[HttpResponse]])


def _error_shape(reason: str, status: int) -> HttpResponse:
    return error_response(reason, status=status)


def json_failures(shape: Shape = _error_shape) -> Callable[[V], V]:
    """Decorate an async view: every failure is answered in `shape` (default `{"error": reason}`)."""

    def decorate(view: V) -> V:
        @functools.wraps(view)
        async def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            return _challenging(await _answer(request, *args, **kwargs))

        async def _answer(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                return await view(request, *args, **kwargs)
            except Refused as err:
                return shape(err.reason, status_of(err.reason))
            except RequestDataTooBig:
                # Django refuses to read a body past DATA_UPLOAD_MAX_MEMORY_SIZE (request.body raises).
                return shape(f"invalid: body larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes", 413)
            except SuspiciousOperation as exc:
                log.warning("%s %s refused: %s", request.method, request.path, exc)
                return shape("invalid: malformed request", 400)
            except Exception as exc:
                reason = dependency_failure(exc)
                if reason is not None:
                    _log_dependency(reason, exc)
                    return shape(reason, 503)
                log.exception("%s %s failed", request.method, request.path)
                return shape(INTERNAL, 500)

        return wrapped  # type: ignore[return-value]

    return decorate
