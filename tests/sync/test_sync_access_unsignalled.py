"""NIP-AR Access: "Membership and visibility changes take effect on subsequent reads and deliveries", also
before the change's signal has reached the sync.

An access change and a later artifact change are published by different processes, and Redis orders no
two publishers' messages: a sync can hear of the edit first and read a head written after its reader
lost access. Every head a sync reads carries its channel's access epoch (advanced by every membership,
visibility and deletion change) and the community's policy stamp (bans, relay members, admission,
tokens); a head read with values the sync has not decided on goes out only after the reader's access is
checked again. Here the access change's signal is withheld from the relay altogether (the test's own
process does not publish it), which is the delayed signal at its worst.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.chat import channels
from buzz.nostr import Signer
from tests.support.factories import admit
from tests.support.faults import unsignalled
from tests.support.wsclient import RelayClient
from tests.sync.support import RELAY_ENV, World, follow, make_world, open_sync, revision, write

HOST = "sync-unsignalled.test"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


async def _synced(world: World, relay_factory: Any, d: uuid.UUID) -> tuple[Any, Any, Any, dict[str, Any]]:
    """A relay; the owner's artifact d in channel a; the reader's sync of a holding it. Returns (owner's
    client, reader's client, the reader's sync state, d's create) with the clients' contexts to leave."""
    relay = relay_factory(**RELAY_ENV)
    stack = contextlib.AsyncExitStack()
    owner = await stack.enter_async_context(RelayClient.connect(relay.ws_url, host=HOST))
    reader = await stack.enter_async_context(RelayClient.connect(relay.ws_url, host=HOST))
    assert (await owner.auth(world.owner))[2] is True and (await reader.auth(world.reader))[2] is True
    first = revision(world.owner, d, world.a, "create")
    await write(owner, first)
    state = await open_sync(reader, "s", {"artifact": "current", "#h": [str(world.a)]})
    assert state.eose and set(state.heads) == {str(d)}
    return stack, (owner, reader), state, first


async def test_a_head_written_after_the_reader_lost_access_is_not_sent(
    world: World, relay_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = uuid.uuid4()
    stack, (owner, reader), state, first = await _synced(world, relay_factory, d)
    async with stack:
        await unsignalled(channels.member_remove, monkeypatch)(
            community=world.community, channel_uuid=world.a, actor=None, pubkey=world.reader.pubkey
        )
        await write(owner, revision(world.owner, d, world.a, "update", prev=first["id"], content='{"secret":1}'))

        await follow(reader, "s", state, lambda s: bool(s.live))  # the head written after, or the CLOSED
        assert state.live == [], "a head written after the reader lost access was sent"
        assert state.closed is not None and state.closed.startswith("resync:"), state.closed


async def test_another_members_unsignalled_change_costs_a_check_not_the_sync(
    world: World, relay_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = uuid.uuid4()
    newcomer = Signer.generate()
    await sync_to_async(admit)(world.community, newcomer)
    stack, (owner, reader), state, first = await _synced(world, relay_factory, d)
    async with stack:
        await unsignalled(channels.member_put, monkeypatch)(
            community=world.community, channel_uuid=world.a, actor=None, pubkey=newcomer.pubkey
        )
        second = revision(world.owner, d, world.a, "update", prev=first["id"])
        await write(owner, second)
        await follow(reader, "s", state, lambda s: bool(s.live))
        assert state.closed is None and state.heads[str(d)]["id"] == second["id"]
        # Decided once: the next head goes out without another check, and the sync goes on.
        third = revision(world.owner, d, world.a, "update", prev=second["id"])
        await write(owner, third)
        await follow(reader, "s", state, lambda s: len(s.live) == 2)
        assert state.closed is None and state.heads[str(d)]["id"] == third["id"]


# --- the decision, with the head reader and the access check held by the test (pure logic) ---------------


def _checked_sync(allowed: bool) -> tuple[Any, Any, uuid.UUID, list[uuid.UUID]]:
    from tests.sync.test_sync_retire_race import HeldReader, Host, live_sync

    host, reader, channel = Host(), HeldReader(), uuid.uuid4()
    sync = live_sync(host, channel, reader)
    sync._access = {str(channel): (3, 1)}
    checked: list[uuid.UUID] = []

    async def can_read(ch: uuid.UUID) -> bool:
        checked.append(ch)
        return allowed

    sync._can_read = can_read  # type: ignore[method-assign,assignment]
    return sync, host, channel, checked


@pytest.mark.asyncio
@pytest.mark.parametrize("allowed", [True, False])
async def test_a_change_to_who_reads_during_the_snapshot_is_checked_before_eose(allowed: bool) -> None:
    sync, host, channel, checked = _checked_sync(allowed)
    assert await sync._access_held({str(channel): (3, 1)}) is True and checked == []  # unchanged: no check
    assert await sync._access_held({str(channel): (4, 1)}) is allowed and checked == [channel]
    if allowed:
        assert sync._access[str(channel)] == (4, 1) and host.closed == []
    else:
        assert len(host.closed) == 1 and host.closed[0].startswith("resync: ")


@pytest.mark.asyncio
@pytest.mark.parametrize("allowed", [True, False])
async def test_a_head_read_with_a_new_policy_stamp_waits_for_the_check(allowed: bool) -> None:
    from artifacts.sync import _RECHECK
    from tests.sync.test_sync_retire_race import head

    sync, host, channel, checked = _checked_sync(allowed)
    d = str(uuid.uuid4())
    sync._access[str(channel)] = (0, 0)
    assert sync._render(d, head(d, channel, seq=5)) is not _RECHECK  # the values the sync decided on
    stamped = head(d, channel, seq=6)
    object.__setattr__(stamped, "access", (0, 1))  # a ban, say, elsewhere in the community
    assert sync._render(d, stamped) is _RECHECK and checked == []
    text = await sync._recheck(d, stamped)
    assert checked == [channel]
    if allowed:
        assert text is not None and stamped.raw in text and sync._access[str(channel)] == (0, 1)
    else:
        assert text is None and host.closed[0].startswith("resync: ")
