"""Deleting a whole community (`manage.py community delete`): NIP-AR "Access recovery and bounds" says
whole-community deletion closes admission and purges the recovery history (heads, membership removals,
move-source records) with everything else.

Two communities hold the same channel UUIDs and the same signed events (as in
tests/artifacts/test_two_communities.py), with a row in every table a community owns. Deleting one
removes every row it had, in every table, and leaves the other's rows exactly as they were; its open
subscriptions end on every node (a REQ restricted, a sync resync), its connections are refused from
then on, and its host becomes unknown; the other community's subscriptions keep receiving.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.management import CommandError, call_command
from django.db import connection

from buzz.chat import bans, channels
from buzz.identity.communities import (
    community_create,
    community_delete,
    deletion_counts,
    deletion_plan,
    member_add,
)
from buzz.identity.tokens import token_create
from buzz.models import Channel, Community
from buzz.nostr import Signer
from moderation import services as moderation
from tests.artifacts.write_support import accepted, message, revision
from tests.support.relay import RelayProcess, start_relays
from tests.support.wire import http
from tests.support.wsclient import RelayClient
from tests.sync.support import open_sync

GONE, KEPT = "gone.test", "kept.test"
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}


def _tables_with_community_column() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND column_name = 'community_id'"
        )
        return {row[0] for row in cursor.fetchall()}


def _referencing(tables: set[str]) -> set[str]:
    """Tables with a foreign key (as PostgreSQL has it, migrations' own constraints included) into `tables`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint WHERE contype = 'f'"
        )
        return {child for child, parent in cursor.fetchall() if parent in tables}


def test_the_plan_covers_every_table_that_holds_a_communitys_rows(db: None) -> None:
    planned = [step.table.strip('"') for step in deletion_plan()]
    assert len(planned) == len(set(planned))
    covered = set(planned)
    assert _tables_with_community_column() <= covered
    assert _referencing(covered) <= covered, "a table with a foreign key into the community's rows is left out"
    assert planned[-1] == "buzz_community"
    # A table whose rows are found through another table's rows is emptied before that table.
    assert planned.index("buzz_membership") < planned.index("buzz_channel")
    assert planned.index("buzz_eventtag") < planned.index("buzz_storedevent")
    assert planned.index("artifacts_currenttag") < planned.index("artifacts_artifact")


def _snapshot() -> dict[str, list[str]]:
    """Every row of every table a community owns, as text."""
    rows: dict[str, list[str]] = {}
    with connection.cursor() as cursor:
        for step in deletion_plan():
            cursor.execute(f"SELECT t::text FROM {step.table} AS t")  # noqa: S608 - table names from the models
            rows[step.table] = sorted(r[0] for r in cursor.fetchall())
    return rows


class Seeded:
    def __init__(self, community: Community, chat: uuid.UUID, other: uuid.UUID) -> None:
        self.community, self.chat, self.other = community, chat, other


def _create(host: str, alice: Signer, bob: Signer, carol: Signer, chat: uuid.UUID, other: uuid.UUID) -> Seeded:
    community = community_create(host=host, name=host)
    for signer in (alice, bob, carol):
        member_add(community=community, pubkey=signer.pubkey)
    for ch in (chat, other):
        channels.channel_create(community=community, channel_uuid=ch, name=str(ch)[:8], creator=alice.pubkey)
        channels.member_put(community=community, channel_uuid=ch, actor=None, pubkey=bob.pubkey)
    # A membership removal (kept as a row for incremental reads), a ban, a timeout, a token.
    channels.member_put(community=community, channel_uuid=other, actor=None, pubkey=carol.pubkey)
    channels.member_remove(community=community, channel_uuid=other, actor=None, pubkey=carol.pubkey)
    bans.ban_add(community=community, pubkey=Signer.generate().pubkey, reason="spam")
    bans.timeout_add(community=community, pubkey=carol.pubkey, duration=dt.timedelta(minutes=5))
    token_create(community=community, pubkey=bob.pubkey, scopes=["messages:read"], name="cli")
    # The audit log and the retention policy.
    moderation.set_retention(community, dt.timedelta(days=30), actor="operator")
    channel = Channel.objects.get(community=community, uuid=other)
    moderation.archive_channel(channel, actor="operator", reason="quiet")
    moderation.unarchive_channel(channel, actor="operator", reason="back")
    return Seeded(community, chat, other)


async def _write(relay: RelayProcess, host: str, alice: Signer, bob: Signer, seeded: Seeded) -> None:
    """Messages with a mention and a reply, and an artifact created, updated and moved."""
    async with RelayClient.connect(relay.ws_url, host=host) as client:
        assert (await client.auth(alice))[2] is True
        root = await accepted(client, message(alice, seeded.chat, extra=[["p", bob.pubkey]], content="hello"))
        await accepted(client, message(alice, seeded.chat, root=root, content="a reply"))
        d = uuid.uuid4()
        first = await accepted(
            client, revision(alice, d=d, h=seeded.chat, op="create", extra=[["status", "open"]], content="{}")
        )
        second = await accepted(
            client, revision(alice, d=d, h=seeded.chat, op="update", prev=first, extra=[["status", "done"]])
        )
        await accepted(client, revision(alice, d=d, h=seeded.other, op="move", prev=second))


async def _next(client: RelayClient, sub: str, timeout: float = 15.0) -> list[Any]:
    while True:
        m = await client.recv_json(timeout)
        if isinstance(m, list) and len(m) > 1 and m[1] == sub and m[0] in ("EVENT", "CLOSED", "EOSE"):
            return m


