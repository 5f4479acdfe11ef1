"""Services.supervise() against real embedded servers: a server that dies is restarted on its port,
with its data, and stop() ends that: nothing comes back after it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from buzz.dev.devservices import start_embedded
from tests.support.environment import TEST_VAR_DIR

RESTART_TIMEOUT = 60.0


@pytest.fixture
def var_dir() -> Iterator[Path]:
    # Under var/test, not tmp_path: see test_devservices.py.
    TEST_VAR_DIR.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="selftest-", dir=TEST_VAR_DIR))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + RESTART_TIMEOUT
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {RESTART_TIMEOUT:.0f} s"
        time.sleep(0.1)


def _redis_pid(url: str) -> int | None:
    try:
        return int(redis.Redis.from_url(url, socket_timeout=2).info("server")["process_id"])
    except redis.RedisError:
        return None


def _postmaster_pid(url: str) -> int | None:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            # While connected: the backend exits with the connection.
            return psutil.Process(row[0]).ppid() if row else None
    except (psycopg.Error, psutil.NoSuchProcess):
        return None


def _listening(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_dead_servers_come_back_on_their_ports_until_stop(var_dir: Path) -> None:
    services = start_embedded(var_dir, durable=False)
    try:
        services.supervise(interval=0.2)
        with psycopg.connect(services.database_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (value text)")
            conn.execute("INSERT INTO kept VALUES ('before the crash')")

        first_redis = _redis_pid(services.redis_url)
        assert first_redis is not None
        os.kill(first_redis, signal.SIGKILL)
        _until(lambda: _redis_pid(services.redis_url) not in (None, first_redis), "new Redis on the same port")

        first_pg = _postmaster_pid(services.database_url)
        assert first_pg is not None
        os.kill(first_pg, signal.SIGKILL)
        _until(lambda: _postmaster_pid(services.database_url) not in (None, first_pg), "new PostgreSQL on its port")
        with psycopg.connect(services.database_url) as conn:
            assert conn.execute("SELECT value FROM kept").fetchall() == [("before the crash",)]
    finally:
        services.stop()

    # Stopped on purpose: the supervisor must not bring them back.
    time.sleep(1.0)
    assert not _listening(services.redis_url)
    assert not _listening(services.database_url)
    assert not (var_dir / "redis" / "state.json").exists()
    assert not (var_dir / "postgres" / "owner.json").exists()
