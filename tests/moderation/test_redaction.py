"""NIP-AR "Moderation and retention", redaction: a NIP-29 kind-9005 removal withholds a revision from every
surface (current, head, history, count, generic REQ replay, sync, mentions), over WS and HTTP, on two relay
nodes; the revision stays accepted (resubmission is duplicate:, its id stays valid as prev); redacting the
current revision retires the artifact and resyncs every open sync that holds it, on both nodes (sync rule 6)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from artifacts.services import KIND5_REFUSED
from tests.moderation.moderation_support import (
    RELAY_ENV,
    World,
    closed,
    count,
    make_world,
    mentions,
    ok,
    removal,
    replay,
    view,
    ws_count,
)
from tests.support.factories import revision, signed
from tests.support.relay import start_relays
from tests.support.wire import accept, logged_in, publish
from tests.sync.support import follow, open_sync

HOST = "redact.test"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


async def test_redacting_old_then_current_revision_on_every_surface_and_two_nodes(
    world: World, relay_factory: Any
) -> None:
    n1, n2 = await start_relays(relay_factory, RELAY_ENV, RELAY_ENV)
    ch = str(world.ch)
    d = str(uuid.uuid4())
    sync_filter = {"artifact": "current", "#h": [ch]}
    async with (
        logged_in(n1, world.author, host=HOST) as a,
        logged_in(n1, world.owner, host=HOST) as o,
        logged_in(n1, world.member, host=HOST) as m1,
        logged_in(n2, world.member, host=HOST) as m2,
    ):
        r1 = revision(world.author, d=d, h=ch, p=[world.member.pubkey])
        await accept(a, r1)
        r2 = revision(world.author, d=d, h=ch, op="update", prev=r1["id"], p=[world.member.pubkey])
        await accept(a, r2)
        s1 = await open_sync(m1, "s1", sync_filter)
        s2 = await open_sync(m2, "s2", sync_filter)
        assert s1.eose and s2.eose and s1.heads[d]["id"] == s2.heads[d]["id"] == r2["id"]
        assert r1["id"] in await mentions(n2, world, world.member)

        # --- an old revision, by its author ---
        assert await ok(a, removal(world.author, world.ch, r1["id"], "typo")) == (True, "")
        for node in (n1, n2):
            history = await view(node, world, world.member, {"artifact": "history", "#h": [ch], "#d": [d]})
            assert history == [r2["id"]]
            assert await count(node, world, world.member, {"artifact": "history", "#h": [ch], "#d": [d]}) == 1
            # Never changes which revision is current.
            assert await view(node, world, world.member, {"artifact": "current", "#h": [ch]}) == [r2["id"]]
            assert await view(node, world, world.member, {"artifact": "head", "#h": [ch], "#d": [d]}) == [r2["id"]]
            assert r1["id"] not in await mentions(node, world, world.member)
        for client in (m1, m2):
            assert await replay(client, "rp", {"#h": [ch], "kinds": [45010]}) == [r2["id"]]
            assert await replay(client, "ids", {"ids": [r1["id"]]}) == []
            assert await ws_count(client, {"#h": [ch], "kinds": [45010]}) == 1
        # Still accepted: a resubmission is a duplicate, and nothing is reapplied.
        again = await publish(a, r1)
        assert again[2] is True and again[3].startswith("duplicate:"), again
        # The open syncs were not ended: a later change reaches both.
        d2 = str(uuid.uuid4())
        other = revision(world.author, d=d2, h=ch)
        await accept(a, other)
        for client, sub, state in ((m1, "s1", s1), (m2, "s2", s2)):
            await follow(client, sub, state, lambda s: d2 in s.heads)
            assert state.closed is None and state.heads[d]["id"] == r2["id"]

        # --- the current revision, by the channel owner: the artifact retires ---
        assert (await ok(o, removal(world.owner, world.ch, r2["id"])))[0] is True
        assert (await closed(m1, "s1")).startswith("resync:")
        assert (await closed(m2, "s2")).startswith("resync:")
        for node in (n1, n2):
            assert await view(node, world, world.member, {"artifact": "current", "#h": [ch]}) == [other["id"]]
            assert await view(node, world, world.member, {"artifact": "head", "#h": [ch], "#d": [d]}) == []
            assert await count(node, world, world.member, {"artifact": "current", "#h": [ch]}) == 1
            assert await view(node, world, world.member, {"artifact": "history", "#h": [ch], "#d": [d]}) == []
        assert await replay(m2, "rp2", {"#h": [ch], "kinds": [45010]}) == [other["id"]]
        fresh = await open_sync(m2, "s3", sync_filter)
        assert fresh.eose and set(fresh.heads) == {d2}
        again = await publish(a, r2)
        assert again[2] is True and again[3].startswith("duplicate:"), again

        # A redacted revision that is not the head is an ordinary conflict as prev ...
        stale = await publish(a, revision(world.author, d=d, h=ch, op="update", prev=r1["id"]))
        assert stale[2] is False and stale[3].startswith("conflict:"), stale
        # ... and the retired head's id stays valid as prev: that edit makes a new, visible head.
        r3 = revision(world.author, d=d, h=ch, op="update", prev=r2["id"])
        await accept(a, r3)
        await follow(m2, "s3", fresh, lambda s: d in s.heads)
        assert fresh.heads[d]["id"] == r3["id"]
        for node in (n1, n2):
            assert sorted(await view(node, world, world.member, {"artifact": "current", "#h": [ch]})) == sorted(
                [other["id"], r3["id"]]
            )
            assert await view(node, world, world.member, {"artifact": "head", "#h": [ch], "#d": [d]}) == [r3["id"]]
            assert await view(node, world, world.member, {"artifact": "history", "#h": [ch], "#d": [d]}) == [r3["id"]]


async def test_redacting_a_move_removal_withholds_it_and_kind5_stays_refused(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    ch, dest = str(world.ch), str(world.other)
    d = str(uuid.uuid4())
    async with logged_in(relay, world.author, host=HOST) as a, logged_in(relay, world.owner, host=HOST) as o:
        create = revision(world.author, d=d, h=ch)
        await accept(a, create)
        move = revision(world.author, d=d, h=dest, op="move", prev=create["id"])
        await accept(a, move)
        source = await replay(o, "src", {"#h": [ch], "kinds": [45010, 45011]})
        removal_id = next(i for i in source if i != create["id"])
        # A relay-signed removal has no author among the members: only an owner/admin may redact it.
        refused = await publish(a, removal(world.author, world.ch, removal_id))
        assert refused[2] is False and refused[3] == "restricted: that event can't be deleted by you"
        assert await ok(o, removal(world.owner, world.ch, removal_id)) == (True, "")
        assert await replay(o, "src2", {"#h": [ch], "kinds": [45010, 45011]}) == [create["id"]]
        # The move itself is untouched: current in the destination.
        assert await view(relay, world, world.owner, {"artifact": "current", "#h": [dest]}) == [move["id"]]
        # Kind 5 stays refused with its reason, for a revision as for anything.
        kind5 = await publish(a, signed(world.author, 5, [["e", move["id"]]]))
        assert kind5[2] is False and kind5[3] == KIND5_REFUSED


async def test_no_reader_learns_a_retired_heads_id_from_its_removal(world: World, relay_factory: Any) -> None:
    """NIP-AR: "Redacting an artifact's current revision retires the artifact: ... clients that do not already
    hold that revision's ID cannot edit it further." The 9005 names the id: it is kept (a resubmission still
    meets it) but no reader gets it, by replay or live, while a 9005 on a message is an ordinary event."""
    relay = relay_factory(**RELAY_ENV)
    ch = str(world.ch)
    d = str(uuid.uuid4())
    async with (
        logged_in(relay, world.author, host=HOST) as a,
        logged_in(relay, world.owner, host=HOST) as o,
        logged_in(relay, world.member, host=HOST) as m,
    ):
        await m.send_json(["REQ", "live", {"#h": [ch], "kinds": [9, 9005]}])
        await m.expect("EOSE", where=lambda x: x[1] == "live")
        head = revision(world.author, d=d, h=ch)
        await accept(a, head)
        redaction = removal(world.owner, world.ch, head["id"], "spam")
        assert await ok(o, redaction) == (True, "")
        # A message and its removal after it: both reach the live REQ; the redaction before them never did.
        message = signed(world.author, 9, [["h", ch]], "later")
        await accept(a, message)
        message_removal = removal(world.author, world.ch, message["id"])
        assert await ok(a, message_removal) == (True, "")
        seen = []
        while message_removal["id"] not in seen:
            seen.append((await m.expect("EVENT", 15.0, where=lambda x: x[1] == "live"))[2]["id"])
        assert seen == [message["id"], message_removal["id"]]
        for client in (m, o, a):  # the author and the owner who sent it included: none of them reads it back
            assert await replay(client, "rp", {"#h": [ch], "kinds": [9005]}) == [message_removal["id"]]
            assert await replay(client, "ids", {"ids": [redaction["id"]]}) == []
        # Sent again, it meets the stored request: refused as any removal of what is gone, nothing new stored.
        assert (await ok(o, redaction))[0] is False
        assert await view(relay, world, world.member, {"artifact": "current", "#h": [ch]}) == []