async def test_deleting_a_community_removes_all_of_it_and_nothing_of_another(
    transactional_db: None, relay_factory: Any, redis_flush: Any
) -> None:
    alice, bob, carol = Signer.generate(), Signer.generate(), Signer.generate()
    chat, other = uuid.uuid4(), uuid.uuid4()  # the same channel UUIDs in both communities
    a, b = await start_relays(relay_factory, RELAY_ENV, RELAY_ENV)

    kept = await sync_to_async(_create)(KEPT, alice, bob, carol, chat, other)
    await _write(a, KEPT, alice, bob, kept)
    before = await sync_to_async(_snapshot)()
    gone = await sync_to_async(_create)(GONE, alice, bob, carol, chat, other)
    await _write(a, GONE, alice, bob, gone)

    counts = await sync_to_async(deletion_counts)(community=gone.community)
    empty = sorted(table for table, n in counts.items() if n == 0)
    assert not empty, f"the test seeds no row of {GONE} in {empty}: it would not show they are deleted"

    # Without --yes nothing is deleted, and the command to confirm is printed.
    out = io.StringIO()
    with pytest.raises(CommandError, match="nothing deleted") as refused:
        await sync_to_async(call_command)("community", "delete", "--host", GONE, stdout=out)
    assert f"community delete --host {GONE} --yes" in str(refused.value)
    assert "artifacts_moveremoval" in out.getvalue()
    assert await sync_to_async(deletion_counts)(community=gone.community) == counts

    flt = {"#h": [str(chat)], "kinds": [9]}
    sync_filter = {"artifact": "current", "#h": [str(chat), str(other)]}
    async with (
        RelayClient.connect(a.ws_url, host=GONE) as on_a,
        RelayClient.connect(b.ws_url, host=GONE) as on_b,
        RelayClient.connect(b.ws_url, host=KEPT) as kept_b,
    ):
        for client in (on_a, on_b, kept_b):
            assert (await client.auth(bob))[2] is True
        await on_a.send_json(["REQ", "r", flt])
        stored = [await _next(on_a, "r") for _ in range(3)]
        assert [m[0] for m in stored] == ["EVENT", "EVENT", "EOSE"], stored
        gone_sync = await open_sync(on_b, "s", sync_filter)
        kept_sync = await open_sync(kept_b, "s", sync_filter)
        assert gone_sync.eose and kept_sync.eose and len(kept_sync.heads) == 1

        out = io.StringIO()
        await sync_to_async(call_command)("community", "delete", "--host", GONE, "--yes", stdout=out)
        assert f"deleted community {GONE}: {sum(counts.values())} rows" in out.getvalue()

        # Its subscriptions end at once on both nodes: the REQ is refused, the sync must start again.
        closed_r = await _next(on_a, "r")
        closed_s = await _next(on_b, "s")
        assert closed_r[0] == "CLOSED" and closed_r[2].startswith("restricted:"), closed_r
        assert closed_s[0] == "CLOSED" and closed_s[2].startswith("resync:"), closed_s
        # Every later request of its connections is refused, and so is a new sync.
        await on_b.send_json(["REQ", "again", sync_filter])
        again = await _next(on_b, "again")
        assert again[0] == "CLOSED" and again[2].startswith("restricted:"), again

        # The other community's sync, on the same node, keeps receiving.
        async with RelayClient.connect(a.ws_url, host=KEPT) as writer:
            assert (await writer.auth(alice))[2] is True
            d = uuid.uuid4()
            head = await accepted(writer, revision(alice, d=d, h=chat, op="create"))
        live = await _next(kept_b, "s")
        assert live[0] == "EVENT" and live[2]["id"] == head, live

    assert not await sync_to_async(Community.objects.filter(host=GONE).exists)()
    after = await sync_to_async(_snapshot)()
    kept_now = {table: rows for table, rows in after.items()}
    # Everything of the kept community is as it was, except the artifact just written there.
    grown = {t for t in after if after[t] != before[t]}
    assert grown <= {'"artifacts_artifact"', '"artifacts_revision"', '"artifacts_currenttag"', '"buzz_storedevent"',
                     '"buzz_eventtag"'}, grown  # fmt: skip
    for table in grown:
        assert set(before[table]) < set(kept_now[table]), table  # only rows added, none changed or removed

    # The host is unknown: each relay process forgets it within its directory's lifetime (seconds).
    for relay in (a, b):
        for _ in range(100):
            status, _ = await http(relay, "GET", "/", host=GONE)
            if status == 404:
                break
            await asyncio.sleep(0.1)
        assert status == 404


@pytest.fixture(autouse=True)
def _no_stray_communities(transactional_db: None) -> None:
    for community in Community.objects.filter(host__in=(GONE, KEPT)):
        with connection.cursor() as cursor:
            for step in deletion_plan():
                cursor.execute(f"DELETE FROM {step.table} WHERE {step.where}", {"community": community.pk})  # noqa: S608


def test_a_write_under_way_commits_nothing_of_a_deleted_community(transactional_db: None) -> None:
    """A write whose transaction began before the deletion and commits after it fails at its commit (its
    foreign key finds no community) and leaves nothing behind: the community's rows are not recreated."""
    import psycopg

    from tests.support.relay import relay_database_url

    community = community_create(host=GONE, name=GONE)
    with psycopg.connect(relay_database_url()) as writer:
        writer.execute(
            "INSERT INTO buzz_ban (community_id, pubkey, reason, created_at) VALUES (%s, %s, '', now())",
            (community.pk, Signer.generate().pubkey),
        )
        counts = community_delete(community=community)
        assert counts["buzz_community"] == 1 and counts["buzz_ban"] == 0  # the write is not committed yet
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            writer.commit()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM buzz_ban WHERE community_id = %s", [community.pk])
        assert cursor.fetchone() == (0,)
