"""The relay's WebSocket transport: uvicorn's sans-I/O protocol, made to let go of a client that stops reading.

Served as uvicorn's `ws` class (`--ws buzz.ws.transport:RelayWebSocketProtocol`; buzz.dev.serve
and the test relays pass it). Three changes to uvicorn's protocol:

* Closing ends the connection within a bound. uvicorn closes a transport with `close()`, which
  waits for the send buffer to drain; for a client that stopped reading it never drains, so the
  socket stayed ESTABLISHED, holding megabytes in the kernel, for as long as the client liked.
  Here every close (the relay's close frame, the keepalive's timeout, the end of the ASGI app)
  arms a deadline, `CLOSE_DEADLINE`: if by then the close frame could not be written, or the
  buffer still holds unsent data, the transport is aborted with linger 0 (the kernel sends RST
  and frees the socket and its buffers at once).
* A text frame that is not UTF-8 is closed with 1007 and one log line, not a traceback: any
  client can send one before AUTH.
* Reading pauses when more than `READ_AHEAD` frames wait for the app, not after every frame.

And one addition, the ASGI extension `SEND_MANY` in the scope's "extensions": a "websocket.send"
message may carry a list of texts under `FRAMES` instead of one "text". Each becomes a text frame of
its own, in order, and all of them go to the socket in one write: a connection that gets 32 frames
for one change costs one syscall, not 32 (bench/sync.py, delivery). The app must check the scope's
extensions first; any other server would refuse such a message.

Nothing here imports Django: uvicorn loads this class before the application.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from typing import Any

from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.protocol import SERVER, State

__all__ = ["CLOSE_DEADLINE", "FRAMES", "SEND_MANY", "WS_PROTOCOL", "RelayWebSocketProtocol"]

log = logging.getLogger("buzz.ws.transport")

# Seconds a closing connection may wait for its close frame to be written and its send buffer to
# drain before the transport is aborted. A reading client drains it in milliseconds.
CLOSE_DEADLINE = 10.0
CLOSE_INVALID_DATA = 1007  # RFC 6455: a text frame that is not UTF-8
# Text frames that may wait for the app before reading pauses. uvicorn pauses after every frame and resumes
# when the app takes it: two epoll_ctl calls per frame for a client that sends one frame and awaits its
# answer, the common case. Here it pauses when more than READ_AHEAD frames wait (each within --ws-max-size;
# frames parsed from one read are queued whole, as with uvicorn).
READ_AHEAD = 1

WS_PROTOCOL = f"{__name__}:RelayWebSocketProtocol"
# The scope extension that says this server takes `FRAMES` (a list of texts) in one "websocket.send".
SEND_MANY = "buzz.websocket.send_many"
FRAMES = "buzz.frames"
_HEAD16 = struct.Struct("!BBH")
_HEAD64 = struct.Struct("!BBQ")


class RelayWebSocketProtocol(WebSocketsSansIOProtocol):
    close_deadline: float = CLOSE_DEADLINE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._abort_timer: asyncio.TimerHandle | None = None

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"

    # --- a close ends the connection within the deadline ---------------------------------

    def _arm_abort(self) -> None:
        if self._abort_timer is None and not self.disconnected:
            self._abort_timer = self.loop.call_later(self.close_deadline, self._abort_if_stuck)

    def _abort_if_stuck(self) -> None:
        self._abort_timer = None
        if self.disconnected or self.transport is None:
            return
        unsent = self.transport.get_write_buffer_size()
        if self.close_sent and unsent == 0:
            return  # the close frame went out: uvicorn's close handshake timer ends it
        log.info("%s does not read: aborting its connection with %d bytes unsent", self._peer(), unsent)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            # Linger 0: the kernel resets the connection and frees it. A plain close would leave an
            # orphaned socket in FIN_WAIT1 probing the zero window, with the unsent data, for minutes.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            # The app's task is created but has not run yet: it sees the extension in its scope.
            scope.setdefault("extensions", {})[SEND_MANY] = {}

    async def send(self, message: Any) -> None:
        kind = message.get("type")
        if kind == "websocket.close" and self.handshake_complete:
            # Armed before uvicorn's send() waits for the paused transport to become writable.
            self._arm_abort()
        elif kind == "websocket.send" and FRAMES in message:
            await self._send_many(message[FRAMES])
            return
        await super().send(message)

    async def _send_many(self, texts: list[str]) -> None:
        """Several text frames, in order, in one transport write (the `SEND_MANY` extension)."""
        await self.writable.wait()
        if self.disconnected:
            raise ClientDisconnected()
        if not self.handshake_complete or self.close_sent or self.initial_response is not None:
            raise RuntimeError("a websocket.send of several frames outside an open connection")
        conn = self.conn
        if conn.state is not State.OPEN:
            raise ClientDisconnected()
        if conn.extensions or conn.debug or conn.expect_continuation_frame or conn.side is not SERVER:
            try:
                for text in texts:
                    conn.send_text(text.encode())
            except InvalidState:
                raise ClientDisconnected() from None
            output = conn.data_to_send()
        else:
            # The frames websockets would make (RFC 6455 5.2: FIN, opcode 1, no mask from a server, no
            # extension), without its per-frame objects; whatever it queued itself goes first.
            output = conn.data_to_send()
            for text in texts:
                data = text.encode()
                n = len(data)
                if n < 126:
                    output.append(bytes((0x81, n)))
                elif n < 65536:
                    output.append(_HEAD16.pack(0x81, 126, n))
                else:
                    output.append(_HEAD64.pack(0x81, 127, n))
                output.append(data)
        if output:
            self.transport.write(b"".join(output))

    def keepalive_timeout(self) -> None:
        super().keepalive_timeout()
        self._arm_abort()

    async def run_asgi(self) -> None:
        await super().run_asgi()
        self._arm_abort()

    def shutdown(self) -> None:
        super().shutdown()
        self._arm_abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._abort_timer is not None:
            self._abort_timer.cancel()
            self._abort_timer = None
        super().connection_lost(exc)

    # --- a text frame that is not UTF-8 -----------------------------------------------

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type != "text" or self.close_sent:
            super().send_receive_event_to_app()
            return
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            log.info("%s sent a text frame that is not UTF-8: closed with %d", self._peer(), CLOSE_INVALID_DATA)
            self.conn.send_close(CLOSE_INVALID_DATA, "invalid UTF-8")
            self.handle_parser_exception()
            self._arm_abort()
            return
        self.queue.put_nowait({"type": "websocket.receive", "text": text})
        if not self.read_paused and self.queue.qsize() > READ_AHEAD:
            # The app is behind: reading resumes once it has taken every waiting frame (uvicorn's receive()).
            self.read_paused = True
            self.transport.pause_reading()
