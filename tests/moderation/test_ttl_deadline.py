"""A TTL channel's deadline moves forward with every accepted write into it (REFERENCE.md: "Each new event
pushes its deadline forward"), kind 9 and NIP-AR revisions alike, so `retention reap-ttl` archives only a channel
that went quiet. A refused write moves nothing."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.utils import timezone

from tests.moderation.moderation_support import RELAY_ENV, World, make_world
from tests.support.factories import message, revision
from tests.support.wire import accept, logged_in, publish

HOST = "ttl-deadline.test"
TTL = 3600


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


def _set_deadline(channel: uuid.UUID, when: dt.datetime) -> None:
    with connection.cursor() as cur:
        cur.execute("UPDATE buzz_channel SET ttl_seconds = %s, deadline = %s WHERE uuid = %s", [TTL, when, channel])


def _deadline(channel: uuid.UUID) -> dt.datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT deadline FROM buzz_channel WHERE uuid = %s", [channel])
        row = cur.fetchone()
    assert row is not None
    return row[0]


async def _pushed_by(world: World, write: Any) -> bool:
    """Set the deadline an hour in the past, run `write`, and say whether it is now about TTL ahead."""
    past = timezone.now() - dt.timedelta(hours=1)
    await sync_to_async(_set_deadline, thread_sensitive=False)(world.ch, past)
    await write()
    after = await sync_to_async(_deadline, thread_sensitive=False)(world.ch)
    return after > timezone.now() + dt.timedelta(seconds=TTL - 300)


async def test_every_accepted_write_pushes_the_deadline(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    ch = str(world.ch)
    async with logged_in(relay, world.author, host=HOST) as a:
        d = str(uuid.uuid4())
        create = revision(world.author, d=d, h=ch)
        update = revision(world.author, d=d, h=ch, op="update", prev=create["id"], title="again")

        async def post() -> None:
            await accept(a, message(world.author, world.ch))

        async def create_it() -> None:
            await accept(a, create)

        async def update_it() -> None:
            await accept(a, update)

        assert await _pushed_by(world, post), "a kind-9 message did not push the deadline"
        assert await _pushed_by(world, create_it), "an artifact create did not push the deadline"
        assert await _pushed_by(world, update_it), "an artifact update did not push the deadline"


async def test_a_refused_write_moves_nothing(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    ch = str(world.ch)
    async with logged_in(relay, world.author, host=HOST) as a:
        d = str(uuid.uuid4())
        create = revision(world.author, d=d, h=ch)
        await accept(a, create)
        stale = revision(world.author, d=d, h=ch, op="update", prev="ab" * 32, title="stale")

        async def conflict() -> None:
            ok = await publish(a, stale)
            assert ok[2] is False and ok[3].startswith("conflict:"), ok

        assert not await _pushed_by(world, conflict)
