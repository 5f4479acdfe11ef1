"""Every moderation service and command that must resync does: an open sync that must get CLOSED
"resync: ..." gets it (an admin redaction of a head, a policy reset, a TTL channel's deletion by
`retention reap-ttl`), and the admin's removal is a relay-signed 9005 kept in the channel, withheld from readers."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from buzz.models import Channel, PolicyStamp, StoredEvent
from moderation import services
from moderation.models import AuditAction, AuditRecord
from tests.moderation.moderation_support import (
    RELAY_ENV,
    World,
    closed,
    make_world,
    open_syncs_counted,
    replay,
    view,
)
from tests.support.factories import revision
from tests.support.wire import accept, logged_in
from tests.sync.support import follow, open_sync

HOST = "service-resync.test"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


def _thread(fn: Any) -> Any:
    return sync_to_async(fn, thread_sensitive=False)()


async def _a_head_under_an_open_sync(world: World, author: Any, member: Any) -> tuple[str, dict[str, Any]]:
    """The author creates an artifact in world.ch, and the member's sync "s" over the channel holds it and is
    counted: (its d, its head)."""
    ch = str(world.ch)
    d = str(uuid.uuid4())
    head = revision(world.author, d=d, h=ch)
    await accept(author, head)
    state = await open_sync(member, "s", {"artifact": "current", "#h": [ch]})
    assert state.eose and d in state.heads
    await open_syncs_counted(world.community, [world.ch], 1)
    return d, head


async def test_admin_redaction_resyncs_and_is_a_relay_signed_9005(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    ch = str(world.ch)
    async with logged_in(relay, world.author, host=HOST) as a, logged_in(relay, world.member, host=HOST) as m:
        d, head = await _a_head_under_an_open_sync(world, a, m)
        preview = await _thread(lambda: services.preview_redact(world.community, [head["id"], "ab" * 32]))
        assert preview.withheld == (head["id"],) and preview.retiring == (d,) and preview.unknown == ("ab" * 32,)
        assert preview.open_syncs == 1  # the one open sync over the channel, from the relay's census
        plan = await _thread(lambda: services.redact(world.community, [head["id"]], actor="admin:root", reason="spam"))
        assert plan.retiring == (d,) and plan.open_syncs == 1
        assert (await closed(m, "s")).startswith("resync:")
        assert await view(relay, world, world.member, {"artifact": "current", "#h": [ch]}) == []
        # The 9005 names the retired head: it is kept, withheld, and no reader gets it (NIP-AR: clients that
        # don't hold a retired revision's id can't edit it further).
        assert await replay(m, "rm", {"#h": [ch], "kinds": [9005]}) == []
    stored = await _thread(lambda: StoredEvent.objects.get(community=world.community, kind=9005))
    event = json.loads(stored.raw)
    assert stored.deleted_at is not None and stored.pubkey == world.community.relay_pubkey
    assert ["e", head["id"]] in event["tags"] and event["content"] == "spam"
    record = await _thread(lambda: AuditRecord.objects.get(action=AuditAction.REDACT))
    assert record.who == "admin:root" and record.detail["withheld"] == [head["id"]] and record.detail["retired"] == [d]
    assert record.detail["open_syncs"] == 1
    # Redacting it again changes nothing and withholds nothing.
    again = await _thread(lambda: services.redact(world.community, [head["id"]], actor="admin:root", reason="x"))
    assert again.withheld == () and again.unknown == (head["id"],)


async def test_policy_reset_advances_the_stamp_and_resyncs(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with logged_in(relay, world.member, host=HOST) as m:
        state = await open_sync(m, "s", {"artifact": "current", "#h": [str(world.ch), str(world.other)]})
        assert state.eose
        await open_syncs_counted(world.community, [world.ch, world.other], 1)  # one sync over both: counted once
        before = await _thread(lambda: PolicyStamp.objects.filter(community=world.community).first())
        plan = await _thread(lambda: services.reset_policy(world.community, actor="admin:root", reason="rotate"))
        assert set(plan.channels) >= {str(world.ch), str(world.other)} and plan.open_syncs == 1
        assert (await closed(m, "s")).startswith("resync:")
    stamp = await _thread(lambda: PolicyStamp.objects.get(community=world.community).stamp)
    assert stamp == (before.stamp if before else 0) + 1


async def test_reap_ttl_archives_then_deletes_with_resync(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    ch = str(world.ch)

    def expire_ttl(seconds_ago: int) -> None:
        # The channel's TTL passed `seconds_ago` seconds ago (an hour-long TTL).
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE buzz_channel SET ttl_seconds = 3600, deadline = %s WHERE uuid = %s",
                [timezone.now() - dt.timedelta(seconds=seconds_ago), world.ch],
            )

    def reap() -> str:
        out = io.StringIO()
        call_command("retention", "reap-ttl", stdout=out)
        return out.getvalue()

    async with logged_in(relay, world.author, host=HOST) as a, logged_in(relay, world.member, host=HOST) as m:
        d = str(uuid.uuid4())
        head = revision(world.author, d=d, h=ch)
        await accept(a, head)
        state = await open_sync(m, "s", {"artifact": "current", "#h": [ch, str(world.other)]})
        await _thread(lambda: expire_ttl(60))
        assert "1 archived, 0 deleted" in await _thread(reap)
        assert await _thread(lambda: Channel.objects.get(uuid=world.ch).archived_at is not None)
        # Archived: no resync; the sync still gets a later change in the other channel it names.
        d2 = str(uuid.uuid4())
        await accept(a, revision(world.author, d=d2, h=str(world.other)))
        await follow(m, "s", state, lambda s: d2 in s.heads)
        assert state.closed is None and d in state.heads
        assert "0 archived, 0 deleted" in await _thread(reap)
        await _thread(lambda: expire_ttl(2 * 3600))
        assert "0 archived, 1 deleted" in await _thread(reap)
        await follow(m, "s", state, lambda s: False, timeout=15.0)
        assert state.closed is not None and state.closed.startswith("resync:")
    assert await _thread(lambda: Channel.objects.get(uuid=world.ch).deleted_at is not None)


def test_reap_ttl_leaves_an_unarchived_channel_and_an_operators_archive_alone(world: World) -> None:
    """Unarchiving a reaped TTL channel starts its time again (the next reap would otherwise archive it at
    once, and delete it later), and a TTL channel an operator archived before its deadline is never deleted."""

    def set_ttl(channel: uuid.UUID, *, deadline_ago: int, archived_ago: int | None = None) -> None:
        # As time would leave them (raw SQL: the ORM's guards keep archived_at to the services).
        now = timezone.now()
        archived_at = None if archived_ago is None else now - dt.timedelta(seconds=archived_ago)
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE buzz_channel SET ttl_seconds = 3600, deadline = %s, archived_at = %s WHERE uuid = %s",
                [now - dt.timedelta(seconds=deadline_ago), archived_at, channel],
            )

    def reap() -> str:
        return services.reap_ttl(actor="command", reason="").detail

    set_ttl(world.ch, deadline_ago=60)
    assert reap() == "1 archived, 0 deleted"
    services.unarchive_channel(Channel.objects.get(uuid=world.ch), actor="admin:root", reason="still needed")
    unarchived = Channel.objects.get(uuid=world.ch)
    assert unarchived.archived_at is None and unarchived.deadline is not None
    assert unarchived.deadline > timezone.now() + dt.timedelta(seconds=3500)  # a whole ttl from now
    assert reap() == "0 archived, 0 deleted"

    # Archived by the operator a day before a deadline now two ttls past: the operator's archive stays.
    set_ttl(world.other, deadline_ago=2 * 3600, archived_ago=2 * 3600 + 86400)
    assert reap() == "0 archived, 0 deleted"
    kept = Channel.objects.get(uuid=world.other)
    assert kept.deleted_at is None and kept.archived_at is not None


def _command(*args: str) -> tuple[str, str | None]:
    """`manage.py moderation ARGS`: (its output, the CommandError's text or None)."""
    from django.core.management.base import CommandError

    out = io.StringIO()
    try:
        call_command("moderation", *args, stdout=out)
    except CommandError as err:
        return out.getvalue(), str(err)
    return out.getvalue(), None


async def test_the_moderation_command_previews_then_redacts_and_resets_with_resync(
    world: World, relay_factory: Any
) -> None:
    """`manage.py moderation redact` and `reset-policy` do what the admin actions do, as the actor `command`:
    without --yes they only say what would happen (nothing changes) and print the command that does it."""
    relay = relay_factory(**RELAY_ENV)
    ch = str(world.ch)
    async with logged_in(relay, world.author, host=HOST) as a, logged_in(relay, world.member, host=HOST) as m:
        d, head = await _a_head_under_an_open_sync(world, a, m)
        out, refused = await _thread(
            lambda: _command("redact", "--host", HOST, "--reason", "spam", head["id"], "ab" * 32)
        )
        assert refused is not None and refused.startswith("nothing redacted; to redact, run:")
        assert "--yes" in refused and head["id"] in refused
        assert f"  {head['id']}" in out and f"  d {d}" in out and "  " + "ab" * 32 in out and "1 open sync " in out
        assert await view(relay, world, world.member, {"artifact": "current", "#h": [ch]}) != []  # nothing changed
        out, refused = await _thread(
            lambda: _command("redact", "--host", HOST, "--reason", "spam", "--yes", head["id"])
        )
        assert refused is None and out.startswith(f"redacted 1 event in {HOST}; 1 artifact retired;"), out
        assert (await closed(m, "s")).startswith("resync:")
        assert await view(relay, world, world.member, {"artifact": "current", "#h": [ch]}) == []
        state = await open_sync(m, "t", {"artifact": "current", "#h": [ch]})
        assert state.eose
        await open_syncs_counted(world.community, [world.ch], 1)
        stamp = await _thread(lambda: PolicyStamp.objects.filter(community=world.community).first())
        before = stamp.stamp if stamp else 0
        out, refused = await _thread(lambda: _command("reset-policy", "--host", HOST, "--reason", "rotate"))
        assert refused is not None and refused.startswith("nothing reset; to reset it, run:"), refused
        unchanged = await _thread(lambda: PolicyStamp.objects.filter(community=world.community).first())
        assert (unchanged.stamp if unchanged else 0) == before
        out, refused = await _thread(lambda: _command("reset-policy", "--host", HOST, "--reason", "rotate", "--yes"))
        assert refused is None and "1 open sync resync" in out, out
        assert (await closed(m, "t")).startswith("resync:")
    assert await _thread(lambda: PolicyStamp.objects.get(community=world.community).stamp) == before + 1
    records = await _thread(
        lambda: list(AuditRecord.objects.filter(who=services.COMMAND).values_list("action", flat=True))
    )
    assert sorted(records) == sorted([AuditAction.REDACT, AuditAction.POLICY_RESET])
    # Nothing the community can redact: said so, and no command to confirm.
    out, refused = await _thread(lambda: _command("redact", "--host", HOST, "--reason", "x", "cd" * 32))
    assert refused == "nothing to redact" and "  " + "cd" * 32 in out, (out, refused)
    for bad in (
        ["redact", "--host", HOST, "--reason", "x", "AB" * 32],
        ["redact", "--host", HOST, "--reason", " ", "ab" * 32],
    ):
        _, refused = await _thread(lambda bad=bad: _command(*bad))
        assert refused is not None and ("invalid event id" in refused or "--reason must say why" in refused), refused
