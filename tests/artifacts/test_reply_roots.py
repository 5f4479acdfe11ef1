"""A kind-9 reply can't have an artifact revision as its thread root (issue 9, item 7).

NIP-AR: "Replies belong to that conversation, not to an artifact revision." A kind-9 message whose
NIP-10 root (["e", id, relay, "root"]) is a kind-45010 revision, or the kind-45011 removal a move
left in its source channel, is refused with an `invalid:` reason: nothing is stored, no counter
moves. Seen from outside: the OK, a REQ by id, and the HTTP channel, thread and unread counters.
Non-disclosure: a root that is a revision in a channel the sender can't read is answered like an
unknown root (accepted, and counted nowhere).
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
from tests.artifacts.write_support import accepted, message, revision, send
from tests.support.wire import http, query
from tests.support.wsclient import RelayClient

HOST = "reply-roots.test"
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}


@dataclass
class Team:
    community: Community
    alice: Signer  # owner
    bob: Signer  # member of chat and other, not of secret
    chat: uuid.UUID
    other: uuid.UUID
    secret: uuid.UUID  # private, alice only


@pytest.fixture
def team(transactional_db: None) -> Team:
    community = community_create(host=HOST, name="Reply roots")
    alice, bob = Signer.generate(), Signer.generate()
    for s in (alice, bob):
        member_add(community=community, pubkey=s.pubkey)
    chat, other, secret = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for ch in (chat, other):
        channels.channel_create(community=community, channel_uuid=ch, name=str(ch)[:8], creator=alice.pubkey)
        channels.member_put(community=community, channel_uuid=ch, actor=None, pubkey=bob.pubkey)
    channels.channel_create(
        community=community, channel_uuid=secret, name="secret", creator=alice.pubkey, visibility="private"
    )
    return Team(community, alice, bob, chat, other, secret)


async def counts(relay: Any, team: Team, channel: uuid.UUID, roots: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in (
        f"/api/channels/{channel}/counts",
        "/api/unread",
        *(f"/api/channels/{channel}/threads/{r}" for r in roots),
    ):
        status, body = await http(relay, "GET", path, host=HOST, signer=team.alice)
        assert status == 200, (path, status, body)
        out[path] = body
    return out


async def test_a_reply_rooted_at_a_revision_or_a_removal_is_refused(
    team: Team, relay_factory: Any, redis_flush: Any
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with (
        RelayClient.connect(relay.ws_url, host=HOST) as alice,
        RelayClient.connect(relay.ws_url, host=HOST) as bob,
    ):
        assert (await alice.auth(team.alice))[2] is True
        assert (await bob.auth(team.bob))[2] is True
        d = uuid.uuid4()
        created = await accepted(alice, revision(team.alice, d=d, h=team.chat, op="create"))
        updated = await accepted(alice, revision(team.alice, d=d, h=team.chat, op="update", prev=created))
        moved = await accepted(alice, revision(team.alice, d=d, h=team.other, op="move", prev=updated))
        # The relay-signed removal the move stored in the source channel.
        _, removals = await query(alice, "rm", {"kinds": [45011], "#h": [str(team.chat)]})
        assert len(removals) == 1, removals
        removal = removals[0]["id"]
        roots = {"create": (created, team.chat), "update": (updated, team.chat), "move": (moved, team.other)}
        roots["removal"] = (removal, team.chat)
        both = (team.chat, team.other)
        before = {ch: await counts(relay, team, ch, [r for r, c in roots.values() if c == ch]) for ch in both}
        for name, (root, channel) in roots.items():
            reply = message(team.bob, channel, root=root)
            answer = await send(bob, reply)
            assert answer[2] is False and answer[3].startswith("invalid:"), (name, answer)
            assert "conversation" in answer[3], answer
            _, found = await query(bob, "id", {"ids": [reply["id"]]})
            assert found == [], (name, found)
        after = {ch: await counts(relay, team, ch, [r for r, c in roots.values() if c == ch]) for ch in both}
        assert after == before
        # Control: a reply to a kind-9 message in the same channel is accepted and counted.
        anchor = await accepted(alice, message(team.alice, team.chat))
        await accepted(bob, message(team.bob, team.chat, root=anchor))
        thread = await counts(relay, team, team.chat, [anchor])
        assert thread[f"/api/channels/{team.chat}/threads/{anchor}"]["replies"] == 1


async def test_a_revision_root_the_sender_cannot_read_is_answered_like_an_unknown_root(
    team: Team, relay_factory: Any, redis_flush: Any
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with (
        RelayClient.connect(relay.ws_url, host=HOST) as alice,
        RelayClient.connect(relay.ws_url, host=HOST) as bob,
    ):
        assert (await alice.auth(team.alice))[2] is True
        assert (await bob.auth(team.bob))[2] is True
        hidden = await accepted(alice, revision(team.alice, d=uuid.uuid4(), h=team.secret, op="create"))
        unknown = "ab" * 32
        answers = []
        for root in (hidden, unknown):
            answers.append((await send(bob, message(team.bob, team.chat, root=root)))[2:])
        assert answers == [[True, ""], [True, ""]]
        counted = await counts(relay, team, team.chat, [hidden, unknown])
        assert counted[f"/api/channels/{team.chat}/threads/{hidden}"]["replies"] == 0
        assert counted[f"/api/channels/{team.chat}/threads/{unknown}"]["replies"] == 0
