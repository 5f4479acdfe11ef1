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
from buzz.identity.actor import Actor
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
    # A continuation: all of that, the page over the scope of the reader's last page, and COMMIT, in one
    # pipeline (the page is used because the scope read with it is the same).
    "bearer continuation": 1,
    "actor continuation": 1,
    # The first request of a token: its holder is not known yet, so the scope is a round trip of its own.
    "bearer first page": 3,
}


@pytest.fixture
def desk(transactional_db: None, settings: Any) -> tuple[Community, Signer, uuid.UUID, str]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    settings.BUZZ_INCREMENTAL = {
        **settings.BUZZ_INCREMENTAL,
        "enabled": True,
        "signing_key": "trips-" + "k" * 40,
        "page_rows": 2,  # three artifacts: a first page and a continuation
    }
    alice = Signer.generate()
    community = make_community(HOST, members=[alice])
    channel = make_channel(community, alice, visibility="private")
    return community, alice, channel, make_token(community, alice, ["messages:read"])


async def three_artifacts(writer: Actor, alice: Signer, channel: uuid.UUID) -> set[str]:
    """Three artifacts created in `channel` through the write path; their revision ids."""
    ids = set()
    for _ in range(3):
        event = revision(alice, d=uuid.uuid4(), h=channel)
        _, result = await ingest(writer, event)
        assert result.ok, result
        ids.add(event["id"])
    return ids


async def test_round_trips_per_incremental_page(desk: tuple[Community, Signer, uuid.UUID, str]) -> None:
    community, alice, channel, token = desk
    writer = actor_of(community, alice)
    ids = await three_artifacts(writer, alice, channel)
    info = community_info(community)
    request = incremental.parse_request([{"artifact": "incremental", "query": {"artifact": "current"}}])
    incremental._HOLDERS.clear()
    incremental._SCOPES.clear()
    got: dict[str, int] = {}
    async with Harness.open() as h:
        loop_time = asyncio.get_running_loop().time
        bearer = incremental.Bearer(info, f"Bearer {token}")
        trips, _, body = await h.measure(incremental.read_page(bearer, request, loop_time() + DEADLINE_S))
        got["bearer first page"] = trips.total
        for i in range(WARMUP + 1):
            for name, who in (("bearer", bearer), ("actor", writer)):
                trips, _, body = await h.measure(incremental.read_page(who, request, loop_time() + DEADLINE_S))
                first = json.loads(body)
                assert trips.prepares == 0 or i < WARMUP, trips
                got[f"{name} page"] = trips.total
                assert len(first["changes"]) == 2 and first["nextCursor"], first
                more = incremental.Request(query=request.query, digest=request.digest, cursor=first["nextCursor"])
                trips, _, body = await h.measure(incremental.read_page(who, more, loop_time() + DEADLINE_S))
                rest = json.loads(body)
                assert trips.prepares == 0 or i < WARMUP, trips
                got[f"{name} continuation"] = trips.total
                assert rest["nextCursor"] is None and rest["checkpoint"], rest
                assert {c["event"]["id"] for c in first["changes"] + rest["changes"]} == ids
    assert got == PINNED, f"{got}, pinned {PINNED}"


async def test_a_continuation_whose_scope_guess_is_wrong_is_read_again(
    desk: tuple[Community, Signer, uuid.UUID, str],
) -> None:
    community, alice, channel, token = desk
    writer = actor_of(community, alice)
    ids = await three_artifacts(writer, alice, channel)
    info = community_info(community)
    request = incremental.parse_request([{"artifact": "incremental", "query": {"artifact": "current"}}])
    incremental._SCOPES.clear()
    async with Harness.open() as h:
        loop_time = asyncio.get_running_loop().time
        bearer = incremental.Bearer(info, f"Bearer {token}")
        first = json.loads(await incremental.read_page(bearer, request, loop_time() + DEADLINE_S))
        more = incremental.Request(query=request.query, digest=request.digest, cursor=first["nextCursor"])
        # Another channel than the reader's: the page read with it is not the answer.
        for key in list(incremental._SCOPES):
            incremental._SCOPES[key] = [uuid.uuid4()]
        trips, _, body = await h.measure(incremental.read_page(bearer, more, loop_time() + DEADLINE_S))
        rest = json.loads(body)
        assert trips.total > 1, trips
        assert {c["event"]["id"] for c in first["changes"] + rest["changes"]} == ids
        assert rest["checkpoint"] and rest["nextCursor"] is None
        assert list(incremental._SCOPES.values()) == [[channel]]  # the guess is the fresh scope again
