"""A move's write permission in its destination is checked where a kind-9 message's is (NIP-AR Access: "Relays
apply these checks the same way, and at the same point, as for a kind-9 message"; "Move: Write in both source
and destination"): before anything about the artifact or the edit, as the source's is. A move that is also
stale, or of a deleted artifact, into a destination the sender may not post in is refused for the destination,
with the kind-9 reason, through the real write path (buzz.events.ingest, in-process, on the test database)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.chat import channels
from buzz.events.ingest import ingest
from buzz.identity.actor import Actor
from buzz.models import Community
from buzz.nostr import Signer
from buzz.runtime import runtime
from tests.support.factories import make_channel, make_community, revision
from tests.support.inprocess import actor_of

HOST = "move-permission.test"
ARCHIVED = "invalid: channel is archived"
NOT_A_MEMBER = "restricted: not a channel member"
HEAD_CHANGED_PREFIX = "conflict:"


@pytest.fixture
def world(transactional_db: None, settings: Any) -> tuple[Community, Signer, Signer, dict[str, uuid.UUID]]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    alice, bob = Signer.generate(), Signer.generate()
    community = make_community(HOST, members=[alice, bob])
    home = make_channel(community, alice, visibility="private")
    archived = make_channel(community, alice, visibility="private")
    closed = make_channel(community, bob, visibility="private")  # alice is not a member
    channels.channel_edit(community=community, channel_uuid=archived, actor=None, changes={"archived": "true"})
    return community, alice, bob, {"home": home, "archived": archived, "closed": closed}


async def _write(actor: Actor, event: dict[str, Any]) -> tuple[bool, str]:
    _, result = await ingest(actor, event)
    return result.ok, result.message


async def test_a_moves_destination_is_refused_before_its_prev_or_the_artifacts_state(
    world: tuple[Community, Signer, Signer, dict[str, uuid.UUID]],
) -> None:
    community, alice, _, ch = world
    writer = await sync_to_async(actor_of)(community, alice)
    try:
        live, gone = uuid.uuid4(), uuid.uuid4()
        created = revision(alice, d=live, h=ch["home"])
        assert await _write(writer, created) == (True, "")
        to_delete = revision(alice, d=gone, h=ch["home"])
        assert (await _write(writer, to_delete))[0]
        deletion = revision(alice, d=gone, h=ch["home"], op="delete", prev=to_delete["id"])
        assert (await _write(writer, deletion))[0]
        stale = "ab" * 32
        for destination, reason in ((ch["archived"], ARCHIVED), (ch["closed"], NOT_A_MEMBER)):
            # A stale prev, and a deleted artifact (only restore is accepted): the destination answers.
            assert await _write(writer, revision(alice, d=live, h=destination, op="move", prev=stale)) == (
                False,
                reason,
            )
            moved_deleted = revision(alice, d=gone, h=destination, op="move", prev=deletion["id"])
            assert await _write(writer, moved_deleted) == (False, reason)
        # With a destination that takes the write, the edit's own rules answer.
        other = await sync_to_async(make_channel)(community, alice, visibility="private")
        ok, reason = await _write(writer, revision(alice, d=live, h=other, op="move", prev=stale))
        assert not ok and reason.startswith(HEAD_CHANGED_PREFIX), reason
        assert await _write(writer, revision(alice, d=live, h=other, op="move", prev=created["id"])) == (True, "")
    finally:
        await runtime.aclose()
