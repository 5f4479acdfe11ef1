"""The transport reads on while the app keeps up, and pauses when text frames wait for it (READ_AHEAD)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from buzz.ws.transport import READ_AHEAD, RelayWebSocketProtocol


class _Transport:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")


def _protocol() -> Any:
    """A RelayWebSocketProtocol with only what a received text frame touches."""
    proto: Any = RelayWebSocketProtocol.__new__(RelayWebSocketProtocol)
    proto.transport = _Transport()
    proto.queue = asyncio.Queue()
    proto.read_paused = False
    proto.close_sent = False
    proto.frames = []
    return proto


def _frame_arrives(proto: Any, text: str) -> None:
    proto.curr_msg_data_type = "text"
    proto.frames = [text.encode()]
    proto.send_receive_event_to_app()


@pytest.mark.asyncio
async def test_a_client_that_awaits_each_answer_never_pauses_reading() -> None:
    proto = _protocol()
    for n in range(5):
        _frame_arrives(proto, f"frame {n}")
        message = await proto.receive()  # uvicorn's: the app takes the frame
        assert message == {"type": "websocket.receive", "text": f"frame {n}"}
    assert proto.transport.calls == []


@pytest.mark.asyncio
async def test_frames_the_app_has_not_taken_pause_reading_until_it_takes_them_all() -> None:
    proto = _protocol()
    for n in range(READ_AHEAD):
        _frame_arrives(proto, f"frame {n}")
    assert proto.transport.calls == []
    _frame_arrives(proto, f"frame {READ_AHEAD}")  # one more than may wait: reading pauses
    assert proto.transport.calls == ["pause"]
    _frame_arrives(proto, "already read")  # frames of a read in progress are still queued, in order
    assert proto.transport.calls == ["pause"]
    texts = [(await proto.receive())["text"] for _ in range(READ_AHEAD + 2)]
    assert texts == [f"frame {n}" for n in range(READ_AHEAD + 1)] + ["already read"]
    assert proto.transport.calls == ["pause", "resume"]  # once the queue is empty
