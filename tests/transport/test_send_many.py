"""The outbound queue's batches and the transport's SEND_MANY frames, without a server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from websockets.protocol import State
from websockets.server import ServerProtocol

from buzz.ws.outbound import Outbound, QueueFull
from buzz.ws.transport import RelayWebSocketProtocol


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)


def _protocol() -> Any:
    """A RelayWebSocketProtocol past its handshake, writing to a list (only what _send_many touches)."""
    proto: Any = RelayWebSocketProtocol.__new__(RelayWebSocketProtocol)
    proto.conn = ServerProtocol()
    proto.conn.state = State.OPEN
    proto.transport = _Transport()
    proto.writable = asyncio.Event()
    proto.writable.set()
    proto.disconnected = False
    proto.handshake_complete = True
    proto.close_sent = False
    proto.initial_response = None
    return proto


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 200_000])
async def test_send_many_writes_the_frames_websockets_would_in_one_write(size: int) -> None:
    texts = ["é" * (size // 2) + "a" * (size % 2), "x" * size, '["EOSE","s"]']
    reference = ServerProtocol()
    reference.state = State.OPEN
    for text in texts:
        reference.send_text(text.encode())
    proto = _protocol()
    await proto._send_many(texts)
    assert proto.transport.writes == [b"".join(reference.data_to_send())]


@pytest.mark.asyncio
async def test_the_writer_sends_what_is_queued_in_one_batch_and_counts_it_until_sent() -> None:
    sent: list[list[str]] = []
    release = asyncio.Event()

    async def send_text(text: str) -> None:
        sent.append([text])
        await release.wait()

    async def send_many(texts: list[str]) -> None:
        sent.append(list(texts))
        await release.wait()

    out = Outbound(send_text, max_messages=4, max_bytes=1 << 20, send_many=send_many)
    out.start()
    try:
        for n in range(4):
            out.try_put(f"f{n}")
        await asyncio.sleep(0.01)
        assert sent == [["f0", "f1", "f2", "f3"]]  # one send for everything queued
        # The batch in flight still holds the queue's room: no more than one frame beyond it fits.
        out.try_put("g0")
        with pytest.raises(QueueFull):
            out.try_put("g1")
        release.set()
        await asyncio.sleep(0.01)
        assert sent[1:] == [["g0"]]  # a lone frame goes through send_text
        for n in range(3):
            out.try_put(f"h{n}")
    finally:
        await out.close()
