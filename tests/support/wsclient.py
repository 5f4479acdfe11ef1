"""A small NIP-01 client for tests, over the `websockets` library.

    async with RelayClient.connect(relay.ws_url, host="localhost") as client:
        ok = await client.auth(signer)
        await client.send_json(["REQ", "s1", {"kinds": [9]}])
        eose = await client.expect("EOSE")

`host` is the Host header the relay sees (it picks the community by it) while the TCP
connection still goes to the address in `ws_url`. Compression is off, so byte counts
in backpressure tests mean what they say.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect

AUTH_KIND = 22242
DEFAULT_TIMEOUT = 5.0
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class SignedEvent(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


class EventSigner(Protocol):
    """What auth() needs: buzz.nostr.Signer has this shape."""

    @property
    def pubkey(self) -> str: ...

    def sign_event(
        self, *, kind: int, tags: list[list[str]], content: str, created_at: int | None = None
    ) -> SignedEvent: ...


def naming(ident: str) -> Callable[[list[Any]], bool]:
    """An expect() filter: the message whose [1] (event id or subscription id) is `ident`."""
    return lambda message: len(message) > 1 and message[1] == ident


class RelayClient:
    def __init__(self, ws: ClientConnection, relay_url: str) -> None:
        self.ws = ws
        # The URL a NIP-42 AUTH event names: the one the relay was reached by (scheme + Host).
        self.relay_url = relay_url
        # Messages that expect() read past while looking for another verb, oldest first.
        self.collected: list[list[Any]] = []
        self.challenge: str | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        ws_url: str,
        *,
        host: str | None = None,
        authorization: str | None = None,
        headers: Mapping[str, str] | None = None,
        open_timeout: float = DEFAULT_TIMEOUT,
        max_size: int | None = MAX_MESSAGE_BYTES,
        **kwargs: Any,
    ) -> AsyncIterator[RelayClient]:
        """Open a connection. `authorization` is a full header value, e.g. "Bearer <token>"."""
        target = urlsplit(ws_url)
        extra: dict[str, Any] = {}
        uri = ws_url
        if host is not None:
            # websockets takes Host from the URI; host=/port= only redirect the TCP connection.
            uri = target._replace(netloc=host).geturl()
            extra = {"host": target.hostname, "port": target.port or (443 if target.scheme == "wss" else 80)}
        additional = dict(headers or {})
        if authorization is not None:
            additional["Authorization"] = authorization
        async with connect(
            uri,
            additional_headers=additional or None,
            compression=None,
            max_size=max_size,
            open_timeout=open_timeout,
            proxy=None,
            **extra,
            **kwargs,
        ) as ws:
            yield cls(ws, relay_url=uri)

    @classmethod
    def bearer(cls, token: str) -> str:
        return f"Bearer {token}"

    # --- frames --------------------------------------------------------------------

    async def send_json(self, message: Any) -> None:
        await self.ws.send(json.dumps(message, separators=(",", ":"), ensure_ascii=False))

    async def recv_json(self, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """The next message (collected ones first), decoded. TimeoutError if none comes."""
        if self.collected:
            return self.collected.pop(0)
        return await self._recv_raw(timeout)

    async def _recv_raw(self, timeout: float) -> Any:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        return json.loads(raw)

    async def expect(
        self,
        verb: str,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        where: Callable[[list[Any]], bool] | None = None,
    ) -> list[Any]:
        """The first message whose [0] is `verb` (and that `where` accepts).

        Messages read past on the way are kept, in order, in .collected, where later
        recv_json()/expect() calls find them.
        """

        def wanted(message: Any) -> bool:
            return (
                isinstance(message, list) and bool(message) and message[0] == verb and (where is None or where(message))
            )

        for index, message in enumerate(self.collected):
            if wanted(message):
                return self.collected.pop(index)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                message = await self._recv_raw(remaining)
            except TimeoutError:
                raise TimeoutError(f"no {verb!r} within {timeout} s; got meanwhile: {self.collected!r}") from None
            if wanted(message):
                return list(message)
            self.collected.append(message)

    async def auth(
        self, signer: EventSigner, *, relay_url: str | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> list[Any]:
        """Answer the relay's ["AUTH", challenge] with a signed kind 22242; return its ["OK", id, ok, msg]."""
        if self.challenge is None:
            self.challenge = str((await self.expect("AUTH", timeout))[1])
        event = signer.sign_event(
            kind=AUTH_KIND,
            tags=[["relay", relay_url or self.relay_url], ["challenge", self.challenge]],
            content="",
        )
        body = event.to_dict()
        await self.send_json(["AUTH", body])
        return await self.expect("OK", timeout, where=lambda reply: len(reply) > 1 and reply[1] == body.get("id"))

    async def close(self) -> None:
        await self.ws.close()
