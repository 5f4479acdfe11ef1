"""An initial pass reads heads in change order two ways (artifacts.incremental._initial_sql): over at most
MERGED_CHANNELS channels, each channel's heads merged; over more, the community's change order, keeping the
reader's. Both give every readable head once, in (changed_at, d) order, with page boundaries anywhere, and
nothing of a channel the reader can't read.

In-process passes through artifacts.incremental.read_page on the test database (real PostgreSQL), pages of
two rows, against the heads' own (changed_at, d) order read from artifacts_artifact.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
import pytest

from artifacts import incremental
from buzz.events.ingest import ingest
from buzz.identity.actor import Actor
from buzz.nostr import Signer
from buzz.runtime import conninfo_from_settings, runtime
from tests.support.factories import make_channel, make_community, revision
from tests.support.inprocess import actor_of

HOST = "incremental-merge.test"
CHANNELS = incremental.MERGED_CHANNELS + 4  # a wide read over more channels than a page merges
PAGE_ROWS = 2


@pytest.fixture
def world(transactional_db: None, settings: Any) -> tuple[Actor, Signer, Actor, Signer, list[uuid.UUID], uuid.UUID]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    settings.BUZZ_INCREMENTAL = {
        **settings.BUZZ_INCREMENTAL,
        "enabled": True,
        "signing_key": "merge-" + "k" * 40,
        "page_rows": PAGE_ROWS,
    }
    alice, bob = Signer.generate(), Signer.generate()
    community = make_community(HOST, members=[alice, bob])
    readable = [make_channel(community, alice, visibility="private") for _ in range(CHANNELS)]
    hidden = make_channel(community, bob, visibility="private")
    return actor_of(community, alice), alice, actor_of(community, bob), bob, readable, hidden


async def _pass(actor: Actor, query: dict[str, Any]) -> list[str]:
    """The artifacts an initial pass upserts, in order."""
    request = incremental.parse_request([{"artifact": "incremental", "query": query}])
    named: list[str] = []
    while True:
        body = json.loads(await incremental.read_page(actor, request, asyncio.get_running_loop().time() + 8))
        assert len(body["changes"]) <= PAGE_ROWS
        named += [c["artifactId"] for c in body["changes"] if c["type"] == "upsert"]
        if body["nextCursor"] is None:
            return named
        request = incremental.Request(query=request.query, digest=request.digest, cursor=body["nextCursor"])


def _in_change_order(channels: list[uuid.UUID]) -> list[str]:
    with psycopg.connect(conninfo_from_settings()) as conn:
        rows = conn.execute(
            "SELECT d FROM artifacts_artifact WHERE home = ANY(%s) AND NOT deleted ORDER BY changed_at, d",
            (channels,),
        ).fetchall()
    return [str(row[0]) for row in rows]


async def test_merged_and_walked_initial_passes_read_every_head_once_in_change_order(
    world: tuple[Actor, Signer, Actor, Signer, list[uuid.UUID], uuid.UUID], monkeypatch: pytest.MonkeyPatch
) -> None:
    actor, alice, bob_actor, bob, readable, hidden = world
    try:
        # Heads spread unevenly: most in two channels, one in each of some others, none in the rest; and some
        # in the channel the reader can't read.
        spread = [readable[0]] * 5 + [readable[1]] * 4 + readable[2:8]
        for channel in spread:
            event = revision(alice, d=str(uuid.uuid4()), h=channel)
            assert (await ingest(actor, event))[1].ok
        for _ in range(3):
            assert (await ingest(bob_actor, revision(bob, d=str(uuid.uuid4()), h=hidden)))[1].ok
        wide = {"artifact": "current", "#type": ["buzz.task"]}
        expected = _in_change_order(readable)
        assert len(expected) == len(spread)
        walked = await _pass(actor, wide)  # more channels than a page merges: the community's change order
        assert walked == expected
        few = readable[:3]
        merged = await _pass(actor, {**wide, "#h": [str(c) for c in few]})
        assert merged == _in_change_order(few)
        # The same wide read, merged over every channel.
        monkeypatch.setattr(incremental, "MERGED_CHANNELS", CHANNELS)
        assert await _pass(actor, wide) == expected
        # #h naming the hidden channel too: left out of the scope, nothing of it read.
        assert await _pass(actor, {**wide, "#h": [str(c) for c in [*few, hidden]]}) == _in_change_order(few)
    finally:
        await runtime.aclose()
