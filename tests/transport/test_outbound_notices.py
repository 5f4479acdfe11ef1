"""The outbound queue's slack for notices (buzz.ws.outbound): the CLOSED of a subscription the relay ends
is queued past a full queue, within a bound of its own, and that room comes back as the writer sends."""

from __future__ import annotations

import asyncio

import pytest

from buzz.ws.outbound import NOTICE_SLACK_BYTES, NOTICE_SLACK_FRAMES, Outbound, QueueFull


class Gate:
    """A send that blocks until opened, recording what it sent."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.open = asyncio.Event()

    async def send(self, text: str) -> None:
        await self.open.wait()
        self.sent.append(text)


def closed(i: int) -> str:
    return f'["CLOSED","s{i}","error: the client did not read the initial set in time; start a new sync"]'


@pytest.mark.asyncio
@pytest.mark.parametrize("full_by", ["count", "bytes", "one oversized frame"])
async def test_a_full_queue_refuses_frames_but_takes_notices_up_to_their_own_bound(full_by: str) -> None:
    gate = Gate()
    out = Outbound(gate.send, max_messages=4, max_bytes=1000)
    if full_by == "count":
        frames = ["x" * 10] * 4
    elif full_by == "bytes":
        frames = ["x" * 500, "x" * 500]
    else:
        frames = ["x" * 50_000]  # one frame always fits, however large
    for frame in frames:
        out.try_put(frame)
    with pytest.raises(QueueFull):
        out.try_put("x")
    out.try_put(closed(0), notice=True)
    taken = 1
    while True:
        try:
            out.try_put(closed(taken), notice=True)
        except QueueFull:
            break
        taken += 1
    assert taken <= NOTICE_SLACK_FRAMES and taken * len(closed(0)) <= NOTICE_SLACK_BYTES
    assert taken == min(NOTICE_SLACK_FRAMES, NOTICE_SLACK_BYTES // len(closed(10)))
    # Sent in order; then the room is back, for frames and for notices.
    out.start()
    gate.open.set()
    deadline = asyncio.get_running_loop().time() + 5
    while len(gate.sent) < len(frames) + taken:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    assert gate.sent == frames + [closed(i) for i in range(taken)]
    out.try_put("x" * 10)
    out.try_put(closed(99), notice=True)
    await out.close()
