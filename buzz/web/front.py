"""Async HTTP routes served before Django's middleware chain: no thread hop per middleware.

In Django's async handler every MiddlewareMixin middleware runs its process_request and process_response
in a worker thread and back (sync_to_async, thread-sensitive), and so do the request_started signal and
the response's close: about fifteen hops for each request, several milliseconds on a busy machine, for a
view that is async from end to end. An app registers a route here (from AppConfig.ready()) for requests
that need none of that: a method, an exact path, a predicate on the complete body and an async view. The
front (buzz.asgi) reads the body of such a request, and when the predicate accepts it, it serves the
view on the event loop itself:

* the Django middlewares that only check the request or add headers run inline, in the configured
  order (security headers, X-Frame-Options, the host check and Content-Length: the same response);
* the ones that serve sessions, users, messages, CSRF and django-axes lockouts are skipped: a front view
  uses none of them (it is csrf_exempt and authenticates its own requests);
* a middleware that is in neither list turns the front off (every request goes through Django as before),
  so a new middleware is never skipped silently.

Anything else (another path, a body the predicate refuses or larger than the route's bound, a request
that a pre-check answers itself or fails) is handed to Django unchanged, its body replayed.
A front view runs without Django's request_started / request_finished: it must not use the ORM on the
loop (it can't: Django refuses sync ORM calls there), only the runtime's async pools. It runs on the
request's own task; a client that disconnects while it runs cancels it, as Django's handler would, which
frees its slot and budget (noticed once the view has run DISCONNECT_WATCH_AFTER: most end sooner).
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import response_for_exception
from django.http import HttpRequest, HttpResponse
from django.urls import set_script_prefix
from django.utils.module_loading import import_string

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]
View = Callable[[HttpRequest], Awaitable[HttpResponse]]

# Middlewares whose hooks only inspect the request or add response headers, with no I/O: run inline.
INLINE: Final = frozenset(
    {
        "django.middleware.security.SecurityMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    }
)
# Middlewares a front view has no use for: static files (another path), sessions, users, messages,
# CSRF (front views are csrf_exempt) and the django-axes lockout (login views only).
SKIPPED: Final = frozenset(
    {
        "buzz.web.static.StaticFilesMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "axes.middleware.AxesMiddleware",
    }
)


@dataclass(frozen=True, slots=True)
class Route:
    accepts: Callable[[bytes], bool]  # the complete body: serve it here?
    view: View
    max_body: int  # past it, Django serves the request (and its own size checks answer)


_routes: dict[tuple[str, str], Route] = {}


def register_route(method: str, path: str, *, accepts: Callable[[bytes], bool], view: View, max_body: int) -> None:
    """Serve `method path` (exact, no script prefix) with `view` when `accepts(body)`, from the front."""
    _routes[(method, path)] = Route(accepts=accepts, view=view, max_body=max_body)


def _not_called(request: HttpRequest) -> HttpResponse:
    raise AssertionError("a front middleware never calls the next handler")


_UNSET: Final = object()
_chain: Any = _UNSET


def _middlewares() -> list[Any] | None:
    """The inline middlewares in settings order (instantiated once), or None: the front is off."""
    global _chain
    if _chain is _UNSET:
        unknown = [m for m in settings.MIDDLEWARE if m not in INLINE and m not in SKIPPED]
        if unknown:
            log.warning("front routes off: middleware %s is neither inline nor skipped (buzz.web.front)", unknown[0])
            _chain = None
        else:
            _chain = [import_string(m)(_not_called) for m in settings.MIDDLEWARE if m in INLINE]
    chain: list[Any] | None = _chain
    return chain


def route_of(scope: Scope) -> Route | None:
    """The registered route of this request, if any (the front may still hand it to Django)."""
    if scope.get("type") != "http" or scope.get("root_path") or not _routes:
        return None
    return _routes.get((scope.get("method", ""), scope.get("path", "")))


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _ClientGone(Exception):
    """The client disconnected while its view ran; the view was cancelled."""


# A view still running this long after it started gets a listener for the client's disconnect (a task that
# waits on `receive`). Most views end sooner and never pay for one. bench/front.py (in-process, a view that
# answers a 50 kB body at once): the front took 56-59 us a request with a task for the view and one for the
# listener, and 37-41 us with the view awaited on the request's task and no listener, in alternating runs.
DISCONNECT_WATCH_AFTER: Final = 0.05


class _DisconnectWatch:
    """Awaits a view on the request's own task and cancels it when the client disconnects, noticed by a
    listener started only once the view has run for DISCONNECT_WATCH_AFTER seconds."""

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a front view is served on a task (uvicorn's request task)")
        self.receive = receive
        self.task = task
        self.listener: asyncio.Future[None] | None = None
        self.running = True
        self.gone = False

    async def serving(self, view: Awaitable[HttpResponse]) -> HttpResponse:
        timer = asyncio.get_running_loop().call_later(DISCONNECT_WATCH_AFTER, self._listen)
        try:
            return await view
        except (asyncio.CancelledError, Exception):
            # Cancelled for the disconnect (the view may also have failed on the way out): the client is gone.
            # Any other cancel is not ours to swallow.
            if self.gone and self.task.uncancel() == 0:
                raise _ClientGone from None
            raise
        finally:
            self.running = False
            timer.cancel()
            if self.listener is not None:
                self.listener.cancel()

    def _listen(self) -> None:
        if self.running:
            self.listener = asyncio.ensure_future(_until_disconnect(self.receive))
            self.listener.add_done_callback(self._disconnected)

    def _disconnected(self, listener: asyncio.Future[None]) -> None:
        if self.running and not listener.cancelled() and listener.exception() is None:
            self.gone = True
            self.task.cancel()


async def serve(handler: ASGIHandler, route: Route, scope: Scope, receive: Receive, send: Send) -> Receive | None:
    """Serve the request here (None), or return the receive that gives Django the request as it came."""
    messages: list[Message] = []
    body = bytearray()
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return _replay(messages, receive)  # a disconnect: Django's handler ends it
        body += message.get("body", b"")
        if len(body) > route.max_body:
            return _replay(messages, receive)
        if not message.get("more_body", False):
            break
    data = bytes(body)
    chain = _middlewares()
    if chain is None or not route.accepts(data):
        return _replay(messages, receive)
    set_script_prefix(get_script_prefix(scope))
    request, error = handler.create_request(scope, io.BytesIO(data))
    if request is None or error is not None:
        return _replay(messages, receive)
    try:
        for middleware in chain:
            hook = getattr(middleware, "process_request", None)
            if hook is not None and hook(request) is not None:
                return _replay(messages, receive)  # a redirect or a refusal: Django answers it
    except Exception:
        return _replay(messages, receive)  # e.g. DisallowedHost: Django answers it as it always does
    watch = _DisconnectWatch(receive)
    try:
        response = await watch.serving(route.view(request))
    except _ClientGone:
        return None  # the client went away: its view was cancelled, which freed its slot and budget
    except Exception as exc:
        response = response_for_exception(request, exc)  # as Django's handler would (front views catch theirs)
    for middleware in reversed(chain):
        hook = getattr(middleware, "process_response", None)
        if hook is not None:
            response = hook(request, response)
    await handler.send_response(response, send)
    return None
