"""Write quotas: a per-pubkey token bucket in Redis, set by BUZZ_WRITES_PER_SECOND / BUZZ_WRITE_BURST.

The refill rate is set so low (one write per 1000 s) that no token comes back during
a test: the counts below don't depend on timing.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, message, signers
from tests.support.records import stored
from tests.support.wire import http, publish
from tests.support.wsclient import RelayClient

HOST = "quotas.test"
BURST = 3
QUOTA = {"BUZZ_WRITES_PER_SECOND": "0.001", "BUZZ_WRITE_BURST": str(BURST)}
LIMITED = "rate-limited: slow down, too many writes from this pubkey"


@dataclass
class Room:
    writer: Signer
    other: Signer
    channel: uuid.UUID


@pytest.fixture
def room(transactional_db: None, redis_flush: Any) -> Room:
    writer, other = signers(2)
    community = make_community(HOST, "Quotas", members=[writer, other])
    ch = make_channel(community, writer, name="q", members=[other])
    return Room(writer, other, ch)


def connect(relay: Any) -> Any:
    return RelayClient.connect(relay.ws_url, host=HOST)


async def write(client: RelayClient, signer: Signer, channel: uuid.UUID) -> tuple[list[Any], str]:
    event = message(signer, channel)
    return await publish(client, event), event["id"]


async def test_writes_past_the_burst_are_rate_limited_per_pubkey(room: Room, relay_factory: Any) -> None:
    relay = relay_factory(**QUOTA)
    async with connect(relay) as writer, connect(relay) as other:
        assert (await writer.auth(room.writer))[2] is True
        assert (await other.auth(room.other))[2] is True
        for _ in range(BURST):
            reply, _ = await write(writer, room.writer, room.channel)
            assert reply[2] is True, reply
        reply, event_id = await write(writer, room.writer, room.channel)
        assert reply[2:] == [False, LIMITED]
        assert not await stored(event_id)
        # Another pubkey has a bucket of its own.
        reply, _ = await write(other, room.other, room.channel)
        assert reply[2] is True, reply


async def test_two_relay_processes_share_one_bucket(room: Room, relay_factory: Any) -> None:
    one = relay_factory(**QUOTA)
    two = relay_factory(**QUOTA)
    async with connect(one) as a, connect(two) as b:
        assert (await a.auth(room.writer))[2] is True
        assert (await b.auth(room.writer))[2] is True
        for client in (a, b, a):  # BURST writes, spread over both processes
            reply, _ = await write(client, room.writer, room.channel)
            assert reply[2] is True, reply
        for client in (b, a):
            reply, event_id = await write(client, room.writer, room.channel)
            assert reply[2:] == [False, LIMITED]
            assert not await stored(event_id)


async def test_http_writes_share_the_bucket_and_get_429(room: Room, relay_factory: Any) -> None:
    relay = relay_factory(**QUOTA)
    async with connect(relay) as ws:
        assert (await ws.auth(room.writer))[2] is True
        for _ in range(BURST):
            reply, _ = await write(ws, room.writer, room.channel)
            assert reply[2] is True, reply
    event = message(room.writer, room.channel)
    status, body = await http(relay, "POST", "/events", host=HOST, signer=room.writer, body=json.dumps(event).encode())
    assert (status, body) == (429, {"event_id": event["id"], "accepted": False, "message": LIMITED})
    assert not await stored(event["id"])


async def test_a_throttled_or_late_retry_of_an_accepted_message_or_group_event_is_a_duplicate(
    room: Room, relay_factory: Any
) -> None:
    """A client that lost its OK sends the event again; past the quota (or the created_at window) the retry
    is still answered OK duplicate:, not refused, and nothing is applied twice."""
    from tests.support.factories import signed

    relay = relay_factory(**QUOTA, BUZZ_CREATED_AT_PAST="5")
    async with connect(relay) as writer:
        assert (await writer.auth(room.writer))[2] is True
        sent = message(room.writer, room.channel)
        edit = signed(room.writer, 9002, [["h", str(room.channel)], ["about", "once"]])
        for event in (sent, edit):
            assert (await publish(writer, event))[2:] == [True, ""]
        # The third write spends the burst; the retries come after it.
        assert (await write(writer, room.writer, room.channel))[0][2] is True
        assert (await write(writer, room.writer, room.channel))[0][2:] == [False, LIMITED]
        for event in (sent, edit):
            assert (await publish(writer, event))[2:] == [True, "duplicate: already accepted"], event["kind"]
    # Past the created_at window (5 s here), a retry is still the duplicate it is.
    late = message(room.other, room.channel)
    relay_open = relay_factory(BUZZ_CREATED_AT_PAST="5", BUZZ_WRITES_PER_SECOND="0")
    async with connect(relay_open) as other:
        assert (await other.auth(room.other))[2] is True
        assert (await publish(other, late))[2] is True
        await asyncio.sleep(6)
        assert (await publish(other, late))[2:] == [True, "duplicate: already accepted"]
