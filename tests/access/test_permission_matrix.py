"""The permission matrix, against a real relay process.

open / private / DM channel  x  owner / admin / member / nonmember / banned / timed-out / agent of a banned owner
x  NIP-42 / token with scopes / token without them / token for another channel  x  active / archived / deleted,
for posting a kind-9 message and for reading the channel with REQ #h.

The expected answer comes from an oracle written here from REFERENCE.md's check order,
independently of buzz.policy.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from buzz.chat import bans, channels
from buzz.identity.communities import community_create, member_add
from buzz.identity.tokens import token_create
from buzz.models import Community
from buzz.nostr import Signer, make_auth_tag
from tests.support.wsclient import RelayClient

HOST = "matrix.test"
CHANNEL_TYPES = ("open", "private", "dm")
STATES = ("active", "archived", "deleted")
ACTORS = ("owner", "admin", "member", "nonmember", "banned", "timed_out", "agent_of_banned_owner")
CREDENTIALS = ("nip42", "token_scoped", "token_unscoped", "token_other_channel")

NOT_A_MEMBER = "restricted: not a channel member"


@dataclass
class World:
    community: Community
    keys: dict[str, Signer]
    owner_of_agent: Signer
    channels: dict[tuple[str, str], uuid.UUID]
    tokens: dict[tuple[str, str], str]


def build_world() -> World:
    community = community_create(host=HOST, name="Matrix")
    keys = {name: Signer.generate() for name in ACTORS}
    boss = Signer.generate()  # the banned owner of the agent
    for signer in [*keys.values(), boss]:
        member_add(community=community, pubkey=signer.pubkey)
    insiders = [keys[n] for n in ("banned", "timed_out", "agent_of_banned_owner")]
    chans: dict[tuple[str, str], uuid.UUID] = {}
    for ctype, state in itertools.product(CHANNEL_TYPES, STATES):
        cid = uuid.uuid4()
        if ctype == "dm":
            participants = [keys["admin"].pubkey, keys["member"].pubkey] + [s.pubkey for s in insiders]
            channels.channel_create(
                community=community,
                channel_uuid=cid,
                name=f"{ctype}-{state}",
                creator=keys["owner"].pubkey,
                channel_type="dm",
                participants=participants,
            )
        else:
            channels.channel_create(
                community=community,
                channel_uuid=cid,
                name=f"{ctype}-{state}",
                creator=keys["owner"].pubkey,
                visibility=ctype,
            )
            channels.member_put(
                community=community, channel_uuid=cid, actor=None, pubkey=keys["admin"].pubkey, role="admin"
            )
            for who in ["member", "banned", "timed_out", "agent_of_banned_owner"]:
                channels.member_put(community=community, channel_uuid=cid, actor=None, pubkey=keys[who].pubkey)
        if state == "archived":
            channels.channel_edit(community=community, channel_uuid=cid, actor=None, changes={"archived": "true"})
        elif state == "deleted":
            channels.channel_delete(community=community, channel_uuid=cid, actor=None)
        chans[(ctype, state)] = cid
    bans.ban_add(community=community, pubkey=keys["banned"].pubkey)
    bans.ban_add(community=community, pubkey=boss.pubkey)
    bans.timeout_add(community=community, pubkey=keys["timed_out"].pubkey, duration=dt.timedelta(hours=1))
    tokens: dict[tuple[str, str], str] = {}
    elsewhere = str(uuid.uuid4())
    for name, signer in keys.items():
        rw = ["messages:read", "messages:write"]
        tokens[(name, "token_scoped")] = token_create(community=community, pubkey=signer.pubkey, scopes=rw).token
        tokens[(name, "token_unscoped")] = token_create(
            community=community, pubkey=signer.pubkey, scopes=["channels:read"]
        ).token
        tokens[(name, "token_other_channel")] = token_create(
            community=community, pubkey=signer.pubkey, scopes=rw, channels=[elsewhere]
        ).token
    return World(community, keys, boss, chans, tokens)


def is_member(actor: str, ctype: str) -> bool:
    return actor != "nonmember"


def expected_post(actor: str, cred: str, ctype: str, state: str) -> str | None:
    """None for accepted, else the reason. Order: scope, ban (agent: owner's ban), timeout, token channel,
    membership or open channel, archive."""
    if cred == "token_unscoped":
        return "restricted: this token lacks the messages:write scope"
    if actor in ("banned", "agent_of_banned_owner"):
        return "blocked: this pubkey is banned from the community"
    if actor == "timed_out":
        return "restricted: timed out until"
    if cred == "token_other_channel":
        return "restricted: this token does not cover that channel"
    if state == "deleted":
        return NOT_A_MEMBER
    if not is_member(actor, ctype) and ctype != "open":
        return NOT_A_MEMBER
    if state == "archived":
        return "invalid: channel is archived"
    return None


def expected_read(actor: str, cred: str, ctype: str, state: str) -> str | None:
    """Reads: scope, ban (the agent's owner's ban binds only its signed events), token channel,
    membership or open channel. Archive and timeouts don't matter."""
    if cred == "token_unscoped":
        return "restricted: this token lacks the messages:read scope"
    if actor == "banned":
        return "blocked: this pubkey is banned from the community"
    if cred == "token_other_channel":
        return "restricted: this token does not cover that channel"
    if state == "deleted":
        return NOT_A_MEMBER
    if not is_member(actor, ctype) and ctype != "open":
        return NOT_A_MEMBER
    return None


def message(world: World, actor: str, channel: uuid.UUID) -> dict[str, Any]:
    signer = world.keys[actor]
    tags = [["h", str(channel)]]
    if actor == "agent_of_banned_owner":
        tags.append(list(make_auth_tag(world.owner_of_agent, signer.pubkey, "kind=9")))
    return signer.sign_event(kind=9, tags=tags, content=f"hello from {actor}", created_at=int(time.time())).to_dict()


async def end_of_stored(client: Any, sub: str) -> tuple[list[Any], set[str]]:
    """Read until EOSE or CLOSED for sub; the ids of the EVENTs before it."""
    seen: set[str] = set()
    while True:
        m = await client.recv_json()
        if m[0] == "EVENT" and m[1] == sub:
            seen.add(m[2]["id"])
        elif m[0] in ("EOSE", "CLOSED") and m[1] == sub:
            return m, seen


async def open_client(relay: Any, world: World, actor: str, cred: str) -> Any:
    authorization = None if cred == "nip42" else RelayClient.bearer(world.tokens[(actor, cred)])
    return RelayClient.connect(relay.ws_url, host=HOST, authorization=authorization)


@pytest.fixture
def world(transactional_db: None) -> World:
    return build_world()


@pytest.mark.slow
async def test_permission_matrix(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(BUZZ_WRITES_PER_SECOND="0")
    failures: list[str] = []
    checked = 0
    for actor, cred in itertools.product(ACTORS, CREDENTIALS):
        async with await open_client(relay, world, actor, cred) as client:
            if cred == "nip42":
                ok = await client.auth(world.keys[actor])
                assert ok[2] is True, ok
            for (ctype, state), channel in world.channels.items():
                event = message(world, actor, channel)
                await client.send_json(["EVENT", event])
                reply = await client.expect("OK", where=lambda m, i=event["id"]: m[1] == i)
                want = expected_post(actor, cred, ctype, state)
                got = None if reply[2] else reply[3]
                if (want is None) != (got is None) or (want is not None and not str(got).startswith(want)):
                    failures.append(f"post {actor}/{cred}/{ctype}/{state}: want {want!r} got {reply!r}")
                sub = f"r-{ctype}-{state}"
                await client.send_json(["REQ", sub, {"#h": [str(channel)], "kinds": [9]}])
                answer, events = await end_of_stored(client, sub)
                want_read = expected_read(actor, cred, ctype, state)
                if want_read is None:
                    if answer[0] != "EOSE":
                        failures.append(f"read {actor}/{cred}/{ctype}/{state}: want EOSE got {answer!r}")
                    elif want is None and event["id"] not in events:
                        failures.append(f"read {actor}/{cred}/{ctype}/{state}: own accepted message missing")
                    await client.send_json(["CLOSE", sub])
                elif answer != ["CLOSED", sub, want_read]:
                    failures.append(f"read {actor}/{cred}/{ctype}/{state}: want {want_read!r} got {answer!r}")
                checked += 2
    assert checked == len(ACTORS) * len(CREDENTIALS) * len(CHANNEL_TYPES) * len(STATES) * 2
    assert not failures, "\n".join(failures)
