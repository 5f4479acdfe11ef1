"""A TTL channel's deadline moves forward with every accepted write into it (REFERENCE.md: "Each new event
pushes its deadline forward"), kind 9 and NIP-AR revisions alike, so `retention reap-ttl` archives only a channel
that went quiet. A refused write moves nothing."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.utils import timezone

from tests.moderation.moderation_support import RELAY_ENV, World, make_world
from tests.support.factories import message, revision, signed
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


def _create_and_update(world: World) -> tuple[dict[str, Any], dict[str, Any]]:
    """A create of a new artifact in world.ch, and an update of it."""
    d, ch = str(uuid.uuid4()), str(world.ch)
    create = revision(world.author, d=d, h=ch)
    return create, revision(world.author, d=d, h=ch, op="update", prev=create["id"], title="again")


async def _pushed_by(world: World, write: Any) -> bool:
    """Set the deadline an hour in the past, run `write`, and say whether it is now about TTL ahead."""
    past = timezone.now() - dt.timedelta(hours=1)
    await sync_to_async(_set_deadline, thread_sensitive=False)(world.ch, past)
    await write()
    after = await sync_to_async(_deadline, thread_sensitive=False)(world.ch)
    return after > timezone.now() + dt.timedelta(seconds=TTL - 300)


async def test_every_accepted_write_pushes_the_deadline(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with logged_in(relay, world.author, host=HOST) as a:
        create, update = _create_and_update(world)

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


def _channel_ttl(channel: uuid.UUID) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute("SELECT ttl_seconds, deadline, archived_at FROM buzz_channel WHERE uuid = %s", [channel])
        return [tuple(r) for r in cur.fetchall()]


def _reap() -> None:
    from moderation.services import reap_ttl

    reap_ttl(now=timezone.now() + dt.timedelta(days=1), actor="ops", reason="test")


async def test_a_ttl_of_zero_makes_a_permanent_channel_and_a_bad_ttl_makes_none(
    world: World, relay_factory: Any
) -> None:
    """A 9007 with ["ttl", "0"] creates a channel its metadata calls permanent (no ttl tag), and it is:
    no TTL, no deadline after a write, and the reaper leaves it. A ttl that is not a number of seconds
    within ten years, or not ASCII digits, is refused and creates nothing."""
    relay = relay_factory(**RELAY_ENV)
    permanent = uuid.uuid4()
    async with logged_in(relay, world.author, host=HOST) as a:
        ok = await publish(a, signed(world.author, 9007, [["h", str(permanent)], ["name", "z"], ["ttl", "0"]]))
        assert ok[2] is True, ok
        await accept(a, message(world.author, permanent))
        await accept(a, revision(world.author, d=str(uuid.uuid4()), h=str(permanent)))
        for bad in ("99999999999", "²", "-5", "1e3"):
            channel = uuid.uuid4()
            ok = await publish(a, signed(world.author, 9007, [["h", str(channel)], ["name", "y"], ["ttl", bad]]))
            assert ok[2:] == [False, "invalid: ttl must be a number of seconds"], (bad, ok)
            assert await sync_to_async(_channel_ttl, thread_sensitive=False)(channel) == [], bad
    assert await sync_to_async(_channel_ttl, thread_sensitive=False)(permanent) == [(None, None, None)]
    await sync_to_async(_reap, thread_sensitive=False)()
    assert await sync_to_async(_channel_ttl, thread_sensitive=False)(permanent) == [(None, None, None)]


async def test_a_write_racing_the_reapers_archive_leaves_the_deadline(world: World, relay_factory: Any) -> None:
    """A write whose check ran before the reaper archived the channel is accepted (it came first), but the
    deadline it would push waits for the archive's row lock and then stays where it was: the reaper still
    sees a channel it archived itself, and deletes it a TTL later. Kind 9, a create and an update alike."""
    import psycopg

    from tests.support.relay import relay_database_url

    relay = relay_factory(**RELAY_ENV)
    async with logged_in(relay, world.author, host=HOST) as a:
        create, update = _create_and_update(world)
        for name, event in (("kind 9", message(world.author, world.ch)), ("create", create), ("update", update)):
            past = timezone.now() - dt.timedelta(hours=1)
            await sync_to_async(_set_deadline, thread_sensitive=False)(world.ch, past)
            async with await psycopg.AsyncConnection.connect(relay_database_url()) as reaper:
                await reaper.execute("UPDATE buzz_channel SET archived_at = now() WHERE uuid = %s", [world.ch])
                pid = reaper.info.backend_pid
                sent = asyncio.ensure_future(publish(a, event))
                async with await psycopg.AsyncConnection.connect(relay_database_url(), autocommit=True) as probe:
                    waiting = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
                    for _ in range(200):  # until the write waits for the archive's row lock
                        row = await (await probe.execute(waiting, [pid])).fetchone()
                        if row and row[0]:
                            break
                        await asyncio.sleep(0.05)
                    else:
                        raise AssertionError(f"{name}: the write never waited for the archive")
                await reaper.commit()
            ok = await sent
            assert ok[2] is True, (name, ok)
            assert await sync_to_async(_deadline, thread_sensitive=False)(world.ch) == past, name
            await sync_to_async(_unarchive, thread_sensitive=False)(world.ch)


def _unarchive(channel: uuid.UUID) -> None:
    with connection.cursor() as cur:
        cur.execute("UPDATE buzz_channel SET archived_at = NULL WHERE uuid = %s", [channel])
