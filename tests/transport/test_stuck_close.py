"""Closing a connection ends it within a bound, and misbehaving clients leave no tracebacks.

A real relay (served with buzz.ws.transport) and raw-socket clients (tests/transport/rawclient.py):
- a client that stops reading altogether: the relay's end of the socket is closed (it was left
  ESTABLISHED with megabytes unsent for as long as the client liked);
- a text frame that is not UTF-8, before AUTH: close 1007, no traceback in the relay's log;
- a client that vanishes (RST) while the relay is closing its connection: nothing unretrieved logged.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest
import redis

from buzz.nostr import Signer
from tests.support.factories import make_community
from tests.transport.rawclient import RawClient, server_socket_open, wait_until
from tests.transport.stock import stock_channel

HOST = "stuck.test"
EVENTS = 3000
PAYLOAD = 2000
REQS = 20  # 20 x 1000 events of 2 kB: 40 MB asked, far past every buffer on the way
SMALL_QUEUE = {"BUZZ_OUTBOUND_MAX_BYTES": str(256 * 1024), "BUZZ_OUTBOUND_MAX_MESSAGES": "256"}


@pytest.fixture
def stocked(transactional_db: None) -> tuple[Signer, uuid.UUID]:
    return stock_channel(HOST, events=EVENTS, payload=PAYLOAD)


def flood(client: RawClient, channel: uuid.UUID, reqs: int = REQS) -> None:
    for i in range(reqs):
        client.send_json(["REQ", f"s{i}", {"#h": [str(channel)], "limit": 1000}])


@pytest.mark.timeout(300)
def test_a_client_that_stops_reading_has_its_socket_closed(
    stocked: tuple[Signer, uuid.UUID], relay_factory: Any
) -> None:
    reader, channel = stocked
    relay = relay_factory(**SMALL_QUEUE)
    client = RawClient(relay.port, HOST)
    try:
        assert client.auth(reader)[2] is True
        flood(client, channel)
        # From here on the client reads nothing. The relay gives up on it (its queue is full), its close
        # frame can't be written behind the unread data, and then the transport must still go away.
        assert server_socket_open(relay.port, client.local_port)
        assert wait_until(lambda: not server_socket_open(relay.port, client.local_port), timeout=150), (
            "the relay still holds the connection of a client that stopped reading"
        )
        assert "does not read: aborting its connection" in relay.log_text()
    finally:
        client.close()


def test_a_text_frame_that_is_not_utf8_is_closed_1007_without_a_traceback(relay_factory: Any) -> None:
    make_community(HOST, "Stuck")
    relay = relay_factory()
    client = RawClient(relay.port, HOST)  # before AUTH
    try:
        client.send_text(b'["REQ","\xff\xfe",{}]')
        assert client.wait_close() == 1007
    finally:
        client.close()
    time.sleep(0.5)  # let the relay write its log line
    log = relay.log_text()
    assert "not UTF-8" in log
    assert "Traceback" not in log


def channel_subscribed(redis_client: redis.Redis, channel: uuid.UUID) -> bool:
    """Whether a relay's hub still subscribes to the channel's topic in Redis."""
    return bool(redis_client.pubsub_channels(f"{os.environ['BUZZ_REDIS_PREFIX']}*{channel}*"))


@pytest.mark.timeout(300)
def test_a_client_that_vanishes_while_being_closed_leaves_nothing_unretrieved(
    stocked: tuple[Signer, uuid.UUID], relay_factory: Any, redis_client: redis.Redis
) -> None:
    reader, channel = stocked
    relay = relay_factory(**SMALL_QUEUE)
    client = RawClient(relay.port, HOST)
    try:
        assert client.auth(reader)[2] is True
        flood(client, channel, reqs=3)  # 6 MB: past the kernel buffers
        assert wait_until(lambda: channel_subscribed(redis_client, channel), timeout=20)
        # The relay gives up on the client (its queue stays full): it releases the subscriptions, then
        # waits for its close frame to be written. The client vanishes during that wait.
        assert wait_until(lambda: not channel_subscribed(redis_client, channel), timeout=120)
        client.vanish()
        assert wait_until(lambda: not server_socket_open(relay.port, client.local_port), timeout=60)
    finally:
        client.close()
    time.sleep(1.0)
    log = relay.log_text()
    assert "never retrieved" not in log
    assert "ClientDisconnected" not in log
    assert "Traceback" not in log
