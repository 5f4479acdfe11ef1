"""One signed event, two communities on one relay (issue 9, item 8).

Communities are separate workspaces selected by Host. A client may send the same signed event to
two of them (a bridge, a user in both with the same channel UUIDs). Each must accept it and keep its
own copy: stored events and revisions are keyed by (community, id), and so is everything found by
event id: the tag index, the artifact head pointer, move removals, mentions, thread counts, the
duplicate check on resubmission, and NIP-29 kind-9005 removal.
"""

from __future__ import annotations

import json
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

HOSTS = ("one.test", "two.test")
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}


@dataclass
class World:
    communities: dict[str, Community]
    alice: Signer  # owner of the channels in both
    bob: Signer  # member of both
    chat: uuid.UUID  # the same channel UUID in both communities
    other: uuid.UUID


@pytest.fixture
def world(transactional_db: None) -> World:
    alice, bob = Signer.generate(), Signer.generate()
    chat, other = uuid.uuid4(), uuid.uuid4()
    communities = {}
    for host in HOSTS:
        community = community_create(host=host, name=host)
        for s in (alice, bob):
            member_add(community=community, pubkey=s.pubkey)
        for ch in (chat, other):
            channels.channel_create(community=community, channel_uuid=ch, name=str(ch)[:8], creator=alice.pubkey)
            channels.member_put(community=community, channel_uuid=ch, actor=None, pubkey=bob.pubkey)
        communities[host] = community
    return World(communities, alice, bob, chat, other)


class Both:
    """A NIP-42 connection of one signer to each community."""

    def __init__(self, relay: Any, signer: Signer) -> None:
        self.relay, self.signer = relay, signer
        self.clients: dict[str, RelayClient] = {}
        self._cms: list[Any] = []

    async def __aenter__(self) -> Both:
        for host in HOSTS:
            cm = RelayClient.connect(self.relay.ws_url, host=host)
            client = await cm.__aenter__()
            self._cms.append(cm)
            ok = await client.auth(self.signer)
            assert ok[2] is True, ok
            self.clients[host] = client
        return self

    async def __aexit__(self, *exc: object) -> None:
        for cm in self._cms:
            await cm.__aexit__(None, None, None)

    async def everywhere(self, event: dict[str, Any]) -> list[list[Any]]:
        return [await send(self.clients[host], event) for host in HOSTS]


async def get(relay: Any, host: str, signer: Signer, path: str) -> Any:
    status, body = await http(relay, "GET", path, host=host, signer=signer)
    assert status == 200, (host, path, status, body)
    return body


async def view(relay: Any, host: str, signer: Signer, filt: dict[str, Any]) -> list[dict[str, Any]]:
    status, body = await http(relay, "POST", "/query", host=host, signer=signer, body=json.dumps([filt]).encode())
    assert status == 200, (host, filt, status, body)
    assert isinstance(body, list)
    return body


