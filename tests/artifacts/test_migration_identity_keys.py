"""Migrations buzz 0012 and artifacts 0011 (issue 14, "Throughput"): the unique keys of stored events,
artifacts and revisions lead with the key the write path looks up, the indexes that repeated them are
gone, and four foreign keys the write statements satisfy by construction are no longer checked at commit.

The uniqueness is the same both ways, rows survive both ways, and the community's foreign keys stay."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from buzz.identity.communities import community_create
from tests.support.migrations import migrate, schema_at

BEFORE = [("buzz", "0011_policy_stamp"), ("artifacts", "0010_policy_stamp_to_buzz")]
AFTER = [("buzz", "0012_identity_leads_with_id"), ("artifacts", "0011_identity_leads_with_key")]

TABLES = ("buzz_storedevent", "buzz_eventtag", "artifacts_artifact", "artifacts_revision", "artifacts_currenttag")
EVENT, REVISION = "e1" * 32, "f1" * 32


def rows(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params or [])
        return [tuple(r) for r in cur.fetchall()]


def uniques() -> set[tuple[str, str, str]]:
    return {
        (t, n, d)
        for t, n, d in rows(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE contype = 'u' AND conrelid::regclass::text = ANY(%s)",
            [list(TABLES)],
        )
    }


def foreign_keys() -> set[tuple[str, str]]:
    """(table, what the key references) for every foreign key of the tables."""
    return {
        (t, d.split(" REFERENCES ")[1].split(" ")[0])
        for t, d in rows(
            "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE contype = 'f' AND conrelid::regclass::text = ANY(%s)",
            [list(TABLES)],
        )
    }


def index_columns() -> set[tuple[str, str]]:
    return {
        (t, d.split(" USING ")[1])
        for t, d in rows("SELECT tablename, indexdef FROM pg_indexes WHERE tablename = ANY(%s)", [list(TABLES)])
    }


def seed(community: int) -> int:
    """A stored event with a tag, and an artifact headed by its revision with a current tag."""
    channel, d = uuid.uuid4(), uuid.uuid4()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            "INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw, received_at)"
            " VALUES (%s, %s, %s, 45010, 1, %s, '{}', now()) RETURNING key",
            [REVISION, community, "a1" * 32, channel],
        )
        (key,) = cur.fetchone()
        cur.execute("INSERT INTO buzz_eventtag (event_key, name, value) VALUES (%s, 'h', %s)", [key, str(channel)])
        cur.execute(
            "INSERT INTO artifacts_artifact (community_id, d, type, head_id, home, deleted, retired, created_at,"
            " changed_at) VALUES (%s, %s, 'buzz.task', %s, %s, false, false, now(), now()) RETURNING id",
            [community, d, REVISION, channel],
        )
        (artifact,) = cur.fetchone()
        cur.execute(
            "INSERT INTO artifacts_revision (id, community_id, artifact_id, op, channel, pubkey, created_at, raw, seq,"
            " accepted_at) VALUES (%s, %s, %s, 'create', %s, %s, 1, '{}', nextval('artifacts_accept_seq'), now())",
            [REVISION, community, artifact, channel, "a1" * 32],
        )
        cur.execute("INSERT INTO artifacts_currenttag (artifact_id, name, value) VALUES (%s, 'h', %s)",
                    [artifact, str(channel)])  # fmt: skip
    return artifact


def survived(community: int, artifact: int) -> None:
    assert rows(
        "SELECT count(*) FROM buzz_storedevent e JOIN buzz_eventtag t ON t.event_key = e.key WHERE e.community_id = %s",
        [community],
    ) == [(1,)]
    assert rows(
        "SELECT r.id, count(c.id) FROM artifacts_artifact a"
        " JOIN artifacts_revision r ON r.community_id = a.community_id AND r.id = a.head_id"
        " JOIN artifacts_currenttag c ON c.artifact_id = a.id WHERE a.id = %s GROUP BY r.id",
        [artifact],
    ) == [(REVISION, 1)]


def refused(sql: str, params: list[Any]) -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql, params)
    except IntegrityError:
        return True
    return False


@pytest.fixture
def before(transactional_db: None) -> Iterator[None]:
    with schema_at(BEFORE):
        yield


def test_keys_lead_with_the_looked_up_key_and_rows_survive_both_ways(before: None) -> None:
    community = community_create(host="rekeyed.test", name="Rekeyed").pk
    artifact = seed(community)
    old_uniques, old_fks, old_indexes = uniques(), foreign_keys(), index_columns()
    assert ("buzz_storedevent", "stored_event_identity", "UNIQUE (community_id, id)") in old_uniques

    migrate(AFTER)
    survived(community, artifact)
    assert {u for u in uniques() if u[1].endswith("_identity")} == {
        ("buzz_storedevent", "stored_event_identity", "UNIQUE (id, community_id)"),
        ("artifacts_artifact", "artifact_identity", "UNIQUE (d, community_id)"),
        ("artifacts_revision", "revision_identity", "UNIQUE (id, community_id)"),
    }
    # The single-column lookups are served by the unique keys now.
    assert {c for c in index_columns() if c[1] in ("btree (id)", "btree (d)")} & {
        ("buzz_storedevent", "btree (id)"), ("artifacts_artifact", "btree (d)"), ("artifacts_revision", "btree (id)")
    } == set()  # fmt: skip
    # Only the community's foreign keys are left among these tables.
    assert foreign_keys() == {
        ("buzz_storedevent", "buzz_community(id)"),
        ("artifacts_artifact", "buzz_community(id)"),
        ("artifacts_revision", "buzz_community(id)"),
    }
    # The same uniqueness: a second copy of a key in one community is refused, in another it is stored.
    second = community_create(host="second.test", name="Second").pk
    copy_event = (
        "INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, raw, received_at)"
        " VALUES (%s, %s, %s, 9, 1, '{}', now())"
    )
    assert refused(copy_event, [REVISION, community, "a1" * 32])
    assert not refused(copy_event, [REVISION, second, "a1" * 32])
    copy_revision = (
        "INSERT INTO artifacts_revision (id, community_id, artifact_id, op, channel, pubkey, created_at, raw, seq,"
        " accepted_at) VALUES (%s, %s, %s, 'create', %s, %s, 1, '{}', nextval('artifacts_accept_seq'), now())"
    )
    assert refused(copy_revision, [REVISION, community, artifact, uuid.uuid4(), "a1" * 32])
    # A write into a community that is gone still fails at commit: the community's foreign key.
    assert refused(copy_event, [EVENT, 987654321, "a1" * 32])
    with connection.cursor() as cur:
        cur.execute("DELETE FROM buzz_storedevent WHERE community_id = %s", [second])

    migrate(BEFORE)
    survived(community, artifact)
    assert (uniques(), foreign_keys(), index_columns()) == (old_uniques, old_fks, old_indexes)
