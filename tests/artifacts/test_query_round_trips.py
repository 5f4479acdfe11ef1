"""Pinned: the database round trips of a NIP-AR current-view read with #h behind a bearer token (issue 14,
item 6: "token, admission and scope in one query" against one hand-written statement).

Method as tests/artifacts/test_revision_round_trips.py: buzz.identity.tokens.authenticate_bearer (what
POST /query runs for `Authorization: Bearer`) and artifacts.selectors.query_events run in-process on
buzz.runtime's pool, traced by libpq; a round trip is one wait for the server (a Sync or a simple
Query). Counts are a warmed-up connection's (no prepares). The reads are checked to return the artifacts.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from artifacts.query import parse_query_body
from artifacts.selectors import query_events
from buzz.events.ingest import ingest
from buzz.identity.tokens import authenticate_bearer
from buzz.models import Community
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, make_token, revision
from tests.support.inprocess import Harness, actor_of, community_info

HOST = "query-trips.test"
WARMUP = 6

PINNED = {
    "bearer token": 1,  # the token and its holder's admission in one statement
    # Pipelined: BEGIN, the settings and the policy's scope read in one; the view and COMMIT in the other.
    "current #h": 2,
}


@pytest.fixture
def desk(transactional_db: None, settings: Any) -> tuple[Community, Signer, uuid.UUID, str]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    alice = Signer.generate()
    community = make_community(HOST, members=[alice])
    assert community.admission != "open"  # admission is checked: a members-only community
    channel = make_channel(community, alice, visibility="private")
    return community, alice, channel, make_token(community, alice, ["messages:read"], channels=[channel])


async def test_round_trips_per_current_read_with_h(desk: tuple[Community, Signer, uuid.UUID, str]) -> None:
    community, alice, channel, token = desk
    writer = actor_of(community, alice)
    ids = []
    for _ in range(3):
        event = revision(alice, d=uuid.uuid4(), h=channel)
        _, result = await ingest(writer, event)
        assert result.ok, result
        ids.append(event["id"])
    info = community_info(community)
    query = parse_query_body([{"artifact": "current", "#h": [str(channel)], "limit": 10}])
    got: dict[str, int] = {}
    async with Harness.open() as h:
        for i in range(WARMUP + 1):
            trips, _, actor = await h.measure(authenticate_bearer(info, f"Bearer {token}"))
            assert actor is not None and actor.token_id is not None
            assert trips.prepares == 0 or i < WARMUP, trips
            got["bearer token"] = trips.total
            trips, _, raws = await h.measure(query_events(actor, query))
            assert sorted(json.loads(r)["id"] for r in raws) == sorted(ids)
            assert trips.prepares == 0 or i < WARMUP, trips
            got["current #h"] = trips.total
            report = str(trips)
    assert got == PINNED, f"{got}, pinned {PINNED}; last read: {report}"
