"""The sync's snapshot buffer is bounded in bytes as they are sent (NIP-AR Sync rule 8: "bounds its buffers
for a sync in bytes as well as in count"): UTF-8 bytes, not characters, since stored events keep non-ASCII
text as it is. Pure logic on the event loop."""

from __future__ import annotations

import asyncio

from artifacts.sync import _ByteBuffer

EMOJI = "\U0001f600" * 300  # 300 characters, 1,200 UTF-8 bytes
ASCII = "a" * 600


async def _blocked(buffer: _ByteBuffer, text: str) -> asyncio.Task[None]:
    """Start a put and give it the loop; the task is still running if the put waits for room."""
    task = asyncio.create_task(buffer.put(text))
    await asyncio.sleep(0.05)
    return task


async def test_a_put_waits_when_the_utf8_bytes_pass_the_bound() -> None:
    buffer = _ByteBuffer(max_bytes=1000, max_items=100)
    await buffer.put(EMOJI)  # an empty buffer takes one frame whatever its size
    second = await _blocked(buffer, EMOJI)
    assert not second.done(), "600 characters were counted, not 2,400 bytes"
    assert await buffer.get() == EMOJI
    await asyncio.wait_for(second, 1)
    assert await buffer.get() == EMOJI


async def test_ascii_frames_count_one_byte_a_character() -> None:
    buffer = _ByteBuffer(max_bytes=1200, max_items=100)
    await buffer.put(ASCII)
    await buffer.put(ASCII)  # 1,200 bytes: at the bound, not past it
    third = await _blocked(buffer, "b")
    assert not third.done()
    await buffer.get()
    await asyncio.wait_for(third, 1)
