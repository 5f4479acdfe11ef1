"""A live REQ delivers an event only if its reader could read the channel when the event was stored.

Signals of different processes reach a node in no set order: the signal of an access change can arrive after
the signal of a message stored after that change. Each event signal carries its channel's access epoch as the
write read it (buzz.live.signals.EVENT), and a REQ whose reader's access was decided at a lower epoch, or an
event signal that carries none, decides it again before delivering (buzz.ws.req). Here the access change's
own signal is withheld altogether (tests/support/faults.py `unsignalled`): only the epoch can stop the event.
Before the epoch, the removed reader got the message.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async

from artifacts.envelope import KIND_ARTIFACT, KIND_REMOVAL
from buzz.access.policy import BANNED, NOT_ADMITTED, TOKEN_INVALID
from buzz.chat import bans, channels
from buzz.identity import communities, tokens
from buzz.live.hub import topic_for_channel
from buzz.models import ApiToken
from buzz.nostr import Signer
from tests.artifacts.write_support import accepted, message
from tests.support.factories import make_token
from tests.support.faults import next_for, unsignalled
from tests.support.wsclient import RelayClient
from tests.sync.support import RELAY_ENV, World, make_world, revision

HOST = "req-epoch.test"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


@contextlib.asynccontextmanager
async def _owner_and_reader(world: World, relay_factory: Any) -> AsyncIterator[tuple[RelayClient, RelayClient]]:
    """The owner and the reader, each authenticated on its own connection to one new relay process."""
    relay = relay_factory(**RELAY_ENV)
    async with (
        RelayClient.connect(relay.ws_url, host=HOST) as owner,
        RelayClient.connect(relay.ws_url, host=HOST) as reader,
    ):
        assert (await owner.auth(world.owner))[2] is True and (await reader.auth(world.reader))[2] is True
        yield owner, reader


async def _remove_reader_unsignalled(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader leaves channel a; no relay process hears of it."""
    await unsignalled(channels.member_remove, monkeypatch)(
        community=world.community, channel_uuid=world.a, actor=None, pubkey=world.reader.pubkey
    )


async def _live_req(reader: RelayClient, flt: dict[str, Any]) -> None:
    await reader.send_json(["REQ", "r", flt])
    while (m := await next_for(reader, "r"))[0] == "EVENT":
        pass
    assert m[0] == "EOSE", m


# Each write path that stores an event in channel a after the reader's removal: (the REQ's filter, the events the
# owner sends before the removal, the events after). A move out of a stores its 45011 in a; a wide REQ (a and b)
# gets b's message before, and must not get a's after.
def _writes(world: World) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]]:
    d = uuid.uuid4()
    create = revision(world.owner, d, world.a, "create")
    in_a = {"#h": [str(world.a)]}
    return {
        "message": ({**in_a, "kinds": [9]}, [message(world.owner, world.a)], [message(world.owner, world.a)]),
        "create": (
            {**in_a, "kinds": [KIND_ARTIFACT]},
            [create],
            [revision(world.owner, uuid.uuid4(), world.a, "create")],
        ),
        "update": (
            {**in_a, "kinds": [KIND_ARTIFACT]},
            [create],
            [revision(world.owner, d, world.a, "update", prev=create["id"])],
        ),
        "move": (
            {**in_a, "kinds": [KIND_REMOVAL]},
            [create],
            [revision(world.owner, d, world.b, "move", prev=create["id"])],
        ),
        "wide": ({"kinds": [9]}, [message(world.owner, world.b)], [message(world.owner, world.a)]),
    }


