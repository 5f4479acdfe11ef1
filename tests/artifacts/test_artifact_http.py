"""Kind-45010 writes over HTTP POST /events and over the WebSocket, against real relay processes.

* POST /events answers {"event_id", "accepted", "message"}: 200 accepted (and duplicate), 400 invalid,
  401 without a valid NIP-98 or bearer credential, 403 restricted, 409 conflict, 429 rate-limited;
  each message is the text the WebSocket OK carries for the same event.
* Kind 5 aimed at a revision is refused with the explicit reason; a client's kind 45011 is refused.
* The write quota applies to 45010 (BUZZ_WRITES_PER_SECOND=1, BUZZ_WRITE_BURST=2: the third quick
  write is rate-limited) and so does the per-event content size limit (BUZZ_MAX_CONTENT_LENGTH).
* A rejected envelope (or kind 5, or kind 45011) stores nothing: no revision, no artifact, no tag
  index row, no mention, no stored event, and the head stays where it was.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from artifacts.models import Artifact, CurrentTag, MoveRemoval, Revision
from buzz.models import Community, Mention, StoredEvent
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, make_token, nip98_url, revision, signed, signers
from tests.support.wire import Logins, http, publish
from tests.support.wsclient import RelayClient, naming

HOST = "artifact-http.test"
NO_QUOTA = {"BUZZ_WRITES_PER_SECOND": "0"}
HEAD_CHANGED = "conflict: head changed; fetch the current revision and reapply your change"
HEAD_UNAVAILABLE = "conflict: head unavailable"
IDENTITY_TAKEN = "conflict: artifact identity is taken"
NOT_A_MEMBER = "restricted: not a channel member"
RATE_LIMITED = "rate-limited: slow down, too many writes from this pubkey"
REMOVAL_REFUSED = "invalid: kind 45011 removals are written by the relay, never by clients"


@dataclass
class World:
    community: Community
    alice: Signer  # owner of `private`
    mallory: Signer  # relay member, not in `private`
    carol: Signer  # member of `private`
    stranger: Signer  # not a relay member
    private: uuid.UUID
    read_token: str  # alice, messages:read only
    write_token: str  # alice, messages:read + messages:write


@pytest.fixture
def world(transactional_db: None) -> World:
    alice, mallory, carol, stranger = signers(4)
    community = make_community(HOST, "Artifact HTTP", members=[alice, mallory, carol])
    private = make_channel(community, alice, visibility="private", name="p", members=[carol])
    read = make_token(community, alice, ["messages:read"])
    write = make_token(community, alice, ["messages:read", "messages:write"])
    return World(community, alice, mallory, carol, stranger, private, read, write)


async def post(
    relay: Any, event: Any, *, signer: Signer | None = None, authorization: str | None = None
) -> tuple[int, Any]:
    body = event if isinstance(event, bytes) else json.dumps(event).encode()
    return await http(relay, "POST", "/events", host=HOST, signer=signer, authorization=authorization, body=body)


@sync_to_async
def stored_state() -> dict[str, Any]:
    return {
        "revisions": Revision.objects.count(),
        "artifacts": Artifact.objects.count(),
        "heads": sorted((str(a.d), str(a.head_id), str(a.home), a.deleted) for a in Artifact.objects.all()),
        "tags": CurrentTag.objects.count(),
        "mentions": Mention.objects.count(),
        "removals": MoveRemoval.objects.count(),
        "events": StoredEvent.objects.count(),
    }


def reason_of(body: dict[str, Any]) -> str:
    """The reason of a refused request: `message` in the event answer, `error` in an authentication failure."""
    return str(body.get("message", body.get("error", "")))


async def test_post_events_statuses_and_ws_texts(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**NO_QUOTA)
    login = Logins(relay, HOST)
    try:
        alice_ws, mallory_ws = await login(world.alice), await login(world.mallory)

        # 200: accepted, then the duplicate.
        d = uuid.uuid4()
        create = revision(world.alice, d=d, h=world.private)
        assert await post(relay, create, signer=world.alice) == (
            200, {"event_id": create["id"], "accepted": True, "message": ""}
        )  # fmt: skip
        assert await post(relay, create, signer=world.alice) == (
            200, {"event_id": create["id"], "accepted": True, "message": "duplicate: already accepted"}
        )  # fmt: skip
        assert (await publish(alice_ws, create))[2:] == [True, "duplicate: already accepted"]
        # With a bearer token holding messages:write.
        update = revision(world.alice, d=d, h=world.private, op="update", prev=create["id"])
        status, body = await post(relay, update, authorization=RelayClient.bearer(world.write_token))
        assert (status, body["accepted"], body["message"]) == (200, True, "")
        ws_new = revision(world.alice, d=uuid.uuid4(), h=world.private)
        assert (await publish(alice_ws, ws_new))[2:] == [True, ""]

        before = await stored_state()
        # Each rejection: (sender over HTTP, credential, event, status, message); the WS gets the same text.
        other = uuid.uuid4()
        cases: list[tuple[str, Signer, str | None, dict[str, Any], int, str]] = [
            ("blank title", world.alice, None, revision(world.alice, d=other, h=world.private, title=" "), 400,
             "invalid: title must not be blank"),
            ("ar twice", world.alice, None, revision(world.alice, d=other, h=world.private, extra=[["ar", "2"]]), 400,
             "invalid: envelope tag ar occurs more than once"),
            ("delete with content", world.alice, None,
             revision(world.alice, d=d, h=world.private, op="delete", prev=update["id"], title=None, content="x"),
             400, "invalid: a delete has empty content"),
            ("kind 5", world.alice, None, signed(world.alice, 5, [["e", update["id"]], ["k", "45010"]], ""), 400, ""),
            ("kind 45011", world.alice, None,
             signed(world.alice, 45011, [["ar", "1"], ["d", str(d)], ["h", str(world.private)],
                                         ["reason", "moved"], ["prev", update["id"]]], ""), 400, REMOVAL_REFUSED),
            ("not a member", world.mallory, None, revision(world.mallory, d=other, h=world.private), 403, NOT_A_MEMBER),
            ("read-only token", world.alice, world.read_token, revision(world.alice, d=other, h=world.private), 403,
             "restricted: this token lacks the messages:write scope"),
            ("stale prev", world.alice, None,
             revision(world.alice, d=d, h=world.private, op="update", prev=create["id"]), 409, HEAD_CHANGED),
            ("unreadable head", world.mallory, None,
             revision(world.mallory, d=d, h=world.private, op="update", prev=update["id"]), 409, HEAD_UNAVAILABLE),
            ("taken d", world.mallory, None, revision(world.mallory, d=d, h=world.private), 403, NOT_A_MEMBER),
            ("taken d, writable h", world.alice, None, revision(world.alice, d=d, h=world.private), 409,
             IDENTITY_TAKEN),
        ]  # fmt: skip
        for label, signer, token, event, want_status, want_message in cases:
            if token is None:
                status, body = await post(relay, event, signer=signer)
            else:
                status, body = await post(relay, event, authorization=RelayClient.bearer(token))
            assert status == want_status, (label, status, body)
            assert body["event_id"] == event["id"] and body["accepted"] is False, (label, body)
            if want_message:
                assert body["message"] == want_message, (label, body)
            client = alice_ws if signer is world.alice else mallory_ws
            if token is None:
                assert (await publish(client, event))[2:] == [False, body["message"]], label
            else:
                async with RelayClient.connect(relay.ws_url, host=HOST, authorization=RelayClient.bearer(token)) as tc:
                    assert (await publish(tc, event))[2:] == [False, body["message"]], label
        # Kind 5 on a revision: refused with a reason that says so.
        kind5 = next(c for c in cases if c[0] == "kind 5")[3]
        status, body = await post(relay, kind5, signer=world.alice)
        assert body["message"].startswith("invalid: kind 5 deletion requests are not accepted"), body
        assert "op=delete" in body["message"] and "9005" in body["message"]
        assert await stored_state() == before

        # 400 for a body that is not JSON.
        assert await post(relay, b"{not json", signer=world.alice) == (
            400, {"event_id": "", "accepted": False, "message": "invalid: body is not JSON"}
        )  # fmt: skip
        # 401: no credential, NIP-98 for another URL, a replayed NIP-98 header, an unknown bearer token.
        fresh = revision(world.alice, d=uuid.uuid4(), h=world.private)
        raw = json.dumps(fresh).encode()
        status, body = await post(relay, fresh)
        assert status == 401 and reason_of(body).startswith("auth-required:"), body
        wrong_url = nip98_url(world.alice, f"http://{HOST}/query", "POST", raw)
        status, body = await post(relay, fresh, authorization=wrong_url)
        assert status == 401 and reason_of(body).startswith("auth-required:"), body
        good = nip98_url(world.alice, f"http://{HOST}/events", "POST", raw)
        other_body = revision(world.alice, d=uuid.uuid4(), h=world.private)
        status, body = await post(relay, other_body, authorization=good)  # payload hash of another body
        assert status == 401 and reason_of(body).startswith("auth-required:"), body
        assert (await post(relay, fresh, authorization=good))[0] == 200
        status, body = await post(relay, fresh, authorization=good)
        assert status == 401 and reason_of(body).startswith("auth-required: replayed authorization event")
        status, body = await post(relay, fresh, authorization="Bearer buzz_not-a-token")
        assert status == 401 and reason_of(body).startswith("auth-required:"), body
        # 403 at authentication: NIP-98 by a pubkey that is not a relay member.
        status, body = await post(relay, revision(world.stranger, d=uuid.uuid4(), h=world.private),
                                  signer=world.stranger)  # fmt: skip
        assert (status, reason_of(body)) == (403, "restricted: not a relay member")
    finally:
        await login.close()


async def test_quota_and_size_limits_apply(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(BUZZ_WRITES_PER_SECOND="1", BUZZ_WRITE_BURST="2", BUZZ_MAX_CONTENT_LENGTH="1024")
    login = Logins(relay, HOST)
    try:
        alice_ws = await login(world.alice)
        # WS: three quick creates, sent together: the third is rate-limited and stores nothing.
        before = await stored_state()
        events = [revision(world.alice, d=uuid.uuid4(), h=world.private) for _ in range(3)]
        for e in events:
            await alice_ws.send_json(["EVENT", e])
        replies = [await alice_ws.expect("OK", where=naming(e["id"])) for e in events]
        assert [r[2:] for r in replies] == [[True, ""], [True, ""], [False, RATE_LIMITED]], replies
        assert (await stored_state())["revisions"] == before["revisions"] + 2
        # HTTP: carol's own bucket; three quick requests, one 429 with the same text.
        before = await stored_state()
        events = [revision(world.carol, d=uuid.uuid4(), h=world.private) for _ in range(3)]
        answers = await asyncio.gather(*(post(relay, e, signer=world.carol) for e in events))
        assert sorted(status for status, _ in answers) == [200, 200, 429], answers
        limited = next(body for status, body in answers if status == 429)
        assert (limited["accepted"], limited["message"]) == (False, RATE_LIMITED)
        after = await stored_state()
        assert after["revisions"] == before["revisions"] + 2

        # Size: content over BUZZ_MAX_CONTENT_LENGTH is invalid, over both transports, whatever the bucket holds.
        too_big = revision(world.alice, d=uuid.uuid4(), h=world.private, content="x" * 1025)
        reply = await publish(alice_ws, too_big)
        assert reply[2:] == [False, "invalid: content too long (max 1024 bytes)"], reply
        status, body = await post(relay, too_big, signer=world.alice)
        assert (status, body["message"]) == (400, "invalid: content too long (max 1024 bytes)")
        # Measured in bytes: 342 three-byte characters are 1026 bytes.
        wide = revision(world.alice, d=uuid.uuid4(), h=world.private, content="€" * 342)
        assert (await publish(alice_ws, wide))[2:] == [False, "invalid: content too long (max 1024 bytes)"]
        assert await stored_state() == after
        # At the limit it is accepted (once the bucket has a token again).
        await asyncio.sleep(1.1)
        at_limit = revision(world.alice, d=uuid.uuid4(), h=world.private, content="y" * 1024)
        assert (await publish(alice_ws, at_limit))[2:] == [True, ""]
    finally:
        await login.close()


async def test_rejected_envelopes_store_nothing(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**NO_QUOTA)
    login = Logins(relay, HOST)
    try:
        alice = await login(world.alice)
        d = uuid.uuid4()
        create = revision(world.alice, d=d, h=world.private, extra=[["p", world.carol.pubkey], ["status", "open"]])
        assert (await publish(alice, create))[2] is True
        before = await stored_state()
        h, p = world.private, ["p", world.mallory.pubkey]
        new = uuid.uuid4()
        rejected = [
            revision(world.alice, d=new, h=h, title=None, extra=[p]),
            revision(world.alice, d=new, h=h, extra=[p, ["type", "buzz.other"]]),
            revision(world.alice, d=new, h=h, prev=create["id"], extra=[p]),
            revision(world.alice, d=new, h=h, extra=[p, ["root", "AB" * 32]]),
            revision(world.alice, d=new, h=h, extra=[p, ["x" * 129, "v"]]),
            revision(world.alice, d=new, h=h, extra=[p, ["v", "x" * 4097]]),
            revision(world.alice, d=new, h=h, extra=[p, *(["v", "x" * 4000] for _ in range(17))]),
            revision(world.alice, d=d, h=h, op="update", extra=[p]),  # no prev
            revision(world.alice, d=d, h=h, op="update", prev=create["id"], title="", extra=[p]),
            revision(world.alice, d=d, h=h, op="delete", prev=create["id"], title=None, extra=[p]),
            revision(world.alice, d=d, h=h, op="rename", prev=create["id"], extra=[p]),
            revision(world.alice, d=d, h=uuid.uuid4(), op="update", prev=create["id"], extra=[p]),  # update keeps h
            revision(world.alice, d=d, h=h, op="restore", prev=create["id"], extra=[p]),  # not deleted
            revision(world.alice, d=d, h=h, op="move", prev=create["id"], extra=[p]),  # a move changes h
            revision(world.alice, d=d, h=h, op="update", prev=create["id"], extra=[p, ["root", "ab" * 32]]),
            signed(world.alice, 5, [["e", create["id"]]], ""),
            signed(world.alice, 45011, [["ar", "1"], ["d", str(d)], ["h", str(h)], ["reason", "moved"],
                                        ["prev", create["id"]]], ""),
        ]  # fmt: skip
        for event in rejected:
            reply = await publish(alice, event)
            assert reply[2] is False and reply[3].startswith("invalid: "), (event["tags"][:8], reply)
            status, body = await post(relay, event, signer=world.alice)
            assert (status, body["message"]) == (400, reply[3])
        assert await stored_state() == before
    finally:
        await login.close()
