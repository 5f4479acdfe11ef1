"""The bounded outbound queue of one WebSocket connection.

One writer task drains it and awaits the server's send(), which under uvicorn
waits while the transport is paused. So a client that stops reading fills this
queue, and the queue refuses more instead of growing (DESIGN.md, daphne fact).

When the server can take several frames in one send (`send_many`, the transport's
SEND_MANY extension), the writer hands it everything queued so far, up to
`BATCH_FRAMES` frames and `BATCH_BYTES` bytes: one change that concerns many
subscriptions of a connection is one socket write. The frames in flight count
against the bounds until that send returns, as a single frame did.

A notice that ends something (the CLOSED of a subscription the relay ends) may go
past the bounds by a fixed slack, `NOTICE_SLACK_FRAMES` frames and
`NOTICE_SLACK_BYTES` bytes in all: a client that reads too slowly for its sync is
told so with CLOSED "error: ..." instead of losing the connection (NIP-AR sync rule 2;
rule 5 closes the connection only when the CLOSED can't be queued). The queue stays
bounded: by the bounds plus the slack.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable

from buzz.nostr import utf8_size

# The most frames, and bytes, the writer hands the server in one send. The server takes a batch while the
# transport is writable, so a batch is what may sit in the transport's buffer beyond its high-water mark:
# 64 KiB, asyncio's default mark, keeps a slow reader's backlog near what one frame at a time allowed
# (tests/sync/test_sync_snapshot.py: a reader slower than the budget gets no EOSE).
BATCH_FRAMES = 256
BATCH_BYTES = 1 << 16
# How far past the bounds notices (`try_put(..., notice=True)`) may take the queue, in all.
NOTICE_SLACK_FRAMES = 32
NOTICE_SLACK_BYTES = 16 * 1024


class QueueFull(Exception):
    """The queue is at its bound; nothing was queued."""


class Outbound:
    def __init__(
        self,
        send_text: Callable[[str], Awaitable[None]],
        *,
        max_messages: int,
        max_bytes: int,
        send_many: Callable[[list[str]], Awaitable[None]] | None = None,
    ) -> None:
        self._send_text = send_text
        self._send_many = send_many
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        # (text, its UTF-8 size, a notice?)
        self._items: collections.deque[tuple[str, int, bool]] = collections.deque()
        # Bytes queued plus the bytes of the frames the writer is sending now.
        self._bytes = 0
        # Of those, the notices': they have a bound of their own (the slack).
        self._notice_frames = 0
        self._notice_bytes = 0
        # Frames the writer is sending now beyond the first: they count against max_messages, so a batch
        # in flight holds no more than one frame would have.
        self._extra = 0
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._writer(), name="ws-writer")

    def _fits(self, size: int) -> bool:
        if not self._items and self._bytes == 0:
            return True  # one frame always fits, however large (the event size limit bounds it)
        return len(self._items) + self._extra < self.max_messages and self._bytes + size <= self.max_bytes

    def _notice_fits(self, size: int) -> bool:
        # Whatever else is queued: the notices are bounded by the slack alone.
        return self._notice_frames < NOTICE_SLACK_FRAMES and self._notice_bytes + size <= NOTICE_SLACK_BYTES

    def try_put(self, text: str, *, notice: bool = False) -> None:
        """Queue text or raise QueueFull; never waits, never grows past the bound (plus the notices' slack,
        for a `notice`)."""
        if self._closed:
            raise QueueFull("connection closing")
        size = utf8_size(text)
        if not (self._fits(size) or (notice and self._notice_fits(size))):
            raise QueueFull("outbound queue full")
        self._push(text, size, notice)

    async def put(self, text: str, *, timeout: float) -> None:
        """Queue text, waiting up to timeout for room; raise QueueFull when there is none."""
        size = utf8_size(text)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._closed:
                raise QueueFull("connection closing")
            if self._fits(size):
                self._push(text, size, False)
                return
            self._space.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise QueueFull("outbound queue full")
            try:
                await asyncio.wait_for(self._space.wait(), remaining)
            except TimeoutError:
                raise QueueFull("outbound queue full") from None

    def _push(self, text: str, size: int, notice: bool) -> None:
        self._items.append((text, size, notice))
        self._bytes += size
        if notice:
            self._notice_frames += 1
            self._notice_bytes += size
        self._wake.set()

    def _sent(self, size: int, notices: int, notice_bytes: int) -> None:
        """Frames of `size` bytes, `notices` of them notices, have left (or failed): room again."""
        self._bytes -= size
        self._notice_frames -= notices
        self._notice_bytes -= notice_bytes
        self._extra = 0
        self._space.set()

    async def _writer(self) -> None:
        items = self._items
        while not self._closed:
            if not items:
                self._wake.clear()
                await self._wake.wait()
                continue
            text, size, notice = items.popleft()
            notices, notice_bytes = (1, size) if notice else (0, 0)
            if self._send_many is None or not items:
                try:
                    await self._send_text(text)
                finally:
                    self._sent(size, notices, notice_bytes)
                continue
            batch = [text]
            while items and len(batch) < BATCH_FRAMES and size + items[0][1] <= BATCH_BYTES:
                more, more_size, more_notice = items.popleft()
                batch.append(more)
                size += more_size
                if more_notice:
                    notices += 1
                    notice_bytes += more_size
            self._extra = len(batch) - 1
            try:
                await self._send_many(batch)
            finally:
                self._sent(size, notices, notice_bytes)

    async def close(self) -> None:
        self._closed = True
        self._items.clear()
        self._notice_frames = self._notice_bytes = 0
        self._wake.set()
        self._space.set()
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # the writer's end is not an error
                await task
