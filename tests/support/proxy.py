"""A TCP proxy for a Redis or PostgreSQL URL that the test can stall: forwarding stops, sockets stay open
(a black hole). It runs on the test's event loop; a relay process given `proxy.url` talks through it."""

from __future__ import annotations

import asyncio
from typing import Final
from urllib.parse import urlsplit, urlunsplit

DEFAULT_PORTS: Final = {"redis": 6379, "postgres": 5432, "postgresql": 5432}


class StallableProxy:
    """A TCP proxy that can delay every chunk, or stop forwarding without closing sockets."""

    def __init__(self, target_url: str, delay: float = 0.0) -> None:
        self.delay = delay
        parts = urlsplit(target_url)
        if parts.scheme not in DEFAULT_PORTS or parts.hostname is None:
            raise ValueError("StallableProxy needs a redis:// or postgres:// URL with a host")
        self._target = (parts.hostname, parts.port or DEFAULT_PORTS[parts.scheme])
        self._parts = parts
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.url = ""

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        userinfo = self._parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
        self.url = urlunsplit((self._parts.scheme, netloc, self._parts.path, self._parts.query, ""))
        return self.url

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers.append(up_writer)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)
        writer.close()
        up_writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.delay:
                    await asyncio.sleep(self.delay)
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        if self._server is not None:
            await self._server.wait_closed()
