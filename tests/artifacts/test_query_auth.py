"""NIP-98 and bearer authentication of POST /query and POST /count, against a real relay process.

Every NIP-98 header here is built field by field (URL, method, created_at, payload hash, kind,
signature), so each test changes exactly one thing from a header that works. Failures are 401
with an `auth-required:` reason; a valid credential for someone the community doesn't admit, or
a token without messages:read, is 403. No failure returns any event.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import json
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.utils import timezone

from buzz.identity.tokens import token_create, token_revoke
from buzz.models import ApiToken, Community
from buzz.nostr import Signer
from tests.artifacts.query_model import Author, Channel, World
from tests.support.factories import make_channel, make_community, signers
from tests.support.relay import RelayProcess, relays_key
from tests.support.wire import publish, raw_request
from tests.support.wsclient import RelayClient

# The test database must exist; the tests only read the module's committed data through the relay.
pytestmark = pytest.mark.django_db

HOST = "query-auth.test"
FILTER = json.dumps([{"artifact": "current"}]).encode()


@dataclass
class Env:
    relay: RelayProcess
    w: Signer  # owner of O and P
    alice: Signer  # member of P
    outsider: Signer  # not a relay member (the community admits members only)
    tokens: dict[str, str]
    open_id: str  # the artifact in O
    private_id: str  # the artifact in P
    open_channel: str
    private_channel: str


def header(
    signer: Signer,
    *,
    url: str,
    method: str = "POST",
    body: bytes | None = FILTER,
    created_at: int | None = None,
    kind: int = 27235,
    payload: str | None = None,
    tamper: bool = False,
) -> str:
    """`Authorization: Nostr <base64 event>` with each NIP-98 field under the test's control.
    `body` None leaves the payload tag out; `payload` overrides its hash."""
    tags = [["u", url], ["method", method], ["nonce", secrets.token_hex(8)]]
    if body is not None:
        tags.append(["payload", payload or hashlib.sha256(body).hexdigest()])
    event = signer.sign_event(
        kind=kind, tags=tags, content="", created_at=int(time.time()) if created_at is None else created_at
    ).to_dict()
    if tamper:
        event["content"] = "changed after signing"
    return "Nostr " + base64.b64encode(json.dumps(event).encode()).decode()


async def send(env: Env, authorization: str | None, path: str = "/query", body: bytes = FILTER) -> tuple[int, Any]:
    headers = {"Host": HOST, "Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    status, raw = await asyncio.to_thread(raw_request, env.relay, "POST", path, headers, body)
    return status, json.loads(raw)


def url(path: str) -> str:
    return f"http://{HOST}{path}"


def bearer(env: Env, name: str) -> str:
    return f"Bearer {env.tokens[name]}"


# --- data ------------------------------------------------------------------------------


def _setup() -> tuple[Env, list[int]]:
    w, alice, outsider = signers(3)
    community = make_community(HOST, "Query auth", members=[w, alice])
    o = make_channel(community, w, name="o")
    p = make_channel(community, w, visibility="private", name="p", members=[alice])
    read = ["messages:read"]
    issued = {
        "read": token_create(community=community, pubkey=alice.pubkey, scopes=read),
        "read_write": token_create(
            community=community, pubkey=alice.pubkey, scopes=["messages:read", "messages:write"]
        ),
        "no_read": token_create(community=community, pubkey=alice.pubkey, scopes=["messages:write", "channels:read"]),
        "only_o": token_create(community=community, pubkey=alice.pubkey, scopes=read, channels=[str(o)]),
        "revoked": token_create(community=community, pubkey=alice.pubkey, scopes=read),
        "expired": token_create(
            community=community, pubkey=alice.pubkey, scopes=read, expires_in=dt.timedelta(hours=1)
        ),
    }
    token_revoke(token_id=issued["revoked"].row.id)
    # Expired a second ago (token_create takes only a lifetime that is still to come).
    past = timezone.now() - dt.timedelta(seconds=1)
    ApiToken.objects.filter(pk=issued["expired"].row.pk).update(expires_at=past)
    tokens = {name: t.token for name, t in issued.items()}
    env = Env(None, w, alice, outsider, tokens, "", "", str(o), str(p))  # type: ignore[arg-type]
    return env, [community.id]


async def _write(env: Env) -> None:
    world = World(channels={c: Channel(c, members={env.w.pubkey}) for c in (env.open_channel, env.private_channel)})
    author = Author(world, env.w)
    async with RelayClient.connect(env.relay.ws_url, host=HOST) as client:
        assert (await client.auth(env.w))[2] is True
        for channel in (env.open_channel, env.private_channel):
            event = author.revision(str(uuid.uuid4()), "create", h=channel, type_name="test.auth")
            reply = await publish(client, event)
            assert reply[2] is True, reply
            if channel == env.open_channel:
                env.open_id = event["id"]
            else:
                env.private_id = event["id"]


@pytest.fixture(scope="module")
def env(django_db_setup: None, django_db_blocker: Any) -> Iterator[Env]:
    with django_db_blocker.unblock():
        Community.objects.filter(host=HOST).delete()
        try:
            data, _ = _setup()
        except BaseException:
            # Module scope: no test transaction undoes what a failed set-up wrote, and later modules count rows.
            Community.objects.filter(host=HOST).delete()
            raise
    data.relay = RelayProcess(env={"BUZZ_WRITES_PER_SECOND": "0"})
    try:
        data.relay.start()
        asyncio.run(_write(data))
        yield data
    finally:
        data.relay.stop()
        with django_db_blocker.unblock():
            Community.objects.filter(host=HOST).delete()


@pytest.fixture(autouse=True)
def _relay_log(request: pytest.FixtureRequest, env: Env) -> None:
    request.node.stash[relays_key] = [env.relay]


def _ids(body: Any) -> set[str]:
    assert isinstance(body, list), body
    return {e["id"] for e in body}


# --- NIP-98 ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/query", "/count"])
async def test_a_valid_signed_request_reads(env: Env, path: str) -> None:
    status, body = await send(env, header(env.alice, url=url(path)), path)
    assert status == 200, body
    if path == "/query":
        assert _ids(body) == {env.open_id, env.private_id}
    else:
        assert body == {"count": 2}
    # The signer is who reads: w's own request gets w's view (the same two here), outsiders none.
    status, body = await send(env, header(env.w, url=url(path)), path)
    assert status == 200, body


def _bad_headers(env: Env, path: str) -> dict[str, str]:
    now = int(time.time())
    other = "/count" if path == "/query" else "/query"
    return {
        "no Authorization header": "",
        "another path": header(env.alice, url=url(other)),
        "another host": header(env.alice, url=f"http://elsewhere.test{path}"),
        "another scheme": header(env.alice, url=f"https://{HOST}{path}"),
        "a query string": header(env.alice, url=url(path) + "?x=1"),
        "a trailing slash": header(env.alice, url=url(path) + "/"),
        "method GET": header(env.alice, url=url(path), method="GET"),
        "method PUT": header(env.alice, url=url(path), method="PUT"),
        "created 2 minutes ago": header(env.alice, url=url(path), created_at=now - 120),
        "created 2 minutes ahead": header(env.alice, url=url(path), created_at=now + 120),
        "the hash of another body": header(env.alice, url=url(path), payload=hashlib.sha256(b"[]").hexdigest()),
        "no payload tag": header(env.alice, url=url(path), body=None),
        "a malformed payload hash": header(env.alice, url=url(path), payload="not-a-hash"),
        "kind 27236": header(env.alice, url=url(path), kind=27236),
        "a broken signature": header(env.alice, url=url(path), tamper=True),
        "not base64": "Nostr %%%not-base64%%%",
        "another scheme name": header(env.alice, url=url(path)).replace("Nostr ", "Basic ", 1),
        "an unknown bearer token": "Bearer buzz_" + secrets.token_urlsafe(32),
        "a revoked token": bearer(env, "revoked"),
        "an expired token": bearer(env, "expired"),
    }


@pytest.mark.parametrize("path", ["/query", "/count"])
async def test_bad_credentials_are_401(env: Env, path: str) -> None:
    failures = []
    for what, authorization in _bad_headers(env, path).items():
        status, body = await send(env, authorization or None, path)
        if status != 401 or set(body) != {"error"} or not body["error"].startswith("auth-required: "):
            failures.append(f"{what}: {status} {body}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("path", ["/query", "/count"])
async def test_a_replayed_authorization_is_401(env: Env, path: str) -> None:
    authorization = header(env.alice, url=url(path))
    status, _ = await send(env, authorization, path)
    assert status == 200
    for _ in range(2):
        status, body = await send(env, authorization, path)
        assert status == 401 and body["error"].startswith("auth-required: ") and "already used" in body["error"], body


async def test_the_signed_body_is_the_body_read(env: Env) -> None:
    # Signed for one filter, sent with another: the hash no longer matches.
    signed_for = json.dumps([{"artifact": "current", "#h": [env.open_channel]}]).encode()
    sent = json.dumps([{"artifact": "current", "#h": [env.private_channel]}]).encode()
    status, body = await send(env, header(env.alice, url=url("/query"), body=signed_for), "/query", sent)
    assert status == 401, body
    status, body = await send(env, header(env.alice, url=url("/query"), body=signed_for), "/query", signed_for)
    assert status == 200 and _ids(body) == {env.open_id}


async def test_a_pubkey_the_community_does_not_admit_is_403(env: Env) -> None:
    for path in ("/query", "/count"):
        status, body = await send(env, header(env.outsider, url=url(path)), path)
        assert status == 403 and body == {"error": "restricted: not a relay member"}, body


# --- bearer tokens ---------------------------------------------------------------------


async def test_bearer_tokens(env: Env) -> None:
    for name in ("read", "read_write"):
        status, body = await send(env, bearer(env, name))
        assert status == 200 and _ids(body) == {env.open_id, env.private_id}, (name, body)
        status, body = await send(env, bearer(env, name), "/count")
        assert (status, body) == (200, {"count": 2}), name
    # Without messages:read: 403, for every view and with or without #h.
    for filt in (
        {"artifact": "current"},
        {"artifact": "current", "#h": [env.open_channel]},
        {"artifact": "history"},
        {"artifact": "head", "#d": [str(uuid.uuid4())]},
    ):
        for path in ("/query", "/count"):
            status, body = await send(env, bearer(env, "no_read"), path, json.dumps([filt]).encode())
            assert status == 403, (filt, path, body)
            assert body == {"error": "restricted: this token lacks the messages:read scope"}, body
    # A token limited to O reads O only, although alice is a member of P.
    status, body = await send(env, bearer(env, "only_o"))
    assert status == 200 and _ids(body) == {env.open_id}
    status, body = await send(env, bearer(env, "only_o"), "/count")
    assert body == {"count": 1}
    only_p = json.dumps([{"artifact": "current", "#h": [env.private_channel]}]).encode()
    status, body = await send(env, bearer(env, "only_o"), "/query", only_p)
    assert status == 403, body
    # A bearer token isn't replay-guarded: it is a standing credential.
    for _ in range(2):
        status, _ = await send(env, bearer(env, "read"))
        assert status == 200
