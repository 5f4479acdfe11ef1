"""Pinned: the database round trips and PUBLISHes of each NIP-AR revision, so a regression shows.

Method: buzz.events.ingest.ingest (the whole write path of a WebSocket EVENT: the checks, the quota,
artifacts.services.accept_revision) runs in-process on buzz.runtime's pool
against the test database. Each connection the pool hands out is traced by libpq (psycopg's
`pgconn.trace`), and the round trips are the frontend Sync and Query messages in the trace
(tests/support/pgtrace.py): each is one wait for the server, BEGIN and COMMIT included. The
PUBLISHes are the messages a pattern subscriber on this run's Redis prefix receives before a
sentinel published afterwards (tests/support/inprocess.py).

One cycle is a create, an update, a move to a second channel, a delete, a restore, and the create
resubmitted (answered "duplicate:"). The counts are a connection's steady state: psycopg prepares
a statement the third time a connection runs it (one extra round trip, then none), so the cycle is
run a few times first and the pinned cycle has no prepare in it. The write quota is off (settings),
which keeps Redis out of the way; it costs no database round trip either way.

These pins are today's counts, measured, not targets: a change that lowers them updates them here.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from buzz.events.ingest import ingest
from buzz.live.hub import topic_for_channel
from buzz.models import Community
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, revision
from tests.support.inprocess import Harness, actor_of
from tests.support.pgtrace import Trips

HOST = "revision-trips.test"
WARMUP = 6

# op -> (database round trips, PUBLISHes). No transaction and no duplicate check up front (it runs only on
# the failure paths, buzz.events.ingest; the statements below answer a resubmission themselves).
PINNED = {
    "create": (1, 1),  # ONE statement: the policy's facts and decision, the root anchor, the identity and the rest
    "update": (1, 1),  # ONE statement: the read and the compare-and-set, guarded by the decision (_UPDATE)
    "move": (2, 2),  # as an update (the read's facts cover the home and the destination); the arrival and the removal
    "delete": (2, 1),
    "restore": (2, 1),
    "create resubmitted": (1, 0),  # the create statement finds the revision and answers "duplicate:"
}


@pytest.fixture
def desk(transactional_db: None, settings: Any) -> tuple[Community, Signer, uuid.UUID, uuid.UUID]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    alice = Signer.generate()
    community = make_community(HOST, members=[alice])
    return community, alice, make_channel(community, alice, visibility="private"), make_channel(community, alice)


async def test_round_trips_per_revision(desk: tuple[Community, Signer, uuid.UUID, uuid.UUID]) -> None:
    community, alice, home, there = desk
    actor = actor_of(community, alice)
    got: dict[str, tuple[Trips, list[str]]] = {}
    async with Harness.open() as h:

        async def send(op: str, event: dict[str, Any], reply: str = "") -> str:
            trips, published, (_, result) = await h.measure(ingest(actor, event))
            assert result.ok and result.message.startswith(reply), (op, result)
            got[op] = (trips, published)
            return str(event["id"])

        for _ in range(WARMUP + 1):
            d = uuid.uuid4()
            create = revision(alice, d=d, h=home)
            head = await send("create", create)
            head = await send("update", revision(alice, d=d, h=home, op="update", prev=head))
            head = await send("move", revision(alice, d=d, h=there, op="move", prev=head))
            head = await send("delete", revision(alice, d=d, h=there, op="delete", prev=head))
            await send("restore", revision(alice, d=d, h=there, op="restore", prev=head))
            await send("create resubmitted", create, "duplicate:")
    counts = {op: (trips.total, len(published)) for op, (trips, published) in got.items()}
    report = "\n".join(f"  {op}: {trips}; PUBLISH {published}" for op, (trips, published) in got.items())
    assert all(trips.prepares == 0 for trips, _ in got.values()), f"not warmed up:\n{report}"
    assert counts == PINNED, f"round trips, PUBLISHes per op: {counts}, pinned {PINNED}\n{report}"
    # A move publishes the arrival in the destination and the removal in the source.
    assert sorted(got["move"][1]) == sorted(topic_for_channel(community.pk, str(c)) for c in (home, there)), report
