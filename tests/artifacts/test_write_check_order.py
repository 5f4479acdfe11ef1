"""The order of the NIP-AR write checks, seen from a real relay (issue 9, items 5 and 6).

* Standing first. NIP-AR: "Relays apply these checks the same way, and at the same point, as for a
  kind-9 message." A sender whose standing denies every write (a token without messages:write, a
  banned pubkey, a timed-out pubkey, a token revoked after it authenticated the connection) gets
  exactly the kind-9 answer for every malformed envelope, whether d names nothing or an artifact it
  can't read. A malformed h tag is the one check kind 9 makes before the standing ones, so an
  envelope with such an h gets kind 9's answer to that h. A sender in good standing gets `invalid:`.
* Identity before root. The ensure flow's step 1 ("Sends create ... On conflict, reads the head")
  needs a create of a taken d to answer `conflict: artifact identity is taken` even when its root is
  bad, whether the sender can read the existing artifact or not, and whether it is live or deleted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.chat import bans, channels
from buzz.identity.communities import community_create, member_add
from buzz.identity.tokens import token_create, token_revoke
from buzz.models import Community
from buzz.nostr import Signer
from tests.artifacts.write_support import IDENTITY_TAKEN, accepted, message, revision, send
from tests.support.wsclient import RelayClient

HOST = "check-order.test"
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}


@dataclass
class World:
    community: Community
    alice: Signer  # owner of both channels
    keys: dict[str, Signer]
    secret: uuid.UUID  # private: alice only
    open: uuid.UUID  # open: everyone a member
    tokens: dict[str, tuple[int, str]] = field(default_factory=dict)


@pytest.fixture
def world(transactional_db: None) -> World:
    community = community_create(host=HOST, name="Check order")
    alice = Signer.generate()
    keys = {name: Signer.generate() for name in ("mallory", "banned", "timed_out")}
    for signer in (alice, *keys.values()):
        member_add(community=community, pubkey=signer.pubkey)
    secret, open_ch = uuid.uuid4(), uuid.uuid4()
    channels.channel_create(
        community=community, channel_uuid=secret, name="secret", creator=alice.pubkey, visibility="private"
    )
    channels.channel_create(community=community, channel_uuid=open_ch, name="open", creator=alice.pubkey)
    for signer in keys.values():
        channels.member_put(community=community, channel_uuid=open_ch, actor=None, pubkey=signer.pubkey)
    bans.ban_add(community=community, pubkey=keys["banned"].pubkey)
    bans.timeout_add(community=community, pubkey=keys["timed_out"].pubkey, duration=dt.timedelta(hours=1))
    world = World(community, alice, keys, secret, open_ch)
    mallory = keys["mallory"].pubkey
    for name, scopes in (("read_only", ["messages:read"]), ("revoked", ["messages:read", "messages:write"])):
        issued = token_create(community=community, pubkey=mallory, scopes=scopes)
        world.tokens[name] = (issued.row.pk, issued.token)
    return world


@contextlib.asynccontextmanager
async def connect(relay: Any, world: World, sender: str) -> AsyncIterator[tuple[RelayClient, Signer]]:
    """A connection for `sender`: a NIP-42 login by name, or "token:<name>" for a bearer token."""
    if sender.startswith("token:"):
        token_id, token = world.tokens[sender.removeprefix("token:")]
        async with RelayClient.connect(relay.ws_url, host=HOST, authorization=RelayClient.bearer(token)) as client:
            if sender == "token:revoked":
                # Dead after it authenticated the connection: every later write checks it again.
                await sync_to_async(token_revoke)(token_id=token_id)
            yield client, world.keys["mallory"]
        return
    signer = world.alice if sender == "alice" else world.keys[sender]
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        ok = await client.auth(signer)
        assert ok[2] is True, ok
        yield client, signer


def random_id() -> str:
    return secrets.token_hex(32)


# Malformed envelopes (each with a valid h): (name, keyword arguments of revision(), tags to drop).
Malformed = tuple[str, dict[str, Any], Callable[[list[list[str]]], list[list[str]]]]


def _drop(name: str) -> Callable[[list[list[str]]], list[list[str]]]:
    return lambda tags: [t for t in tags if t[0] != name]


def _keep(tags: list[list[str]]) -> list[list[str]]:
    return tags


def _with(tag: list[str]) -> Callable[[list[list[str]]], list[list[str]]]:
    return lambda tags: [*tags, tag]


MALFORMED: list[Malformed] = [
    ("bad type", {"type_": "Not A Type"}, _keep),
    ("no title", {}, _drop("title")),
    ("blank title", {"title": "   "}, _keep),
    ("unknown op", {"op": "rename"}, _keep),
    ("bad prev", {"prev": "XYZ"}, _keep),
    ("no prev", {}, _drop("prev")),
    ("two d tags", {}, _with(["d", str(uuid.uuid4())])),
    ("ar 2", {}, lambda tags: [["ar", "2"] if t[0] == "ar" else t for t in tags]),
    ("bad d", {"d": "not-a-uuid"}, _keep),
    ("delete with content", {"op": "delete", "content": "x"}, _keep),
]


def malformed(signer: Signer, case: Malformed, *, d: uuid.UUID | str, h: uuid.UUID | str, prev: str) -> dict[str, Any]:
    _, overrides, edit = case
    fields: dict[str, Any] = {"d": d, "h": h, "op": "update", "prev": prev, **overrides}
    draft = revision(signer, **fields)
    return signer.sign_event(kind=45010, tags=edit(draft["tags"]), content=draft["content"]).to_dict()


STANDING = ["token:read_only", "banned", "timed_out", "token:revoked"]


@pytest.mark.parametrize("sender", STANDING)
async def test_standing_denials_come_before_envelope_checks_as_for_kind_9(
    world: World, relay_factory: Any, redis_flush: Any, sender: str
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with connect(relay, world, "alice") as (alice, _):
        live = uuid.uuid4()
        head = await accepted(alice, revision(world.alice, d=live, h=world.secret, op="create"))
    async with connect(relay, world, sender) as (client, signer):
        kind9 = await send(client, message(signer, world.open))
        assert kind9[2] is False, kind9
        expected = kind9[3]
        assert expected.split(":")[0] in ("restricted", "blocked", "auth-required"), kind9
        # Whatever d names: nothing, or an artifact in a channel the sender can't read (even its real head).
        for d, prev in ((uuid.uuid4(), random_id()), (live, random_id()), (live, head)):
            for h in (world.open, world.secret):
                for case in MALFORMED:
                    reply = await send(client, malformed(signer, case, d=d, h=h, prev=prev))
                    assert reply[2:] == [False, expected], (case[0], d == live, h == world.secret, reply)
        # A valid envelope gets the same answer too.
        reply = await send(client, revision(signer, d=uuid.uuid4(), h=world.open, op="create"))
        assert reply[2:] == [False, expected], reply


@pytest.mark.parametrize("sender", ["banned", "mallory"])
async def test_a_malformed_h_tag_gets_the_kind_9_answer(
    world: World, relay_factory: Any, redis_flush: Any, sender: str
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with connect(relay, world, sender) as (client, signer):
        for bad_h in ("NOT-A-UUID", str(uuid.UUID(int=0)), str(world.open).upper()):
            kind9 = await send(client, message(signer, bad_h))
            artifact = await send(client, revision(signer, d=uuid.uuid4(), h=bad_h, op="create"))
            assert kind9[2] is False and kind9[3].startswith("invalid:"), kind9
            assert artifact[2:] == kind9[2:], (bad_h, artifact, kind9)


async def test_a_sender_in_good_standing_gets_the_envelope_reason(
    world: World, relay_factory: Any, redis_flush: Any
) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with connect(relay, world, "mallory") as (client, signer):
        for case in MALFORMED:
            reply = await send(client, malformed(signer, case, d=uuid.uuid4(), h=world.open, prev=random_id()))
            assert reply[2] is False and reply[3].startswith("invalid:"), (case[0], reply)


@pytest.mark.parametrize("creator", ["alice", "mallory"])
async def test_a_create_on_a_taken_d_is_a_conflict_even_with_a_bad_root(
    world: World, relay_factory: Any, redis_flush: Any, creator: str
) -> None:
    """alice can read the existing artifacts; mallory can't (they live in alice's private channel)."""
    relay = relay_factory(**RELAY_ENV)
    async with connect(relay, world, "alice") as (alice, _):
        live, deleted = uuid.uuid4(), uuid.uuid4()
        await accepted(alice, revision(world.alice, d=live, h=world.secret, op="create"))
        head = await accepted(alice, revision(world.alice, d=deleted, h=world.secret, op="create"))
        await accepted(alice, revision(world.alice, d=deleted, h=world.secret, op="delete", prev=head))
        anchor = await accepted(alice, message(world.alice, world.open))
        secret_anchor = await accepted(alice, message(world.alice, world.secret))
    async with connect(relay, world, creator) as (client, signer):
        # Roots that are no anchor in h: unknown, in another channel, a revision.
        bad_roots = [random_id(), secret_anchor if creator == "alice" else random_id(), head]
        for d in (live, deleted):
            for root in bad_roots:
                reply = await send(client, revision(signer, d=d, h=world.open, op="create", root=root))
                assert reply[2:] == [False, IDENTITY_TAKEN], (d == live, reply)
            # With a good root, and with none: the same answer.
            for good in (anchor, None):
                reply = await send(client, revision(signer, d=d, h=world.open, op="create", root=good))
                assert reply[2:] == [False, IDENTITY_TAKEN], reply
        # Control: on a free d the bad root is what the relay refuses.
        reply = await send(client, revision(signer, d=uuid.uuid4(), h=world.open, op="create", root=bad_roots[0]))
        assert reply[2] is False and reply[3].startswith("invalid: root"), reply
        await accepted(client, revision(signer, d=uuid.uuid4(), h=world.open, op="create", root=anchor))


async def test_ensure_flow_step_1_then_restore(world: World, relay_factory: Any, redis_flush: Any) -> None:
    """The spec's ensure flow with a root: create -> conflict -> read head (deleted) -> restore."""
    relay = relay_factory(**RELAY_ENV)
    async with connect(relay, world, "alice") as (alice, _):
        d = uuid.uuid4()
        anchor = await accepted(alice, message(world.alice, world.open))
        head = await accepted(alice, revision(world.alice, d=d, h=world.open, op="create", root=anchor))
        gone = await accepted(alice, revision(world.alice, d=d, h=world.open, op="delete", prev=head, root=anchor))
        # The anchor is removed since; the create still learns first that d is taken.
        removal = world.alice.sign_event(kind=9005, tags=[["h", str(world.open)], ["e", anchor]], content="")
        await accepted(alice, removal.to_dict())
        reply = await send(alice, revision(world.alice, d=d, h=world.open, op="create", root=anchor))
        assert reply[2:] == [False, IDENTITY_TAKEN], reply
        # Step 2: the head is the deletion; restore names it (a kept root needs no anchor any more).
        await accepted(alice, revision(world.alice, d=d, h=world.open, op="restore", prev=gone, root=anchor))
