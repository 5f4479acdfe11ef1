"""NIP-AR revisions are state changes, not conversation messages ("Current state and queries", last paragraph).

Against a real relay process, with kind-9 messages and artifact revisions in the same channels:
* no revision (create, update, move, delete, restore; by members with and without unread messages;
  attached with root to a thread) changes a channel's message count, a thread's reply count or any
  member's unread count, read over HTTP with NIP-98 and with a bearer token; a kind-9 reply afterwards
  still moves them (the control that makes "unchanged" mean something);
* mentions: a create mentions its p tags; a later revision mentions only p tags the previous revision
  did not carry. Decision from the spec text ("MUST NOT ... repeat mention or push notifications for
  tags carried over from the previous revision"): a p tag removed in one revision and added again in
  the next is not carried over from the previous revision, so it is mentioned again. The author is
  never mentioned, a p tag repeated in one revision is mentioned once, and a move or an edit that
  keeps the same p tags mentions nobody.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.models import Community, Mention
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, make_token, message, revision, signers
from tests.support.wire import Logins, accept, http
from tests.support.wsclient import RelayClient

HOST = "artifact-counters.test"
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}


@dataclass
class Team:
    community: Community
    alice: Signer  # owner of both channels
    bob: Signer
    carol: Signer
    chat: uuid.UUID  # private; all three members
    other: uuid.UUID  # open; all three members
    bob_token: str  # messages:read + messages:write


@pytest.fixture
def team(transactional_db: None) -> Team:
    alice, bob, carol = signers(3)
    community = make_community(HOST, "Artifact counters", members=[alice, bob, carol])
    chat = make_channel(community, alice, visibility="private", name="c", members=[bob, carol])
    other = make_channel(community, alice, name="o", members=[bob, carol])
    token = make_token(community, bob, ["messages:read", "messages:write"])
    return Team(community, alice, bob, carol, chat, other, token)


async def get(relay: Any, path: str, *, signer: Signer | None = None, token: str | None = None) -> Any:
    authorization = RelayClient.bearer(token) if token else None
    status, body = await http(relay, "GET", path, host=HOST, signer=signer, authorization=authorization)
    assert status == 200, (path, status, body)
    return body


async def snapshot(relay: Any, team: Team, roots: list[str]) -> dict[str, Any]:
    """Every counter the members can read: per channel, per thread, and /api/unread, per member."""
    readers: list[tuple[str, dict[str, Any]]] = [
        ("alice", {"signer": team.alice}),
        ("bob", {"token": team.bob_token}),
        ("bob-nip98", {"signer": team.bob}),
        ("carol", {"signer": team.carol}),
    ]
    paths: list[tuple[str, str, dict[str, Any]]] = []
    for name, cred in readers:
        paths += [(f"{name} {ch}", f"/api/channels/{ch}/counts", cred) for ch in (team.chat, team.other)]
        paths += [(f"{name} thread {r}", f"/api/channels/{team.chat}/threads/{r}", cred) for r in roots]
        paths.append((f"{name} unread", "/api/unread", cred))
    bodies = await asyncio.gather(*(get(relay, path, **cred) for _, path, cred in paths))
    return {key: body for (key, _, _), body in zip(paths, bodies, strict=True)}


async def test_revisions_leave_every_counter_alone(team: Team, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    clients = Logins(relay, HOST)
    try:
        alice, bob, carol = [await clients(s) for s in (team.alice, team.bob, team.carol)]
        m1 = await accept(alice, message(team.alice, team.chat))
        r1 = await accept(bob, message(team.bob, team.chat, root=m1))
        await accept(carol, message(team.carol, team.chat))
        await accept(carol, message(team.carol, team.other))
        before = await snapshot(relay, team, [m1, r1])
        # The setup is what the assertions below rely on: unread messages for alice and bob, a thread of one.
        assert before[f"alice {team.chat}"] == {"channel": str(team.chat), "messages": 3, "member": True, "unread": 2}
        assert before[f"bob {team.chat}"]["unread"] == 1 and before[f"carol {team.chat}"]["unread"] == 0
        assert before[f"bob {team.other}"]["unread"] == 1
        assert before[f"carol thread {m1}"]["replies"] == 1

        d, e = uuid.uuid4(), uuid.uuid4()
        steps: list[tuple[RelayClient, Signer, dict[str, Any]]] = []
        head = None

        async def step(client: RelayClient, signer: Signer, **fields: Any) -> None:
            nonlocal head
            head = await accept(client, revision(signer, d=d, prev=head, **fields))
            steps.append((client, signer, fields))
            assert await snapshot(relay, team, [m1, r1]) == before, f"after {fields['op']} by {signer.pubkey[:8]}"

        # Attached to m1's thread, by a member with unread messages, mentioning the others.
        await step(bob, team.bob, h=team.chat, op="create", root=m1, p=[team.alice.pubkey, team.carol.pubkey])
        await step(alice, team.alice, h=team.chat, op="update", root=m1)
        await step(carol, team.carol, h=team.chat, op="update", root=r1)  # re-attached to another message
        await step(bob, team.bob, h=team.other, op="move")
        await step(alice, team.alice, h=team.other, op="update")
        await step(bob, team.bob, h=team.other, op="delete")
        await step(carol, team.carol, h=team.other, op="restore")
        # A second artifact on the same thread root, created and edited in the chat channel.
        first = await accept(bob, revision(team.bob, d=e, h=team.chat, op="create", root=m1))
        await accept(bob, revision(team.bob, d=e, h=team.chat, op="update", root=m1, prev=first))
        assert await snapshot(relay, team, [m1, r1]) == before

        # Control: a kind-9 reply does move the counters the revisions left alone.
        await accept(carol, message(team.carol, team.chat, root=m1))
        after = await snapshot(relay, team, [m1, r1])
        assert after[f"alice thread {m1}"]["replies"] == 2
        assert after[f"alice {team.chat}"]["messages"] == 4 and after[f"alice {team.chat}"]["unread"] == 3
        assert after[f"bob {team.chat}"]["unread"] == 2 and after[f"carol {team.chat}"]["unread"] == 0
    finally:
        await clients.close()


@sync_to_async
def mentions_of(event_id: str) -> list[tuple[str, str, int]]:
    rows = Mention.objects.filter(event_id=event_id).order_by("pubkey")
    return [(m.pubkey, str(m.channel_id), m.kind) for m in rows]


async def test_mentions_only_for_newly_added_p_tags(team: Team, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    clients = Logins(relay, HOST)
    try:
        alice, bob = await clients(team.alice), await clients(team.bob)
        a, b, c = team.alice.pubkey, team.bob.pubkey, team.carol.pubkey
        d = uuid.uuid4()
        chat, other = str(team.chat), str(team.other)

        def mentioned(*pubkeys: str, channel: str = chat) -> list[tuple[str, str, int]]:
            return sorted((pk, channel, 45010) for pk in pubkeys)

        # Create: its p tags, once each, never the author (alice names herself too).
        rev = await accept(alice, revision(team.alice, d=d, h=team.chat, op="create", p=[b, b, a]))
        assert await mentions_of(rev) == mentioned(b)
        # p=bob kept, p=carol added: carol only.
        rev = await accept(alice, revision(team.alice, d=d, h=team.chat, op="update", prev=rev, p=[b, c]))
        assert await mentions_of(rev) == mentioned(c)
        # The same tags again, by someone else: nobody.
        rev = await accept(bob, revision(team.bob, d=d, h=team.chat, op="update", prev=rev, p=[c, b]))
        assert await mentions_of(rev) == []
        # bob removed: nobody.
        rev = await accept(alice, revision(team.alice, d=d, h=team.chat, op="update", prev=rev, p=[c]))
        assert await mentions_of(rev) == []
        # bob added again: the previous revision did not carry him, so he is mentioned again; carol is not.
        rev = await accept(alice, revision(team.alice, d=d, h=team.chat, op="update", prev=rev, p=[c, b]))
        assert await mentions_of(rev) == mentioned(b)
        # A move keeping both tags: nobody, in either channel.
        rev = await accept(alice, revision(team.alice, d=d, h=team.other, op="move", prev=rev, p=[b, c]))
        assert await mentions_of(rev) == []
        # bob, the author now, is never mentioned; alice, newly added, is (in the destination channel).
        rev = await accept(bob, revision(team.bob, d=d, h=team.other, op="update", prev=rev, p=[b, c, a]))
        assert await mentions_of(rev) == mentioned(a, channel=other)
        # Nothing else was ever recorded for this artifact's revisions.
        total = await sync_to_async(lambda: Mention.objects.filter(kind=45010).count())()
        assert total == 4
    finally:
        await clients.close()
