"""A restore does not mention again the p tags the deleted artifact carried (issue 9, item 2).

NIP-AR: a revision MUST NOT "repeat mention or push notifications for tags carried over from the
previous revision". A deletion carries no p tags (only envelope and auth tags), so comparing a
restore with the deletion itself would mention every p tag again. New mentions are computed against
the last revision that is not a deletion. Seen from outside: each member's /api/mentions inbox.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.models import Community
from buzz.nostr import Signer
from tests.artifacts.write_support import accepted, revision
from tests.support.wire import http
from tests.support.wsclient import RelayClient

HOST = "restore-mentions.test"
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}


@dataclass
class Team:
    community: Community
    alice: Signer
    bob: Signer
    carol: Signer
    chat: uuid.UUID
    other: uuid.UUID


@pytest.fixture
def team(transactional_db: None) -> Team:
    community = community_create(host=HOST, name="Restore mentions")
    alice, bob, carol = Signer.generate(), Signer.generate(), Signer.generate()
    for s in (alice, bob, carol):
        member_add(community=community, pubkey=s.pubkey)
    chat, other = uuid.uuid4(), uuid.uuid4()
    for ch in (chat, other):
        channels.channel_create(community=community, channel_uuid=ch, name=str(ch)[:8], creator=alice.pubkey)
        for s in (bob, carol):
            channels.member_put(community=community, channel_uuid=ch, actor=None, pubkey=s.pubkey)
    return Team(community, alice, bob, carol, chat, other)


async def inbox(relay: Any, signer: Signer) -> list[str]:
    """The event ids in `signer`'s mentions inbox, newest first."""
    status, body = await http(relay, "GET", "/api/mentions", host=HOST, signer=signer)
    assert status == 200, (status, body)
    return [m["event_id"] for m in body["mentions"]] if isinstance(body, dict) else [m["event_id"] for m in body]


def p(*signers: Signer) -> list[list[str]]:
    return [["p", s.pubkey] for s in signers]


async def test_delete_then_restore_with_the_same_p_tags_mentions_nobody(
    team: Team, relay_factory: Any, redis_flush: Any
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(team.alice))[2] is True
        d = uuid.uuid4()
        created = await accepted(client, revision(team.alice, d=d, h=team.chat, op="create", extra=p(team.bob)))
        assert await inbox(relay, team.bob) == [created]
        gone = await accepted(client, revision(team.alice, d=d, h=team.chat, op="delete", prev=created))
        # The same p tag back: carried over from the last revision that was not the deletion.
        back = await accepted(
            client, revision(team.alice, d=d, h=team.chat, op="restore", prev=gone, extra=p(team.bob))
        )
        assert await inbox(relay, team.bob) == [created]
        # A p tag the live revision did not carry is new: carol is mentioned by the restore... of a second
        # delete/restore cycle, and bob still only once.
        gone = await accepted(client, revision(team.alice, d=d, h=team.chat, op="delete", prev=back))
        again = await accepted(
            client, revision(team.alice, d=d, h=team.chat, op="restore", prev=gone, extra=p(team.bob, team.carol))
        )
        assert await inbox(relay, team.bob) == [created]
        assert await inbox(relay, team.carol) == [again]


async def test_a_p_tag_dropped_before_the_delete_is_new_on_restore(
    team: Team, relay_factory: Any, redis_flush: Any
) -> None:
    """Compared with the last live revision, not with any earlier one: a p tag that revision did not
    carry is mentioned again, as for an update (tests/ws/test_artifact_counters.py)."""
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(team.alice))[2] is True
        d = uuid.uuid4()
        first = await accepted(client, revision(team.alice, d=d, h=team.chat, op="create", extra=p(team.bob)))
        dropped = await accepted(client, revision(team.alice, d=d, h=team.chat, op="update", prev=first))
        gone = await accepted(client, revision(team.alice, d=d, h=team.chat, op="delete", prev=dropped))
        back = await accepted(
            client, revision(team.alice, d=d, h=team.chat, op="restore", prev=gone, extra=p(team.bob))
        )
        assert await inbox(relay, team.bob) == [back, first]


async def test_a_move_then_delete_then_restore_keeps_the_moved_p_tags(
    team: Team, relay_factory: Any, redis_flush: Any
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(team.alice))[2] is True
        d = uuid.uuid4()
        first = await accepted(client, revision(team.alice, d=d, h=team.chat, op="create", extra=p(team.bob)))
        moved = await accepted(
            client, revision(team.alice, d=d, h=team.other, op="move", prev=first, extra=p(team.bob, team.carol))
        )
        gone = await accepted(client, revision(team.alice, d=d, h=team.other, op="delete", prev=moved))
        await accepted(
            client,
            revision(team.alice, d=d, h=team.other, op="restore", prev=gone, extra=p(team.bob, team.carol)),
        )
        assert await inbox(relay, team.bob) == [first]
        assert await inbox(relay, team.carol) == [moved]
