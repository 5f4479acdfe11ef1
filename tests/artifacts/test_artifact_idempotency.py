"""Resubmitting an accepted NIP-AR revision, against real relay processes.

The spec ("Identity and edits"): resubmitting an already accepted event succeeds without applying it
again, even if a later revision has since become current, and the response reveals nothing the
sender can no longer read. Checked here:
* after later revisions (the old event and the current one answer alike);
* after the sender lost access to the channel (removed by an owner);
* after a move to a channel the sender can't read (no second removal, head unchanged);
* on a relay whose created_at window has since become too small for the event: the duplicate is
  answered before the window, so a late retry still succeeds (and a new event that old is refused).
Each time: OK true with a `duplicate:` message, no new revision, the head unchanged, one and the
same message text whatever the current state is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from artifacts.models import Artifact, MoveRemoval, Revision
from buzz.models import Community
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, revision, signers
from tests.support.relay import start_relays
from tests.support.wire import logged_in, publish
from tests.support.wsclient import RelayClient, naming

HOST = "idempotent.test"
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}
HEAD_UNAVAILABLE = "conflict: head unavailable"
_LEAKS = re.compile(r"[0-9a-f]{64}|[0-9a-f]{8}-[0-9a-f]{4}-|Secret|buzz\.")


@dataclass
class World:
    community: Community
    alice: Signer  # owner of both channels
    bob: Signer  # member of `first` only
    first: uuid.UUID
    second: uuid.UUID


@pytest.fixture
def world(transactional_db: None) -> World:
    alice, bob = signers(2)
    community = make_community(HOST, "Idempotency", members=[alice, bob])
    first = make_channel(community, alice, visibility="private", members=[bob])
    second = make_channel(community, alice, visibility="private")
    return World(community, alice, bob, first, second)


async def accepted(client: RelayClient, event: dict[str, Any]) -> str:
    reply = await publish(client, event)
    assert reply[2] is True and reply[3] == "", reply
    return str(event["id"])


@sync_to_async
def state(community: Community, d: uuid.UUID) -> tuple[str, uuid.UUID, int, int]:
    """(head id, home, revision count, move removal count) from the database."""
    art = Artifact.objects.get(community=community, d=d)
    return (
        str(art.head_id),
        art.home,
        Revision.objects.filter(artifact=art).count(),
        MoveRemoval.objects.filter(artifact=art).count(),
    )


def duplicate_reply(reply: list[Any], event: dict[str, Any]) -> str:
    assert reply[1] == event["id"] and reply[2] is True, reply
    message = str(reply[3])
    assert message.startswith("duplicate:"), reply
    assert not _LEAKS.search(message), message
    return message


async def test_resubmission_after_later_revisions(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay, other = await start_relays(relay_factory, RELAY_ENV, RELAY_ENV)
    d = uuid.uuid4()
    now = int(time.time())
    # Timestamps choose nothing: each revision is older than the one before it.
    c = revision(world.alice, d=d, h=world.first, op="create", created_at=now + 600)
    u1 = revision(world.alice, d=d, h=world.first, op="update", prev=c["id"], created_at=now)
    u2 = revision(world.alice, d=d, h=world.first, op="update", prev=u1["id"], created_at=now - 600)
    async with logged_in(relay, world.alice, host=HOST) as alice:
        for e in (c, u1, u2):
            await accepted(alice, e)
        before = await state(world.community, d)
        assert before == (u2["id"], world.first, 3, 0)
        messages = {duplicate_reply(await publish(alice, e), e) for e in (c, u1, u2, c)}
        assert len(messages) == 1, messages
        assert await state(world.community, d) == before
    # A client that lost its connection (and the acknowledgement) retries on a new one, on another node.
    async with logged_in(other, world.alice, host=HOST) as again:
        assert duplicate_reply(await publish(again, u1), u1) in messages
        # A different event on a stale prev is a conflict, not a duplicate.
        stale = revision(world.alice, d=d, h=world.first, op="update", prev=u1["id"])
        reply = await publish(again, stale)
        assert reply[2] is False and reply[3].startswith("conflict: head changed"), reply
        assert await state(world.community, d) == before


async def test_resubmission_after_losing_access(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    d = uuid.uuid4()
    async with logged_in(relay, world.alice, host=HOST) as alice, logged_in(relay, world.bob, host=HOST) as bob:
        c = revision(world.bob, d=d, h=world.first, op="create")
        await accepted(bob, c)
        u1 = revision(world.alice, d=d, h=world.first, op="update", prev=c["id"], title="Secret plan")
        await accepted(alice, u1)
        # The owner removes bob from the channel (NIP-29 9001).
        remove = world.alice.sign_event(
            kind=9001, tags=[["h", str(world.first)], ["p", world.bob.pubkey]], content="", created_at=int(time.time())
        ).to_dict()
        assert (await publish(alice, remove))[2] is True
        before = await state(world.community, d)
        assert before == (u1["id"], world.first, 2, 0)
        message = duplicate_reply(await publish(bob, c), c)
        assert await state(world.community, d) == before
        # Control: a new edit by bob is refused like an edit of a missing artifact.
        edit = revision(world.bob, d=d, h=world.first, op="update", prev=u1["id"])
        assert (await publish(bob, edit))[2:] == [False, HEAD_UNAVAILABLE]
        # Alice's resubmission of the current head gets the very same text.
        assert duplicate_reply(await publish(alice, u1), u1) == message
        assert await state(world.community, d) == before


async def test_resubmission_after_move(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    d = uuid.uuid4()
    async with logged_in(relay, world.alice, host=HOST) as alice, logged_in(relay, world.bob, host=HOST) as bob:
        c = revision(world.bob, d=d, h=world.first, op="create")
        await accepted(bob, c)
        # Alice moves it to the channel bob is not in.
        m = revision(world.alice, d=d, h=world.second, op="move", prev=c["id"], title="Secret plan")
        await accepted(alice, m)
        before = await state(world.community, d)
        assert before == (m["id"], world.second, 2, 1)
        message = duplicate_reply(await publish(bob, c), c)
        assert duplicate_reply(await publish(alice, m), m) == message
        # Nothing applied again: no third revision, no second removal, the head and home unchanged.
        assert await state(world.community, d) == before
        # Bob, who can't read the destination, can't edit it either: the missing-artifact answer.
        edit = revision(world.bob, d=d, h=world.first, op="update", prev=c["id"])
        assert (await publish(bob, edit))[2:] == [False, HEAD_UNAVAILABLE]


async def test_old_resubmission_outside_the_window(world: World, relay_factory: Any, redis_flush: Any) -> None:
    # The second node's window is 60 s; the first one's is the default 900 s.
    wide, narrow = await start_relays(relay_factory, RELAY_ENV, {"BUZZ_CREATED_AT_PAST": "60", **RELAY_ENV})
    d = uuid.uuid4()
    old = revision(world.alice, d=d, h=world.first, op="create", created_at=int(time.time()) - 800)
    async with logged_in(wide, world.alice, host=HOST) as alice:
        await accepted(alice, old)
    before = await state(world.community, d)
    # On the node whose window is 60 s: the event is 800 s old, yet its resubmission succeeds.
    async with logged_in(narrow, world.alice, host=HOST) as alice:
        duplicate_reply(await publish(alice, old), old)
        assert await state(world.community, d) == before
        # Control: a new event just as old is refused by that node's window.
        fresh = revision(
            world.alice, d=d, h=world.first, op="update", prev=old["id"], created_at=int(time.time()) - 800
        )
        reply = await publish(alice, fresh)
        assert reply[2:] == [False, "invalid: created_at is more than 60 seconds in the past"], reply
        assert await state(world.community, d) == before


async def test_concurrent_resubmissions_of_one_event(world: World, relay_factory: Any, redis_flush: Any) -> None:
    """A client that retries on other connections while the first attempt is still in flight: the copies
    race each other, yet exactly one applies it and every other copy is a duplicate, never a conflict."""
    relays = await start_relays(relay_factory, RELAY_ENV, RELAY_ENV)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(logged_in(relays[i % 2], world.alice, host=HOST)) for i in range(10)]
        for round_no in range(3):
            d = uuid.uuid4()
            chain = [revision(world.alice, d=d, h=world.first, op="create")]
            chain.append(revision(world.alice, d=d, h=world.first, op="update", prev=chain[-1]["id"]))
            chain.append(revision(world.alice, d=d, h=world.second, op="move", prev=chain[-1]["id"]))
            chain.append(revision(world.alice, d=d, h=world.second, op="delete", prev=chain[-1]["id"]))
            for event in chain:
                frame = json.dumps(["EVENT", event])
                await asyncio.gather(*(c.ws.send(frame) for c in clients))
                replies = await asyncio.gather(*(c.expect("OK", where=naming(event["id"])) for c in clients))
                answers = sorted((r[2], r[3].split(":")[0]) for r in replies)
                want = sorted([(True, "")] + [(True, "duplicate")] * (len(clients) - 1))
                assert answers == want, (round_no, event["tags"][-2:], replies)
            head, home, count, removals = await state(world.community, d)
            assert (head, home, count, removals) == (chain[-1]["id"], world.second, 4, 1)
