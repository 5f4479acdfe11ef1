"""ASGI entry point: uvicorn serves `buzz.asgi:application`.

The front selects the community by Host before anything else runs. An unknown
host gets a bare 404 over HTTP and a closed socket over WebSocket, and learns
nothing else. A Host header that is not `host[:port]` (or that is missing or sent
twice) gets a bare 400 (RFC 9112 3.2), without a lookup, a cache entry or a log line:
`localhost:7777.` is one (its port is not a number), while `localhost.:7777`, the
fully qualified spelling, names the same community as `localhost:7777`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "buzz.settings")
django_http = get_asgi_application()

from buzz.identity.communities import directory, host_header_ok  # noqa: E402  (needs Django set up first)
from buzz.runtime import runtime  # noqa: E402
from buzz.web import front  # noqa: E402
from buzz.ws.consumer import RelayConsumer  # noqa: E402

Scope = dict[str, Any]
log = logging.getLogger(__name__)

_ws_app = RelayConsumer.as_asgi()


def host_of(scope: Scope) -> str:
    """The request's one Host header ("" when there is none, or more than one)."""
    hosts = [value for name, value in scope.get("headers", ()) if name == b"host"]
    return str(hosts[0].decode("latin-1")) if len(hosts) == 1 else ""


async def _plain(send: Any, status: int, text: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(text)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": text})


# The collector's thresholds (CPython's default is 700, 10, 10). A change fanned out to many live
# subscriptions allocates thousands of objects that live a few milliseconds; at 700 they survive into the
# old generations, and full collections (over 100 ms each on the 2-core bench machine, several in a few
# seconds) stalled the event loop: bench/sync.py's delivery p99 went from about 250 ms to 90 ms with these.
GC_THRESHOLDS = (50_000, 20, 20)


# Seconds the startup waits for the database and Redis before it serves anyway.
WARM_TIMEOUT = 3.0


async def _warm() -> None:
    """Connect to the database (the main pool's first connections) and to Redis before the first request, so
    that no request pays for it inside its own budget (an incremental read's authentication has two seconds).
    A failure is logged and the relay serves anyway: its requests then fail, or connect, as they would."""
    try:
        async with asyncio.timeout(WARM_TIMEOUT):
            await runtime.pool()
            await runtime.redis().ping()
    except Exception as exc:
        log.warning("could not connect to the database and Redis at startup (%s); serving anyway", exc)


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            gc.set_threshold(*GC_THRESHOLDS)
            await _warm()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await runtime.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope: Scope, receive: Any, send: Any) -> None:
    kind = scope["type"]
    if kind == "lifespan":
        await _lifespan(receive, send)
        return
    host = host_of(scope)
    well_formed = host_header_ok(host)
    community = await directory.lookup(host) if well_formed else None
    if community is None:
        if kind == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
        elif well_formed:
            await _plain(send, 404, b"not found\n")
        else:
            await _plain(send, 400, b"bad host\n")
        return
    scope = dict(scope)
    scope["community"] = community
    if kind == "websocket":
        await _ws_app(scope, receive, send)
        return
    route = front.route_of(scope)
    if route is not None:
        # A route an app serves on the loop, without Django's middleware thread hops (buzz.web.front).
        passed_on = await front.serve(django_http, route, scope, receive, send)
        if passed_on is None:
            return
        receive = passed_on
    await django_http(scope, receive, send)
