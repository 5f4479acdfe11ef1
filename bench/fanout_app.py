"""A bare fan-out ASGI app: the floor for the sync's write-to-head delivery figure.

Each WebSocket connection sends `["SUB", "<sub id>"]` frames (answered with `["EOSE", "<sub id>"]`);
one Redis SUBSCRIBE connection per process receives published event JSON on the topic in
$FANOUT_TOPIC and the app sends `["EVENT", "<sub id>", <event>]` to every subscription of every
connection of this process, through the same uvicorn WebSocket protocol the relay uses. No policy,
no head read, no sync state: what is left is Redis, the event loop and the WebSocket writes, which
the relay's delivery pays too.

With FANOUT_BATCH=1 each connection's writer hands the server everything queued so far in one send,
through the relay's transport extension (buzz.ws.transport.SEND_MANY): one socket write per
connection per event, as the relay's outbound queue does. Without it, one send per frame.

    FANOUT_TOPIC=t REDIS_URL=redis://... python -m uvicorn fanout_app:application --app-dir bench ...
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from typing import Any

import redis.asyncio as aioredis

from buzz.ws.transport import FRAMES, SEND_MANY

# connection id -> (its send queue, its subscription prefixes)
_connections: dict[int, tuple[asyncio.Queue[str | None], list[str]]] = {}
_listener: asyncio.Task[None] | None = None


async def _listen() -> None:
    client = aioredis.from_url(os.environ["REDIS_URL"])
    pubsub = client.pubsub()
    await pubsub.subscribe(os.environ["FANOUT_TOPIC"])
    async for message in pubsub.listen():
        if message.get("type") != "message":
            continue
        raw = message["data"].decode()
        for queue, prefixes in list(_connections.values()):
            for prefix in prefixes:
                queue.put_nowait(prefix + raw + "]")


async def _writer(send: Any, queue: asyncio.Queue[str | None]) -> None:
    while (text := await queue.get()) is not None:
        await send({"type": "websocket.send", "text": text})


async def _batch_writer(send: Any, queue: asyncio.Queue[str | None]) -> None:
    while (text := await queue.get()) is not None:
        texts = [text]
        while not queue.empty():
            more = queue.get_nowait()
            if more is None:
                await send({"type": "websocket.send", FRAMES: texts})
                return
            texts.append(more)
        await send({"type": "websocket.send", FRAMES: texts})


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _listener
    kind = scope["type"]
    if kind == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _listener = asyncio.get_running_loop().create_task(_listen())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if _listener is not None:
                    _listener.cancel()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if kind != "websocket":
        return
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    prefixes: list[str] = []
    key = id(queue)
    _connections[key] = (queue, prefixes)
    batch = os.environ.get("FANOUT_BATCH") == "1" and SEND_MANY in scope.get("extensions", {})
    writer = asyncio.get_running_loop().create_task((_batch_writer if batch else _writer)(send, queue))
    try:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            frame = json.loads(message.get("text") or "[]")
            if frame[:1] == ["SUB"]:
                sub = str(frame[1])
                prefixes.append(f'["EVENT",{json.dumps(sub)},')
                queue.put_nowait(json.dumps(["EOSE", sub]))
    finally:
        _connections.pop(key, None)
        queue.put_nowait(None)
        with contextlib.suppress(Exception):
            await writer
