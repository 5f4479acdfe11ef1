"""A Redis that can be made unreachable: a TCP forwarder to the real Redis on a port of its own.

`shut()` stops listening (nothing answers on the port: connections are refused) and cuts every
open link, as a Redis outage or a network partition looks to a client; `open()` listens on the
same port again. It runs its own event loop in a thread, so sync and async tests use it alike.
Clients that must stay connected through the outage (a test's subscriber) talk to the real
Redis directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class RedisGate:
    def __init__(self, redis_url: str) -> None:
        parts = urlsplit(redis_url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._path = parts.path or "/0"
        self.port = _free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="redis-gate", daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}{self._path}"

    def start(self) -> RedisGate:
        self._thread.start()
        self.open()
        return self

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    def open(self) -> None:
        self._call(self._open())

    def shut(self) -> None:
        self._call(self._shut())

    def stop(self) -> None:
        self.shut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _open(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._link, "127.0.0.1", self.port, reuse_address=True)

    async def _shut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._links.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._links.discard(writer)
            writer.transport.abort()


@contextlib.contextmanager
def redis_gate(redis_url: str) -> Iterator[RedisGate]:
    gate = RedisGate(redis_url).start()
    try:
        yield gate
    finally:
        gate.stop()
