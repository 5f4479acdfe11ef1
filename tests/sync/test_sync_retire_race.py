"""Rule 6 against a head read in flight: the sync's decision logic, with the head reader held by the test.

A live sync reads a changed d's head from the writer. If a moderator's redaction retires that head while the
read is on its way, the read may carry the head as it was before the retirement committed, and the RETIRED
signal may come first. The sync must end with CLOSED "resync: ..." then, not send the withheld revision.
The race can't be timed against a real server, so the reader here is a stand-in that answers when the test
says (pure decision logic: the signals and heads are the ones the relay produces).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from artifacts.heads import Head, HeadCallback
from artifacts.query import parse_query
from artifacts.sync import SyncSubscription, _ByteBuffer
from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo
from buzz.limits import limits
from buzz.live import signals
from buzz.nostr import Signer
from buzz.ws.outbound import Outbound

Answer = Callable[[Head | None, BaseException | None], None]


class Host:
    """The connection side of a sync: what it queued and how it ended."""

    def __init__(self) -> None:
        self.community = CommunityInfo(7, "race.test", "race", "", "ws://race.test", "a" * 64, "b" * 64, "open")
        self.actor = Actor(community=self.community, pubkey=Signer.generate().pubkey)
        self.limits = limits()
        self.outbound = Outbound(self._never_sent, max_messages=64, max_bytes=1 << 20)  # not started: it keeps
        self.reads = asyncio.Semaphore(4)
        self.closed: list[str] = []

    async def _never_sent(self, text: str) -> None:
        raise AssertionError("the writer is not started")

    def queued(self) -> list[str]:
        return [text for text, *_ in self.outbound._items]

    def reply(self, message: list[Any]) -> bool:
        return True

    def subscription_ended(self, sub: Any, reason: str) -> None:
        self.closed.append(reason)

    def abort(self) -> None:
        self.closed.append("(aborted)")


class HeldReader:
    """The head reader, answering only when told."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, Answer]] = []

    def submit(self, community: int, d: str, callback: HeadCallback) -> None:
        self.asked.append((d, lambda head, exc: callback(d, head, exc)))


def live_sync(host: Host, channel: uuid.UUID, reader: HeldReader) -> SyncSubscription:
    sync = SyncSubscription(host, "s", parse_query({"artifact": "current", "#h": [str(channel)]}), [channel])
    # As `_run` leaves it after EOSE: the scope granted, the set sent (empty here), live.
    sync._grant(frozenset([channel]))
    sync._access = {str(channel): (0, 0)}  # who reads it, as the heads below are read: nothing to check again
    sync._reader = reader  # type: ignore[assignment]
    sync._live_phase = True
    return sync


def head(d: str, channel: uuid.UUID, *, seq: int, retired: bool = False, access: tuple[int, int] = (0, 0)) -> Head:
    raw = f'{{"id":"{seq:064x}","kind":45010,"tags":[["d","{d}"],["h","{channel}"]]}}'
    return Head(
        d=d,
        home=channel,
        deleted=False,
        retired=retired,
        event_id=f"{seq:064x}",
        seq=seq,
        raw=raw,
        tags=(("d", d), ("h", str(channel))),
        access=access,
    )


@pytest.mark.asyncio
async def test_a_retirement_during_the_head_read_ends_the_sync_and_the_old_head_is_not_sent() -> None:
    host, channel, reader = Host(), uuid.uuid4(), HeldReader()
    sync = live_sync(host, channel, reader)
    d = str(uuid.uuid4())
    sync._changed(d)  # a revision of d was accepted: its head is being read
    [(asked, answer)] = reader.asked
    assert asked == d
    # The redaction commits and its signal arrives before the read's answer.
    sync.on_message(signals.channel_topic(7, channel), signals.retired_message(channel, d))
    assert len(host.closed) == 1 and host.closed[0].startswith("resync: ")
    # The read had seen the head before the retirement: it is not sent.
    answer(head(d, channel, seq=5), None)
    assert host.queued() == []


@pytest.mark.asyncio
async def test_a_retirement_of_an_artifact_the_sync_never_had_changes_nothing() -> None:
    host, channel, reader = Host(), uuid.uuid4(), HeldReader()
    sync = live_sync(host, channel, reader)
    d, other = str(uuid.uuid4()), str(uuid.uuid4())
    sync._changed(d)
    sync.on_message(signals.channel_topic(7, channel), signals.retired_message(channel, other))
    assert host.closed == []
    [(_, answer)] = reader.asked
    answer(head(d, channel, seq=5), None)
    assert len(host.queued()) == 1 and host.closed == []  # d's head went out; the sync goes on
    # A retirement of d now (it is in the client's copy) ends the sync, as before.
    sync.on_message(signals.channel_topic(7, channel), signals.retired_message(channel, d))
    assert len(host.closed) == 1 and host.closed[0].startswith("resync: ")


