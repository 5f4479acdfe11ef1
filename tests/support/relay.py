"""Real relay processes for tests: uvicorn serving buzz.asgi on a free port.

The guarantees (sync, backpressure, multi-node) are tested against these, not against
an in-process communicator. A relay reads the test database the test has committed
to, so the `relay_factory` fixture needs `transactional_db`.

    def test_something(relay_factory):
        relay = relay_factory(BUZZ_OUTBOUND_MAX_BYTES="65536")
        ... RelayClient.connect(relay.ws_url, host="localhost") ...

When a test fails, the log of each relay it started is added to its report.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from buzz.dev.devservices import die_with_parent, free_port
from buzz.dev.serve import ws_implementation, ws_max_size

BASE_DIR = Path(__file__).resolve().parents[2]
DEFAULT_APP = "buzz.asgi:application"
START_TIMEOUT = 90.0  # a loaded 2-core machine (CI runs alongside other work) can take tens of seconds
STOP_TIMEOUT = 5.0

# The relays a test started, read by the report hook in tests/conftest.py.
relays_key = pytest.StashKey[list["RelayProcess"]]()


def with_database_name(url: str, name: str) -> str:
    """`url` pointing at database `name` instead (user, host, port and options kept)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(name)))


def relay_database_url() -> str:
    """DATABASE_URL, but naming the test database pytest-django created (e.g. test_buzz)."""
    from django.db import connection

    return with_database_name(os.environ["DATABASE_URL"], str(connection.settings_dict["NAME"]))


@contextlib.contextmanager
def limited_role() -> Iterator[tuple[str, str]]:
    """A database role with the relay's privileges (not a superuser); yields (database URL, role name). A test
    injects a database failure by revoking one of them."""
    role = f"relay_probe_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    db_url = relay_database_url()
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(role)))
        admin.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}").format(
                sql.Identifier(role)
            )
        )
        admin.execute(
            sql.SQL("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {}").format(sql.Identifier(role))
        )
    parts = db_url.split("://", 1)
    rest = parts[1].split("@", 1)[-1]
    url = f"{parts[0]}://{role}@{rest}"
    try:
        yield url, role
    finally:
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def set_select(role: str, table: str, *, allowed: bool) -> None:
    """GRANT or REVOKE the SELECT of `table` for a `limited_role` role: a database failure, on demand."""
    command = "GRANT SELECT ON {} TO {}" if allowed else "REVOKE SELECT ON {} FROM {}"
    with psycopg.connect(relay_database_url(), autocommit=True) as admin:
        admin.execute(sql.SQL(command).format(sql.Identifier(table), sql.Identifier(role)))


class RelayProcess:
    """One `uvicorn buzz.asgi:application` subprocess. Use as a context manager or start()/stop()."""

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        database_url: str | None = None,
        redis_url: str | None = None,
        host: str = "127.0.0.1",
        app: str = DEFAULT_APP,
        log_level: str = "warning",
    ) -> None:
        self.host = host
        self.app = app
        self.log_level = log_level
        self.extra_env = dict(env or {})
        self.database_url = database_url
        self.redis_url = redis_url
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._final_log: str | None = None

    # --- addresses -----------------------------------------------------------------

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("relay not started")
        return self.proc.pid

    # --- lifecycle -----------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.database_url or relay_database_url(),
            REDIS_URL=self.redis_url or os.environ["REDIS_URL"],
            BUZZ_DEV="1",
            SECRET_KEY=os.environ.get("SECRET_KEY", ""),
            DJANGO_SETTINGS_MODULE="buzz.settings",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def start(self) -> RelayProcess:
        if self.proc is not None:
            raise RuntimeError("relay already started")
        env = self.environment()
        # The relay's own message limit, as its settings will read it from `env`.
        from django.conf import settings

        max_message_length = int(env.get("BUZZ_MAX_MESSAGE_LENGTH") or settings.BUZZ_LIMITS["max_message_length"])
        fd, name = tempfile.mkstemp(prefix="buzz-relay-", suffix=".log")
        os.close(fd)
        self._log_path = Path(name)
        for attempt in range(3):
            self.port = free_port(self.host)
            command = [
                sys.executable, "-m", "uvicorn", self.app,
                "--host", self.host,
                "--port", str(self.port),
                "--ws", ws_implementation(),
                "--ws-max-size", str(ws_max_size(max_message_length)),
                "--ws-per-message-deflate", "false",
                "--no-access-log",
                "--log-level", self.log_level,
            ]  # fmt: skip
            with self._log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    command,
                    cwd=BASE_DIR,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent(signal.SIGTERM),  # only a prctl call: safe after fork
                )
            if self._wait_listening():
                return self
            # Another process may have taken the free port between our probe and uvicorn's bind.
            if attempt < 2 and "address already in use" in self.log_text().lower():
                self._terminate()
                continue
            break
        text = self.log_text()
        assert self.proc is not None
        status = self.proc.poll()
        why = f"exited with status {status}" if status is not None else f"did not listen within {START_TIMEOUT:.0f} s"
        self.stop()
        raise RuntimeError(f"relay on {self.host}:{self.port} {why}; log:\n{text}")

    def _wait_listening(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def _terminate(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """Terminate (SIGTERM, SIGKILL after 5 s) and keep the log text. Idempotent."""
        self._terminate()
        if self._log_path is not None:
            self._final_log = self.log_text()
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

    def __enter__(self) -> RelayProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if exc is not None and self._final_log:
            exc.add_note(f"relay {self.host}:{self.port} log:\n{self._final_log}")

    # --- inspection ----------------------------------------------------------------

    def log_text(self) -> str:
        """What the relay wrote to stdout/stderr so far."""
        if self._log_path is None:
            return self._final_log or ""
        with contextlib.suppress(OSError):
            return self._log_path.read_text(errors="replace")
        return ""

    def rss_bytes(self) -> int:
        """Resident set size of the relay process (VmRSS), in bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for pid {self.pid}")

    def __repr__(self) -> str:
        state = "not started" if self.proc is None else f"pid {self.proc.pid}"
        return f"<RelayProcess {self.host}:{self.port} {state}>"


RelayFactory = Callable[..., RelayProcess]


@pytest.fixture
def relay_factory(request: pytest.FixtureRequest, transactional_db: None) -> Iterator[RelayFactory]:
    """Start relay processes: `relay_factory(**env_overrides)`. All are stopped after the test."""
    started: list[RelayProcess] = []
    request.node.stash[relays_key] = started

    def start(env: Mapping[str, str] | None = None, **overrides: str) -> RelayProcess:
        relay = RelayProcess(env={**(env or {}), **overrides})
        started.append(relay)
        return relay.start()

    yield start
    for relay in reversed(started):
        relay.stop()


async def start_relays(relay_factory: RelayFactory, *envs: Mapping[str, str]) -> list[RelayProcess]:
    """One relay process per env, started side by side (each on the one test database and Redis)."""
    import asyncio

    return list(await asyncio.gather(*(asyncio.to_thread(relay_factory, **env) for env in envs)))
