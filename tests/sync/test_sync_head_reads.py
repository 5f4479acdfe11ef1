"""Rules 3 and 4: a live sync reads one changed d's head at a time, and starts each read only after the previous
result is in the send queue; a head no newer than the one it sent for that d is not sent again.

Pure decision logic: the head reader is the test's stand-in, which answers when the test says
(tests.sync.test_sync_retire_race), so the order of reads and queued frames is exact. The same rules against a
real relay are in tests/sync/test_sync_basics.py and tests/sync/test_sync_consistency.py.
"""

from __future__ import annotations

import uuid

import pytest

from tests.sync.test_sync_retire_race import HeldReader, Host, head, live_sync


@pytest.mark.asyncio
async def test_one_read_at_a_time_each_started_after_the_previous_result_is_queued() -> None:
    host, channel, reader = Host(), uuid.uuid4(), HeldReader()
    sync = live_sync(host, channel, reader)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    sync._changed(first)
    sync._changed(second)  # arrives while the first read is in flight: it waits
    sync._changed(first)  # the first d changes again during its own read: a later read must see that change
    assert [d for d, _ in reader.asked] == [first]
    reader.asked[0][1](head(first, channel, seq=5), None)
    # The first result is queued, and only then does the next read start.
    assert len(host.queued()) == 1 and head(first, channel, seq=5).raw in host.queued()[0]
    assert [d for d, _ in reader.asked] == [first, second]
    reader.asked[1][1](head(second, channel, seq=6), None)
    assert len(host.queued()) == 2
    # The first d again, read after its second change (the read in flight when it came may have missed it).
    assert [d for d, _ in reader.asked] == [first, second, first]
    reader.asked[2][1](head(first, channel, seq=7), None)
    assert len(host.queued()) == 3 and head(first, channel, seq=7).raw in host.queued()[2]
    assert host.closed == []


@pytest.mark.asyncio
async def test_a_head_no_newer_than_the_one_sent_is_not_sent_again() -> None:
    host, channel, reader = Host(), uuid.uuid4(), HeldReader()
    sync = live_sync(host, channel, reader)
    d = str(uuid.uuid4())
    sync._changed(d)
    reader.asked[-1][1](head(d, channel, seq=5), None)
    sync._changed(d)  # a change whose head this sync has sent already (its signal came late)
    reader.asked[-1][1](head(d, channel, seq=5), None)
    sync._changed(d)  # and an older head than the one sent, which a read never returns, is not sent either
    reader.asked[-1][1](head(d, channel, seq=4), None)
    assert len(host.queued()) == 1 and len(reader.asked) == 3 and host.closed == []


@pytest.mark.asyncio
async def test_a_change_before_eose_is_held_and_read_after_it() -> None:
    host, channel, reader = Host(), uuid.uuid4(), HeldReader()
    sync = live_sync(host, channel, reader)
    sync._live_phase = False  # the initial set is still being read
    d = str(uuid.uuid4())
    sync._changed(d)
    assert reader.asked == [] and list(sync._pending) == [d]
    sync._live_phase = True  # EOSE queued: `_serve_changes` starts the held reads
    sync._next()
    assert [asked for asked, _ in reader.asked] == [d] and sync._pending == {}
