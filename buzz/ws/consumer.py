"""The Channels consumer: WebSocket transport only. Protocol state lives in Session."""

from __future__ import annotations

import logging
from typing import Any

from channels.consumer import AsyncConsumer
from channels.exceptions import StopConsumer

from buzz.ws.session import Session

log = logging.getLogger(__name__)


class RelayConsumer(AsyncConsumer):  # type: ignore[misc]
    session: Session | None = None

    async def websocket_connect(self, message: dict[str, Any]) -> None:
        community = self.scope["community"]
        self.session = Session(community=community, send_text=self._send_text, close=self._close)
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
