"""BUZZ_ARTIFACT_INCREMENTAL_ENABLED is off by default; on, the settings fail closed without a signing
key (one line that says what to set, not a traceback). The key command in docs/operations.md makes one
the settings accept."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BASE = Path(__file__).resolve().parents[2]
BASIC = {"BUZZ_DEV": "1", "DATABASE_URL": "postgres://u@127.0.0.1:1/db", "REDIS_URL": "redis://127.0.0.1:1/0"}
NAMES = ("BUZZ_ARTIFACT_INCREMENTAL_ENABLED", "BUZZ_INCREMENTAL_SIGNING_KEY")


def _settings(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in (*BASIC, *NAMES)}
    clean.update(BASIC)
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-c", "import buzz.settings as s; print(s.BUZZ_INCREMENTAL['enabled'])"],
        cwd=BASE,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_off_by_default() -> None:
    result = _settings({})
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr


@pytest.mark.parametrize("key", [None, "", "too-short"])
def test_enabled_without_a_usable_key_fails_closed_in_one_line(key: str | None) -> None:
    env = {"BUZZ_ARTIFACT_INCREMENTAL_ENABLED": "1"}
    if key is not None:
        env["BUZZ_INCREMENTAL_SIGNING_KEY"] = key
    result = _settings(env)
    assert result.returncode != 0
    assert result.stderr.startswith("configuration error: set BUZZ_INCREMENTAL_SIGNING_KEY")
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_documented_key_command_makes_a_key_the_settings_accept() -> None:
    doc = (BASE / "docs" / "operations.md").read_text()
    section = doc[doc.index("## Incremental reads") :]
    command = re.search(r"```sh\n(.*?)\n```", section, re.S)
    assert command is not None
    line = command.group(1).strip()
    assert line.startswith(".venv/bin/python -c ")
    code = line.split(" -c ", 1)[1].strip("'\"")
    key = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    result = _settings({"BUZZ_ARTIFACT_INCREMENTAL_ENABLED": "1", "BUZZ_INCREMENTAL_SIGNING_KEY": key.stdout.strip()})
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr


def test_the_response_bound_has_the_pages_reserve_as_its_floor() -> None:
    from artifacts.incremental import MIN_RESPONSE_BYTES

    assert MIN_RESPONSE_BYTES == 4608  # buzz.settings spells it (it can't import artifacts)
    on = {"BUZZ_ARTIFACT_INCREMENTAL_ENABLED": "1", "BUZZ_INCREMENTAL_SIGNING_KEY": "settings-test-" + "s" * 40}
    low = _settings({**on, "BUZZ_INCREMENTAL_RESPONSE_BYTES": str(MIN_RESPONSE_BYTES - 1)})
    assert low.returncode != 0
    assert low.stderr.startswith(
        f"configuration error: BUZZ_INCREMENTAL_RESPONSE_BYTES must be at least {MIN_RESPONSE_BYTES}"
    )
    floor = _settings({**on, "BUZZ_INCREMENTAL_RESPONSE_BYTES": str(MIN_RESPONSE_BYTES)})
    assert floor.returncode == 0 and floor.stdout.strip() == "True", floor.stderr
