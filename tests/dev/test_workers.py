"""`python -m buzz.dev.serve --workers 2` (what `make run WORKERS=2` runs): two uvicorn worker processes
answer on one port, and a message written through one is delivered live on a subscription held
through the other (each worker has its own pool and its own hub connection, like two relays).

Which worker holds a connection is read from the kernel, not from the relay: the accepted socket of
each client connection (/proc/net/tcp: local port = the relay's, remote port = the client's) and the
worker process whose file descriptors include it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from buzz.dev.devservices import free_port
from buzz.models import Community
from buzz.nostr import Signer
from tests.support.factories import admit, make_channel, message
from tests.support.relay import relay_database_url
from tests.support.wire import accept
from tests.support.wsclient import RelayClient

BASE_DIR = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120.0
BATCH = 8  # connections opened at once

pytestmark = [pytest.mark.timeout(300)]


class Served:
    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"localhost:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def workers(self) -> set[int]:
        """The uvicorn worker processes: children of the serve process that hold a socket."""
        assert self.proc is not None
        out = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == self.proc.pid and _sockets(int(entry.name)):
                    out.add(int(entry.name))
        return out


def _sockets(pid: int) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def _accepted_inode(server_port: int, client_port: int) -> int | None:
    """The inode of the server side of the TCP connection from `client_port` to `server_port`."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                local, remote, inode = parts[1], parts[2], int(parts[9])
                if int(local.rsplit(":", 1)[1], 16) == server_port and int(remote.rsplit(":", 1)[1], 16) == client_port:
                    return inode
    return None


def holder(served: Served, client: RelayClient) -> int | None:
    """The worker process that holds `client`'s connection."""
    inode = _accepted_inode(served.port, client.ws.local_address[1])
    if inode is None:
        return None
    for pid in served.workers():
        if inode in _sockets(pid):
            return pid
    return None


@pytest.fixture
def served(transactional_db: None) -> Iterator[Served]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="buzz-workers-") as scratch:
        log = Path(scratch) / "serve.log"
        env = dict(os.environ)
        env.update(
            DATABASE_URL=relay_database_url(),
            REDIS_URL=os.environ["REDIS_URL"],
            BUZZ_DEV="1",
            STATIC_ROOT=str(Path(scratch) / "static"),
            PYTHONUNBUFFERED="1",
        )
        s = Served(port, log)
        with log.open("ab") as out:
            s.proc = subprocess.Popen(
                [sys.executable, "-m", "buzz.dev.serve", "--port", str(port), "--workers", "2"],
                cwd=BASE_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while len(s.workers()) < 2 or "Buzz relay:" not in log.read_text(errors="replace"):
                assert s.proc.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, f"no two workers within {START_TIMEOUT} s:\n{log.read_text()}"
                time.sleep(0.2)
            yield s
        finally:
            s.proc.send_signal(signal.SIGTERM)
            try:
                s.proc.wait(30)
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait()
            text = log.read_text(errors="replace")
            # The supervisor stopped its workers before the parent exited.
            assert s.proc.returncode == 0, text


async def _ready(served: Served) -> None:
    """Both workers accept: the first connection a fresh worker takes loads Django, which takes a while."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            async with RelayClient.connect(served.ws_url, host=served.host) as client:
                await client.expect("AUTH")
                return
        except OSError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)


async def test_two_workers_answer_on_one_port_and_deliver_to_each_other(served: Served) -> None:
    community = await asyncio.to_thread(Community.objects.get, host=served.host)
    alice, bob = Signer.generate(), Signer.generate()
    await asyncio.to_thread(admit, community, alice, bob)
    chat = await asyncio.to_thread(make_channel, community, alice, members=[bob])
    await _ready(served)
    async with contextlib.AsyncExitStack() as stack:
        # Connections are opened in batches and kept until both workers hold one: which worker accepts
        # a connection is the kernel's choice (and a worker still loading Django accepts none yet).
        held: dict[int, RelayClient] = {}
        deadline = time.monotonic() + START_TIMEOUT
        while len(held) < 2:
            assert time.monotonic() < deadline, f"every connection went to {set(held)}; workers {served.workers()}"
            batch = await asyncio.gather(
                *(stack.enter_async_context(RelayClient.connect(served.ws_url, host=served.host)) for _ in range(BATCH))
            )
            for client in batch:
                pid = holder(served, client)
                assert pid is not None, "a connection no worker holds"
                held.setdefault(pid, client)
            await asyncio.sleep(0.5)
        assert set(held) <= served.workers(), (held, served.workers())
        writer, reader = held.values()
        for client, who in ((writer, alice), (reader, bob)):
            ok = await client.auth(who)
            assert ok[2] is True, ok
        await reader.send_json(["REQ", "live", {"kinds": [9], "#h": [str(chat)], "limit": 0}])
        await reader.expect("EOSE", where=lambda m: m[1] == "live")
        event = message(alice, chat, "through the other worker")
        await accept(writer, event)
        got = await reader.expect("EVENT", where=lambda m: m[1] == "live")
        assert got[2]["id"] == event["id"]
