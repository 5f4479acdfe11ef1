"""Pinned: the database round trips of one incremental page behind a bearer token, and of one behind an
authenticated actor (NIP-98 authenticates before the read). Method as tests/artifacts/test_query_round_trips.py:
artifacts.incremental.read_page runs in-process on buzz.runtime's pool, traced by libpq; a round trip is
one wait for the server (a Sync or a simple Query); counts are a warmed-up connection's (no prepares).
The pages are checked to return the artifacts and to follow each other.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from artifacts import incremental
from buzz.events.ingest import ingest
from buzz.models import Community
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, make_token, revision
from tests.support.inprocess import Harness, actor_of, community_info

HOST = "incremental-trips.test"
WARMUP = 6
DEADLINE_S = 8.0

PINNED = {
    # BEGIN, the settings, clock, stamp and TTL channels, the token and its holder's admission, and the
    # policy's wide scope (its holder known from an earlier request) in one pipeline; the page with COMMIT.
    "bearer page": 2,
    "actor page": 2,
    # The first request of a token: its holder is not known yet, so the scope is a round trip of its own.
    "bearer first page": 3,
}


@pytest.fixture
def desk(transactional_db: None, settings: Any) -> tuple[Community, Signer, uuid.UUID, str]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    settings.BUZZ_INCREMENTAL = {**settings.BUZZ_INCREMENTAL, "enabled": True, "signing_key": "trips-" + "k" * 40}
    alice = Signer.generate()
    community = make_community(HOST, members=[alice])
    channel = make_channel(community, alice, visibility="private")
    return community, alice, channel, make_token(community, alice, ["messages:read"])


async def test_round_trips_per_incremental_page(desk: tuple[Community, Signer, uuid.UUID, str]) -> None:
    community, alice, channel, token = desk
    writer = actor_of(community, alice)
    ids = set()
    for _ in range(3):
        event = revision(alice, d=uuid.uuid4(), h=channel)
        _, result = await ingest(writer, event)
        assert result.ok, result
        ids.add(event["id"])
    info = community_info(community)
    request = incremental.parse_request([{"artifact": "incremental", "query": {"artifact": "current"}}])
    incremental._HOLDERS.clear()
    got: dict[str, int] = {}
    async with Harness.open() as h:
        loop_time = asyncio.get_running_loop().time
        bearer = incremental.Bearer(info, f"Bearer {token}")
        trips, _, body = await h.measure(incremental.read_page(bearer, request, loop_time() + DEADLINE_S))
        got["bearer first page"] = trips.total
        for i in range(WARMUP + 1):
            for name, who in (("bearer page", bearer), ("actor page", writer)):
                trips, _, body = await h.measure(incremental.read_page(who, request, loop_time() + DEADLINE_S))
                page = json.loads(body)
                assert {c["event"]["id"] for c in page["changes"]} == ids
                assert page["nextCursor"] is None and page["checkpoint"]
                assert trips.prepares == 0 or i < WARMUP, trips
                got[name] = trips.total
    assert got == PINNED, f"{got}, pinned {PINNED}"
