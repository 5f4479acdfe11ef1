"""Rule 5 for live messages a sync can't interpret: a live sync's decision logic (artifacts.sync.SyncSubscription
.on_message) with the head reader held by the test, as in test_sync_retire_race.py. A message of an unknown kind,
or one whose fields are missing or mistyped, may have been a change the sync needed: it ends the sync with
CLOSED "resync: ...", never silently. Well-formed signals keep their meaning. Pure logic: no server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from artifacts.sync import SyncSubscription
from buzz.live import signals
from tests.sync.test_sync_retire_race import HeldReader, Host, live_sync

D = str(uuid.UUID(int=1))
KNOWN = {signals.EVENT, signals.ACCESS, signals.STANDING, signals.RETIRED}


def _sync() -> tuple[Host, uuid.UUID, HeldReader, SyncSubscription]:
    host, channel, reader = Host(), uuid.uuid4(), HeldReader()
    return host, channel, reader, live_sync(host, channel, reader)


def _artifact_event(channel: uuid.UUID, *, d: str | None = D, kind: Any = 45010) -> dict[str, Any]:
    tags = [["h", str(channel)]] + ([["d", d]] if d is not None else [])
    return {"id": "0" * 64, "kind": kind, "tags": tags}


def _resynced(host: Host) -> bool:
    return len(host.closed) == 1 and host.closed[0].startswith("resync: ")


MALFORMED: dict[str, Callable[[uuid.UUID], dict[str, Any]]] = {
    "an unknown kind": lambda c: {"t": "rename", "channel": str(c)},
    "no kind": lambda c: {"channel": str(c)},
    "an event that is no object": lambda c: {"t": signals.EVENT, "event": "{}"},
    "an event without a kind": lambda c: {"t": signals.EVENT, "event": {"tags": [["h", str(c)]]}},
    "an event whose kind is text": lambda c: {"t": signals.EVENT, "event": _artifact_event(c, kind="45010")},
    "an artifact event without d": lambda c: {"t": signals.EVENT, "event": _artifact_event(c, d=None)},
    "an access signal without a channel": lambda c: {"t": signals.ACCESS, "why": signals.WHY_VISIBILITY},
    "an access signal whose channel is a list": lambda c: {"t": signals.ACCESS, "channel": [str(c)]},
    "a retirement without d": lambda c: {"t": signals.RETIRED, "channel": str(c)},
    "a retirement without a channel": lambda c: {"t": signals.RETIRED, "d": D},
    "a standing signal without a pubkey": lambda c: {"t": signals.STANDING, "why": signals.WHY_BAN, "token": None},
    "a standing signal whose token is text": lambda c: {
        "t": signals.STANDING,
        "pubkey": "f" * 64,
        "why": signals.WHY_TOKEN_REVOKED,
        "token": "3",
    },
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_a_message_the_sync_cant_interpret_ends_it_with_resync(case: str) -> None:
    host, channel, reader, sync = _sync()
    sync.on_message(signals.channel_topic(7, channel), MALFORMED[case](channel))
    assert _resynced(host), host.closed
    assert reader.asked == [] and host.queued() == []


async def test_well_formed_signals_that_dont_concern_the_sync_change_nothing() -> None:
    host, channel, reader, sync = _sync()
    other = uuid.uuid4()
    topic = signals.channel_topic(7, channel)
    for message in (
        {"t": signals.EVENT, "event": {"id": "1" * 64, "kind": 9, "tags": [["h", str(channel)]], "content": "hi"}},
        signals.access_message(other, signals.WHY_VISIBILITY),
        signals.retired_message(other, D),
        signals.standing_message("f" * 64, signals.WHY_BAN),
    ):
        sync.on_message(topic, message)
    assert host.closed == [] and reader.asked == []
    # An artifact change of the sync's channel is a head read, as before.
    sync.on_message(topic, {"t": signals.EVENT, "event": _artifact_event(channel)})
    assert [d for d, _ in reader.asked] == [D] and host.closed == []


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_messages = st.dictionaries(
    st.sampled_from(["t", "event", "channel", "d", "pubkey", "token", "why"]) | st.text(max_size=4),
    _json | st.sampled_from(sorted(KNOWN)),
    max_size=5,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=_messages)
def test_any_message_ends_in_resync_nothing_or_a_head_read_and_never_raises(message: dict[str, Any]) -> None:
    async def run() -> None:
        host, channel, reader, sync = _sync()
        sync.on_message(signals.channel_topic(7, channel), message)
        assert host.closed == [] or _resynced(host), host.closed
        assert len(reader.asked) <= 1 and not (reader.asked and host.closed)
        if not any(message.get("t") == known for known in KNOWN):
            assert _resynced(host), message

    asyncio.run(run())
