"""Two relay processes with one signing key serve one paged pass alternately: each continuation was
signed by the other node and is verified there. A node with another key refuses them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.nostr import Signer
from tests.incremental.support import Client, env, incremental, post
from tests.support.factories import make_channel, make_community, revision
from tests.support.relay import start_relays
from tests.support.wire import accept, logged_in

HOST = "incremental-two-nodes.test"
QUERY = {"artifact": "current", "#type": ["buzz.task"]}
pytestmark = pytest.mark.timeout(300)


def _world(w: Signer, r: Signer) -> uuid.UUID:
    community = make_community(HOST, members=[w, r])
    return make_channel(community, w, visibility="private", members=[r])


async def test_one_pass_served_alternately_by_two_nodes(transactional_db: None, relay_factory: Any) -> None:
    w, r = Signer.generate(), Signer.generate()
    channel = await sync_to_async(_world)(w, r)
    a, b = await start_relays(relay_factory, env(BUZZ_INCREMENTAL_PAGE_ROWS="2"), env(BUZZ_INCREMENTAL_PAGE_ROWS="2"))
    heads: dict[str, str] = {}
    async with logged_in(a, w, host=HOST) as client:
        for _ in range(7):
            d = str(uuid.uuid4())
            event = revision(w, d=d, h=channel)
            await accept(client, event)
            heads[d] = event["id"]
    reader = Client([a, b], HOST, r, QUERY)
    await reader.sync()
    assert reader.pages == 4  # a, b, a, b: every continuation crossed nodes
    assert reader.store.heads() == heads
    # The checkpoint b signed starts a later pass on a; an update written through b shows up.
    async with logged_in(b, w, host=HOST) as client:
        d = next(iter(heads))
        event = revision(w, d=d, h=channel, op="update", prev=heads[d])
        await accept(client, event)
        heads[d] = event["id"]
    await reader.sync()
    assert reader.store.heads() == heads and reader.resets == []

    # A node with another signing key refuses the others' cursors and checkpoints.
    stranger = relay_factory(**env(BUZZ_INCREMENTAL_SIGNING_KEY="stranger-key-" + "x" * 48))
    status, first = await post(a, HOST, r, incremental(QUERY))
    assert status == 200 and first["nextCursor"]
    for extra in ({"cursor": first["nextCursor"]}, {"checkpoint": reader.checkpoint}):
        status, body = await post(stranger, HOST, r, incremental(QUERY, **extra))
        assert status == 400 and body["error"] == "incremental_invalid", body
