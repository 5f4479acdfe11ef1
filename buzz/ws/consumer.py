"""The Channels consumer: WebSocket transport only. Protocol state lives in Session."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from channels.consumer import AsyncConsumer, get_handler_name
from channels.exceptions import StopConsumer

from buzz.errors import Refused
from buzz.identity.tokens import authenticate_bearer
from buzz.web.errors import dependency_failure
from buzz.ws.session import CLOSE_TRY_AGAIN, Session
from buzz.ws.transport import FRAMES, SEND_MANY

log = logging.getLogger(__name__)

CLOSE_SEND_TIMEOUT = 30.0
CLOSE_INTERNAL_ERROR = 1011  # RFC 6455: the server hit a condition it did not expect
TOKEN_UNCHECKED = "error: could not check the token, try again"  # noqa: S105 - a reason, not a secret


class RelayConsumer(AsyncConsumer):  # type: ignore[misc]
    session: Session | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # Channels' own loop (await_many_dispatch) wraps every receive() in a task of its own and waits on
        # it with asyncio.wait, to serve a channel layer beside the client; the relay has no channel layer
        # (buzz.live.hub delivers live events), so frames are received and dispatched in this task.
        self.scope = scope
        self.base_send = send
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass
        finally:
            # However the connection's handler ends (a disconnect, a crash, a cancelled task), its
            # subscriptions leave the hub: a dead connection must not keep a channel topic alive.
            await self._release()

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels' own dispatch hops to the ORM thread (close_old_connections) before every
        # frame. This consumer never touches the ORM on the event loop thread (hot paths use the
        # async pool; ORM services run in worker threads), and that hop cost a third of the CPU
        # per frame (bench/frames.py with py-spy), so dispatch goes straight to the handler.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        try:
            await handler(message)
        except StopConsumer:
            raise
        except Exception:
            # A bug in a frame's handling ends this connection alone, with a close frame, and releases
            # what it held; the traceback is logged once, here.
            log.exception("closing a connection after an unexpected error in %s", message.get("type"))
            await self._release()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.send({"type": "websocket.close", "code": CLOSE_INTERNAL_ERROR}), 1.0)
            raise StopConsumer() from None

    async def _release(self) -> None:
        if self.session is not None:
            try:
                await self.session.shutdown()
            except Exception:
                log.exception("releasing a connection's subscriptions failed")

    async def websocket_connect(self, message: dict[str, Any]) -> None:
        community = self.scope["community"]
        actor = None
        header = _header(self.scope, b"authorization")
        if header is not None:
            # A bearer token on the upgrade authenticates the whole connection; a bad one is refused outright.
            try:
                actor = await authenticate_bearer(community, header)
            except Refused:
                actor = None  # its holder is not admitted: refused at the upgrade as a bad token is
            except Exception as exc:
                if dependency_failure(exc) is None:
                    raise
                # Not a bad token: the database or the pool failed. Said so, with a code that means "try again"
                # (a refusal before the upgrade is a bare 403, which a client takes for a bad token).
                log.warning("a bearer token could not be checked (%s: %s)", type(exc).__name__, exc)
                await self.send({"type": "websocket.accept"})
                await self.send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN, "reason": TOKEN_UNCHECKED})
                raise StopConsumer() from None
            if actor is None:
                await self.send({"type": "websocket.close", "code": 1008})
                raise StopConsumer()
        # Under the relay's transport one send may carry several frames (one socket write for all of them).
        many = SEND_MANY in self.scope.get("extensions", {})
        self.session = Session(
            community=community,
            send_text=self._send_text,
            send_many=self._send_many if many else None,
            close=self._close,
            actor=actor,
        )
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
        await self._release()
        raise StopConsumer()

    async def _send_text(self, text: str) -> None:
        await self.send({"type": "websocket.send", "text": text})

    async def _send_many(self, texts: list[str]) -> None:
        await self.send({"type": "websocket.send", FRAMES: texts})

    async def _close(self, code: int) -> None:
        """Run as a task of its own (Session.abort): every way it can end is handled here."""
        await self._release()
        # The close frame waits behind whatever the client has not read; don't wait for it forever.
        # If it can't be written, the transport (buzz.ws.transport) aborts the connection. A client
        # that is already gone makes send() raise uvicorn's ClientDisconnected: nothing left to do.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.send({"type": "websocket.close", "code": code}), CLOSE_SEND_TIMEOUT)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None