async def test_the_same_kind_9_message_in_two_communities(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with Both(relay, world.alice) as alice, Both(relay, world.bob) as bob:
        root = message(world.alice, world.chat, extra=[["t", "shared"], ["p", world.bob.pubkey]])
        assert await alice.everywhere(root) == [["OK", root["id"], True, ""]] * 2
        # Resubmission is a duplicate in each community, judged in that community alone.
        for answer in await alice.everywhere(root):
            assert answer[2] is True and answer[3].startswith("duplicate:"), answer
        reply = message(world.bob, world.chat, root=root["id"])
        assert await bob.everywhere(reply) == [["OK", reply["id"], True, ""]] * 2
        for host in HOSTS:
            client = bob.clients[host]
            # The tag index: #t and #e find each community's own copy.
            _, found = await query(client, "t", {"#t": ["shared"]})
            assert [e["id"] for e in found] == [root["id"]], host
            _, found = await query(client, "e", {"#e": [root["id"]]})
            assert [e["id"] for e in found] == [reply["id"]], host
            thread = await get(relay, host, world.bob, f"/api/channels/{world.chat}/threads/{root['id']}")
            assert thread["replies"] == 1, host
            counts = await get(relay, host, world.bob, f"/api/channels/{world.chat}/counts")
            assert counts["messages"] == 2, (host, counts)
            inbox = await get(relay, host, world.bob, "/api/mentions")
            assert [m["event_id"] for m in inbox["mentions"]] == [root["id"]], host
        # NIP-29 removal in the first community withholds its copy only.
        removal = world.alice.sign_event(kind=9005, tags=[["h", str(world.chat)], ["e", root["id"]]], content="")
        await accepted(alice.clients[HOSTS[0]], removal.to_dict())
        gone = [await query(bob.clients[host], "id", {"ids": [root["id"]]}) for host in HOSTS]
        assert [len(events) for _, events in gone] == [0, 1]
        # ... and the 9005 itself is stored in the first community only (it was sent there only).
        _, found = await query(alice.clients[HOSTS[1]], "rm", {"kinds": [9005]})
        assert found == []


async def test_the_same_revisions_in_two_communities(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with Both(relay, world.alice) as alice:
        d = uuid.uuid4()
        anchor = message(world.alice, world.chat)
        assert [r[2] for r in await alice.everywhere(anchor)] == [True, True]
        steps = []
        mention = [["p", world.bob.pubkey]]
        create = revision(world.alice, d=d, h=world.chat, op="create", root=anchor["id"], extra=mention)
        steps.append(create)
        steps.append(revision(world.alice, d=d, h=world.chat, op="update", prev=create["id"], root=anchor["id"]))
        steps.append(revision(world.alice, d=d, h=world.other, op="move", prev=steps[-1]["id"]))
        steps.append(revision(world.alice, d=d, h=world.other, op="delete", prev=steps[-1]["id"]))
        steps.append(revision(world.alice, d=d, h=world.other, op="restore", prev=steps[-1]["id"]))
        for step in steps:
            assert await alice.everywhere(step) == [["OK", step["id"], True, ""]] * 2, step["tags"]
        # Resubmitting any accepted revision is a duplicate in each community.
        for step in steps:
            for reply in await alice.everywhere(step):
                assert reply[2] is True and reply[3].startswith("duplicate:"), reply
        # A late edit against an old head is a conflict in each.
        late = revision(world.alice, d=d, h=world.chat, op="update", prev=create["id"])
        for reply in await alice.everywhere(late):
            assert reply[2] is False and reply[3].startswith("conflict:"), reply
        removals = {}
        for host in HOSTS:
            head = await view(relay, host, world.alice, {"artifact": "head", "#d": [str(d)]})
            assert [e["id"] for e in head] == [steps[-1]["id"]], host
            history = await view(relay, host, world.alice, {"artifact": "history", "#d": [str(d)]})
            assert [e["id"] for e in history] == [s["id"] for s in steps], host
            current = await view(relay, host, world.alice, {"artifact": "current", "#h": [str(world.other)]})
            assert [e["id"] for e in current] == [steps[-1]["id"]], host
            # Each community's move stored its own relay-signed removal in its own source channel.
            _, found = await query(alice.clients[host], "rm", {"kinds": [45011], "#h": [str(world.chat)]})
            assert len(found) == 1, (host, found)
            removals[host] = found[0]
            inbox = await get(relay, host, world.bob, "/api/mentions")
            assert [m["event_id"] for m in inbox["mentions"]] == [create["id"]], host
            # The revisions are stored channel events in each community: REQ by id finds them.
            _, found = await query(alice.clients[host], "ids", {"ids": [s["id"] for s in steps]})
            assert sorted(e["id"] for e in found) == sorted(s["id"] for s in steps), host
        one, two = (removals[h] for h in HOSTS)
        assert one["id"] != two["id"] and one["pubkey"] != two["pubkey"]
        assert one["tags"] == two["tags"]


async def test_an_artifact_in_one_community_leaves_the_other_free(
    world: World, relay_factory: Any, redis_flush: Any
) -> None:
    """The identity is (community, d): the first community's artifact takes nothing in the second."""
    relay = relay_factory(**RELAY_ENV)
    async with Both(relay, world.alice) as alice:
        d = uuid.uuid4()
        first = revision(world.alice, d=d, h=world.chat, op="create")
        await accepted(alice.clients[HOSTS[0]], first)
        # The second community has never seen d: an update there is "head unavailable"...
        update = revision(world.alice, d=d, h=world.chat, op="update", prev=first["id"])
        reply = await send(alice.clients[HOSTS[1]], update)
        assert reply[2:] == [False, "conflict: head unavailable"], reply
        # ... and another create of d there is accepted.
        await accepted(alice.clients[HOSTS[1]], revision(world.alice, d=d, h=world.other, op="create"))
        await accepted(alice.clients[HOSTS[0]], update)
