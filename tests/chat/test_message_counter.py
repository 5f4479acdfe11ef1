"""A channel's message count in shards (buzz.models.MessageCounter, migration buzz 0006).

Concurrent writers in one channel must not wait for each other's commits: each kind-9 statement adds 1 to
the shard of its own database session. Checked with two open transactions on two real PostgreSQL
sessions whose shards differ: the second counts its message while the first still holds its row, under a
lock timeout. Then the counts and the read marks those two messages leave, and the migration's data
copy, forward and back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from buzz.chat.messages import _POST, post_params
from buzz.models import MESSAGE_COUNTER_SHARDS, Channel, Community, Membership, MessageCounter
from buzz.nostr import Signer, parse_event
from buzz.runtime import conninfo_from_settings
from tests.support.factories import make_channel, make_community, message
from tests.support.inprocess import actor_of
from tests.support.migrations import migrate, schema_at


def _session_in_another_shard(taken: int) -> tuple[psycopg.Connection[Any], int]:
    """A new session whose shard (pg_backend_pid() % shards) is not `taken`."""
    spare: list[psycopg.Connection[Any]] = []
    try:
        for _ in range(64):
            conn = psycopg.connect(conninfo_from_settings())
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            conn.rollback()
            assert row is not None
            if row[0] % MESSAGE_COUNTER_SHARDS != taken:
                return conn, row[0] % MESSAGE_COUNTER_SHARDS
            spare.append(conn)
    finally:
        for conn in spare:
            conn.close()
    raise AssertionError("64 sessions in one shard")


def _post(conn: psycopg.Connection[Any], community: Community, signer: Signer, channel: uuid.UUID) -> None:
    event = parse_event(message(signer, channel, "hello"))
    row = conn.execute(_POST.named, post_params(actor_of(community, signer), event, channel)).fetchone()
    assert row is not None and row[-2] == 1, "the message was not stored"


def test_writers_in_one_channel_count_without_waiting_for_each_other(transactional_db: None) -> None:
    alice, bob, carol = Signer.generate(), Signer.generate(), Signer.generate()
    community = make_community("counter.test", members=[alice, bob, carol])
    channel = make_channel(community, alice, members=[bob, carol])
    first = psycopg.connect(conninfo_from_settings())
    pid = first.execute("SELECT pg_backend_pid()").fetchone()
    assert pid is not None
    second, shard = _session_in_another_shard(pid[0] % MESSAGE_COUNTER_SHARDS)
    try:
        _post(first, community, alice, channel)  # its transaction stays open, its shard's row locked
        second.execute("SET lock_timeout = '2s'")
        _post(second, community, bob, channel)  # would time out on a row alice's transaction holds
        second.commit()
        first.commit()
    finally:
        first.close()
        second.close()
    pk = Channel.objects.get(uuid=channel).pk
    shards = dict(MessageCounter.objects.filter(channel_id=pk).values_list("shard", "message_count"))
    assert shards == {pid[0] % MESSAGE_COUNTER_SHARDS: 1, shard: 1}
    marks = dict(Membership.objects.filter(channel_id=pk, removed_at__isnull=True).values_list("pubkey", "read_mark"))
    # Each author's mark counts what its statement saw, its own message included: neither saw the other's,
    # which is unread for it. Carol posted nothing and has read nothing.
    assert marks == {alice.pubkey: 1, bob.pubkey: 1, carol.pubkey: 0}


OLD = [("buzz", "0005_hot_lookup_indexes")]


@pytest.fixture
def old_schema(transactional_db: None) -> Iterator[None]:
    with schema_at(OLD):
        yield


def _rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return [tuple(r) for r in cur.fetchall()]


def test_the_migration_keeps_each_channel_count_both_ways(old_schema: None) -> None:
    community = make_community("counter-migration.test").pk
    with connection.cursor() as cur:
        ids = []
        for n in (7, 0):
            cur.execute(
                "INSERT INTO buzz_channel (uuid, name, about, topic, purpose, visibility, listed, type, created_by,"
                " created_at, community_id) VALUES (%s, 'c', '', '', '', 'open', true, 'stream', %s, now(), %s)"
                " RETURNING id",
                [uuid.uuid4(), "a1" * 32, community],
            )
            (pk,) = cur.fetchone()
            cur.execute("INSERT INTO buzz_channelstats (channel_id, message_count) VALUES (%s, %s)", [pk, n])
            ids.append(pk)
    migrate([("buzz", "0006_message_counter_shards")])
    got = _rows("SELECT channel_id, shard, message_count FROM buzz_messagecounter WHERE channel_id = ANY(%s)", [ids])
    assert sorted(got) == sorted([(ids[0], 0, 7), (ids[1], 0, 0)])
    # A second shard, as a concurrent writer leaves it; back, the shards sum into the one row.
    with connection.cursor() as cur:
        cur.execute("INSERT INTO buzz_messagecounter (channel_id, shard, message_count) VALUES (%s, 3, 2)", [ids[0]])
    migrate(OLD)
    back = _rows("SELECT channel_id, message_count FROM buzz_channelstats WHERE channel_id = ANY(%s)", [ids])
    assert sorted(back) == sorted([(ids[0], 9), (ids[1], 0)])
