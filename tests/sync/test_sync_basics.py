"""NIP-AR sync against a real relay: the request, its scope, the initial set, live heads, 45011 delivery,
and what NIP-11 advertises (spec "Sync", rules 1-4 and 9, "Relay information document")."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.chat import channels
from tests.support.wire import http
from tests.support.wsclient import RelayClient
from tests.sync.support import RELAY_ENV, World, follow, make_world, open_sync, revision, write

HOST = "sync-basics.test"
NOT_A_MEMBER = "restricted: not a channel member"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


async def current_view(relay: Any, world: World, flt: dict[str, Any]) -> list[dict[str, Any]]:
    body = json.dumps([{**flt, "artifact": "current", "limit": 1000}]).encode()
    status, rows = await http(relay, "POST", "/query", host=HOST, signer=world.reader, body=body)
    assert status == 200, rows
    return list(rows)


async def test_initial_set_is_the_current_view_and_live_heads_keep_it(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as w, RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await w.auth(world.owner))[2] is True
        assert (await r.auth(world.reader))[2] is True
        heads: dict[str, dict[str, Any]] = {}
        for i in range(12):
            d = str(uuid.uuid4())
            home = (world.a, world.b, world.private)[i % 3]
            status = "open" if i % 2 == 0 else "done"
            ev = revision(world.owner, d, home, "create", tags=[["status", status], ["status", "ignored-second"]])
            await write(w, ev)
            heads[d] = ev
        flt = {"artifact": "current", "#h": [str(world.a), str(world.b)], "#status": ["open"], "kinds": [45010]}
        state = await open_sync(r, "s1", flt)
        assert state.eose and state.closed is None
        expected = {e["id"] for e in await current_view(relay, world, flt)}
        assert {e["id"] for e in state.heads.values()} == expected
        assert expected  # the fixture's data puts some open tasks in a and b

        # A head that stops matching is sent, and the client drops it.
        d_open = next(d for d, e in heads.items() if e["id"] in expected)
        closed = revision(world.owner, d_open, _h(heads[d_open]), "update", prev=heads[d_open]["id"],
                          tags=[["status", "done"]])  # fmt: skip
        await write(w, closed)
        heads[d_open] = closed
        await follow(r, "s1", state, lambda s: d_open not in s.heads)
        assert state.live[-1]["id"] == closed["id"]

        # A new matching artifact arrives; a non-matching one never reaches the client.
        quiet = revision(world.owner, uuid.uuid4(), world.a, "create", tags=[["status", "done"]])
        await write(w, quiet)
        fresh_d = str(uuid.uuid4())
        fresh = revision(world.owner, fresh_d, world.b, "create", tags=[["status", "open"]])
        await write(w, fresh)
        heads[fresh_d] = fresh
        await follow(r, "s1", state, lambda s: fresh_d in s.heads)
        assert quiet["id"] not in {e["id"] for e in state.live}

        # A move to a channel the reader can't read: the source's relay-signed 45011, nothing of the destination.
        moved = revision(world.owner, fresh_d, world.private, "move", prev=fresh["id"], tags=[["status", "open"]])
        await write(w, moved)
        await follow(r, "s1", state, lambda s: fresh_d not in s.heads)
        removal = state.live[-1]
        assert removal["kind"] == 45011 and removal["pubkey"] == world.community.relay_pubkey
        assert str(world.private) not in json.dumps(removal)

        # A move between two channels of the sync keeps it in the set, with the new head.
        d_a = next(d for d, e in heads.items() if _h(e) == str(world.a) and d in state.heads)
        to_b = revision(world.owner, d_a, world.b, "move", prev=heads[d_a]["id"], tags=[["status", "open"]])
        await write(w, to_b)
        await follow(r, "s1", state, lambda s: s.heads.get(d_a, {}).get("id") == to_b["id"])

        # A deletion is sent as the head; the client drops it.
        deletion = revision(world.owner, d_a, world.b, "delete", prev=to_b["id"])
        await write(w, deletion)
        await follow(r, "s1", state, lambda s: d_a not in s.heads)
        assert state.live[-1]["id"] == deletion["id"]

        # After quiescence the live-maintained set equals a fresh sync's, and the current view.
        again = await open_sync(r, "s2", flt)
        assert again.digest() == state.digest()
        assert {e["id"] for e in state.heads.values()} == {e["id"] for e in await current_view(relay, world, flt)}


def _h(event: dict[str, Any]) -> str:
    return next(t[1] for t in event["tags"] if t[0] == "h")


@pytest.mark.parametrize(
    ("flt", "reason"),
    [
        ({"artifact": "current"}, "invalid: a sync filter needs #h"),
        ({"artifact": "current", "#h": ["A"], "limit": 10}, "invalid: a sync takes no limit or offset"),
        ({"artifact": "current", "#h": ["A"], "offset": 1}, "invalid: a sync takes no limit or offset"),
        ({"artifact": "current", "#h": ["A"], "bogus": 1}, "invalid: unsupported query key"),
        ({"artifact": "current", "#h": ["A"], "kinds": [1]}, "invalid: kinds must be exactly [45010]"),
        ({"artifact": "history", "#h": ["A"]}, "invalid: the history view has no REQ form"),
        ({"artifact": "head", "#d": ["A"]}, "invalid: the head view has no REQ form"),
        ({"artifact": "nope", "#h": ["A"]}, "invalid: artifact must be one of"),
    ],
)
async def test_bad_sync_filters_are_closed_with_a_reason(
    world: World, relay_factory: Any, flt: dict[str, Any], reason: str
) -> None:
    relay = relay_factory(**RELAY_ENV)
    flt = {k: ([str(world.a)] if v == ["A"] else v) for k, v in flt.items()}
    async with RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await r.auth(world.reader))[2] is True
        await r.send_json(["REQ", "bad", flt])
        closed = await r.expect("CLOSED", where=lambda m: m[1] == "bad")
        assert closed[2].startswith(reason), closed
        # The connection keeps working.
        state = await open_sync(r, "good", {"artifact": "current", "#h": [str(world.a)]})
        assert state.eose


async def test_two_filters_and_unreadable_channels_are_refused(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await r.auth(world.reader))[2] is True
        one = {"artifact": "current", "#h": [str(world.a)]}
        await r.send_json(["REQ", "two", one, one])
        assert (await r.expect("CLOSED", where=lambda m: m[1] == "two"))[2].startswith("invalid: a sync takes exactly")
        answers = []
        for sub, channel in (("priv", world.private), ("none", uuid.uuid4()), ("bad", "not-a-uuid")):
            state = await open_sync(r, sub, {"artifact": "current", "#h": [str(world.a), str(channel)]})
            answers.append(state.closed)
        # A private channel and a missing one get the same text: no existence oracle.
        assert answers == [NOT_A_MEMBER, NOT_A_MEMBER, NOT_A_MEMBER]


async def test_membership_change_ends_the_sync_with_resync(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await r.auth(world.reader))[2] is True
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a), str(world.b)]})
        assert state.eose
        # Archive does not change reads, so it does not end the sync (checked by a later message arriving).
        await sync_to_async(channels.channel_edit)(
            community=world.community, channel_uuid=world.b, actor=None, changes={"archived": "true"}
        )
        async with RelayClient.connect(relay.ws_url, host=HOST) as w:
            assert (await w.auth(world.owner))[2] is True
            marker = revision(world.owner, uuid.uuid4(), world.a, "create")
            await write(w, marker)
            await follow(r, "s", state, lambda s: marker["id"] in {e["id"] for e in s.heads.values()})
        assert state.closed is None
        await sync_to_async(channels.member_remove)(
            community=world.community, channel_uuid=world.b, actor=None, pubkey=world.reader.pubkey
        )
        await follow(r, "s", state, lambda s: False)
        assert state.closed is not None and state.closed.startswith("resync:"), state.closed


async def test_nip11_advertises_sync(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV, BUZZ_SYNC_MAX_EVENTS="77")
    status, doc = await _nip11(relay)
    assert status == 200
    assert doc["artifacts"]["sync"] == {"version": 1, "max_events": 77}
    assert "head" in doc["artifacts"]["modes"]
    assert doc["websocket_query_extensions"] is True
    off = relay_factory(**RELAY_ENV, BUZZ_SYNC_ENABLED="0")
    status, doc = await _nip11(off)
    assert "sync" not in doc["artifacts"] and "websocket_query_extensions" not in doc
    # The spec advertises sync and head together, only when every backend runs them.
    assert doc["artifacts"]["modes"] == ["current", "history"]


async def test_a_visibility_change_of_a_named_channel_resyncs_on_every_node(world: World, relay_factory: Any) -> None:
    # Rule 9: the channel's visibility is an access change, even when this reader could still read it.
    a, b = relay_factory(**RELAY_ENV), relay_factory(**RELAY_ENV)
    flt = {"artifact": "current", "#h": [str(world.a), str(world.b)]}
    async with RelayClient.connect(a.ws_url, host=HOST) as ra, RelayClient.connect(b.ws_url, host=HOST) as rb:
        assert (await ra.auth(world.reader))[2] is True
        assert (await rb.auth(world.reader))[2] is True
        sa, sb = await open_sync(ra, "s", flt), await open_sync(rb, "s", flt)
        assert sa.eose and sb.eose
        await sync_to_async(channels.channel_edit)(
            community=world.community, channel_uuid=world.b, actor=None, changes={"visibility": "open"}
        )
        for client, state in ((ra, sa), (rb, sb)):
            await follow(client, "s", state, lambda s: False)
            assert state.closed is not None and state.closed.startswith("resync:"), state.closed


async def _nip11(relay: Any) -> tuple[int, Any]:
    import asyncio
    import http.client

    def get() -> tuple[int, Any]:
        conn = http.client.HTTPConnection(relay.host, relay.port, timeout=10)
        conn.request("GET", "/", headers={"Host": HOST, "Accept": "application/nostr+json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())

    return await asyncio.to_thread(get)


async def test_restore_deletion_and_channel_deletion_after_eose(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as w, RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await w.auth(world.owner))[2] is True
        assert (await r.auth(world.reader))[2] is True
        d = uuid.uuid4()
        created = revision(world.owner, d, world.b, "create")
        await write(w, created)
        deleted = revision(world.owner, d, world.b, "delete", prev=created["id"])
        await write(w, deleted)
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a), str(world.b)]})
        assert str(d) not in state.heads  # a deleted artifact is not in the set
        restored = revision(world.owner, d, world.b, "restore", prev=deleted["id"])
        await write(w, restored)
        await follow(r, "s", state, lambda s: s.heads.get(str(d), {}).get("id") == restored["id"])
        # Deleting a named channel: its artifacts leave every current-state result, and the sync resyncs.
        await sync_to_async(channels.channel_delete)(community=world.community, channel_uuid=world.b, actor=None)
        await follow(r, "s", state, lambda s: False)
        assert state.closed is not None and state.closed.startswith("resync:"), state.closed
        again = await open_sync(r, "again", {"artifact": "current", "#h": [str(world.a), str(world.b)]})
        assert again.closed == NOT_A_MEMBER


async def test_a_forced_retirement_resyncs_the_syncs_that_hold_it(world: World, relay_factory: Any) -> None:
    """Rule 6, with the retirement forced by hand (moderation's redaction produces it in production): the head
    row is marked retired and the retirement signal goes to the channel, as the redaction service does."""
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as w, RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await w.auth(world.owner))[2] is True
        assert (await r.auth(world.reader))[2] is True
        d = uuid.uuid4()
        created = revision(world.owner, d, world.a, "create")
        await write(w, created)
        holds = await open_sync(r, "holds", {"artifact": "current", "#h": [str(world.a)]})
        other = await open_sync(r, "other", {"artifact": "current", "#h": [str(world.b)]})
        # Same channel, but its filter never held the artifact: nothing to tell it.
        narrow = await open_sync(r, "narrow", {"artifact": "current", "#h": [str(world.a)], "#status": ["x"]})
        assert str(d) in holds.heads and other.eose and str(d) not in narrow.heads
        await sync_to_async(_retire)(world, d)
        await follow(r, "holds", holds, lambda s: False)
        assert holds.closed is not None and holds.closed.startswith("resync:"), holds.closed
        # A sync of another channel is not affected; a new sync of the first no longer has the artifact.
        marker = revision(world.owner, uuid.uuid4(), world.b, "create")
        await write(w, marker)
        await follow(r, "other", other, lambda s: marker["id"] in {e["id"] for e in s.heads.values()})
        assert other.closed is None
        in_a = revision(world.owner, uuid.uuid4(), world.a, "create", tags=[["status", "x"]])
        await write(w, in_a)
        await follow(r, "narrow", narrow, lambda s: in_a["id"] in {e["id"] for e in s.heads.values()})
        assert narrow.closed is None
        again = await open_sync(r, "again", {"artifact": "current", "#h": [str(world.a)]})
        assert str(d) not in again.heads


def _retire(world: World, d: uuid.UUID) -> None:
    """A moderation redaction of the current head (artifacts.redaction, what a 9005 runs)."""
    from django.db import transaction

    from artifacts.models import Artifact
    from artifacts.redaction import redact_events

    with transaction.atomic():
        artifact = Artifact.objects.get(community=world.community, d=d)
        assert artifact.head_id is not None
        assert redact_events(world.community.pk, [artifact.head_id]).retired == ((str(d), artifact.home),)


async def test_a_set_larger_than_max_events_is_closed_without_eose(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV, BUZZ_SYNC_MAX_EVENTS="5", BUZZ_SYNC_PAGE_ROWS="2")
    async with RelayClient.connect(relay.ws_url, host=HOST) as w, RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await w.auth(world.owner))[2] is True
        assert (await r.auth(world.reader))[2] is True
        for _ in range(5):
            await write(w, revision(world.owner, uuid.uuid4(), world.a, "create"))
        at_bound = await open_sync(r, "five", {"artifact": "current", "#h": [str(world.a)]})
        assert at_bound.eose and len(at_bound.heads) == 5
        await write(w, revision(world.owner, uuid.uuid4(), world.a, "create"))
        over = await open_sync(r, "six", {"artifact": "current", "#h": [str(world.a)]})
        # Never a partial set: no EOSE, and a reason that names the bound.
        assert not over.eose and over.closed is not None, over.closed
        assert over.closed.startswith("error:") and "max_events" in over.closed, over.closed
