"""A deliberately broken relay build for the conformance test: the real ASGI app, except that the head view
truncates (it drops the last event of any answer naming more than one d).

Started as `uvicorn tests.client.broken_relay:application` (RelayProcess(app=...)): the conformance suite must
fail against it, naming the head-view rule, and pass everything else.
"""

from __future__ import annotations

import json
from typing import Any

from buzz.asgi import application as relay

Message = dict[str, Any]


def _truncated(request: bytes, body: bytes) -> bytes:
    try:
        query = json.loads(request)
        events = json.loads(body)
    except ValueError:
        return body
    if not (isinstance(query, list) and query and isinstance(query[0], dict) and query[0].get("artifact") == "head"):
        return body
    if not isinstance(events, list) or len(events) < 2:
        return body
    return json.dumps(events[:-1], separators=(",", ":")).encode()


async def application(scope: Message, receive: Any, send: Any) -> None:
    if scope["type"] != "http" or scope.get("path") != "/query":
        await relay(scope, receive, send)
        return
    request = bytearray()

    async def receive_request() -> Message:
        message: Message = await receive()
        if message["type"] == "http.request":
            request.extend(message.get("body", b""))
        return message

    start: Message = {}
    chunks: list[bytes] = []

    async def send_response(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
            return
        if message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = _truncated(bytes(request), b"".join(chunks))
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    await relay(scope, receive_request, send_response)
