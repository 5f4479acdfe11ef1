"""Kind-9 messages and their counters, read over HTTP with NIP-98 and with bearer tokens.

Messages go in over the WebSocket (and once over POST /events); the counters come
back from GET /api/channels/<id>/counts, /threads/<root>, /api/unread and
/api/mentions on the same relay process.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.chat import bans
from buzz.models import Community, Mention, StoredEvent
from buzz.nostr import Signer
from tests.support.factories import NOT_A_MEMBER, make_channel, make_community, make_token, message, nip98, signers
from tests.support.records import stored
from tests.support.wire import http, publish, query, request
from tests.support.wsclient import RelayClient

HOST = "counters.test"


@dataclass
class Team:
    community: Community
    alice: Signer  # owner of both channels
    bob: Signer  # member of both
    carol: Signer  # relay member, in no channel
    private: uuid.UUID
    open: uuid.UUID
    bob_token: str  # messages:read + messages:write
    bob_token_noread: str  # channels:read only


@pytest.fixture
def team(transactional_db: None) -> Team:
    alice, bob, carol = signers(3)
    community = make_community(HOST, "Counters", members=[alice, bob, carol])
    private = make_channel(community, alice, visibility="private", name="p", members=[bob])
    open_ch = make_channel(community, alice, name="o", members=[bob])
    rw = make_token(community, bob, ["messages:read", "messages:write"])
    noread = make_token(community, bob, ["channels:read"])
    return Team(community, alice, bob, carol, private, open_ch, rw, noread)


def bearer(token: str) -> str:
    return RelayClient.bearer(token)


async def post(client: RelayClient, event: dict[str, Any]) -> dict[str, Any]:
    reply = await publish(client, event)
    assert reply[2] is True, reply
    return event


def root_tag(event_id: str) -> list[str]:
    return ["e", event_id, "", "root"]


async def get(relay: Any, path: str, *, signer: Signer | None = None, token: str | None = None) -> tuple[int, Any]:
    return await http(relay, "GET", path, host=HOST, signer=signer, authorization=bearer(token) if token else None)


@sync_to_async
def stored_channel(event_id: str) -> uuid.UUID | None:
    return StoredEvent.objects.get(id=event_id).channel_id


@sync_to_async
def mention_rows(event_id: str) -> set[str]:
    return set(Mention.objects.filter(event_id=event_id).values_list("pubkey", flat=True))


async def test_messages_are_stored_with_their_channel_and_served_to_readers_only(
    team: Team, relay_factory: Any
) -> None:
    t = team
    relay = relay_factory()
    async with (
        RelayClient.connect(relay.ws_url, host=HOST) as alice,
        RelayClient.connect(relay.ws_url, host=HOST) as bob,
        RelayClient.connect(relay.ws_url, host=HOST) as carol,
    ):
        for client, who in ((alice, t.alice), (bob, t.bob), (carol, t.carol)):
            assert (await client.auth(who))[2] is True
        m = await post(alice, message(t.alice, t.private, "secret plans"))
        assert await stored_channel(m["id"]) == t.private
        end, events = await query(bob, "b1", {"#h": [str(t.private)], "kinds": [9]})
        assert end[0] == "EOSE" and [e["id"] for e in events] == [m["id"]]
        end, _ = await query(carol, "c1", {"#h": [str(t.private)], "kinds": [9]})
        assert end == ["CLOSED", "c1", NOT_A_MEMBER]
        end, events = await query(carol, "c2", {"kinds": [9]})
        assert end[0] == "EOSE" and events == []


async def test_thread_replies_are_counted_per_root(team: Team, relay_factory: Any) -> None:
    t = team
    relay = relay_factory()
    ch = str(t.private)
    async with (
        RelayClient.connect(relay.ws_url, host=HOST) as alice,
        RelayClient.connect(relay.ws_url, host=HOST) as bob,
    ):
        assert (await alice.auth(t.alice))[2] is True
        assert (await bob.auth(t.bob))[2] is True
        r1 = await post(alice, message(t.alice, ch, "root one"))
        r2 = await post(alice, message(t.alice, ch, "root two"))
        await post(bob, message(t.bob, ch, "re 1", [root_tag(r1["id"])]))
        await post(alice, message(t.alice, ch, "re 1 again", [root_tag(r1["id"])]))
        await post(bob, message(t.bob, ch, "re 2", [root_tag(r2["id"])]))
        await post(bob, message(t.bob, ch, "not a thread reply", [["e", r1["id"], "", "reply"]]))
        # A root in another channel is not this channel's thread.
        await post(bob, message(t.bob, t.open, "elsewhere", [root_tag(r1["id"])]))
    path1 = f"/api/channels/{ch}/threads/{r1['id']}"
    assert await get(relay, path1, signer=t.bob) == (200, {"channel": ch, "root": r1["id"], "replies": 2})
    assert await get(relay, path1, token=t.bob_token) == (200, {"channel": ch, "root": r1["id"], "replies": 2})
    path2 = f"/api/channels/{ch}/threads/{r2['id']}"
    assert await get(relay, path2, token=t.bob_token) == (200, {"channel": ch, "root": r2["id"], "replies": 1})
    assert await get(relay, path1, signer=t.carol) == (403, {"error": NOT_A_MEMBER})


async def test_message_counts_and_unread_per_member(team: Team, relay_factory: Any) -> None:
    t = team
    relay = relay_factory()
    ch = str(t.private)
    counts = f"/api/channels/{ch}/counts"
    async with RelayClient.connect(relay.ws_url, host=HOST) as alice:
        assert (await alice.auth(t.alice))[2] is True
        for i in range(3):
            await post(alice, message(t.alice, ch, f"news {i}"))
    assert await get(relay, counts, signer=t.bob) == (200, {"channel": ch, "messages": 3, "member": True, "unread": 3})
    assert await get(relay, counts, token=t.bob_token) == (
        200,
        {"channel": ch, "messages": 3, "member": True, "unread": 3},
    )
    # Posting marks the channel read for its author.
    assert (await get(relay, counts, signer=t.alice))[1]["unread"] == 0

    # Bob posts once, over HTTP this time.
    event = message(t.bob, ch, "reply over http")
    body = json.dumps(event).encode()
    status, answer = await http(relay, "POST", "/events", host=HOST, signer=t.bob, body=body)
    assert (status, answer) == (200, {"event_id": event["id"], "accepted": True, "message": ""})
    assert (await get(relay, counts, token=t.bob_token))[1] == {
        "channel": ch,
        "messages": 4,
        "member": True,
        "unread": 0,
    }
    assert (await get(relay, counts, signer=t.alice))[1]["unread"] == 1

    status, listing = await get(relay, "/api/unread", signer=t.alice)
    assert status == 200
    assert {c["channel"]: (c["messages"], c["unread"]) for c in listing["channels"]} == {
        ch: (4, 1),
        str(t.open): (0, 0),
    }
    # A client may send a body with the POST; NIP-98 then signs its hash.
    status, marked = await http(relay, "POST", f"/api/channels/{ch}/read", host=HOST, signer=t.alice, body=b"{}")
    assert (status, marked) == (200, {"channel": ch, "marked": True, "unread": 0})
    assert (await get(relay, counts, signer=t.alice))[1]["unread"] == 0
    status, listing = await get(relay, "/api/unread", token=t.bob_token)
    assert status == 200 and {c["channel"]: c["unread"] for c in listing["channels"]} == {ch: 0, str(t.open): 0}

    # A bearer token marks read too.
    async with RelayClient.connect(relay.ws_url, host=HOST) as alice:
        assert (await alice.auth(t.alice))[2] is True
        await post(alice, message(t.alice, ch, "one more"))
    assert (await get(relay, counts, token=t.bob_token))[1]["unread"] == 1
    status, marked = await http(relay, "POST", f"/api/channels/{ch}/read", host=HOST, authorization=bearer(t.bob_token))
    assert (status, marked["unread"]) == (200, 0)
    assert (await get(relay, counts, signer=t.bob))[1]["unread"] == 0


async def test_p_tags_make_mention_records_readable_by_the_mentioned(team: Team, relay_factory: Any) -> None:
    t = team
    relay = relay_factory()
    async with RelayClient.connect(relay.ws_url, host=HOST) as alice:
        assert (await alice.auth(t.alice))[2] is True
        m = await post(
            alice,
            message(
                t.alice,
                t.private,
                "hey bob",
                [["p", t.bob.pubkey], ["p", t.bob.pubkey], ["p", t.alice.pubkey], ["p", t.carol.pubkey]],
            ),
        )
    # One record per mentioned pubkey, never the author.
    assert await mention_rows(m["id"]) == {t.bob.pubkey, t.carol.pubkey}
    want = [{"event_id": m["id"], "channel": str(t.private), "kind": 9}]
    for auth in ({"signer": t.bob}, {"token": t.bob_token}):
        status, body = await get(relay, "/api/mentions", **auth)  # type: ignore[arg-type]
        assert status == 200
        assert [{k: v for k, v in x.items() if k != "created_at"} for x in body["mentions"]] == want
    assert await get(relay, "/api/mentions", signer=t.alice) == (200, {"mentions": []})
    # Carol is named, but can't read the private channel: her inbox stays empty.
    assert await get(relay, "/api/mentions", signer=t.carol) == (200, {"mentions": []})


async def test_counter_endpoints_need_a_reading_credential(team: Team, relay_factory: Any) -> None:
    t = team
    relay = relay_factory()
    counts = f"/api/channels/{t.private}/counts"
    status, body = await get(relay, counts)
    assert status == 401 and body["error"].startswith("auth-required:")
    status, body = await get(relay, counts, token="buzz_not-a-real-token")
    assert (status, body) == (401, {"error": "auth-required: unknown, revoked or expired token"})
    assert await get(relay, counts, token=t.bob_token_noread) == (
        403,
        {"error": "restricted: this token lacks the messages:read scope"},
    )
    # A NIP-98 authorization is good for one request.
    header = nip98(t.bob, HOST, "GET", counts)
    headers = {"Host": HOST, "Authorization": header}
    first = await sync_to_async(request, thread_sensitive=False)(relay, "GET", counts, headers, b"")
    again = await sync_to_async(request, thread_sensitive=False)(relay, "GET", counts, headers, b"")
    assert first[0] == 200
    assert again[0] == 401 and again[1]["error"].startswith("auth-required: replayed authorization event")
    # Signed for another path: refused.
    wrong = {"Host": HOST, "Authorization": nip98(t.bob, HOST, "GET", "/api/unread")}
    status, body = await sync_to_async(request, thread_sensitive=False)(relay, "GET", counts, wrong, b"")
    assert status == 401 and "u tag" in body["error"]


async def test_unread_and_mentions_are_withheld_from_banned_and_unscoped_readers(
    team: Team, relay_factory: Any
) -> None:
    t = team
    relay = relay_factory()
    async with RelayClient.connect(relay.ws_url, host=HOST) as alice:
        assert (await alice.auth(t.alice))[2] is True
        await post(alice, message(t.alice, t.private, "hi bob", [["p", t.bob.pubkey]]))
    status, body = await get(relay, "/api/unread", token=t.bob_token)
    assert status == 200 and len(body["channels"]) == 2
    # A token without messages:read learns nothing about messages.
    assert await get(relay, "/api/unread", token=t.bob_token_noread) == (200, {"channels": []})
    assert await get(relay, "/api/mentions", token=t.bob_token_noread) == (200, {"mentions": []})
    await sync_to_async(bans.ban_add)(community=t.community, pubkey=t.bob.pubkey)
    # Reads are refused to a banned pubkey: no unread counts, no mentions, no channel counts.
    assert await get(relay, "/api/unread", signer=t.bob) == (200, {"channels": []})
    assert await get(relay, "/api/mentions", signer=t.bob) == (200, {"mentions": []})
    status, body = await get(relay, f"/api/channels/{t.private}/counts", signer=t.bob)
    assert (status, body) == (403, {"error": "blocked: this pubkey is banned from the community"})


async def test_rejected_http_post_stores_nothing(team: Team, relay_factory: Any) -> None:
    t = team
    relay = relay_factory()
    event = message(t.carol, t.private, "let me in")
    body = json.dumps(event).encode()
    status, answer = await http(relay, "POST", "/events", host=HOST, signer=t.carol, body=body)
    assert (status, answer) == (403, {"event_id": event["id"], "accepted": False, "message": NOT_A_MEMBER})
    assert not await stored(event["id"])
    forged = dict(message(t.bob, t.private, "forged"), content="changed after signing")
    body = json.dumps(forged).encode()
    status, answer = await http(relay, "POST", "/events", host=HOST, signer=t.bob, body=body)
    assert status == 400 and answer["accepted"] is False and answer["message"].startswith("invalid:")
    assert not await stored(forged["id"])
    # Signed by carol, sent under bob's token: not the authenticated pubkey.
    other = message(t.carol, t.open, "impostor")
    status, answer = await http(
        relay, "POST", "/events", host=HOST, authorization=bearer(t.bob_token), body=json.dumps(other).encode()
    )
    assert (status, answer["message"]) == (400, "invalid: event pubkey is not the authenticated pubkey")
    assert not await stored(other["id"])
