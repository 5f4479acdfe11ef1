"""Helpers for the HTTP tests: one raw request to a relay process, with its status, headers and body.

Not a test module (pytest collects test_*.py only). The Host header picks the community;
`signer` signs a NIP-98 header for the request (tests.db.chat_support.nip98, with a nonce).
"""

from __future__ import annotations

import asyncio
import http.client as httpclient
import json
from dataclasses import dataclass, field
from typing import Any

from buzz.nostr import Signer
from tests.support.factories import nip98
from tests.support.relay import RelayProcess


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lowercased names (the last of a repeated header)
    body: bytes
    header_list: list[tuple[str, str]] = field(default_factory=list)  # every header, as sent

    @property
    def set_cookie(self) -> list[str]:
        return [v for k, v in self.header_list if k.lower() == "set-cookie"]

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def is_json(self) -> bool:
        if not self.headers.get("content-type", "").startswith("application/json"):
            return False
        try:
            self.json()
        except ValueError:
            return False
        return True


def request_sync(
    relay: RelayProcess,
    method: str,
    path: str,
    *,
    headers: dict[str, str],
    body: bytes = b"",
    timeout: float = 30.0,
) -> Answer:
    conn = httpclient.HTTPConnection(relay.host, relay.port, timeout=timeout)
    try:
        # skip_host: the test's own Host header (or none, or two) is sent as given.
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if body or method == "POST":
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        response = conn.getresponse()
        data = response.read()
        raw = response.getheaders()
        return Answer(response.status, {k.lower(): v for k, v in raw}, data, raw)
    finally:
        conn.close()


async def request(
    relay: RelayProcess,
    method: str,
    path: str,
    *,
    host: str,
    signer: Signer | None = None,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Answer:
    all_headers = {"Host": host, **(headers or {})}
    if signer is not None:
        all_headers["Authorization"] = nip98(signer, host, method, path, body)
    if body:
        all_headers.setdefault("Content-Type", "application/json")
    return await asyncio.to_thread(request_sync, relay, method, path, headers=all_headers, body=body, timeout=timeout)


async def view(relay: RelayProcess, signer: Signer, host: str, filt: Any, path: str = "/query") -> Answer:
    """POST one NIP-AR filter to /query or /count."""
    return await request(relay, "POST", path, host=host, signer=signer, body=json.dumps([filt]).encode())
