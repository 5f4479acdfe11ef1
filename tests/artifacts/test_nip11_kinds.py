"""NIP-11 `accepted_kinds` lists only kinds the relay can accept (issue 9, item 3).

Kinds 5 (NIP-09 deletion requests) and 45011 (NIP-AR move removals, written by the relay only) are
registered so that they get an explicit reason, and every such event is refused. A relay that lists
them tells clients to send what it always refuses. The kind registry says which kinds are registered
only to be refused; NIP-11 lists the others.
"""

from __future__ import annotations

import asyncio
import http.client as httpclient
import json
import uuid
from typing import Any

import pytest

from buzz.identity.communities import community_create, member_add
from buzz.nostr import Signer
from tests.artifacts.write_support import send
from tests.support.wsclient import RelayClient

HOST = "nip11-kinds.test"


def nip11(relay: Any) -> dict[str, Any]:
    conn = httpclient.HTTPConnection(relay.host, relay.port, timeout=10)
    try:
        conn.request("GET", "/", headers={"Host": HOST, "Accept": "application/nostr+json"})
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 200, (response.status, body[:200])
    doc: dict[str, Any] = json.loads(body)
    return doc


@pytest.fixture
def owner(transactional_db: None) -> Signer:
    community = community_create(host=HOST, name="Kinds")
    signer = Signer.generate()
    member_add(community=community, pubkey=signer.pubkey, role="owner")
    return signer


async def test_kinds_registered_only_to_be_refused_are_not_advertised(owner: Signer, relay_factory: Any) -> None:
    relay = relay_factory()
    doc = await asyncio.to_thread(nip11, relay)
    kinds = doc["accepted_kinds"]
    assert 5 not in kinds and 45011 not in kinds, kinds
    assert {9, 45010, 9005, 9007}.issubset(kinds), kinds
    # What the document leaves out is indeed always refused, with a reason.
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(owner))[2] is True
        target = "ab" * 32
        for kind, tags in (
            (5, [["e", target]]),
            (45011, [["ar", "1"], ["d", str(uuid.uuid4())], ["h", str(uuid.uuid4())], ["prev", target]]),
        ):
            reply = await send(client, owner.sign_event(kind=kind, tags=tags, content="").to_dict())
            assert reply[2] is False and reply[3].startswith("invalid:"), (kind, reply)


async def test_the_advertised_tag_bound_is_the_one_a_revision_meets(owner: Signer, relay_factory: Any) -> None:
    """A revision passes the relay's event checks (BUZZ_MAX_EVENT_TAGS) before the envelope's 256: with the
    relay's bound set lower, `artifacts.limits.max_tags` says that bound, and a revision at it is accepted,
    one past it refused."""
    from buzz.chat import channels
    from buzz.models import Community
    from tests.artifacts.write_support import revision

    relay = relay_factory(BUZZ_MAX_EVENT_TAGS="100", BUZZ_WRITES_PER_SECOND="0")
    doc = await asyncio.to_thread(nip11, relay)
    assert doc["limitation"]["max_event_tags"] == 100
    assert doc["artifacts"]["limits"]["max_tags"] == 100
    channel = uuid.uuid4()
    community = await Community.objects.aget(host=HOST)
    await asyncio.to_thread(
        channels.channel_create, community=community, channel_uuid=channel, name="tags", creator=owner.pubkey
    )
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(owner))[2] is True
        envelope = 6  # ar, d, h, type, title, op
        for extra, ok in ((100 - envelope, True), (101 - envelope, False)):
            event = revision(owner, d=uuid.uuid4(), h=channel, op="create", extra=[["x", str(i)] for i in range(extra)])
            reply = await send(client, event)
            assert reply[2] is ok, reply
            if not ok:
                assert reply[3] == "invalid: too many tags (max 100)", reply
