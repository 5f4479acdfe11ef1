"""Sync rule 3: when an artifact moves to a channel the reader can't read, the sync sends the 45011 removal
stored in the source by that move. When that removal was redacted, an earlier removal (from an earlier
move out of the same channel) is no answer: it names an earlier revision. The sync resyncs instead.

The artifact leaves the reader's channel twice (ch -> away, back, ch -> away). The second removal is
redacted before the sync reads the move: Redis is paused for writes, so the move's signal waits until the
redaction has committed (a 9005 of a removal is withheld and publishes nothing).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from django.db import connection

from tests.moderation.moderation_support import RELAY_ENV, World, make_world, ok, removal
from tests.support.factories import make_channel, revision
from tests.support.faults import next_for, redis_paused
from tests.support.wire import accept, logged_in
from tests.sync.support import open_sync

HOST = "removal-redacted.test"
PAUSE_MS = 3000


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


def _latest_removal(d: str) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT m.raw FROM artifacts_moveremoval m JOIN artifacts_artifact a ON a.id = m.artifact_id"
            " WHERE a.d = %s ORDER BY m.seq DESC LIMIT 1",
            [d],
        )
        row = cursor.fetchone()
    assert row is not None
    event: dict[str, Any] = json.loads(row[0])
    return event


async def test_a_redacted_removal_is_not_replaced_by_an_earlier_one(
    world: World, relay_factory: Any, redis_flush: Any, redis_client: redis.Redis
) -> None:
    # A channel of the author's that the member can't read.
    away = await sync_to_async(make_channel)(world.community, world.owner, visibility="private", members=[world.author])
    relay = relay_factory(**RELAY_ENV)
    ch, d = str(world.ch), str(uuid.uuid4())
    async with (
        logged_in(relay, world.author, host=HOST) as a,
        logged_in(relay, world.owner, host=HOST) as o,
        logged_in(relay, world.member, host=HOST) as m,
    ):
        create = await accept(a, revision(world.author, d=d, h=ch))
        out = await accept(a, revision(world.author, d=d, h=away, op="move", prev=create))
        back = await accept(a, revision(world.author, d=d, h=ch, op="move", prev=out))
        first = await sync_to_async(_latest_removal)(d)
        state = await open_sync(m, "s", {"artifact": "current", "#h": [ch]})
        assert state.eose and state.heads[d]["id"] == back

        async with redis_paused(redis_client, PAUSE_MS, "WRITE"):
            await accept(a, revision(world.author, d=d, h=away, op="move", prev=back))  # its signal waits
            second = await sync_to_async(_latest_removal)(d)
            assert second["id"] != first["id"]
            assert await ok(o, removal(world.owner, world.ch, second["id"])) == (True, "")

        message = await next_for(m, "s")
        assert message[0] == "CLOSED" and message[2].startswith("resync:"), message