@pytest.mark.parametrize("write", ["message", "create", "update", "move", "wide"])
async def test_an_event_stored_after_an_unsignalled_removal_is_not_delivered(
    world: World, relay_factory: Any, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    flt, before, after = _writes(world)[write]
    kinds = flt["kinds"]
    async with _owner_and_reader(world, relay_factory) as (owner, reader):
        await _live_req(reader, flt)
        for event in before:
            await accepted(owner, event)
        for event in before:
            if event["kind"] in kinds:
                m = await next_for(reader, "r")
                assert m[0] == "EVENT" and m[2]["id"] == event["id"], m
        await _remove_reader_unsignalled(world, monkeypatch)
        for event in after:
            await accepted(owner, event)
        # The first thing the reader hears is the end of the REQ, not the event.
        m = await next_for(reader, "r")
        assert m[0] == "CLOSED" and m[2].startswith("restricted:"), m


async def test_an_epoch_advanced_by_another_readers_change_delays_but_delivers(
    world: World, relay_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _owner_and_reader(world, relay_factory) as (owner, reader):
        await _live_req(reader, {"#h": [str(world.a)], "kinds": [9]})
        # Someone else joins a: the epoch advances, the reader keeps its access.
        await unsignalled(channels.member_put, monkeypatch)(
            community=world.community, channel_uuid=world.a, actor=None, pubkey=Signer.generate().pubkey
        )
        sent = [await accepted(owner, message(world.owner, world.a, content=f"after {i}")) for i in range(3)]
        got = [(await next_for(reader, "r")) for _ in sent]
        assert [m[0] for m in got] == ["EVENT"] * 3 and [m[2]["id"] for m in got] == sent, got


async def _closed_not_delivered(
    world: World, owner: RelayClient, reader: RelayClient, flt: dict[str, Any], change: Callable[[], Awaitable[Any]]
) -> str:
    """The reader's live REQ gets a message stored in a before `change`; after it, the owner stores another, and
    the next thing for the REQ is its CLOSED, not that event. Returns the CLOSED's reason."""
    await _live_req(reader, flt)
    before = await accepted(owner, message(world.owner, world.a, content="before"))
    m = await next_for(reader, "r")
    assert m[0] == "EVENT" and m[2]["id"] == before, m
    await change()
    await accepted(owner, message(world.owner, world.a, content="after"))
    m = await next_for(reader, "r")
    assert m[0] == "CLOSED", m
    return str(m[2])


# Changes of a pubkey's standing in the whole community (not of one channel's members), each with the reason a
# reader who loses its standing is given.
_STANDING: dict[str, tuple[Any, str]] = {
    "ban": (bans.ban_add, BANNED),
    "relay-member-removed": (communities.member_remove, NOT_ADMITTED),
}


@pytest.mark.parametrize("flt", [{"kinds": [9]}, {"kinds": [9], "#h": ["a"]}], ids=["wide", "named"])
@pytest.mark.parametrize("change", sorted(_STANDING))
async def test_an_event_stored_after_an_unsignalled_standing_change_is_not_delivered(
    world: World, relay_factory: Any, monkeypatch: pytest.MonkeyPatch, change: str, flt: dict[str, Any]
) -> None:
    """A ban or a removal from the relay members changes no channel's members, and its signal (to the pubkey's
    topic) can come after a later message's: the community's policy stamp, part of every channel's epoch,
    stops the message."""
    service, reason = _STANDING[change]
    flt = {**flt, "#h": [str(world.a)]} if "#h" in flt else flt
    async with _owner_and_reader(world, relay_factory) as (owner, reader):
        change_standing = unsignalled(service, monkeypatch)
        closed = await _closed_not_delivered(
            world, owner, reader, flt, lambda: change_standing(community=world.community, pubkey=world.reader.pubkey)
        )
    assert closed == reason


async def test_an_event_stored_after_an_unsignalled_token_revocation_is_not_delivered(
    world: World, relay_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader's connection holds a bearer token; its revocation is the community-wide change here."""
    token = await sync_to_async(make_token)(world.community, world.reader)
    token_id = (await ApiToken.objects.aget(token_hash=tokens.hash_token(token))).pk
    relay = relay_factory(**RELAY_ENV)
    async with (
        RelayClient.connect(relay.ws_url, host=HOST) as owner,
        RelayClient.connect(relay.ws_url, host=HOST, authorization=f"Bearer {token}") as reader,
    ):
        assert (await owner.auth(world.owner))[2] is True
        revoke = unsignalled(tokens.token_revoke, monkeypatch)
        flt = {"#h": [str(world.a)], "kinds": [9]}
        closed = await _closed_not_delivered(world, owner, reader, flt, lambda: revoke(token_id=token_id))
    assert closed == TOKEN_INVALID


async def test_another_pubkeys_ban_delays_but_delivers(
    world: World, relay_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _owner_and_reader(world, relay_factory) as (owner, reader):
        await _live_req(reader, {"#h": [str(world.a)], "kinds": [9]})
        await unsignalled(bans.ban_add, monkeypatch)(community=world.community, pubkey=Signer.generate().pubkey)
        sent = [await accepted(owner, message(world.owner, world.a, content=f"after {i}")) for i in range(3)]
        got = [(await next_for(reader, "r")) for _ in sent]
        assert [m[0] for m in got] == ["EVENT"] * 3 and [m[2]["id"] for m in got] == sent, got


@pytest.mark.parametrize("removed", [False, True], ids=["reader-kept", "reader-removed"])
async def test_an_event_signal_without_an_epoch_waits_for_a_decision_made_after_it(
    world: World, relay_factory: Any, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, removed: bool
) -> None:
    """A signal from a writer that sends no epoch (an older relay, during a rolling upgrade) counts as one of a
    later epoch: the event goes out only once the reader's access has been decided after it arrived."""
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as reader:
        assert (await reader.auth(world.reader))[2] is True
        await _live_req(reader, {"#h": [str(world.a)], "kinds": [9]})
        if removed:
            await _remove_reader_unsignalled(world, monkeypatch)
        event = message(world.owner, world.a, content="no epoch")
        wire = os.environ["BUZZ_REDIS_PREFIX"] + topic_for_channel(world.community.pk, str(world.a))
        assert redis_client.publish(wire, json.dumps({"t": "event", "event": event})) == 1
        m = await next_for(reader, "r")
        if removed:
            assert m[0] == "CLOSED" and m[2].startswith("restricted:"), m
        else:
            assert m[0] == "EVENT" and m[2]["id"] == event["id"], m
