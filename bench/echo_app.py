"""The smallest ASGI WebSocket app: the floor the relay's numbers are compared with.

On connect it sends one greeting of the same shape as the relay's AUTH
challenge (["AUTH", 32 hex]), then echoes every text or binary frame back
unchanged. Served by the same uvicorn command line as the relay:

    python -m uvicorn echo_app:application --app-dir bench --ws buzz.ws.transport:RelayWebSocketProtocol ...

HTTP requests get a 404, and lifespan is acknowledged.
"""

from __future__ import annotations

import secrets
from typing import Any


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    kind = scope["type"]
    if kind == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if kind == "http":
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    if kind != "websocket":
        return
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": f'["AUTH","{secrets.token_hex(16)}"]'})
    while True:
        message = await receive()
        if message["type"] == "websocket.receive":
            if message.get("text") is not None:
                await send({"type": "websocket.send", "text": message["text"]})
            else:
                await send({"type": "websocket.send", "bytes": message.get("bytes") or b""})
        elif message["type"] == "websocket.disconnect":
            return
