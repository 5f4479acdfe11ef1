"""A client that stops reading never makes the relay's memory grow past its outbound bound.

A real uvicorn relay, a real client that asks for far more data than the bound and
then reads nothing: the relay's resident memory stays near its starting point, the
connection is closed with 1013, and the relay keeps serving other clients.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from buzz.nostr import Signer
from tests.support.wsclient import RelayClient
from tests.transport.stock import stock_channel

HOST = "slow.test"
EVENTS = 3000
PAYLOAD = 2000  # bytes of content per stored event
REQS = 30  # each asks for 1000 events: about 60 MB in all


@pytest.fixture
def stocked(transactional_db: None) -> tuple[Signer, uuid.UUID]:
    return stock_channel(HOST, events=EVENTS, payload=PAYLOAD)


@pytest.mark.timeout(300)
async def test_client_that_stops_reading_is_bounded(stocked: tuple[Signer, uuid.UUID], relay_factory: Any) -> None:
    reader, channel = stocked
    relay = relay_factory(
        BUZZ_OUTBOUND_MAX_BYTES=str(256 * 1024), BUZZ_OUTBOUND_MAX_MESSAGES="256", BUZZ_MAX_SUBSCRIPTIONS="32"
    )
    # Warm the relay up (imports, pools) so the baseline is its steady state.
    async with RelayClient.connect(relay.ws_url, host=HOST) as warm:
        await warm.auth(reader)
        await warm.send_json(["REQ", "w", {"#h": [str(channel)], "limit": 200}])
        await warm.expect("EOSE", timeout=20)
    baseline = relay.rss_bytes()
    peak = baseline
    # A small receive buffer on the client side, so its kernel does not soak up the flood for it.
    # No client keepalive: its pings would wait behind the unread data and end the test early.
    async with RelayClient.connect(relay.ws_url, host=HOST, max_queue=1, ping_interval=None) as slow:
        await slow.auth(reader)
        for i in range(REQS):
            await slow.send_json(["REQ", f"s{i}", {"#h": [str(channel)], "limit": 1000}])
        # Stop reading. Sample the relay's memory while it is stuck behind this client, past the
        # moment its stored reads give up waiting for room (10 s).
        for _ in range(70):
            await asyncio.sleep(0.2)
            peak = max(peak, relay.rss_bytes())
        # The relay ends the connection once its bounded queue can't take more: 1013 (try again later),
        # or, when even the close frame waits too long behind the unread data, its keepalive's 1011.
        with pytest.raises(ConnectionClosed) as info:
            async with asyncio.timeout(120):
                while True:
                    await slow.ws.recv()
        assert info.value.rcvd is not None and info.value.rcvd.code in (1013, 1011), info.value
    growth = peak - baseline
    requested = REQS * 1000 * PAYLOAD
    # What the client asked for is ~60 MB; the relay held a small, bounded fraction of it.
    assert growth < 25 * 1024 * 1024, f"relay grew by {growth / 2**20:.1f} MiB for {requested / 2**20:.0f} MiB asked"
    # The relay still serves everyone else (generous waits: the machine may still be busy with the flood).
    async with RelayClient.connect(relay.ws_url, host=HOST, open_timeout=30) as other:
        assert (await other.auth(reader, timeout=30))[2] is True
        await other.send_json(["REQ", "after", {"#h": [str(channel)], "limit": 5}])
        assert (await other.expect("EOSE", timeout=30))[1] == "after"
