"""ASGI entry point: uvicorn serves `buzz.asgi:application`.

The front selects the community by Host before anything else runs. An unknown
host gets a bare 404 over HTTP and a closed socket over WebSocket, and learns
nothing else.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "buzz.settings")
django_http = get_asgi_application()

from buzz.identity.communities import directory  # noqa: E402  (needs Django set up first)
from buzz.runtime import runtime  # noqa: E402
from buzz.ws.consumer import RelayConsumer  # noqa: E402

Scope = dict[str, Any]

_ws_app = RelayConsumer.as_asgi()


def host_of(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"host":
            return str(value.decode("latin-1"))
    return ""


async def _not_found(send: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"10")],
        }
    )
    await send({"type": "http.response.body", "body": b"not found\n"})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
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
    community = await directory.lookup(host_of(scope))
    if community is None:
        if kind == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
        else:
            await _not_found(send)
        return
    scope = dict(scope)
    scope["community"] = community
    if kind == "websocket":
        await _ws_app(scope, receive, send)
    else:
        await django_http(scope, receive, send)
