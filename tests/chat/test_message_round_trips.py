"""Pinned: the database round trips and PUBLISHes of one kind-9 message, so a regression shows.

Method: buzz.events.ingest.ingest (the whole write path a WebSocket EVENT takes: checks, quota,
buzz.chat.messages.post_message) runs in-process on buzz.runtime's pool against the test database.
Each connection the pool hands out is traced by libpq (psycopg's `pgconn.trace`), and the round
trips are the frontend Sync and Query messages in the trace (tests/support/pgtrace.py): each is one
wait for the server, BEGIN and COMMIT included. The PUBLISHes are the messages a pattern subscriber
on this run's Redis prefix receives before a sentinel published afterwards (tests/support/inprocess.py).

The counts are a connection's steady state: psycopg prepares a statement the third time a
connection runs it (one extra round trip, then none), so the message is sent a few times first
and the pinned send has no prepare in it. The write quota is off (settings), which keeps Redis
out of the way; it costs no database round trip either way.

These pins are today's counts, measured, not targets: a change that lowers them updates them here.
"""

from __future__ import annotations

from typing import Any

import pytest

from buzz.events.ingest import ingest
from buzz.live.hub import topic_for_channel
from buzz.models import Community
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, message
from tests.support.inprocess import Harness, actor_of
from tests.support.pgtrace import Trips

HOST = "message-trips.test"
WARMUP = 6

# op -> (database round trips, PUBLISHes)
PINNED = {
    "kind 9": (1, 1),  # ONE statement: the policy's facts and decision, the stored event and its counters
    "kind 9 resubmitted": (1, 0),  # the same statement finds the event; nothing is published
}


@pytest.fixture
def room(transactional_db: None, settings: Any) -> tuple[Community, Signer, str]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    alice = Signer.generate()
    community = make_community(HOST, members=[alice])
    return community, alice, str(make_channel(community, alice, visibility="private"))


async def test_round_trips_per_kind_9_message(room: tuple[Community, Signer, str]) -> None:
    community, alice, channel = room
    actor = actor_of(community, alice)
    got: dict[str, tuple[Trips, list[str]]] = {}
    async with Harness.open() as h:
        for _ in range(WARMUP + 1):
            event = message(alice, channel)
            trips, published, (_, result) = await h.measure(ingest(actor, event))
            assert result.ok and result.message == "", result
            got["kind 9"] = (trips, published)
            trips, published, (_, result) = await h.measure(ingest(actor, event))
            assert result.ok and result.message.startswith("duplicate:"), result
            got["kind 9 resubmitted"] = (trips, published)
    counts = {op: (trips.total, len(published)) for op, (trips, published) in got.items()}
    report = "\n".join(f"  {op}: {trips}; PUBLISH {published}" for op, (trips, published) in got.items())
    assert all(trips.prepares == 0 for trips, _ in got.values()), f"not warmed up:\n{report}"
    assert counts == PINNED, f"round trips, PUBLISHes per op: {counts}, pinned {PINNED}\n{report}"
    assert got["kind 9"][1] == [topic_for_channel(community.pk, channel)], report
