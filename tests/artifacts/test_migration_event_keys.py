"""Migrations buzz 0002 and artifacts 0004 keep existing rows (issue 9, item 8: "Write the migration so
existing rows survive").

Rows written in the old schema (stored events keyed by id, the tag index by event id, revisions keyed by
id, the head and a move removal pointing at revisions by id) are migrated forward, checked, migrated
back and forward again. Afterwards the new keys do what they are for: the same event id can be stored
in a second community.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from buzz.identity.communities import community_create
from tests.support.migrations import migrate, schema_at

OLD = [("buzz", "0002_access_change_stamps"), ("artifacts", "0003_currenttag_statistics")]
NEW = [("buzz", "0003_community_event_keys"), ("artifacts", "0004_community_revision_keys")]

ALICE, BOB, CAROL = "a1" * 32, "b0" * 32, "c0" * 32
MSG, CREATE, UPDATE, MOVE, DELETE, REMOVAL = (f"{n:02x}" * 32 for n in range(1, 7))


@pytest.fixture
def old_schema(transactional_db: None) -> Iterator[None]:
    with schema_at(OLD):
        yield


def raw(event_id: str, kind: int, tags: list[list[str]], pubkey: str = ALICE) -> str:
    return json.dumps({"id": event_id, "pubkey": pubkey, "created_at": 1, "kind": kind, "tags": tags,
                       "content": "a\x00b", "sig": "0" * 128})  # fmt: skip


def seed_old_rows(community: int, chat: uuid.UUID, other: uuid.UUID, d: uuid.UUID) -> None:
    """What the old code wrote for a message and an artifact: create (p bob), update (p bob, carol),
    move, delete, and the move's removal."""
    revisions = [
        (CREATE, "create", chat, None, [["p", BOB]], 1),
        (UPDATE, "update", chat, CREATE, [["p", BOB], ["p", CAROL], ["p", "not hex"]], 2),
        (MOVE, "move", other, UPDATE, [["p", CAROL]], 3),
        (DELETE, "delete", other, MOVE, [], 5),
    ]
    # One transaction: the head's foreign key is checked at commit (the artifact row comes first).
    with transaction.atomic(), connection.cursor() as cur:
        for event_id, kind, channel, tags in (
            (MSG, 9, chat, [["h", str(chat)], ["t", "topic"]]),
            *((r[0], 45010, r[2], [["h", str(r[2])], ["d", str(d)], *r[4]]) for r in revisions),
        ):
            cur.execute(
                "INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw,"
                " received_at) VALUES (%s, %s, %s, %s, 1, %s, %s, now())",
                [event_id, community, ALICE, kind, channel, raw(event_id, kind, tags)],
            )
            for name, value in [(t[0], t[1]) for t in tags if len(t[0]) == 1]:
                cur.execute(
                    "INSERT INTO buzz_eventtag (event_id, name, value) VALUES (%s, %s, %s)", [event_id, name, value]
                )
        cur.execute(
            "INSERT INTO buzz_mention (community_id, pubkey, event_id, channel_id, kind, created_at)"
            " VALUES (%s, %s, %s, %s, 45010, now())",
            [community, BOB, CREATE, chat],
        )
        cur.execute(
            "INSERT INTO artifacts_artifact (community_id, d, type, head_id, home, root, deleted, retired, created_at,"
            " changed_at) VALUES (%s, %s, 'buzz.task', %s, %s, NULL, true, false, now(), now()) RETURNING id",
            [community, d, DELETE, other],
        )
        (artifact,) = cur.fetchone()
        for event_id, op, channel, prev, tags, seq in revisions:
            cur.execute(
                "INSERT INTO artifacts_revision (id, community_id, artifact_id, op, channel, prev, root, pubkey,"
                " created_at, raw, seq, accepted_at) VALUES (%s, %s, %s, %s, %s, %s, NULL, %s, 1, %s, %s, now())",
                [event_id, community, artifact, op, channel, prev, ALICE, raw(event_id, 45010, tags), seq],
            )
        cur.execute(
            "INSERT INTO artifacts_moveremoval (id, community_id, artifact_id, source, replaced, move_id, raw, seq,"
            " accepted_at) VALUES (%s, %s, %s, %s, %s, %s, '{}', 4, now())",
            [REMOVAL, community, artifact, chat, UPDATE, MOVE],
        )


def rows(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params or [])
        return [tuple(r) for r in cur.fetchall()]


def check_migrated(community: int, d: uuid.UUID) -> None:
    # Every stored event has a key of its own, and the tag index still finds the same events.
    keys = rows("SELECT key, id FROM buzz_storedevent WHERE community_id = %s ORDER BY id", [community])
    assert [i for _, i in keys] == sorted([MSG, CREATE, UPDATE, MOVE, DELETE])
    assert len({k for k, _ in keys}) == 5
    tagged = rows(
        "SELECT e.id, t.name, t.value FROM buzz_eventtag t JOIN buzz_storedevent e ON e.key = t.event_key"
        " WHERE e.community_id = %s AND t.name IN ('t', 'p') ORDER BY e.id, t.value",
        [community],
    )
    assert tagged == sorted(
        [(MSG, "t", "topic"), (CREATE, "p", BOB), (UPDATE, "p", BOB), (UPDATE, "p", CAROL), (UPDATE, "p", "not hex"),
         (MOVE, "p", CAROL)]
    )  # fmt: skip
    assert rows("SELECT pubkey, event_id FROM buzz_mention WHERE community_id = %s", [community]) == [(BOB, CREATE)]
    # The head pointer, the history and the removal, by (community, id).
    head = rows(
        "SELECT r.id, r.op, a.p_tags FROM artifacts_artifact a"
        " JOIN artifacts_revision r ON r.community_id = a.community_id AND r.id = a.head_id WHERE a.d = %s",
        [d],
    )
    assert len(head) == 1 and head[0][:2] == (DELETE, "delete")
    # The p values of the last revision that is not the deletion: the move's.
    assert sorted(head[0][2]) == [CAROL]
    history = rows("SELECT seq, id FROM artifacts_revision WHERE community_id = %s ORDER BY seq", [community])
    assert history == [(1, CREATE), (2, UPDATE), (3, MOVE), (5, DELETE)]
    removal = rows("SELECT id, move_id, replaced FROM artifacts_moveremoval WHERE community_id = %s", [community])
    assert removal == [(REMOVAL, MOVE, UPDATE)]


def test_existing_rows_survive_both_ways(old_schema: None) -> None:
    community = community_create(host="migrated.test", name="Migrated").pk
    second = community_create(host="second.test", name="Second").pk
    chat, other, d = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    seed_old_rows(community, chat, other, d)
    migrate(NEW)
    check_migrated(community, d)
    # Back, while no id is in two communities, and forward again.
    migrate(OLD)
    assert rows("SELECT count(*) FROM buzz_eventtag t JOIN buzz_storedevent e ON e.id = t.event_id") == [(15,)]
    assert rows("SELECT head_id FROM artifacts_artifact") == [(DELETE,)]
    migrate(NEW)
    check_migrated(community, d)
    # What the new keys are for: the same event in a second community.
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw, received_at)"
            " SELECT id, %s, pubkey, kind, created_at, channel_id, raw, now() FROM buzz_storedevent WHERE id = %s",
            [second, MSG],
        )
    assert rows("SELECT count(*) FROM buzz_storedevent WHERE id = %s", [MSG]) == [(2,)]
