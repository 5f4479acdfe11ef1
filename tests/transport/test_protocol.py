"""NIP-01 / NIP-42 / NIP-11 behaviour of a real relay process: AUTH, limits, bad input, hosts."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import psycopg
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from buzz.identity.communities import community_create, member_add
from buzz.nostr import Signer
from tests.support.relay import relay_database_url
from tests.support.wsclient import RelayClient, naming

HOST = "proto.test"
OPEN_HOST = "open.test"


@pytest.fixture
def keys(transactional_db: None) -> dict[str, Signer]:
    member, outsider = Signer.generate(), Signer.generate()
    community = community_create(host=HOST, name="Proto", description="protocol tests")
    member_add(community=community, pubkey=member.pubkey)
    community_create(host=OPEN_HOST, name="Open", admission="open")
    return {"member": member, "outsider": outsider}


def http_get(
    relay: Any, host: str, accept: str | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Host": host, **({"Accept": accept} if accept else {})}
    req = urllib.request.Request(relay.http_url + "/", headers=headers, method=method)  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - a loopback relay
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def stored_event_count() -> int:
    with psycopg.connect(relay_database_url()) as conn:
        row = conn.execute("SELECT count(*) FROM buzz_storedevent").fetchone()
    assert row is not None
    return int(row[0])


async def test_auth_challenge_then_login(keys: dict[str, Signer], relay_factory: Any) -> None:
    relay = relay_factory()
    async with RelayClient.connect(relay.ws_url, host=HOST) as c:
        first = await c.recv_json()
        assert first[0] == "AUTH" and isinstance(first[1], str) and len(first[1]) >= 16
        c.challenge = first[1]
        ok = await c.auth(keys["member"])
        assert ok[2] is True and ok[3] == ""


async def test_before_auth_event_and_req_are_auth_required(keys: dict[str, Signer], relay_factory: Any) -> None:
    relay = relay_factory()
    async with RelayClient.connect(relay.ws_url, host=HOST) as c:
        await c.expect("AUTH")
        ev = keys["member"].sign_event(kind=9, tags=[["h", "9b353519-f4fe-4757-aef4-bec6cc0ae54c"]], content="x")
        await c.send_json(["EVENT", ev.to_dict()])
        ok = await c.expect("OK")
        assert ok[1:3] == [ev.id, False] and ok[3].startswith("auth-required:")
        await c.send_json(["REQ", "s", {"kinds": [9]}])
        closed = await c.expect("CLOSED")
        assert closed[1] == "s" and closed[2].startswith("auth-required:")
    assert stored_event_count() == 0


async def test_auth_checks_every_field(keys: dict[str, Signer], relay_factory: Any) -> None:
    relay = relay_factory()
    member = keys["member"]
    async with RelayClient.connect(relay.ws_url, host=HOST) as c:
        challenge = (await c.expect("AUTH"))[1]

        async def attempt(tags: list[list[str]], *, kind: int = 22242, created_at: int | None = None) -> list[Any]:
            ev = member.sign_event(kind=kind, tags=tags, content="", created_at=created_at)
            await c.send_json(["AUTH", ev.to_dict()])
            return await c.expect("OK", where=lambda m: m[1] == ev.id)

        relay_tag = ["relay", f"ws://{HOST}/"]
        wrong_challenge = await attempt([relay_tag, ["challenge", "not-the-challenge"]])
        assert wrong_challenge[2] is False and "challenge" in wrong_challenge[3]
        wrong_url = await attempt([["relay", "ws://elsewhere.test/"], ["challenge", challenge]])
        assert wrong_url[2] is False and "relay" in wrong_url[3]
        stale = await attempt([relay_tag, ["challenge", challenge]], created_at=int(time.time()) - 3600)
        assert stale[2] is False and stale[3].startswith("auth-required:")
        future = await attempt([relay_tag, ["challenge", challenge]], created_at=int(time.time()) + 3600)
        assert future[2] is False
        wrong_kind = await attempt([relay_tag, ["challenge", challenge]], kind=1)
        assert wrong_kind[2] is False
        good = member.sign_event(kind=22242, tags=[relay_tag, ["challenge", challenge]], content="").to_dict()
        forged = dict(good, sig="00" * 64)
        await c.send_json(["AUTH", forged])
        bad_sig = await c.expect("OK", where=lambda m: m[1] == forged["id"])
        assert bad_sig[2] is False and bad_sig[3].startswith("invalid:")
        # After every refusal the connection still logs in with a correct event.
        await c.send_json(["AUTH", good])
        assert (await c.expect("OK", where=lambda m: m[1] == good["id"]))[2] is True
        # The challenge stays good for the connection (NIP-42: until the relay sends another, and it sends
        # none): the same pubkey logs in again, another pubkey is refused as another, not as a bad challenge.
        await c.send_json(["AUTH", good])
        assert (await c.expect("OK", where=lambda m: m[1] == good["id"]))[2:] == [True, ""]
        again = member.sign_event(kind=22242, tags=[relay_tag, ["challenge", challenge]], content="again").to_dict()
        await c.send_json(["AUTH", again])
        assert (await c.expect("OK", where=lambda m: m[1] == again["id"]))[2:] == [True, ""]
        other = keys["outsider"].sign_event(kind=22242, tags=[relay_tag, ["challenge", challenge]], content="")
        await c.send_json(["AUTH", other.to_dict()])
        assert (await c.expect("OK", where=lambda m: m[1] == other.id))[2:] == [
            False,
            "restricted: this connection is authenticated as another pubkey",
        ]


async def test_non_member_is_restricted_and_open_admission_admits(keys: dict[str, Signer], relay_factory: Any) -> None:
    relay = relay_factory()
    async with RelayClient.connect(relay.ws_url, host=HOST) as c:
        ok = await c.auth(keys["outsider"])
        assert ok[2] is False and ok[3] == "restricted: not a relay member"
        await c.send_json(["REQ", "s", {"kinds": [9]}])
        assert (await c.expect("CLOSED"))[2].startswith("auth-required:")
    async with RelayClient.connect(relay.ws_url, host=OPEN_HOST) as c:
        assert (await c.auth(keys["outsider"]))[2] is True


async def test_bad_frames_get_reasons_and_connection_keeps_working(keys: dict[str, Signer], relay_factory: Any) -> None:
    relay = relay_factory(BUZZ_MAX_MESSAGE_LENGTH="2048", BUZZ_MAX_SUBSCRIPTIONS="2", BUZZ_MAX_FILTERS="2")
    async with RelayClient.connect(relay.ws_url, host=HOST) as c:
        await c.auth(keys["member"])
        await c.ws.send("{not json")
        assert await c.recv_json() == ["NOTICE", "invalid: message is not valid JSON"]
        await c.send_json(["PING"])
        assert await c.recv_json() == ["NOTICE", "invalid: unknown message type 'PING'"]
        await c.send_json(["REQ", "big", {"#t": ["x" * 4000]}])
        notice = await c.recv_json()
        assert notice[0] == "NOTICE" and "limit is 2048" in notice[1]
        await c.send_json(["REQ", "f", {}, {}, {}])
        assert await c.recv_json() == ["CLOSED", "f", "invalid: at most 2 filters per REQ"]
        await c.send_json(["REQ", "x" * 65, {}])
        assert (await c.recv_json())[0] == "NOTICE"
        await c.send_json(["REQ", "u", {"search": "x"}])
        assert await c.recv_json() == ["CLOSED", "u", "invalid: unsupported filter key 'search'"]
        await c.send_json(["EVENT", {"id": "zz"}])
        bad = await c.expect("OK")
        assert bad[2] is False and bad[3].startswith("invalid:")
        stale = keys["member"].sign_event(kind=9, tags=[], content="", created_at=int(time.time()) - 7200)
        await c.send_json(["EVENT", stale.to_dict()])
        assert (await c.expect("OK", where=lambda m: m[1] == stale.id))[3].startswith("invalid: created_at")
        other = Signer.generate().sign_event(kind=9, tags=[], content="")
        await c.send_json(["EVENT", other.to_dict()])
        assert (await c.expect("OK", where=lambda m: m[1] == other.id))[3] == (
            "invalid: event pubkey is not the authenticated pubkey"
        )
        unsupported = keys["member"].sign_event(kind=1, tags=[], content="hi")
        await c.send_json(["EVENT", unsupported.to_dict()])
        assert (await c.expect("OK", where=lambda m: m[1] == unsupported.id))[3].startswith("blocked: kind 1")
        # An EVENT frame of another shape is still answered with OK (NIP-01), with its event's id.
        await c.send_json(["EVENT", {"id": "ab" * 32}, 1])
        assert await c.expect("OK") == ["OK", "ab" * 32, False, "invalid: EVENT takes exactly one event"]
        await c.send_json(["EVENT"])
        assert await c.expect("OK") == ["OK", "", False, "invalid: EVENT takes exactly one event"]
        # Subscription limit, and a REQ reusing an open id replaces it instead of counting twice.
        for sub in ("a", "b", "a"):
            await c.send_json(["REQ", sub, {"kinds": [9]}])
            assert (await c.expect("EOSE", where=naming(sub)))[1] == sub
        await c.send_json(["REQ", "c", {"kinds": [9]}])
        assert await c.expect("CLOSED") == ["CLOSED", "c", "blocked: at most 2 open subscriptions"]
        await c.send_json(["CLOSE", "a"])
        await c.send_json(["REQ", "c", {"kinds": [9]}])
        assert await c.expect("EOSE") == ["EOSE", "c"]
        # A REQ refused while parsing still replaces the open subscription of its id: "b" has ended (its
        # CLOSED says so), and its slot is free again.
        await c.send_json(["REQ", "b", {"search": "x"}])
        assert await c.expect("CLOSED", where=naming("b")) == [
            "CLOSED",
            "b",
            "invalid: unsupported filter key 'search'",
        ]
        await c.send_json(["REQ", "d", {"kinds": [9]}])
        assert await c.expect("EOSE", where=naming("d")) == ["EOSE", "d"]
    assert stored_event_count() == 0


async def test_frame_over_the_transport_limit_closes(keys: dict[str, Signer], relay_factory: Any) -> None:
    relay = relay_factory(BUZZ_MAX_MESSAGE_LENGTH="2048")
    async with RelayClient.connect(relay.ws_url, host=HOST) as c:
        await c.expect("AUTH")
        # Past four times the message limit the transport refuses to buffer the frame at all (1009).
        await c.ws.send("x" * (2048 * 4 + 1))
        with pytest.raises(ConnectionClosed) as info:
            await c.recv_json()
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009


async def test_unknown_host_learns_nothing(keys: dict[str, Signer], relay_factory: Any) -> None:
    relay = relay_factory()
    status, _, body = http_get(relay, "nobody.test", accept="application/nostr+json")
    assert status == 404 and body == b"not found\n"
    with pytest.raises(InvalidStatus):
        async with RelayClient.connect(relay.ws_url, host="nobody.test"):
            pass


async def test_nip11_document(keys: dict[str, Signer], relay_factory: Any) -> None:
    relay = relay_factory(BUZZ_MAX_SUBSCRIPTIONS="7", BUZZ_WRITES_PER_SECOND="5", BUZZ_WRITE_BURST="10")
    status, headers, body = http_get(relay, HOST, accept="application/nostr+json")
    assert status == 200 and headers["content-type"].startswith("application/nostr+json")
    assert headers.get("access-control-allow-origin") == "*"
    # NIP-11: CORS headers on the document, and a preflight answered with them (only the methods served).
    assert headers.get("access-control-allow-methods") == "GET, OPTIONS"
    pre_status, pre_headers, _ = http_get(relay, HOST, accept="application/nostr+json", method="OPTIONS")
    assert pre_status == 204 and pre_headers.get("access-control-allow-origin") == "*", pre_headers
    assert pre_headers.get("access-control-allow-methods") == "GET, OPTIONS"
    doc = json.loads(body)
    with psycopg.connect(relay_database_url()) as conn:
        row = conn.execute("SELECT relay_pubkey FROM buzz_community WHERE host = %s", (HOST,)).fetchone()
    assert row is not None and doc["pubkey"] == row[0]
    assert doc["name"] == "Proto" and doc["description"] == "protocol tests"
    assert {1, 11, 42}.issubset(doc["supported_nips"])
    assert doc["software"] and doc["version"]
    lim = doc["limitation"]
    for key in (
        "max_message_length",
        "max_subscriptions",
        "max_filters",
        "max_limit",
        "max_subid_length",
        "max_event_tags",
        "max_content_length",
        "created_at_lower_limit",
        "created_at_upper_limit",
    ):
        assert isinstance(lim[key], int), key
    assert lim["max_subscriptions"] == 7 and lim["auth_required"] is True
    assert lim["write_rate_limit"] == {"per_second": 5.0, "burst": 10.0, "per": "pubkey"}
    assert {9, 9000, 9001, 9002, 9005, 9007, 9008, 9021, 9022}.issubset(doc["accepted_kinds"])


async def test_plain_get_is_an_html_page(keys: dict[str, Signer], relay_factory: Any) -> None:
    relay = relay_factory()
    status, headers, body = http_get(relay, HOST)
    assert status == 200 and headers["content-type"].startswith("text/html")
    text = body.decode()
    assert "Proto" in text and "Nostr relay" in text and f"ws://{HOST}/" in text