@pytest.mark.asyncio
async def test_a_head_read_after_the_retirement_sends_nothing_and_keeps_the_sync() -> None:
    host, channel, reader = Host(), uuid.uuid4(), HeldReader()
    sync = live_sync(host, channel, reader)
    d = str(uuid.uuid4())
    sync._changed(d)
    [(_, answer)] = reader.asked
    answer(head(d, channel, seq=5, retired=True), None)  # retired before the read: the client never had it
    assert host.queued() == [] and host.closed == []


def moved_out_sync(host: Host, reader: HeldReader, d: str) -> tuple[SyncSubscription, uuid.UUID, uuid.UUID]:
    """A live sync of channel A holding d; the reader can read B, where d moves (a channel the sync doesn't
    name). Returns (sync, A, B)."""
    a, b = uuid.uuid4(), uuid.uuid4()
    sync = live_sync(host, a, reader)
    sync._holds.add(d)
    sync._last[d] = 4

    async def readable_at(channel: uuid.UUID) -> int | None:
        return 0  # readable, at the access epoch of the heads below (access (0, 0))

    sync._readable_at = readable_at  # type: ignore[method-assign]
    return sync, a, b


async def _left_with(sync: SyncSubscription, reader: HeldReader, d: str, moved: Head, again: Head) -> str | None:
    """`_left` for the moved head, the reader answering its second read with `again`."""
    task = asyncio.ensure_future(sync._left(d, moved))
    for _ in range(100):
        if reader.asked:
            break
        await asyncio.sleep(0)
    [(asked, answer)] = reader.asked
    assert asked == d
    answer(again, None)
    return await task


@pytest.mark.asyncio
async def test_a_moved_out_head_retired_during_the_access_check_ends_the_sync() -> None:
    """The retirement is signalled on B's topic, which a sync of A doesn't hear: the head is read again after
    the access check, and the withheld revision is not sent."""
    host, reader = Host(), HeldReader()
    d = str(uuid.uuid4())
    sync, _, b = moved_out_sync(host, reader, d)
    text = await _left_with(sync, reader, d, head(d, b, seq=5), head(d, b, seq=5, retired=True))
    assert text is None
    assert len(host.closed) == 1 and host.closed[0].startswith("resync: ")


@pytest.mark.asyncio
async def test_a_moved_out_head_is_sent_as_the_writer_has_it_after_the_check() -> None:
    host, reader = Host(), HeldReader()
    d = str(uuid.uuid4())
    sync, _, b = moved_out_sync(host, reader, d)
    later = head(d, b, seq=7)  # edited in B meanwhile
    text = await _left_with(sync, reader, d, head(d, b, seq=5), later)
    assert text is not None and later.raw in text and host.closed == []
    assert sync._last[d] == 7


@pytest.mark.asyncio
async def test_a_moved_out_head_is_not_sent_when_who_reads_its_channel_changed_after_the_check() -> None:
    """The reader could read B when checked; then who reads B changed (the reader was removed from it; the
    signal is on B's topic, which a sync of A doesn't hear) and d was edited there. The head read after the
    check carries B's new access epoch: it is not sent on the old check. The reader's access is checked
    again, and it has lost B: the removal stored in A goes out, never the edit."""
    host, reader = Host(), HeldReader()
    d = str(uuid.uuid4())
    sync, _, b = moved_out_sync(host, reader, d)
    epochs = iter([0, None])  # readable at epoch 0; at the second check, no longer readable
    checks: list[uuid.UUID] = []

    async def readable_at(channel: uuid.UUID) -> int | None:
        checks.append(channel)
        return next(epochs)

    async def removal(moved: Head) -> str:
        return '{"kind":45011,"tags":[["d","' + d + '"]]}'

    sync._readable_at = readable_at  # type: ignore[method-assign]
    sync._removal = removal  # type: ignore[method-assign,assignment]
    edited = head(d, b, seq=7, access=(1, 0))  # edited in B after who reads B changed
    text = await _left_with(sync, reader, d, head(d, b, seq=5), edited)
    assert checks == [b, b]
    assert text is not None and "45011" in text and edited.raw not in text
    assert host.closed == []


@pytest.mark.asyncio
async def test_a_moved_out_head_read_again_after_a_change_that_kept_access_is_sent() -> None:
    """The same change of who reads B, but the reader keeps B: the head is read once more after the second
    check, at the epoch that check saw, and that one goes out."""
    host, reader = Host(), HeldReader()
    d = str(uuid.uuid4())
    sync, _, b = moved_out_sync(host, reader, d)
    epochs = iter([0, 1])

    async def readable_at(channel: uuid.UUID) -> int | None:
        return next(epochs)

    sync._readable_at = readable_at  # type: ignore[method-assign]
    task = asyncio.ensure_future(sync._left(d, head(d, b, seq=5)))
    for answer_with in (head(d, b, seq=7, access=(1, 0)), head(d, b, seq=8, access=(1, 0))):
        for _ in range(100):
            if reader.asked:
                break
            await asyncio.sleep(0)
        (asked, answer) = reader.asked.pop()
        assert asked == d
        answer(answer_with, None)
    text = await task
    assert text is not None and '"id":"' + f"{8:064x}" + '"' in text and host.closed == []
    assert sync._last[d] == 8


