"""A scratch copy of this checkout, to try what a newcomer types: `make run`, then commands in another shell.

    with DevCheckout.create() as checkout:
        serve = checkout.start("make", "run", env={"PORT": str(port)})
        serve.wait_for("Buzz relay:")
        result = checkout.shell(".venv/bin/python manage.py community list")

The copy has its own var/ (so its embedded servers are its own, under its own `make run`),
and its .venv is a symlink to this checkout's (no pip). `shell()` runs a command line in
a fresh shell: bash with PATH and HOME only, none of the test session's DATABASE_URL,
REDIS_URL, BUZZ_DEV or SECRET_KEY. The copy sits under var/test/ rather than /tmp: as
root, embedded PostgreSQL runs as another user, who must be able to reach its data.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support.environment import TEST_VAR_DIR

BASE_DIR = Path(__file__).resolve().parents[2]
_NOT_COPIED = ("var", ".venv", ".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis")
START_TIMEOUT = 180.0  # initdb and every migration on a loaded 2-core machine
STOP_TIMEOUT = 60.0


def fresh_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a new terminal has: PATH, HOME and a locale; nothing of this test session's settings."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    env.update(extra or {})
    return env


class Process:
    """A long-running command in the copy (`make run`), its output in a log file."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT, *, after: int = 0) -> re.Match[str]:
        """The first match of `pattern` in the output (from character `after` on); fails if the process ends first."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.compile(pattern, re.MULTILINE).search(self.log(), after)
            if match:
                return match
            if self.proc.poll() is not None:
                raise AssertionError(f"exited with {self.proc.returncode} before {pattern!r}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} within {timeout:.0f} s:\n{self.log()}")
            time.sleep(0.1)

    def stop(self) -> int:
        """SIGTERM to the whole process group (make and the relay), as a terminal's hang-up would; then wait."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


class DevCheckout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: list[Process] = []

    @classmethod
    def create(cls) -> DevCheckout:
        TEST_VAR_DIR.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="checkout-", dir=TEST_VAR_DIR)) / "buzz"
        shutil.copytree(BASE_DIR, root, ignore=shutil.ignore_patterns(*_NOT_COPIED), symlinks=True)
        (root / ".venv").symlink_to((BASE_DIR / ".venv").resolve())
        return cls(root)

    def start(self, *command: str, env: Mapping[str, str] | None = None) -> Process:
        """Start `command` in the copy, in a session of its own, with a fresh environment plus `env`."""
        fd, name = tempfile.mkstemp(prefix="checkout-", suffix=".log", dir=self.root.parent)
        os.close(fd)
        with open(name, "ab") as log:
            proc = subprocess.Popen(
                list(command),
                cwd=self.root,
                env=fresh_environment(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = Process(proc, Path(name))
        self.processes.append(process)
        return process

    def shell(
        self, command_line: str, *, env: Mapping[str, str] | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """`command_line` as pasted into a new terminal in the copy: bash -c, fresh environment plus `env`."""
        return subprocess.run(
            ["bash", "-c", command_line],
            cwd=self.root,
            env=fresh_environment(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def record(self, relative: str) -> dict[str, Any]:
        """A JSON record under the copy's var/ (redis/state.json, postgres/owner.json)."""
        value: dict[str, Any] = json.loads((self.root / "var" / relative).read_text())
        return value

    def remove(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        var = self.root / "var"
        if var.exists():
            # Servers left by a process that could not stop them (`make clean-var` does the same).
            subprocess.run(
                [sys.executable, "-m", "buzz.dev.devservices", "clean", str(var)],
                cwd=BASE_DIR,
                capture_output=True,
                check=False,
                timeout=STOP_TIMEOUT,
            )
        shutil.rmtree(self.root.parent, ignore_errors=True)

    def __enter__(self) -> DevCheckout:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            for process in self.processes:
                exc.add_note(f"output of {process.proc.args!r}:\n{process.log()}")
        self.remove()
