"""NIP-98 events are deterministic: the same request signed twice in one second is one event id,
and the relay accepts it once. The second answer says "replayed", so a client author can tell."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

from buzz.identity.communities import community_create, member_add
from buzz.nostr import Signer
from tests.http.http_support import request_sync
from tests.support.relay import RelayFactory

HOST = "nip98-replay.test"


def header(signer: Signer, path: str, body: bytes, created_at: int, extra: list[list[str]]) -> str:
    tags = [["u", f"http://{HOST}{path}"], ["method", "POST"], ["payload", hashlib.sha256(body).hexdigest()], *extra]
    event = signer.sign_event(kind=27235, tags=tags, content="", created_at=created_at)
    return "Nostr " + base64.b64encode(json.dumps(event.to_dict()).encode()).decode()


def event_id(authorization: str) -> str:
    return str(json.loads(base64.b64decode(authorization.removeprefix("Nostr ")))["id"])


def test_a_replayed_authorization_says_replayed(transactional_db: None, relay_factory: RelayFactory) -> None:
    w = Signer.generate()
    member_add(community=community_create(host=HOST, name="NIP-98 replay"), pubkey=w.pubkey)
    relay = relay_factory()
    body = json.dumps([{"artifact": "current"}]).encode()
    now = int(time.time())

    def post(authorization: str) -> tuple[int, dict[str, Any]]:
        headers = {"Host": HOST, "Content-Type": "application/json", "Authorization": authorization}
        answer = request_sync(relay, "POST", "/count", headers=headers, body=body)
        return answer.status, answer.json()

    # Two identical requests in one second: one event id (the signatures may differ, the id can't).
    first, second = header(w, "/count", body, now, []), header(w, "/count", body, now, [])
    assert event_id(first) == event_id(second)
    assert post(first) == (200, {"count": 0})
    status, answer = post(second)
    assert status == 401
    assert answer["error"].startswith("auth-required: replayed authorization event"), answer
    # Varying the request (a nonce tag, or another created_at) makes a new event, accepted once more.
    assert post(header(w, "/count", body, now, [["nonce", "1"]])) == (200, {"count": 0})
    assert post(header(w, "/count", body, now - 1, []))[0] == 200


def test_an_authorization_accepted_by_one_community_is_refused_by_another_with_the_same_url(
    transactional_db: None, relay_factory: RelayFactory
) -> None:
    """Nothing makes a public URL unique to one community: two that share one verify the same signed URL, and
    the event one accepted is refused by the other, as a replay (the guard is per event, not per community)."""
    w = Signer.generate()
    shared = f"ws://{HOST}/"
    other = "nip98-replay-other.test"
    for host in (HOST, other):
        member_add(community=community_create(host=host, name=host, public_url=shared), pubkey=w.pubkey)
    relay = relay_factory()
    body = json.dumps([{"artifact": "current"}]).encode()
    authorization = header(w, "/count", body, int(time.time()), [])

    def post(host: str) -> tuple[int, dict[str, Any]]:
        headers = {"Host": host, "Content-Type": "application/json", "Authorization": authorization}
        answer = request_sync(relay, "POST", "/count", headers=headers, body=body)
        return answer.status, answer.json()

    assert post(HOST) == (200, {"count": 0})
    status, answer = post(other)
    assert status == 401
    assert answer["error"].startswith("auth-required: replayed authorization event"), answer