@pytest.mark.asyncio
async def test_a_head_that_came_back_meanwhile_is_left_to_its_own_signal() -> None:
    host, reader = Host(), HeldReader()
    d = str(uuid.uuid4())
    sync, a, b = moved_out_sync(host, reader, d)
    sync._holds.discard(d)  # as `_render` leaves it for a head that left
    text = await _left_with(sync, reader, d, head(d, b, seq=5), head(d, a, seq=6))
    assert text is None and host.closed == []
    assert d in sync._holds  # the client still has it: the move back's signal decides what goes out


# --- no frame of the initial set after the sync ended -------------------------------------------------


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["end", "close"])
async def test_no_frame_of_the_initial_set_follows_the_end_of_the_sync(how: str) -> None:
    """The drain holds a frame of the initial set and waits for room in a full send queue when the sync ends
    (CLOSED "resync: ...", or the client's CLOSE or a replacing REQ). When room comes, the frame is not
    queued: after the CLOSED, or before the replacing sync's frames under the same subscription id, it would
    be counted in a set it is not part of."""
    host, channel = Host(), uuid.uuid4()
    sync = SyncSubscription(host, "s", parse_query({"artifact": "current", "#h": [str(channel)]}), [channel])
    out = host.outbound
    for i in range(out.max_messages):
        out.try_put(f"filler {i}")  # the writer isn't started: the queue stays full
    buffer = _ByteBuffer(1 << 20, 16)
    drain = sync._start_drain(buffer)
    await buffer.put('["EVENT","s",{"stale":1}]')
    await _turns()
    assert buffer.draining and not drain.done()  # the frame is taken, waiting for room
    if how == "end":
        sync.resync("a test")
    else:
        await sync.close()
    out._items.popleft()
    out._sent(10, 0, 0)  # the writer sent one frame: room for one
    await _turns()
    assert '["EVENT","s",{"stale":1}]' not in host.queued()
    assert drain.done()


@pytest.mark.asyncio
async def test_the_live_set_never_grows_past_max_events(settings: Any) -> None:
    """max_events is the largest set a sync serves, after EOSE too: the change that would make the set one
    larger ends the sync with the initial read's refusal, and its head is not sent."""
    settings.BUZZ_SYNC = {**settings.BUZZ_SYNC, "max_events": 3}
    host, channel, reader = Host(), uuid.uuid4(), HeldReader()
    sync = live_sync(host, channel, reader)
    ds = [str(uuid.uuid4()) for _ in range(4)]
    for seq, d in enumerate(ds[:3], start=1):
        sync._changed(d)
        reader.asked[-1][1](head(d, channel, seq=seq), None)
    assert len(host.queued()) == 3 and host.closed == []
    # A new head of a d the set holds already is served at the bound.
    sync._changed(ds[0])
    reader.asked[-1][1](head(ds[0], channel, seq=4), None)
    assert len(host.queued()) == 4 and host.closed == []
    sync._changed(ds[3])
    reader.asked[-1][1](head(ds[3], channel, seq=5), None)
    assert host.closed == ["error: more than 3 artifacts match this sync (max_events); narrow the filter"]
    assert len(host.queued()) == 4


@pytest.mark.asyncio
async def test_what_a_sync_keeps_of_artifacts_that_left_it_is_bounded(settings: Any) -> None:
    """A long-lived sync over a busy channel sees many artifacts come and go: what it remembers of those that
    left stays within a bound of max_events, and what it holds is untouched."""
    settings.BUZZ_SYNC = {**settings.BUZZ_SYNC, "max_events": 4}
    host, channel, reader = Host(), uuid.uuid4(), HeldReader()
    host.outbound.max_messages = 10_000
    sync = live_sync(host, channel, reader)
    kept = str(uuid.uuid4())
    sync._changed(kept)
    reader.asked[-1][1](head(kept, channel, seq=1), None)
    seq = 1
    for _ in range(50):
        d = str(uuid.uuid4())
        for deleted in (False, True):  # created, then deleted: in the set, then out of it
            seq += 1
            sync._changed(d)
            gone = replace(head(d, channel, seq=seq), deleted=deleted)
            reader.asked[-1][1](gone, None)
    assert host.closed == [] and len(host.queued()) == 101
    assert sync._holds == {kept} and len(sync._last) <= 2 * 4 + 1 and sync._last[kept] == 1
