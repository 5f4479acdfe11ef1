"""Helpers for the channel, message, counter, token and quota tests.

Signed events, NIP-98 headers, one HTTP round trip to a relay process (with the
Host header that picks the community), EVENT/OK and REQ/EOSE round trips over a
RelayClient, and "was anything stored" checks against the test database.
Not a test module (pytest collects test_*.py only).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client as httpclient
import json
import secrets
import time
from typing import Any

from asgiref.sync import sync_to_async

from buzz.models import StoredEvent
from buzz.nostr import Signer
from tests.support.relay import RelayProcess
from tests.support.wsclient import RelayClient

NOT_A_MEMBER = "restricted: not a channel member"
TOKEN_INVALID = "auth-required: this token is revoked or expired"


def signed(signer: Signer, kind: int, tags: list[list[str]], content: str | None = None) -> dict[str, Any]:
    """A signed event created now. The default content is random, so two otherwise equal events
    signed in the same second still have different ids."""
    if content is None:
        content = secrets.token_hex(4)
    return signer.sign_event(kind=kind, tags=tags, content=content, created_at=int(time.time())).to_dict()


def message(
    signer: Signer, channel: object, content: str | None = None, extra: list[list[str]] | None = None
) -> dict[str, Any]:
    """A kind-9 chat message in `channel`."""
    return signed(signer, 9, [["h", str(channel)], *(extra or [])], content)


def nip98(signer: Signer, host: str, method: str, path: str, body: bytes = b"") -> str:
    """`Authorization: Nostr <base64>` for one request. The URL is http://<host><path> (the
    community's public_url is ws://<host>/). A nonce tag keeps two requests in the same second
    from having the same event id, which the replay guard would refuse."""
    tags = [["u", f"http://{host}{path}"], ["method", method], ["nonce", secrets.token_hex(8)]]
    if body:
        tags.append(["payload", hashlib.sha256(body).hexdigest()])
    event = signer.sign_event(kind=27235, tags=tags, content="", created_at=int(time.time()))
    return "Nostr " + base64.b64encode(json.dumps(event.to_dict()).encode()).decode()


def _request(relay: RelayProcess, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
    conn = httpclient.HTTPConnection(relay.host, relay.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(data) if data else None
    except ValueError:
        return response.status, data.decode(errors="replace")


async def http(
    relay: RelayProcess,
    method: str,
    path: str,
    *,
    host: str,
    signer: Signer | None = None,
    authorization: str | None = None,
    body: bytes = b"",
) -> tuple[int, Any]:
    """(status, decoded JSON body). `signer` signs a NIP-98 header; `authorization` is used verbatim."""
    headers = {"Host": host}
    if signer is not None:
        headers["Authorization"] = nip98(signer, host, method, path, body)
    elif authorization is not None:
        headers["Authorization"] = authorization
    if body:
        headers["Content-Type"] = "application/json"
    return await asyncio.to_thread(_request, relay, method, path, headers, body)


async def publish(client: RelayClient, event: dict[str, Any]) -> list[Any]:
    """EVENT, then its ["OK", id, ok, message]."""
    await client.send_json(["EVENT", event])
    return await client.expect("OK", where=lambda m: len(m) > 1 and m[1] == event["id"])


async def query(client: RelayClient, sub: str, *filters: dict[str, Any]) -> tuple[list[Any], list[dict[str, Any]]]:
    """REQ; read to EOSE or CLOSED. Returns (that final message, the stored events before it).
    After EOSE the subscription is closed again."""
    await client.send_json(["REQ", sub, *filters])
    events: list[dict[str, Any]] = []
    others: list[Any] = []  # put back for later expect() calls (an AUTH challenge, say)
    while True:
        m = await client.recv_json()
        if m[0] == "EVENT" and m[1] == sub:
            events.append(m[2])
        elif m[0] in ("EOSE", "CLOSED") and m[1] == sub:
            client.collected[:0] = others
            if m[0] == "EOSE":
                await client.send_json(["CLOSE", sub])
            return m, events
        else:
            others.append(m)


@sync_to_async
def stored(event_id: str) -> bool:
    """Is there a StoredEvent row with this id?"""
    return StoredEvent.objects.filter(id=event_id).exists()


@sync_to_async
def stored_count() -> int:
    return StoredEvent.objects.count()
