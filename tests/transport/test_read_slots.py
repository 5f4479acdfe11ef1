"""buzz.events.query.ReadSlots: concurrent stored reads bounded per connection and per process (pure asyncio)."""

from __future__ import annotations

import asyncio

import pytest

from buzz.events.query import RATE_LIMITED, ReadsBusy, ReadSlots


async def test_reads_never_exceed_either_bound_and_all_get_through() -> None:
    slots = ReadSlots(3)
    connections = [asyncio.Semaphore(2) for _ in range(4)]
    running = [0, 0, 0, 0]
    peak_per_connection = [0, 0, 0, 0]
    done = 0

    async def read(c: int) -> None:
        nonlocal done
        async with slots.hold(connections[c]):
            running[c] += 1
            peak_per_connection[c] = max(peak_per_connection[c], running[c])
            assert slots.in_use <= 3
            await asyncio.sleep(0.01)
            running[c] -= 1
        done += 1

    await asyncio.gather(*(read(i % 4) for i in range(40)))
    assert done == 40
    assert slots.peak == 3  # the process bound was reached, never passed
    assert max(peak_per_connection) <= 2  # each connection within its own
    assert slots.in_use == 0


async def test_one_connection_cannot_take_the_whole_process_bound() -> None:
    slots = ReadSlots(4)
    greedy = asyncio.Semaphore(2)
    release = asyncio.Event()

    async def hold_until_released() -> None:
        async with slots.hold(greedy):
            await release.wait()

    holders = [asyncio.create_task(hold_until_released()) for _ in range(6)]
    await asyncio.sleep(0.05)
    assert slots.in_use == 2  # the greedy connection's other four wait on its own bound
    async with slots.hold(asyncio.Semaphore(2), wait=0.5):  # another connection still gets a slot
        assert slots.in_use == 3
    release.set()
    await asyncio.gather(*holders)
    assert slots.in_use == 0


async def test_a_read_that_waits_too_long_is_refused_and_holds_nothing() -> None:
    slots = ReadSlots(1)
    release = asyncio.Event()

    async def hold() -> None:
        async with slots.hold(None):
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    mine = asyncio.Semaphore(1)
    with pytest.raises(ReadsBusy) as info:
        async with slots.hold(mine, wait=0.05):
            raise AssertionError("got a slot that was taken")
    assert str(info.value) == RATE_LIMITED and RATE_LIMITED.startswith("rate-limited:")
    assert not mine.locked()  # the connection's slot was given back
    release.set()
    await holder
    async with slots.hold(mine, wait=0.5):
        assert slots.in_use == 1
    assert slots.in_use == 0
