"""No existence oracle: a channel that does not exist and one the asker can't read answer alike.

Each test asks the same question about a missing channel, a private channel the
asker is not in, and a deleted channel, and compares the answers byte for byte:
WebSocket OK for posts and NIP-29 events, CLOSED for REQ and COUNT, and the HTTP
status and body of the counter endpoints.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from buzz.chat import channels
from buzz.events.store import store_sync
from buzz.nostr import Signer
from tests.support.factories import NOT_A_MEMBER, make_channel, make_community, message, signed, signers
from tests.support.records import stored
from tests.support.wire import http, publish, query
from tests.support.wsclient import RelayClient, naming

HOST = "oracle.test"


@dataclass
class Probe:
    owner: Signer
    asker: Signer
    missing: uuid.UUID
    private: uuid.UUID
    deleted: uuid.UUID
    secret_message: str  # id of a message in the private channel


@pytest.fixture
def probe(transactional_db: None) -> Probe:
    owner, asker = signers(2)
    community = make_community(HOST, "Oracle", members=[owner, asker])
    private = make_channel(community, owner, visibility="private", name="secret")
    deleted = make_channel(community, owner, name="gone", members=[asker])
    channels.channel_delete(community=community, channel_uuid=deleted, actor=None)
    secret = owner.sign_event(kind=9, tags=[["h", str(private)]], content="s")
    store_sync(community_id=community.pk, event=secret, channel=private)
    return Probe(owner, asker, uuid.uuid4(), private, deleted, secret.id)


def targets(p: Probe) -> list[str]:
    return [str(p.missing), str(p.private), str(p.deleted)]


async def test_ws_writes_answer_missing_and_unreadable_channels_alike(probe: Probe, relay_factory: Any) -> None:
    p = probe
    relay = relay_factory()
    builders = {
        "kind 9": lambda ch: message(p.asker, ch),
        "9000 put-user": lambda ch: signed(p.asker, 9000, [["h", ch], ["p", p.asker.pubkey]]),
        "9001 remove-user": lambda ch: signed(p.asker, 9001, [["h", ch], ["p", p.owner.pubkey]]),
        "9002 edit": lambda ch: signed(p.asker, 9002, [["h", ch], ["topic", "x"]]),
        "9008 delete-group": lambda ch: signed(p.asker, 9008, [["h", ch]]),
        "9021 join": lambda ch: signed(p.asker, 9021, [["h", ch]]),
        "9022 leave": lambda ch: signed(p.asker, 9022, [["h", ch]]),
    }
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(p.asker))[2] is True
        for what, build in builders.items():
            answers = []
            for ch in targets(p):
                event = build(ch)
                reply = await publish(client, event)
                answers.append(reply[2:])
                assert not await stored(event["id"]), (what, ch)
            assert answers == [[False, NOT_A_MEMBER]] * 3, (what, answers)


async def test_ws_delete_event_answers_missing_and_foreign_events_alike(probe: Probe, relay_factory: Any) -> None:
    p = probe
    relay = relay_factory()
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(p.asker))[2] is True
        # A channel the asker can't read, with and without a real message in it, and a missing channel.
        answers = []
        for target, ch in ((p.secret_message, p.private), ("cd" * 32, p.private), (p.secret_message, p.missing)):
            event = signed(p.asker, 9005, [["e", target], ["h", str(ch)]])
            reply = await publish(client, event)
            answers.append(reply[2:])
            assert not await stored(event["id"])
        assert answers[0] == answers[1] == answers[2], answers
        assert answers[0][0] is False


async def test_ws_req_and_count_answer_missing_and_unreadable_channels_alike(probe: Probe, relay_factory: Any) -> None:
    p = probe
    relay = relay_factory()
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(p.asker))[2] is True
        for i, ch in enumerate(targets(p)):
            end, events = await query(client, f"q{i}", {"#h": [ch]})
            assert (end, events) == (["CLOSED", f"q{i}", NOT_A_MEMBER], [])
            await client.send_json(["COUNT", f"c{i}", {"#h": [ch]}])
            reply = await client.expect("CLOSED", where=naming(f"c{i}"))
            assert reply == ["CLOSED", f"c{i}", NOT_A_MEMBER]


async def test_http_counters_answer_missing_and_unreadable_channels_alike(probe: Probe, relay_factory: Any) -> None:
    p = probe
    relay = relay_factory()
    for method, template in (
        ("GET", "/api/channels/{ch}/counts"),
        ("GET", "/api/channels/{ch}/threads/" + p.secret_message),
        ("POST", "/api/channels/{ch}/read"),
    ):
        answers = [await http(relay, method, template.format(ch=ch), host=HOST, signer=p.asker) for ch in targets(p)]
        assert answers == [(403, {"error": NOT_A_MEMBER})] * 3, (template, answers)
