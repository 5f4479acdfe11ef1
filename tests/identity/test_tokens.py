"""API tokens: `Authorization: Bearer` on the WebSocket upgrade and on HTTP, against a real relay.

A token authenticates as its pubkey and holds only its scopes and channels; events
must still be signed by that pubkey; NIP-42 login holds every scope; a revoked or
expired token stops working on the very next request, even on a connection that is
already open.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from websockets.exceptions import InvalidStatus

from buzz.identity.tokens import hash_token, token_create, token_revoke
from buzz.models import ApiToken, Channel, Community
from buzz.nostr import Signer
from buzz.ws.session import BEARER_CONNECTION
from tests.support.factories import TOKEN_INVALID, make_channel, make_community, message, signed, signers
from tests.support.records import stored
from tests.support.wire import http, publish, query
from tests.support.wsclient import RelayClient

HOST = "tokens.test"
RW = ["messages:read", "messages:write"]


@dataclass
class Desk:
    community: Community
    dana: Signer  # owner of both channels
    eve: Signer  # member of both
    a: uuid.UUID
    b: uuid.UUID
    tokens: dict[str, tuple[int, str]]  # name -> (row id, token)


@pytest.fixture
def desk(transactional_db: None) -> Desk:
    dana, eve = signers(2)
    community = make_community(HOST, "Tokens", members=[dana, eve])
    a, b = (make_channel(community, dana, visibility="private", members=[eve]) for _ in range(2))
    specs: dict[str, dict[str, Any]] = {
        "rw": {"scopes": RW},
        "read": {"scopes": ["messages:read"]},
        "write": {"scopes": ["messages:write"]},
        "channels": {"scopes": [*RW, "channels:write"]},
        "only_a": {"scopes": RW, "channels": [str(a)]},
        "spare": {"scopes": RW},
        "admin": {"scopes": ["admin:channels"]},
        "channels_read": {"scopes": ["channels:read"]},
    }
    tokens = {}
    for name, spec in specs.items():
        issued = token_create(community=community, pubkey=dana.pubkey, **spec)
        tokens[name] = (issued.row.pk, issued.token)
    return Desk(community, dana, eve, a, b, tokens)


def by_token(relay: Any, token: str) -> Any:
    return RelayClient.connect(relay.ws_url, host=HOST, authorization=RelayClient.bearer(token))


async def ok(client: RelayClient, event: dict[str, Any]) -> dict[str, Any]:
    reply = await publish(client, event)
    assert reply[2] is True, reply
    return event


async def refused(client: RelayClient, event: dict[str, Any], reason: str) -> None:
    reply = await publish(client, event)
    assert reply[2:] == [False, reason], reply
    assert not await stored(event["id"])


async def test_bearer_connection_authenticates_as_the_token_pubkey(desk: Desk, relay_factory: Any) -> None:
    d = desk
    relay = relay_factory()
    async with by_token(relay, d.tokens["rw"][1]) as client:
        # No AUTH needed: the token already names dana.
        mine = await ok(client, message(d.dana, d.a))
        end, events = await query(client, "s1", {"#h": [str(d.a)], "kinds": [9]})
        assert end[0] == "EOSE" and [e["id"] for e in events] == [mine["id"]]
        await refused(client, message(d.eve, d.a), "invalid: event pubkey is not the authenticated pubkey")
        reply = await client.auth(d.eve)
        assert reply[2:] == [False, "restricted: this connection is authenticated as another pubkey"]
        await refused(client, message(d.eve, d.a), "invalid: event pubkey is not the authenticated pubkey")
        # Nor does the token's own pubkey log in over it: the token's scopes, channels and expiry stay the
        # connection's, so an OK would promise what the connection can't do.
        reply = await client.auth(d.dana)
        assert reply[2:] == [False, BEARER_CONNECTION]


async def test_token_scopes_limit_what_it_may_do(desk: Desk, relay_factory: Any) -> None:
    d = desk
    relay = relay_factory()
    ch = str(d.a)
    async with by_token(relay, d.tokens["read"][1]) as reader:
        await refused(reader, message(d.dana, ch), "restricted: this token lacks the messages:write scope")
        end, _ = await query(reader, "r1", {"#h": [ch]})
        assert end[0] == "EOSE"
    async with by_token(relay, d.tokens["write"][1]) as writer:
        target = await ok(writer, message(d.dana, ch))
        end, _ = await query(writer, "w1", {"#h": [ch]})
        assert end == ["CLOSED", "w1", "restricted: this token lacks the messages:read scope"]
        await refused(
            writer,
            signed(d.dana, 9007, [["h", str(uuid.uuid4())], ["name", "x"]]),
            "restricted: this token lacks the channels:write scope",
        )
        await refused(
            writer,
            signed(d.dana, 9000, [["h", ch], ["p", Signer.generate().pubkey]]),
            "restricted: this token lacks the admin:channels scope",
        )
        # Deleting a message is a message write.
        await ok(writer, signed(d.dana, 9005, [["e", target["id"]], ["h", ch]]))
    async with by_token(relay, d.tokens["channels"][1]) as manager:
        new = uuid.uuid4()
        await ok(manager, signed(d.dana, 9007, [["h", str(new)], ["name", "by token"]]))
        assert await sync_to_async(Channel.objects.filter(uuid=new).exists)()
        await ok(manager, signed(d.dana, 9002, [["h", str(new)], ["about", "edited"]]))
        # Membership changes by others, archiving and a group's deletion are administration (as Buzz asks).
        lacks_admin = "restricted: this token lacks the admin:channels scope"
        for kind, tags in (
            (9000, [["p", Signer.generate().pubkey]]),
            (9001, [["p", d.eve.pubkey]]),
            (9002, [["archived", "true"]]),
            (9008, []),
        ):
            await refused(manager, signed(d.dana, kind, [["h", str(new)], *tags]), lacks_admin)
    async with by_token(relay, d.tokens["admin"][1]) as admin:
        newcomer = Signer.generate().pubkey
        await ok(admin, signed(d.dana, 9000, [["h", str(new)], ["p", newcomer]]))
        await ok(admin, signed(d.dana, 9001, [["h", str(new)], ["p", newcomer]]))
        await ok(admin, signed(d.dana, 9002, [["h", str(new)], ["archived", "true"]]))
        await ok(admin, signed(d.dana, 9002, [["h", str(new)], ["archived", "false"]]))
        await refused(
            admin,
            signed(d.dana, 9002, [["h", str(new)], ["about", "x"]]),
            "restricted: this token lacks the channels:write scope",
        )
        await ok(admin, signed(d.dana, 9008, [["h", str(new)]]))
    async with by_token(relay, d.tokens["channels_read"][1]) as joiner:
        # Joining and leaving need channels:read only: dana's join of a channel it is in passes the scope.
        assert (await publish(joiner, signed(d.dana, 9021, [["h", ch]])))[2:] == [True, "duplicate: already a member"]
        await refused(
            joiner,
            signed(d.dana, 9007, [["h", str(uuid.uuid4())], ["name", "x"]]),
            "restricted: this token lacks the channels:write scope",
        )


async def test_channel_limited_token_covers_only_its_channels(desk: Desk, relay_factory: Any) -> None:
    d = desk
    relay = relay_factory()
    async with RelayClient.connect(relay.ws_url, host=HOST) as full:
        assert (await full.auth(d.dana))[2] is True
        in_a = await ok(full, message(d.dana, d.a))
        await ok(full, message(d.dana, d.b))
    token = d.tokens["only_a"][1]
    async with by_token(relay, token) as client:
        await ok(client, message(d.dana, d.a))
        await refused(client, message(d.dana, d.b), "restricted: this token does not cover that channel")
        end, _ = await query(client, "b1", {"#h": [str(d.b)]})
        assert end == ["CLOSED", "b1", "restricted: this token does not cover that channel"]
        end, events = await query(client, "all", {"kinds": [9]})
        assert end[0] == "EOSE"
        assert in_a["id"] in {e["id"] for e in events}
        assert {e["tags"][0][1] for e in events} == {str(d.a)}
    auth = RelayClient.bearer(token)
    status, body = await http(relay, "GET", f"/api/channels/{d.b}/counts", host=HOST, authorization=auth)
    assert (status, body) == (403, {"error": "restricted: this token does not cover that channel"})
    status, body = await http(relay, "GET", "/api/unread", host=HOST, authorization=auth)
    assert status == 200 and [c["channel"] for c in body["channels"]] == [str(d.a)]


async def test_nip42_login_holds_every_scope(desk: Desk, relay_factory: Any) -> None:
    d = desk
    relay = relay_factory()
    new = str(uuid.uuid4())
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(d.dana))[2] is True
        await ok(client, signed(d.dana, 9007, [["h", new], ["name", "nip42"]]))
        await ok(client, signed(d.dana, 9000, [["h", new], ["p", d.eve.pubkey]]))
        await ok(client, signed(d.dana, 9002, [["h", new], ["about", "edited"]]))
        posted = await ok(client, message(d.dana, new))
        end, events = await query(client, "n1", {"#h": [new], "kinds": [9]})
        assert end[0] == "EOSE" and [e["id"] for e in events] == [posted["id"]]


async def test_unknown_token_is_refused_at_upgrade_and_over_http(desk: Desk, relay_factory: Any) -> None:
    relay = relay_factory()
    with pytest.raises(InvalidStatus) as err:
        async with by_token(relay, "buzz_nope"):
            pass
    assert err.value.response.status_code == 403
    status, body = await http(relay, "GET", "/api/unread", host=HOST, authorization="Bearer buzz_nope")
    assert (status, body) == (401, {"error": "auth-required: unknown, revoked or expired token"})


async def test_revoked_token_is_refused_on_the_next_event_and_req(desk: Desk, relay_factory: Any) -> None:
    d = desk
    relay = relay_factory()
    token_id, token = d.tokens["rw"]
    async with by_token(relay, token) as client:
        mine = await ok(client, message(d.dana, d.a))
        end, _ = await query(client, "before", {"#h": [str(d.a)]})
        assert end[0] == "EOSE"
        await sync_to_async(token_revoke)(token_id=token_id)
        await refused(client, message(d.dana, d.a), TOKEN_INVALID)
        await refused(client, signed(d.dana, 9005, [["e", mine["id"]], ["h", str(d.a)]]), TOKEN_INVALID)
        end, _ = await query(client, "after", {"#h": [str(d.a)]})
        assert end == ["CLOSED", "after", TOKEN_INVALID]


async def test_revoked_token_is_refused_on_a_req_without_h(desk: Desk, relay_factory: Any) -> None:
    """A REQ that names no channel is a read too: a revoked token gets CLOSED, not an empty EOSE."""
    d = desk
    relay = relay_factory()
    token_id, token = d.tokens["rw"]
    async with by_token(relay, token) as client:
        end, _ = await query(client, "before", {"kinds": [9]})
        assert end[0] == "EOSE"
        await sync_to_async(token_revoke)(token_id=token_id)
        end, _ = await query(client, "after", {"kinds": [9]})
        assert end == ["CLOSED", "after", TOKEN_INVALID]


async def test_revoked_and_expired_tokens_get_401_on_the_next_http_request(desk: Desk, relay_factory: Any) -> None:
    d = desk
    relay = relay_factory()
    path = f"/api/channels/{d.a}/counts"
    rw_id, rw = d.tokens["rw"]
    spare_id, spare = d.tokens["spare"]
    for token in (rw, spare):
        assert (await http(relay, "GET", path, host=HOST, authorization=RelayClient.bearer(token)))[0] == 200
    await sync_to_async(token_revoke)(token_id=rw_id)
    past = timezone.now() - dt.timedelta(seconds=1)
    await sync_to_async(ApiToken.objects.filter(pk=spare_id).update)(expires_at=past)
    for token in (rw, spare):
        status, body = await http(relay, "GET", path, host=HOST, authorization=RelayClient.bearer(token))
        assert (status, body) == (401, {"error": "auth-required: unknown, revoked or expired token"})


async def test_expired_token_is_refused_on_an_open_connection(desk: Desk, relay_factory: Any) -> None:
    d = desk
    relay = relay_factory()
    token_id, token = d.tokens["spare"]
    async with by_token(relay, token) as client:
        await ok(client, message(d.dana, d.a))
        past = timezone.now() - dt.timedelta(seconds=1)
        await sync_to_async(ApiToken.objects.filter(pk=token_id).update)(expires_at=past)
        await refused(client, message(d.dana, d.a), TOKEN_INVALID)
        end, _ = await query(client, "x", {"#h": [str(d.a)]})
        assert end == ["CLOSED", "x", TOKEN_INVALID]


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


async def test_token_command_prints_the_token_once_and_revoke_stops_it(desk: Desk, relay_factory: Any) -> None:
    d = desk
    relay = relay_factory()
    text = await sync_to_async(run)(
        "token", "create", "--host", HOST, d.eve.pubkey, "--scope", "messages:read", "--name", "ci bot"
    )
    match = re.fullmatch(r"token id (\d+) for [0-9a-f]{64} \(shown once, store it now\):\n(buzz_\S+)\n", text)
    assert match, text
    token_id, token = int(match.group(1)), match.group(2)
    row = await sync_to_async(ApiToken.objects.get)(pk=token_id)
    assert row.token_hash == hash_token(token) and token not in (row.prefix, row.name)
    listing = await sync_to_async(run)("token", "list", "--host", HOST)
    assert row.prefix in listing and token not in listing
    auth = RelayClient.bearer(token)
    status, body = await http(relay, "GET", "/api/unread", host=HOST, authorization=auth)
    assert status == 200 and {c["channel"] for c in body["channels"]} == {str(d.a), str(d.b)}
    assert await sync_to_async(run)("token", "revoke", "--host", HOST, str(token_id)) == (
        f"revoked token {token_id} ({row.prefix}…)\n"
    )
    status, _ = await http(relay, "GET", "/api/unread", host=HOST, authorization=auth)
    assert status == 401
    assert "\trevoked" in await sync_to_async(run)("token", "list", "--host", HOST, "--pubkey", d.eve.pubkey)


def test_token_command_refuses_a_lifetime_that_is_zero_or_overflows(desk: Desk) -> None:
    # timedelta(0) is falsy: a zero lifetime must not become a token that never expires.
    for zero in ("0s", "0m", "0h", "0d"):
        with pytest.raises(CommandError, match=r"^a token's lifetime must be positive$"):
            run("token", "create", "--host", HOST, desk.eve.pubkey, "--scope", "messages:read", "--expires-in", zero)
    # Added to now, a lifetime past the calendar's end is one clear error, not an OverflowError.
    with pytest.raises(CommandError, match=r"^invalid duration '3000000d': at most 36500d$"):
        run("token", "create", "--host", HOST, desk.eve.pubkey, "--scope", "messages:read", "--expires-in", "3000000d")
    assert not ApiToken.objects.filter(pubkey=desk.eve.pubkey).exists()
    run("token", "create", "--host", HOST, desk.eve.pubkey, "--scope", "messages:read", "--expires-in", "1s")
    assert ApiToken.objects.get(pubkey=desk.eve.pubkey).expires_at is not None


async def test_a_token_whose_holder_is_no_longer_a_relay_member_is_refused_as_that_pubkey(
    desk: Desk, relay_factory: Any
) -> None:
    """The token is live, its holder is not admitted: the answer is NIP-98's and NIP-42's for that pubkey,
    403 restricted:, not 401 auth-required: (re-authenticating with the same token can't help)."""
    from buzz.identity.communities import member_remove

    relay = relay_factory()
    token = desk.tokens["rw"][1]
    auth = RelayClient.bearer(token)
    assert (await http(relay, "GET", "/api/unread", host=HOST, authorization=auth))[0] == 200
    await sync_to_async(member_remove)(community=desk.community, pubkey=desk.dana.pubkey)
    status, body = await http(relay, "GET", "/api/unread", host=HOST, authorization=auth)
    assert (status, body) == (403, {"error": "restricted: not a relay member"})
    # The WebSocket upgrade refuses it as it refuses a bad token (nothing is open to answer on).
    with pytest.raises(InvalidStatus) as refused:
        async with by_token(relay, token):
            pass
    assert refused.value.response.status_code == 403
