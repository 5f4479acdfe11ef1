"""The Host header, read before any authentication: bounded caches, and a clean answer to a bad one.

The directory (buzz.identity.communities.CommunityDirectory, on the real test database):
known hosts sit in an LRU of max_size, unknown ones in a separate, smaller LRU, so a flood of
made-up Hosts neither grows memory nor evicts a known community; a malformed Host is never
looked up nor cached.

The relay process: a malformed Host (`host:7777.`, whose port is not a number; 4 KB; none; two)
gets a bare 400 without a traceback in the log (RFC 9112 3.2), `host.:7777` (the fully qualified
spelling) reaches the same community as `host:7777`, an unknown well-formed Host a bare 404.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket

from buzz.identity.communities import CommunityDirectory, community_create, host_header_ok, normalize_host
from tests.http.http_support import request_sync
from tests.support.relay import RelayFactory, RelayProcess

HOST = "host-header.test:7777"


def test_normalize_and_validate_host() -> None:
    assert normalize_host("Host-Header.TEST:7777") == HOST
    assert normalize_host("host-header.test.:7777") == HOST
    assert normalize_host("host-header.test.") == "host-header.test"
    assert normalize_host("host-header.test:80") == "host-header.test"
    assert normalize_host("host-header.test.:443") == "host-header.test"
    # Not host[:port]: left as it is, so it names no community (and the front refuses it first).
    assert normalize_host("host-header.test:7777.") == "host-header.test:7777."
    for good in (HOST, "host-header.test.:7777", "HOST-header.test", "[::1]:7777", "127.0.0.1"):
        assert host_header_ok(good), good
    for bad in ("", "host-header.test:7777.", "a b", "a:b", "a:123456", "h" * 261, "x/y", "a:7777:1", "[1]"):
        assert not host_header_ok(bad), bad


async def test_directory_caches_are_bounded(transactional_db: None) -> None:
    known = [f"known{i}.test" for i in range(10)]
    for host in known:
        await asyncio.to_thread(community_create, host=host, name=host)
    directory = CommunityDirectory(max_size=8, max_misses=4)
    first = await directory.lookup(known[0])
    assert first is not None and first.host == known[0]
    # A flood of unknown hosts: answered, cached only up to the bound, and no known entry pushed out.
    for i in range(500):
        assert await directory.lookup(f"unknown-{i}-{'x' * 200}.test") is None
    assert directory.sizes() == (1, 4)
    # Known hosts: a bounded LRU too.
    for host in known:
        info = await directory.lookup(host)
        assert info is not None and info.host == host
    assert directory.sizes() == (8, 4)
    # Malformed or over-long hosts are neither looked up nor cached.
    for bad in ("known0.test:7777.", "x" * 4096, "", "a b"):
        assert await directory.lookup(bad) is None
    assert directory.sizes() == (8, 4)
    # The spellings of one host share one entry.
    directory.clear()
    for spelling in ("known1.test", "KNOWN1.test", "known1.test.", "known1.test:80"):
        info = await directory.lookup(spelling)
        assert info is not None and info.host == "known1.test"
    assert directory.sizes() == (1, 0)


def get(relay: RelayProcess, hosts: list[str], *, upgrade: bool = False) -> tuple[int, bytes]:
    """GET / with exactly these Host headers (a WebSocket upgrade with `upgrade`): (status, body)."""
    lines = ["GET / HTTP/1.1", *(f"Host: {h}" for h in hosts), "Accept: application/nostr+json"]
    if upgrade:
        key = base64.b64encode(os.urandom(16)).decode()
        lines += ["Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    else:
        lines.append("Connection: close")
    with socket.create_connection((relay.host, relay.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        data = b""
        while b"\r\n\r\n" not in data or (not upgrade and not _complete(data)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


async def test_relay_answers_each_host_cleanly(transactional_db: None, relay_factory: RelayFactory) -> None:
    await asyncio.to_thread(community_create, host=HOST, name="Host header")
    relay = relay_factory(LOG_LEVEL="INFO")
    for spelling in (HOST, "host-header.test.:7777", "HOST-HEADER.test:7777"):
        status, body = await asyncio.to_thread(get, relay, [spelling])
        assert status == 200, (spelling, body)
        assert json.loads(body)["name"] == "Host header"
    for bad in (["host-header.test:7777."], ["h" * 4096], [], [HOST, HOST], ["host header.test"]):
        status, body = await asyncio.to_thread(get, relay, bad)
        assert (status, body) == (400, b"bad host\n"), bad
    assert await asyncio.to_thread(get, relay, ["unknown.test:7777"]) == (404, b"not found\n")
    # A WebSocket upgrade with a malformed Host is refused like one with an unknown Host (uvicorn answers
    # 403 for a connection the relay closes before accepting it); with the right Host it upgrades.
    for bad in (["host-header.test:7777."], ["h" * 4096], [], ["unknown.test:7777"]):
        status, _ = await asyncio.to_thread(get, relay, bad, upgrade=True)
        assert status == 403, bad
    status, _ = await asyncio.to_thread(get, relay, ["host-header.test.:7777"], upgrade=True)
    assert status == 101
    log = relay.log_text()
    assert "Traceback" not in log and "Invalid HTTP_HOST" not in log, log
    # The POST endpoints too: answered by the front, before Django reads the body.
    answer = await asyncio.to_thread(
        request_sync, relay, "POST", "/events", headers={"Host": "host-header.test:7777."}, body=b"{}"
    )
    assert answer.status == 400 and "Traceback" not in relay.log_text()
