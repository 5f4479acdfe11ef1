"""NIP-AR non-disclosure: an artifact the sender can't read answers exactly like one that doesn't exist.

Side by side, over the WebSocket and over HTTP POST /events, for every sender that can't write
the artifact's home (a nonmember of its private channel; a token limited to another channel; a
token without messages:write; a banned pubkey; a timed-out pubkey):
* update / delete / move / restore of a missing d and of an artifact in that private channel
  (live, and deleted) get the same OK message, whatever h and prev the sender guesses, even the
  real current head;
* over HTTP the status and the body are identical apart from event_id;
* a create of a d taken by an artifact the sender can't read says only
  "conflict: artifact identity is taken": nothing of its home, type, title or head.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import secrets
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from artifacts.models import Revision
from buzz.chat import bans
from buzz.models import Community
from buzz.nostr import Signer
from tests.support.factories import READ_WRITE, make_channel, make_community, make_token, revision
from tests.support.wire import http, logged_in, publish
from tests.support.wsclient import RelayClient

HOST = "nondisclosure.test"
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}
HEAD_UNAVAILABLE = "conflict: head unavailable"
IDENTITY_TAKEN = "conflict: artifact identity is taken"
SECRET_TYPE = "acme.secretplan"
SECRET_TITLE = "Acquisition of Initech"
# Senders: (name, credential). "nip42" logs in with NIP-42 over WS and signs NIP-98 over HTTP.
SENDERS = [
    ("mallory", "nip42"),  # relay member, not in the private channel
    ("mallory", "token_other_channel"),  # messages:read+write, limited to the open channel
    ("mallory", "token_read_only"),  # messages:read only
    ("banned", "nip42"),
    ("timed_out", "nip42"),
]


@dataclass
class World:
    community: Community
    alice: Signer  # owner of the private channel
    keys: dict[str, Signer]
    secret: uuid.UUID  # private: alice only
    open: uuid.UUID  # open: everyone a member
    tokens: dict[tuple[str, str], str] = field(default_factory=dict)


@pytest.fixture
def world(transactional_db: None) -> World:
    alice = Signer.generate()
    keys = {name: Signer.generate() for name in ("mallory", "banned", "timed_out")}
    community = make_community(HOST, "Non-disclosure", members=[alice, *keys.values()])
    secret = make_channel(community, alice, visibility="private", name="secret")
    open_ch = make_channel(community, alice, name="open", members=keys.values())
    bans.ban_add(community=community, pubkey=keys["banned"].pubkey)
    bans.timeout_add(community=community, pubkey=keys["timed_out"].pubkey, duration=dt.timedelta(hours=1))
    world = World(community, alice, keys, secret, open_ch)
    mallory = keys["mallory"]
    world.tokens[("mallory", "token_other_channel")] = make_token(community, mallory, READ_WRITE, channels=[open_ch])
    world.tokens[("mallory", "token_read_only")] = make_token(community, mallory, ["messages:read"])
    return world


@contextlib.asynccontextmanager
async def connect(relay: Any, world: World, name: str, cred: str) -> AsyncIterator[RelayClient]:
    if cred == "nip42":
        async with logged_in(relay, alice_or(world, name), host=HOST) as client:
            yield client
    else:
        bearer = RelayClient.bearer(world.tokens[(name, cred)])
        async with RelayClient.connect(relay.ws_url, host=HOST, authorization=bearer) as client:
            yield client


def alice_or(world: World, name: str) -> Signer:
    return world.alice if name == "alice" else world.keys[name]


@dataclass
class Secrets:
    live: uuid.UUID
    live_head: str
    deleted: uuid.UUID
    deleted_head: str


async def plant_secrets(relay: Any, world: World) -> Secrets:
    """Alice's artifacts in her private channel: one live (two revisions), one deleted."""
    async with connect(relay, world, "alice", "nip42") as alice:
        live, gone = uuid.uuid4(), uuid.uuid4()
        c = revision(world.alice, d=live, h=world.secret, op="create", type_=SECRET_TYPE, title=SECRET_TITLE)
        u = revision(
            world.alice, d=live, h=world.secret, op="update", prev=c["id"], type_=SECRET_TYPE, title=SECRET_TITLE
        )
        g = revision(world.alice, d=gone, h=world.secret, op="create", type_=SECRET_TYPE, title=SECRET_TITLE)
        x = revision(world.alice, d=gone, h=world.secret, op="delete", prev=g["id"], type_=SECRET_TYPE)
        for e in (c, u, g, x):
            ok = await publish(alice, e)
            assert ok[2] is True, ok
    return Secrets(live, u["id"], gone, x["id"])


