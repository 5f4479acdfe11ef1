"""The Channels consumer: WebSocket transport only. Protocol state lives in Session."""

from __future__ import annotations

import logging
from typing import Any

from channels.consumer import AsyncConsumer
from channels.exceptions import StopConsumer

from buzz.tokens import authenticate_bearer
from buzz.ws.session import Session

log = logging.getLogger(__name__)


class RelayConsumer(AsyncConsumer):  # type: ignore[misc]
    session: Session | None = None

    async def websocket_connect(self, message: dict[str, Any]) -> None:
        community = self.scope["community"]
        actor = None
        header = _header(self.scope, b"authorization")
        if header is not None:
            # A bearer token on the upgrade authenticates the whole connection; a bad one is refused outright.
            actor = await authenticate_bearer(community, header)
            if actor is None:
                await self.send({"type": "websocket.close", "code": 1008})
                raise StopConsumer()
        self.session = Session(community=community, send_text=self._send_text, close=self._close, actor=actor)
        await self.send({"type": "websocket.accept"})
        await self.session.open()

    async def websocket_receive(self, message: dict[str, Any]) -> None:
        if self.session is None:
            return
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        await self.session.handle(data)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        if self.session is not None:
            await self.session.shutdown()
        raise StopConsumer()

    async def _send_text(self, text: str) -> None:
        await self.send({"type": "websocket.send", "text": text})

    async def _close(self, code: int) -> None:
        if self.session is not None:
            await self.session.shutdown()
        await self.send({"type": "websocket.close", "code": code})


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None
