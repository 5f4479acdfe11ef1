"""Talking to a relay process the way a client does: HTTP requests, and EVENT/OK, REQ/EOSE round trips.

status, body = await http(relay, "GET", "/api/unread", host=HOST, signer=alice)  # NIP-98
async with logged_in(relay, alice, host=HOST) as client:                         # NIP-42
    ok = await publish(client, message(alice, channel))
    end, events = await query(client, "s1", {"kinds": [9], "#h": [str(channel)]})
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client as httpclient
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from buzz.nostr import Signer
from tests.support.factories import nip98
from tests.support.relay import RelayProcess
from tests.support.wsclient import DEFAULT_TIMEOUT, RelayClient


def raw_request(
    relay: RelayProcess, method: str, path: str, headers: Mapping[str, str], body: bytes = b"", timeout: float = 10
) -> tuple[int, bytes]:
    """One blocking HTTP request to the relay process: (status, the body's bytes)."""
    conn = httpclient.HTTPConnection(relay.host, relay.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers))
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def request(
    relay: RelayProcess, method: str, path: str, headers: Mapping[str, str], body: bytes = b"", timeout: float = 10
) -> tuple[int, Any]:
    """One blocking HTTP request: (status, the JSON body decoded, or its text, or None when empty)."""
    status, data = raw_request(relay, method, path, headers, body, timeout)
    try:
        return status, json.loads(data) if data else None
    except ValueError:
        return status, data.decode(errors="replace")


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
    """(status, decoded JSON body). `signer` signs a NIP-98 header; `authorization` is used verbatim.
    The Host header picks the community."""
    headers = {"Host": host}
    if signer is not None:
        headers["Authorization"] = nip98(signer, host, method, path, body)
    elif authorization is not None:
        headers["Authorization"] = authorization
    if body:
        headers["Content-Type"] = "application/json"
    return await asyncio.to_thread(request, relay, method, path, headers, body)


async def publish(client: RelayClient, event: dict[str, Any], timeout: float = DEFAULT_TIMEOUT) -> list[Any]:
    """EVENT, then its ["OK", id, ok, message]."""
    await client.send_json(["EVENT", event])
    return await client.expect("OK", timeout, where=lambda m: len(m) > 1 and m[1] == event["id"])


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


@contextlib.asynccontextmanager
async def logged_in(relay: RelayProcess, signer: Signer, *, host: str, **kwargs: Any) -> AsyncIterator[RelayClient]:
    """A connection to `relay` for community `host`, logged in as `signer` with NIP-42."""
    async with RelayClient.connect(relay.ws_url, host=host, **kwargs) as client:
        ok = await client.auth(signer)
        assert ok[2] is True, ok
        yield client


class Logins:
    """One NIP-42 connection per signer, opened on first use; close() closes them all, newest first."""

    def __init__(self, relay: RelayProcess, host: str) -> None:
        self.relay, self.host = relay, host
        self._stack = contextlib.AsyncExitStack()
        self._by: dict[str, RelayClient] = {}

    async def __call__(self, signer: Signer) -> RelayClient:
        if signer.pubkey not in self._by:
            self._by[signer.pubkey] = await self._stack.enter_async_context(
                logged_in(self.relay, signer, host=self.host)
            )
        return self._by[signer.pubkey]

    async def close(self) -> None:
        await self._stack.aclose()


async def accept(client: RelayClient, event: dict[str, Any], timeout: float = DEFAULT_TIMEOUT) -> str:
    """Publish an event that must be accepted; its id."""
    reply = await publish(client, event, timeout)
    assert reply[2] is True, reply
    return str(event["id"])