def guesses(world: World, s: Secrets, op: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, fields) of edits aimed at the secret artifacts, each to be compared with a missing d."""
    out: list[tuple[str, dict[str, Any]]] = []
    targets = [("live", s.live, s.live_head), ("deleted", s.deleted, s.deleted_head)]
    homes = [world.open, world.secret] if op != "move" else [world.open]
    for (label, d, head), h, prev_kind in itertools.product(targets, homes, ("real", "random")):
        prev = head if prev_kind == "real" else secrets.token_hex(32)
        type_ = SECRET_TYPE if prev_kind == "real" else "buzz.task"
        out.append((f"{op} {label} h={'open' if h == world.open else 'secret'} prev={prev_kind}",
                    {"d": d, "h": h, "op": op, "prev": prev, "type_": type_}))  # fmt: skip
    return out


@sync_to_async
def revision_count() -> int:
    return Revision.objects.count()


async def test_missing_and_unreadable_answer_alike_over_ws(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    planted = await plant_secrets(relay, world)
    before = await revision_count()
    failures: list[str] = []
    for name, cred in SENDERS:
        signer = world.keys[name]
        async with connect(relay, world, name, cred) as client:
            for op in ("update", "delete", "move", "restore"):
                for label, fields in guesses(world, planted, op):
                    missing = {**fields, "d": uuid.uuid4()}
                    real = await publish(client, revision(signer, **fields))
                    fake = await publish(client, revision(signer, **missing))
                    if real[2:] != fake[2:] or real[2] is not False:
                        failures.append(f"{name}/{cred} {label}: unreadable {real[2:]} vs missing {fake[2:]}")
                    if name == "mallory" and cred != "token_read_only" and real[3] != HEAD_UNAVAILABLE:
                        failures.append(f"{name}/{cred} {label}: {real[3]!r}")
                    if SECRET_TITLE in real[3] or str(world.secret) in real[3] or SECRET_TYPE in real[3]:
                        failures.append(f"{name}/{cred} {label}: leaks {real[3]!r}")
    assert not failures, "\n".join(failures)
    assert await revision_count() == before


async def test_create_of_a_taken_d_says_only_taken(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    planted = await plant_secrets(relay, world)
    before = await revision_count()
    mallory = world.keys["mallory"]
    async with connect(relay, world, "mallory", "nip42") as client:
        for d in (planted.live, planted.deleted):  # a deleted d stays reserved too
            for type_ in ("buzz.task", SECRET_TYPE):
                reply = await publish(client, revision(mallory, d=d, h=world.open, op="create", type_=type_))
                assert reply[2:] == [False, IDENTITY_TAKEN], reply
    # Over HTTP: 409 and the same body.
    for d in (planted.live, planted.deleted):
        event = revision(mallory, d=d, h=world.open, op="create")
        status, body = await http(relay, "POST", "/events", host=HOST, signer=mallory, body=json.dumps(event).encode())
        assert (status, body) == (409, {"event_id": event["id"], "accepted": False, "message": IDENTITY_TAKEN})
    assert await revision_count() == before


async def post(relay: Any, world: World, name: str, cred: str, event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    body = json.dumps(event).encode()
    if cred == "nip42":
        return await http(relay, "POST", "/events", host=HOST, signer=world.keys[name], body=body)
    bearer = RelayClient.bearer(world.tokens[(name, cred)])
    return await http(relay, "POST", "/events", host=HOST, authorization=bearer, body=body)


async def test_missing_and_unreadable_answer_alike_over_http(
    world: World, relay_factory: Any, redis_flush: Any
) -> None:
    relay = relay_factory(**RELAY_ENV)
    planted = await plant_secrets(relay, world)
    before = await revision_count()
    failures: list[str] = []
    for name, cred in SENDERS:
        async with connect(relay, world, name, cred) as client:
            for op in ("update", "delete", "move", "restore"):
                # Fewer guesses than over WS: the real head as prev, in its real home (a move: to the open channel).
                aimed = [g for g in guesses(world, planted, op) if "prev=real" in g[0] and "h=open" not in g[0]]
                for label, fields in aimed or [g for g in guesses(world, planted, op) if "prev=real" in g[0]]:
                    await compare_http(relay, world, client, name, cred, label, fields, failures)
    assert not failures, "\n".join(failures)
    assert await revision_count() == before


async def compare_http(
    relay: Any,
    world: World,
    client: RelayClient,
    name: str,
    cred: str,
    label: str,
    fields: dict[str, Any],
    failures: list[str],
) -> None:
    signer = world.keys[name]
    real_event = revision(signer, **fields)
    missing_event = revision(signer, **{**fields, "d": uuid.uuid4()})
    real = await post(relay, world, name, cred, real_event)
    fake = await post(relay, world, name, cred, missing_event)
    for (_, body), event in ((real, real_event), (fake, missing_event)):
        if body.pop("event_id", None) != event["id"]:
            failures.append(f"{name}/{cred} {label}: event_id not echoed")
    if real != fake or real[1]["accepted"] is not False:
        failures.append(f"{name}/{cred} {label}: unreadable {real} vs missing {fake}")
    # The same text as over the WebSocket, for the same event.
    ws = await publish(client, real_event)
    if ws[2:] != [False, real[1]["message"]]:
        failures.append(f"{name}/{cred} {label}: WS {ws[2:]} vs HTTP {real}")


async def test_a_writer_that_cannot_read_learns_nothing_from_a_refusal(
    world: World, relay_factory: Any, redis_flush: Any
) -> None:
    """A member of the private channel whose token has messages:write but not messages:read may post there and
    can't read it: every refused edit of an artifact there answers as for a missing d, whatever its mistake
    (a stale prev, another type, restore of a live one, update of a deleted one, a move that keeps h)."""
    from buzz.chat import channels

    bob = Signer.generate()

    def admit_bob() -> str:
        from buzz.identity.communities import member_add

        member_add(community=world.community, pubkey=bob.pubkey)
        channels.member_put(community=world.community, channel_uuid=world.secret, actor=None, pubkey=bob.pubkey)
        return make_token(world.community, bob, ["messages:write"])

    token = await sync_to_async(admit_bob)()
    relay = relay_factory(**RELAY_ENV)
    planted = await plant_secrets(relay, world)
    before = await revision_count()
    live, gone = planted.live, planted.deleted
    cases: list[tuple[str, dict[str, Any]]] = [
        ("stale prev", {"d": live, "op": "update", "prev": secrets.token_hex(32), "type_": SECRET_TYPE}),
        ("another type", {"d": live, "op": "update", "prev": planted.live_head, "type_": "buzz.task"}),
        ("restore of a live one", {"d": live, "op": "restore", "prev": planted.live_head, "type_": SECRET_TYPE}),
        ("update of a deleted one", {"d": gone, "op": "update", "prev": planted.deleted_head, "type_": SECRET_TYPE}),
        ("move that keeps h", {"d": live, "op": "move", "prev": planted.live_head, "type_": SECRET_TYPE}),
    ]
    failures = []
    bearer = RelayClient.bearer(token)
    async with RelayClient.connect(relay.ws_url, host=HOST, authorization=bearer) as client:
        for label, fields in cases:
            real = await publish(client, revision(bob, h=world.secret, **fields))
            fake = await publish(client, revision(bob, h=world.secret, **{**fields, "d": uuid.uuid4()}))
            if real[2:] != [False, HEAD_UNAVAILABLE] or fake[2:] != real[2:]:
                failures.append(f"{label}: existing {real[2:]} vs missing {fake[2:]}")
        # It may still post: the token writes.
        message = bob.sign_event(kind=9, tags=[["h", str(world.secret)]], content="hello").to_dict()
        assert (await publish(client, message))[2] is True
    assert not failures, "\n".join(failures)
    assert await revision_count() == before
