"""A move's arrival and removal are stored events: replaying each channel recovers them, and live
subscribers of each channel receive them (NIP-AR "Moving and deleting")."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from buzz.nostr import Signer, parse_event, verify_event
from tests.support.factories import make_channel, make_community, revision, signers
from tests.support.wsclient import RelayClient

HOST = "replay.test"


@dataclass
class World:
    writer: Signer  # member of both channels
    source_reader: Signer  # member of the source only
    source: uuid.UUID
    dest: uuid.UUID
    relay_pubkey: str


@pytest.fixture
def world(transactional_db: None) -> World:
    writer, source_reader = signers(2)
    community = make_community(HOST, "Replay", members=[writer, source_reader])
    source = make_channel(community, writer, visibility="private", members=[source_reader])
    dest = make_channel(community, writer, visibility="private")
    return World(writer, source_reader, source, dest, community.relay_pubkey)


async def stored(client: RelayClient, sub: str, flt: dict[str, Any]) -> list[dict[str, Any]]:
    await client.send_json(["REQ", sub, flt])
    out = []
    while True:
        m = await client.recv_json()
        if m[0] == "EVENT" and m[1] == sub:
            out.append(m[2])
        elif m[0] in ("EOSE", "CLOSED") and m[1] == sub:
            assert m[0] == "EOSE", m
            return out


async def test_move_is_recovered_by_replaying_each_channel(world: World, relay_factory: Any) -> None:
    relay = relay_factory(BUZZ_WRITES_PER_SECOND="0")
    d = uuid.uuid4()
    async with RelayClient.connect(relay.ws_url, host=HOST) as w, RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await w.auth(world.writer))[2] is True
        assert (await r.auth(world.source_reader))[2] is True
        create = revision(world.writer, d=d, h=world.source, title="Secret plan")
        await w.send_json(["EVENT", create])
        assert (await w.expect("OK"))[2] is True
        # The source reader is live on the source channel before the move.
        await r.send_json(["REQ", "live", {"#h": [str(world.source)], "kinds": [45011]}])
        await r.expect("EOSE", where=lambda m: m[1] == "live")
        move = revision(world.writer, d=d, h=world.dest, op="move", prev=create["id"], title="Secret plan")
        await w.send_json(["EVENT", move])
        assert (await w.expect("OK", where=lambda m: m[1] == move["id"]))[2] is True

        live = await r.expect("EVENT", where=lambda m: m[1] == "live")
        removal = live[2]
        # Replaying the source: the create, then the relay-signed removal; nothing of the destination.
        source_replay = await stored(r, "src", {"#h": [str(world.source)], "kinds": [45010, 45011]})
        assert {e["id"] for e in source_replay} == {create["id"], removal["id"]}
        assert removal["kind"] == 45011 and removal["pubkey"] == world.relay_pubkey and removal["content"] == ""
        assert removal["tags"] == [
            ["ar", "1"], ["d", str(d)], ["h", str(world.source)], ["reason", "moved"], ["prev", create["id"]],
        ]  # fmt: skip
        assert str(world.dest) not in str(removal) and move["id"] not in str(removal)
        verify_event(parse_event(removal))
        # The source reader can't replay the destination; the writer can, and finds the arrival there.
        await r.send_json(["REQ", "dst", {"#h": [str(world.dest)]}])
        assert (await r.expect("CLOSED", where=lambda m: m[1] == "dst"))[2] == "restricted: not a channel member"
        dest_replay = await stored(w, "dst", {"#h": [str(world.dest)], "kinds": [45010]})
        assert [e["id"] for e in dest_replay] == [move["id"]]
        # The move's author redacts it with a 9005 (tests/moderation has the rest): the replay withholds it.
        nine005 = world.writer.sign_event(
            kind=9005, tags=[["e", move["id"]], ["h", str(world.dest)]], content=""
        ).to_dict()
        await w.send_json(["EVENT", nine005])
        assert (await w.expect("OK", where=lambda m: m[1] == nine005["id"]))[2] is True
        assert [e["id"] for e in await stored(w, "dst2", {"#h": [str(world.dest)], "kinds": [45010]})] == []
