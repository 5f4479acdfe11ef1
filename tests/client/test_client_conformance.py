"""`python -m artifacts.client conformance` against real relay processes.

* This relay passes every check, sync and incremental reads included, and skips none (with incremental
  reads on, it advertises everything the suite checks). The relay runs with its default write
  quota: the suite paces itself to the quota NIP-11 advertises.
* A deliberately broken build (tests/client/broken_relay.py: the head view drops the last
  event of a multi-d answer) fails exactly the head-view rule, named, and exits non-zero.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from tests.client.client_support import NO_QUOTA, ClientWorld, admit
from tests.support.relay import RelayProcess, relays_key

BASE_DIR = Path(__file__).resolve().parents[2]
HEAD_RULE = "head view: returns the current revision of every named artifact, deletions included"


async def conformance(world: ClientWorld) -> tuple[int, list[str]]:
    files = [str(f) for f in world.key_files]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "artifacts.client",
        "conformance",
        "--relay",
        world.url,
        "--key-file",
        files[0],
        "--key-file",
        files[1],
        "--key-file",
        files[2],
        cwd=BASE_DIR,
        env=dict(os.environ),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 100)
    assert err.decode() == "", err.decode()
    return proc.returncode or 0, out.decode().splitlines()


def verdicts(lines: list[str], verdict: str) -> list[str]:
    return [line.removeprefix(verdict + " ") for line in lines if line.startswith(verdict + " ")]


# Incremental reads are off by default; on here, with pages of two rows, so their checks run and page.
INCREMENTAL = {
    "BUZZ_ARTIFACT_INCREMENTAL_ENABLED": "1",
    "BUZZ_INCREMENTAL_SIGNING_KEY": "conformance-test-" + "s" * 40,
    "BUZZ_INCREMENTAL_PAGE_ROWS": "2",
}


@pytest.mark.slow
async def test_this_relay_passes_what_it_advertises(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    world = await sync_to_async(admit)(relay_factory(**INCREMENTAL), tmp_path)
    code, lines = await conformance(world)
    report = "\n".join(lines)
    passed, failed, skipped = verdicts(lines, "PASS"), verdicts(lines, "FAIL"), verdicts(lines, "SKIP")
    assert (code, failed) == (0, []), report
    assert lines[-1] == f"{len(passed)} passed, 0 failed", report
    # This relay advertises everything the suite checks, sync included: nothing is skipped.
    assert skipped == [], report
    areas = {p.split(":")[0] for p in passed}
    assert {
        "envelope",
        "identity",
        "cas",
        "access",
        "move",
        "delete",
        "views",
        "limits",
        "head view",
        "ensure",
        "sync",
        "incremental",
    } <= areas, areas


@pytest.mark.slow
async def test_a_broken_head_view_fails_naming_the_rule(
    request: pytest.FixtureRequest, transactional_db: None, tmp_path: Path, redis_flush: Any
) -> None:
    relay = RelayProcess(app="tests.client.broken_relay:application", env=NO_QUOTA)
    request.node.stash[relays_key] = [relay]
    with relay:
        world = await sync_to_async(admit)(relay, tmp_path)
        code, lines = await conformance(world)
    report = "\n".join(lines)
    failed = verdicts(lines, "FAIL")
    assert code == 1, report
    assert len(failed) == 1 and failed[0].startswith(HEAD_RULE + ": the head view returned 4 of 5"), report
    assert lines[-1] == f"{len(verdicts(lines, 'PASS'))} passed, 1 failed", report


@pytest.mark.parametrize("raised", ["CheckFailed", "Skipped", "RuntimeError"])
async def test_a_relays_reason_cannot_drive_the_terminal_in_the_report(
    monkeypatch: pytest.MonkeyPatch, raised: str
) -> None:
    """A relay's reason reaches the report through a failed check, a skip or an unexpected error: every control
    character in it is printed escaped, as the CLI's other text output is (README: "a relay's reasons are
    untrusted")."""
    import io

    from artifacts.client.conformance import runner

    reason = "invalid: \x1b[2J\x1b]0;owned\x07\u202eevil"
    error = {"CheckFailed": runner.CheckFailed, "Skipped": runner.Skipped, "RuntimeError": RuntimeError}[raised]

    async def hostile(world: Any) -> None:
        raise error(reason)

    monkeypatch.setattr(runner, "CHECKS", [runner.Check("hostile", hostile, ())])
    out = io.StringIO()
    await runner.run_checks(None, out, runner.Report(), None)  # type: ignore[arg-type]
    printed = out.getvalue()
    assert "hostile" in printed and "\\u001b[2J" in printed and "\\u202e" in printed, printed
    assert not {"\x1b", "\x07", "\u202e"} & set(printed), printed
