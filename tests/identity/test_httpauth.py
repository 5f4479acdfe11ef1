"""buzz.identity.httpauth in-process: a NIP-98 authorization event is good for one request.

buzz.nostr.verify_http_auth accepts the same signed event as often as it is shown
(tests/nostr/test_nip98.py::test_replay_is_the_callers_job); the replay guard is here, one
Redis SET NX per event id shared by every node, against this run's Redis and the
test database (the admission check reads the relay members).
"""

from __future__ import annotations

import base64
import json

import pytest
from django.conf import settings
from django.test import RequestFactory

from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo
from buzz.identity.httpauth import REPLAY_CLOCK_SLACK, AuthFailure, authenticate
from buzz.limits import limits
from buzz.nostr import Signer
from buzz.runtime import runtime
from tests.support.factories import make_community, nip98
from tests.support.inprocess import community_info

HOST = "httpauth.test"
PATH = "/api/unread"
USED = (
    "auth-required: replayed authorization event (its id was already used); sign a new one for each request,"
    " e.g. with a nonce tag"
)


@pytest.fixture
def member(transactional_db: None) -> tuple[CommunityInfo, Signer]:
    alice = Signer.generate()
    return community_info(make_community(HOST, members=[alice])), alice


async def attempt(community: CommunityInfo, authorization: str) -> Actor:
    request = RequestFactory().get(PATH, HTTP_HOST=HOST, HTTP_AUTHORIZATION=authorization)
    return await authenticate(request, community, b"")


async def test_a_nip98_authorization_is_accepted_once(member: tuple[CommunityInfo, Signer]) -> None:
    community, alice = member
    try:
        await accepted_once(community, alice)
    finally:
        await runtime.aclose()


async def accepted_once(community: CommunityInfo, alice: Signer) -> None:
    header = nip98(alice, HOST, "GET", PATH)
    first = await attempt(community, header)
    assert (first.pubkey, first.scopes, first.token_id) == (alice.pubkey, None, None)
    for _ in range(2):
        with pytest.raises(AuthFailure) as refused:
            await attempt(community, header)
        assert refused.value.reason == USED
    # The guard is per event, not per pubkey: a newly signed authorization for the same request is accepted.
    assert (await attempt(community, nip98(alice, HOST, "GET", PATH))).pubkey == alice.pubkey
    # It keeps the id while any node could still accept the event: two windows, and slack for a node's clock.
    event_id = json.loads(base64.b64decode(header.removeprefix("Nostr ")))["id"]
    left = await runtime.redis().ttl(f"{settings.BUZZ_REDIS_PREFIX}nip98:{event_id}")
    window = limits().http_auth_window
    assert 2 * window + REPLAY_CLOCK_SLACK - 5 <= left <= 2 * window + REPLAY_CLOCK_SLACK
