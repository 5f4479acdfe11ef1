"""`make run` as a newcomer meets it, in a scratch copy of the checkout with its own var/.

One `make run` (the README's command, verbatim) serves the whole module. Against it:
- the README quickstart's commands work verbatim in a fresh shell;
- the add-member command `make run` prints works verbatim in a fresh shell: manage.py
  finds the embedded servers `make run` keeps in var/, and runs in dev mode;
- a URL that is set wins over them, and without dev servers there is no dev mode;
- a server whose recorded owner is gone is not used;
- an embedded server killed under `make run` is restarted on its port: Redis (then writes
  succeed again) and PostgreSQL (then manage.py finds its data again).
The last two tests kill servers; they run last.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from buzz.dev.devservices import free_port
from buzz.nostr import Signer
from tests.support.checkout import DevCheckout, Process
from tests.support.wsclient import RelayClient

README = Path(__file__).resolve().parents[2] / "README.md"
RESTART_TIMEOUT = 60.0

# Each starts `make run` in a fresh copy: initdb and every migration, slow on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass
class Running:
    checkout: DevCheckout
    make: Process
    port: int

    @property
    def host(self) -> str:
        return f"localhost:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The one thing the README asks a user to set on another port: PORT, for both shells."""
        return {"PORT": str(self.port)}


def quickstart_blocks() -> list[list[str]]:
    """The command lines of each ```sh block in the README's Quickstart section."""
    text = README.read_text()
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    return [[line for line in block.splitlines() if line.strip() and not line.startswith("#")] for block in blocks]


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    blocks = quickstart_blocks()
    assert blocks and blocks[0] == ["make run"], blocks
    port = free_port()
    with DevCheckout.create() as checkout:
        make = checkout.start("bash", "-c", blocks[0][0], env={"PORT": str(port)})
        _wait_listening(port, make)
        yield Running(checkout, make, port)


def _wait_listening(port: int, process: Process, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.proc.poll() is None, process.log()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}:\n{process.log()}")


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


async def _auth_ok(running: Running, signer: Signer) -> bool:
    async with RelayClient.connect(f"ws://127.0.0.1:{running.port}/", host=running.host) as client:
        ok = await client.auth(signer)
        return bool(ok[2])


def test_readme_quickstart_runs_verbatim_in_a_fresh_shell(running: Running) -> None:
    blocks = quickstart_blocks()
    commands = [line for block in blocks[1:] for line in block]
    assert commands, "the quickstart shows no command for the second shell"
    for command in commands:
        result = running.checkout.shell(command, env=running.env)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    for step in ("auth ", "channel ", "message ", "artifact  created", "artifact  updated", "query ", "done "):
        assert any(line.startswith(step) for line in result.stdout.splitlines()), (step, result.stdout)


async def test_printed_add_member_command_works_verbatim_in_a_fresh_shell(running: Running) -> None:
    match = running.make.wait_for(r"^  (.*manage\.py community add-member .*)$")
    printed = match.group(1)
    # Nothing to export first: the printed line is the whole command (one placeholder to fill in).
    assert printed == f".venv/bin/python manage.py community add-member --host {running.host} <pubkey-hex> --role owner"
    signer = Signer.generate()
    assert not await _auth_ok(running, signer)

    result = running.checkout.shell(printed.replace("<pubkey-hex>", signer.pubkey))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"added {signer.pubkey} as owner of {running.host}"
    # The relay sees the member: the command wrote to the database `make run` serves.
    assert await _auth_ok(running, signer)


