"""Closing a community (admission open -> members, in the admin) reaches open connections at once, on every node.

A pubkey that is not a relay member authenticated while the community was open and reads an open channel
(a REQ and a NIP-AR sync); a relay member reads the same. The operator switches the community to members
only on its admin page. The non-member's REQ ends with CLOSED "restricted: not a relay member" and every
later frame of its connection gets that refusal; every sync of the community resyncs (each reader re-syncs
and is admitted again or refused); the member's REQ keeps receiving. Before, the connection kept its
admission as it was when it authenticated, until it reconnected.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.models import AdmissionMode, Community
from buzz.nostr import Signer
from tests.live.test_revocation import (
    NOT_ADMITTED,
    _next_for,
    chat,
    closed_reasons,
    nip42,
    posted,
    receives,
    req,
    send,
)
from tests.sync.support import open_sync

HOST = "revoke.test"  # the helpers of test_revocation connect with this Host


def _switch_to_members_only(community: Community) -> None:
    """The community's admin page, as an operator saves it with admission set to members only."""
    user = User.objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client = Client(HTTP_HOST=HOST)
    client.force_login(user)
    data = {
        "host": community.host,
        "name": community.name,
        "description": community.description,
        "public_url": community.public_url,
        "admission": AdmissionMode.MEMBERS,
        "members-TOTAL_FORMS": "0",
        "members-INITIAL_FORMS": "0",
        "members-MIN_NUM_FORMS": "0",
        "members-MAX_NUM_FORMS": "1000",
    }
    response = client.post(f"/admin/buzz/community/{community.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    community.refresh_from_db()
    assert community.admission == AdmissionMode.MEMBERS


async def test_closing_the_community_ends_what_a_non_member_reads_on_every_node(
    transactional_db: None, relay_factory: Any
) -> None:
    owner, member, outsider = Signer.generate(), Signer.generate(), Signer.generate()

    def world() -> tuple[Community, uuid.UUID]:
        community = community_create(host=HOST, name="Admission", admission=AdmissionMode.OPEN)
        for signer in (owner, member):
            member_add(community=community, pubkey=signer.pubkey)
        channel = uuid.uuid4()
        channels.channel_create(community=community, channel_uuid=channel, name="open", creator=owner.pubkey)
        return community, channel

    community, channel = await sync_to_async(world)()
    a, b = relay_factory(BUZZ_WRITES_PER_SECOND="0"), relay_factory(BUZZ_WRITES_PER_SECOND="0")
    flt = {"#h": [str(channel)], "kinds": [9]}
    sync_filter = {"artifact": "current", "#h": [str(channel)]}
    async with nip42(a, outsider) as x, nip42(b, member) as m, nip42(a, owner) as o:
        await req(x, "r", flt)
        await req(m, "r", flt)
        x_sync = await open_sync(x, "s", sync_filter)
        m_sync = await open_sync(m, "s", sync_filter)
        assert x_sync.eose and m_sync.eose
        first = await posted(o, chat(owner, channel))
        await receives(x, "r", first)  # the outsider reads while the community is open
        await receives(m, "r", first)

        await sync_to_async(_switch_to_members_only)(community)

        reasons = await closed_reasons(x, {"r", "s"})
        assert reasons["r"] == NOT_ADMITTED and reasons["s"].startswith("resync:"), reasons
        assert (await _next_for(m, "s"))[2].startswith("resync:")  # every sync re-syncs, the member's too
        later = await posted(o, chat(owner, channel))
        await receives(m, "r", later)  # the member's REQ, on the other node, keeps reading
        # Every later frame of the outsider's connection is refused.
        reply = await send(x, chat(outsider, channel))
        assert reply[2:] == [False, NOT_ADMITTED], reply
        await x.send_json(["REQ", "again", flt])
        assert await _next_for(x, "again") == ["CLOSED", "again", NOT_ADMITTED]
        resynced = await open_sync(m, "s2", sync_filter)
        assert resynced.eose


@pytest.fixture(autouse=True)
def _no_stray_community(transactional_db: None) -> None:
    Community.objects.filter(host=HOST).delete()
