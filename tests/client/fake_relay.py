"""A scripted relay for the client's own logic: a real websockets server in the test process.

It speaks the messages of the spec's Sync section (AUTH, REQ, EVENT, EOSE, CLOSED, a
dropped connection) in whatever order a test scripts, so the client's state machine can
be driven through cases a correct relay produces only by chance (a drop between two
initial events, a resync right after EOSE ...). The relay's own guarantees are tested
against real relay processes, not here.

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, flt = await conn.req()
        await conn.send("EVENT", sub, event.to_dict())
        await conn.send("EOSE", sub)

    async with FakeRelay(script) as relay:   # each connection runs script(conn)
        ... Sync(relay.url, keys, flt) ...

Its NIP-11 document (a GET that is no WebSocket upgrade) advertises sync, as the client requires before a
sync REQ; `FakeRelay(script, nip11=...)` serves another one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from artifacts.client import Event

Script = Callable[["FakeConnection"], Awaitable[None]]

# What a relay that runs sync advertises (NIP-AR "Relay information document").
SYNC_NIP11: dict[str, Any] = {
    "name": "fake relay",
    "artifacts": {"sync": {"version": 1, "max_events": 4096}, "modes": ["current", "history", "head"]},
    "websocket_query_extensions": True,
}


class FakeConnection:
    def __init__(self, relay: FakeRelay, ws: ServerConnection, index: int) -> None:
        self.relay = relay
        self.ws = ws
        self.index = index  # 0 for the first connection the relay accepted
        self.received: list[list[Any]] = []
        self.pubkey: str | None = None

    async def send(self, *message: Any) -> None:
        await self.ws.send(json.dumps(list(message)))

    async def recv(self, timeout: float = 5.0) -> list[Any]:
        message = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.received.append(message)
        self.relay.log.append((self.index, message))
        return list(message)

    async def expect(self, verb: str, timeout: float = 5.0) -> list[Any]:
        """The next message, which must be `verb` (anything else fails the script)."""
        message = await self.recv(timeout)
        if message[0] != verb:
            raise AssertionError(f"fake relay expected {verb}, got {message}")
        return message

    async def auth(self, *, accept: bool = True, reason: str = "restricted: not a relay member") -> str:
        """Send a challenge and check the client's kind 22242 as NIP-42 says; answer OK."""
        challenge = secrets.token_hex(8)
        await self.send("AUTH", challenge)
        message = await self.expect("AUTH")
        event = Event.from_dict(message[1])
        event.verify()
        assert event.kind == 22242, event
        assert event.first("challenge") == challenge, event
        assert event.first("relay") == self.relay.url, (event.first("relay"), self.relay.url)
        await self.send("OK", event.id, accept, "" if accept else reason)
        if accept:
            self.pubkey = event.pubkey
            self.relay.authenticated.append(event.pubkey)
        return event.pubkey

    async def req(self, timeout: float = 5.0) -> tuple[str, dict[str, Any]]:
        message = await self.expect("REQ", timeout)
        assert len(message) == 3, f"a sync REQ has one filter: {message}"
        return str(message[1]), dict(message[2])

    def drop(self) -> None:
        """Cut the TCP connection without a closing handshake (a crashed or unreachable relay)."""
        transport = self.ws.transport
        if transport is not None:
            transport.abort()

    async def hold(self) -> None:
        """Keep the connection until the client closes it, recording what it sends."""
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            while True:
                await self.recv(timeout=3600)


class FakeRelay:
    def __init__(self, script: Script, *, nip11: dict[str, Any] | None = None) -> None:
        self.script = script
        self.nip11 = SYNC_NIP11 if nip11 is None else nip11
        self.nip11_reads = 0
        self.url = ""
        self.connections: list[FakeConnection] = []
        self.log: list[tuple[int, list[Any]]] = []  # (connection index, message) for everything received
        self.authenticated: list[str] = []
        self.errors: list[BaseException] = []
        self._server: Server | None = None

    async def __aenter__(self) -> FakeRelay:
        self._server = await serve(self._handle, "127.0.0.1", 0, compression=None, process_request=self._information)
        port = next(iter(self._server.sockets)).getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self.errors and exc[0] is None:
            raise AssertionError(f"the fake relay's script failed: {self.errors[0]!r}") from self.errors[0]

    def _information(self, ws: ServerConnection, request: Request) -> Response | None:
        """The NIP-11 document for a plain GET; None lets a WebSocket upgrade through."""
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return None
        self.nip11_reads += 1
        response = ws.respond(200, json.dumps(self.nip11))
        response.headers["Content-Type"] = "application/nostr+json"
        return response

    async def _handle(self, ws: ServerConnection) -> None:
        conn = FakeConnection(self, ws, len(self.connections))
        self.connections.append(conn)
        try:
            await self.script(conn)
            await conn.hold()
        except ConnectionClosed:
            pass
        except Exception as err:
            self.errors.append(err)

    def sent(self, verb: str) -> list[tuple[int, list[Any]]]:
        """Everything the client sent with this verb, with the connection it came on."""
        return [(i, m) for i, m in self.log if m and m[0] == verb]