def test_a_url_that_is_set_wins_and_dev_mode_needs_the_dev_servers(running: Running) -> None:
    listing = ".venv/bin/python manage.py community list"
    found = running.checkout.shell(listing)
    assert found.returncode == 0, found.stderr
    assert running.host in found.stdout

    # DATABASE_URL set: that database is used (here nothing listens on port 1), never the embedded one.
    explicit_db = running.checkout.shell(listing, env={"DATABASE_URL": "postgres://postgres@127.0.0.1:1/none"})
    assert explicit_db.returncode != 0
    assert "port 1 failed" in explicit_db.stderr, explicit_db.stderr

    # Both set: no dev server is used, so no dev mode either, and production settings are required.
    both = running.checkout.shell(
        listing, env={"DATABASE_URL": "postgres://postgres@127.0.0.1:1/none", "REDIS_URL": "redis://127.0.0.1:1/0"}
    )
    assert both.returncode != 0
    assert _one_line(both.stderr).startswith("configuration error: set SECRET_KEY"), both.stderr

    # BUZZ_DEV=0 asks for production settings: the running dev servers are not looked up.
    production = running.checkout.shell(listing, env={"BUZZ_DEV": "0"})
    assert production.returncode != 0
    assert _one_line(production.stderr).startswith("configuration error: set SECRET_KEY"), production.stderr


def test_a_server_whose_recorded_owner_is_gone_is_not_used(running: Running) -> None:
    var = running.checkout.root / "var"
    records = [var / "postgres" / "owner.json", var / "redis" / "state.json"]
    saved = {path: path.read_text() for path in records}
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        for path in records:
            # The same servers, still running, recorded as started by a process that has exited.
            path.write_text(json.dumps({**json.loads(saved[path]), "pid": gone.pid}))
        result = running.checkout.shell(".venv/bin/python manage.py community list")
    finally:
        for path, text in saved.items():
            path.write_text(text)
    assert result.returncode != 0
    line = _one_line(result.stderr)
    assert "no `make run` is serving this checkout" in line, line
    assert running.checkout.shell(".venv/bin/python manage.py community list").returncode == 0


async def test_killed_redis_is_restarted_on_its_port_and_writes_succeed_again(running: Running) -> None:
    signer = Signer.generate()
    admitted = running.checkout.shell(
        f".venv/bin/python manage.py community add-member --host {running.host} {signer.pubkey}"
    )
    assert admitted.returncode == 0, admitted.stderr
    before = running.checkout.record("redis/state.json")
    async with RelayClient.connect(f"ws://127.0.0.1:{running.port}/", host=running.host) as client:
        assert (await client.auth(signer))[2]
        channel = str(uuid.uuid4())
        assert (await _publish(client, signer, 9007, [["h", channel], ["name", "restart"]]))[2]
        assert (await _publish(client, signer, 9, [["h", channel]]))[2]

        log_offset = len(running.make.log())
        os.kill(before["server_pid"], signal.SIGKILL)
        running.make.wait_for(r"embedded Redis restarted on port (\d+)", RESTART_TIMEOUT, after=log_offset)
        after = running.checkout.record("redis/state.json")
        assert after["port"] == before["port"] and after["server_pid"] != before["server_pid"]
        assert after["pid"] == before["pid"]  # still owned by this `make run`
        assert redis.Redis(host="127.0.0.1", port=after["port"]).ping()

        # The relay keeps its REDIS_URL; a pooled connection to the dead server may fail one write.
        results = [await _publish(client, signer, 9, [["h", channel]]) for _ in range(3)]
        assert results[-1][2], results
        assert sum(1 for ok in results if not ok[2]) <= 1, results


def test_killed_postgres_is_restarted_on_its_port(running: Running) -> None:
    before = running.checkout.record("postgres/owner.json")
    log_offset = len(running.make.log())
    os.kill(before["server_pid"], signal.SIGKILL)
    running.make.wait_for(r"embedded PostgreSQL restarted on port (\d+)", RESTART_TIMEOUT, after=log_offset)
    after = running.checkout.record("postgres/owner.json")
    assert after["port"] == before["port"] and after["server_pid"] != before["server_pid"]
    listing = running.checkout.shell(".venv/bin/python manage.py community list")
    assert listing.returncode == 0, listing.stderr
    assert running.host in listing.stdout  # same data directory, same port


async def _publish(client: RelayClient, signer: Signer, kind: int, tags: list[list[str]]) -> list[object]:
    event = signer.sign_event(kind=kind, tags=tags, content=os.urandom(4).hex()).to_dict()
    await client.send_json(["EVENT", event])
    return await client.expect("OK", timeout=15, where=lambda m: len(m) > 1 and m[1] == event["id"])
