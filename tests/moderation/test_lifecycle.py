"""NIP-AR "Home channel lifecycle", through moderation's services, with open syncs and ordinary REQs on two
relay nodes: archive refuses writes with the kind-9 archive reason and changes no reads and no syncs;
unarchive allows writes again; delete refuses writes, takes the channel's artifacts out of every
current-state result and the head view, and ends every sync covering the channel with resync; a later
channel with another id inherits nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.access.policy import ARCHIVED
from buzz.models import Channel
from moderation import services
from moderation.models import AuditAction, AuditRecord
from tests.moderation.moderation_support import RELAY_ENV, World, closed, make_world, view
from tests.support.factories import make_channel, message, revision
from tests.support.relay import start_relays
from tests.support.wire import accept, http, logged_in, publish
from tests.sync.support import follow, open_sync

HOST = "lifecycle.test"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


def _channel(world: World) -> Channel:
    return Channel.objects.get(community=world.community, uuid=world.ch)


async def _call(fn: Any, world: World, **kwargs: Any) -> Any:
    def run() -> Any:
        return fn(_channel(world), actor="admin:test", reason="test", **kwargs)

    return await sync_to_async(run, thread_sensitive=False)()


def _for(sub: str) -> Callable[[list[Any]], bool]:
    return lambda m: bool(m[1] == sub)


async def _live_event(client: Any, sub: str, event_id: str) -> None:
    await client.expect("EVENT", 15.0, where=lambda m: m[1] == sub and m[2]["id"] == event_id)


async def test_archive_unarchive_delete_with_open_syncs_and_reqs_on_two_nodes(world: World, relay_factory: Any) -> None:
    n1, n2 = await start_relays(relay_factory, RELAY_ENV, RELAY_ENV)
    ch = str(world.ch)
    flt = {"artifact": "current", "#h": [ch]}
    async with (
        logged_in(n1, world.author, host=HOST) as a,
        logged_in(n1, world.member, host=HOST) as m1,
        logged_in(n2, world.member, host=HOST) as m2,
    ):
        d = str(uuid.uuid4())
        first = revision(world.author, d=d, h=ch)
        await accept(a, first)
        syncs = {}
        for client, sub in ((m1, "s1"), (m2, "s2")):
            syncs[sub] = await open_sync(client, sub, flt)
            assert syncs[sub].eose and d in syncs[sub].heads
            await client.send_json(["REQ", "r" + sub, {"#h": [ch], "kinds": [9, 45010]}])
            await client.expect("EOSE", 15.0, where=_for("r" + sub))

        # Archive: writes refused with the kind-9 reason; reads unchanged.
        await _call(services.archive_channel, world)
        update = revision(world.author, d=d, h=ch, op="update", prev=first["id"])
        refused = await publish(a, update)
        assert refused[2] is False and refused[3] == ARCHIVED, refused
        chat = await publish(a, message(world.author, world.ch))
        assert chat[2] is False and chat[3] == ARCHIVED, chat
        for node in (n1, n2):
            assert await view(node, world, world.member, flt) == [first["id"]]
        # Unarchive: writes allowed again, and the syncs and REQs opened before the archive get them.
        await _call(services.unarchive_channel, world)
        await accept(a, update)
        for client, sub in ((m1, "s1"), (m2, "s2")):
            # expect() keeps the frames of other subscriptions for later reads; follow() reads those first.
            await _live_event(client, "r" + sub, update["id"])
            await follow(client, sub, syncs[sub], lambda s: s.heads.get(d, {}).get("id") == update["id"])
            assert syncs[sub].closed is None

        # Delete: every sync covering the channel gets resync, on both nodes; writes refused.
        plan = await sync_to_async(lambda: services.preview_delete_channel(_channel(world)), thread_sensitive=False)()
        assert plan.retiring == (d,) and plan.artifacts == 1 and not plan.already_deleted
        await _call(services.delete_channel, world)
        for client, sub in ((m1, "s1"), (m2, "s2")):
            assert (await closed(client, sub)).startswith("resync:")
            # The ordinary REQ named only this channel: it ends too.
            assert await closed(client, "r" + sub)
        gone = await publish(a, revision(world.author, d=d, h=ch, op="update", prev=update["id"]))
        assert gone[2] is False, gone
        for node in (n1, n2):
            # Not in any current-state result or the head view: wide reads leave it out, #h is refused.
            assert d not in json.dumps(await view(node, world, world.member, {"artifact": "current"}))
            assert await view(node, world, world.member, {"artifact": "head", "#d": [d]}) == []
            # Nor in history: nobody reads the channel its revisions were published in any more.
            assert await view(node, world, world.member, {"artifact": "history", "#d": [d]}) == []
            status, _ = await http(
                node, "POST", "/query", host=HOST, signer=world.member, body=json.dumps([flt]).encode()
            )
            assert status != 200
        again = await open_sync(m2, "s3", flt)
        assert not again.eose and again.closed is not None and again.closed.startswith("restricted:")

        # A later channel with another id inherits nothing, and the deleted d stays reserved.
        later = await sync_to_async(
            lambda: str(make_channel(world.community, world.owner, visibility="private", members=[world.author])),
            thread_sensitive=False,
        )()
        assert await view(n1, world, world.author, {"artifact": "current", "#h": [later]}) == []
        taken = await publish(a, revision(world.author, d=d, h=later))
        assert taken[2] is False and taken[3].startswith("conflict:"), taken

    actions = await sync_to_async(
        lambda: list(AuditRecord.objects.order_by("id").values_list("action", flat=True)), thread_sensitive=False
    )()
    assert actions == [AuditAction.ARCHIVE, AuditAction.UNARCHIVE, AuditAction.DELETE_CHANNEL]


def test_every_archive_unarchive_and_delete_is_audited_once(world: World) -> None:
    """A member's NIP-29 requests (9002 archived, 9008) and `manage.py channel` leave one audit record each,
    as the admin's moderation services do (which record their own, with no second record from the observer)."""
    from django.core.management import call_command

    from buzz.chat import channels
    from buzz.nostr import parse_event
    from tests.support.factories import signed

    def records() -> list[tuple[str, str, str, str]]:
        return [
            (r.who, r.action, r.target, str(r.detail.get("via", "")))
            for r in AuditRecord.objects.filter(community=world.community).order_by("pk")
        ]

    ch = str(world.ch)
    # Other edits are no lifecycle change: no record.
    channels.channel_edit(community=world.community, channel_uuid=world.ch, actor=None, changes={"name": "renamed"})
    edit = signed(world.owner, 9002, [["h", ch], ["archived", "true"]], "tidy up")
    channels.channel_edit(
        community=world.community,
        channel_uuid=world.ch,
        actor=world.owner.pubkey,
        changes={"archived": "true"},
        request=parse_event(edit),
    )
    call_command("channel", "unarchive", "--host", HOST, ch)
    services.archive_channel(Channel.objects.get(uuid=world.ch), actor="admin:root", reason="again")
    call_command("channel", "delete", "--host", HOST, str(world.other), "--yes")
    assert records() == [
        (world.owner.pubkey, AuditAction.ARCHIVE, ch, "nip29-9002"),
        ("command", AuditAction.UNARCHIVE, ch, "command"),
        ("admin:root", AuditAction.ARCHIVE, ch, ""),
        ("command", AuditAction.DELETE_CHANNEL, str(world.other), "command"),
    ]
