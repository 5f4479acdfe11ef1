"""A write over HTTP whose client goes away still publishes every signal of its change (NIP-AR sync rule 5).

An HTTP view is cancelled when its client disconnects. A move publishes two signals: the revision on the
destination's topic and the 45011 removal on the source's. They were published one after the other, each
awaited, so a client that went away while the first waited for Redis (here: Redis paused for writes)
left the second unqueued: the move had committed, and a sync naming only the source never heard of it,
without a resync. The write now runs to its end detached from the view, and a change's signals are
queued together before any wait.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import redis
from asgiref.sync import sync_to_async

from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.identity.tokens import token_create
from buzz.nostr import Signer
from tests.artifacts.write_support import accepted, revision
from tests.support.faults import next_for, redis_paused
from tests.support.relay import RelayProcess
from tests.support.wsclient import RelayClient
from tests.sync.support import open_sync

HOST = "gone-client.test"
PAUSE_MS = 2500  # Redis refuses writes (PUBLISH among them) this long
CLIENT_WAITS = 0.4  # the HTTP client gives up after this long, well inside the pause


async def _post_and_leave(relay: RelayProcess, token: str, event: dict[str, Any]) -> None:
    """POST /events with a bearer token, then close the connection before the answer comes."""
    body = json.dumps(event).encode()
    head = (
        f"POST /events HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(head + body)
    await writer.drain()
    try:
        answer = await asyncio.wait_for(reader.read(1), CLIENT_WAITS)
    except TimeoutError:
        answer = b""
    writer.close()
    assert answer == b"", "the relay answered before the client left: nothing was cancelled"


async def test_a_move_whose_http_client_left_still_reaches_the_source_sync(
    transactional_db: None, relay_factory: Any, redis_flush: Any, redis_client: redis.Redis
) -> None:
    alice, bob = Signer.generate(), Signer.generate()
    source, destination = uuid.uuid4(), uuid.uuid4()

    def world() -> str:
        community = community_create(host=HOST, name=HOST)
        for signer in (alice, bob):
            member_add(community=community, pubkey=signer.pubkey)
        for ch in (source, destination):
            channels.channel_create(
                community=community, channel_uuid=ch, name=str(ch)[:8], creator=alice.pubkey, visibility="private"
            )
        channels.member_put(community=community, channel_uuid=source, actor=None, pubkey=bob.pubkey)
        return token_create(community=community, pubkey=alice.pubkey, scopes=["messages:write"]).token

    token = await sync_to_async(world)()
    relay = relay_factory(BUZZ_WRITES_PER_SECOND="0")
    d = uuid.uuid4()
    async with RelayClient.connect(relay.ws_url, host=HOST) as a, RelayClient.connect(relay.ws_url, host=HOST) as b:
        assert (await a.auth(alice))[2] is True and (await b.auth(bob))[2] is True
        head = await accepted(a, revision(alice, d=d, h=source, op="create"))
        state = await open_sync(b, "s", {"artifact": "current", "#h": [str(source)]})
        assert state.eose and set(state.heads) == {str(d)}

        move = revision(alice, d=d, h=destination, op="move", prev=head)
        async with redis_paused(redis_client, PAUSE_MS, "WRITE"):
            await _post_and_leave(relay, token, move)

        # Bob can't read the destination: the sync sends the stored removal (or, never silent, a resync).
        m = await next_for(b, "s")
        assert m[0] in ("EVENT", "CLOSED"), m
        if m[0] == "EVENT":
            assert m[2]["kind"] == 45011 and ["d", str(d)] in m[2]["tags"], m
        else:
            assert m[2].startswith("resync:"), m
