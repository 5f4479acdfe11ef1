"""buzz.dev.devservices against real embedded servers: the code path of `make run` and of the suite."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from buzz.dev.devservices import environment_urls, start_embedded
from tests.support.environment import TEST_VAR_DIR


@pytest.fixture
def var_dir() -> Iterator[Path]:
    """A scratch var/ for one test. Not under pytest's tmp_path: another pytest run starting
    meanwhile resets /tmp/pytest-of-<user> to 0700, locking the postgres user out mid-test."""
    TEST_VAR_DIR.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="selftest-", dir=TEST_VAR_DIR))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _accepts(url: str) -> bool:
    parsed = redis.connection.parse_url(url) if url.startswith("redis") else None
    host, port = (parsed["host"], parsed["port"]) if parsed else _pg_address(url)
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _pg_address(url: str) -> tuple[str, int]:
    info = psycopg.conninfo.conninfo_to_dict(url)
    return str(info["host"]), int(str(info["port"]))


def test_start_stop_and_reuse(var_dir: Path) -> None:
    services = start_embedded(var_dir, durable=False)
    try:
        with psycopg.connect(services.database_url, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.execute("SELECT current_database()").fetchone() == ("buzz",)
            conn.execute("CREATE TABLE kept (value text)")
            conn.execute("INSERT INTO kept VALUES ('first run')")
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert backend is not None
            postmaster = psutil.Process(backend[0]).ppid()

        client = redis.Redis.from_url(services.redis_url)
        assert client.ping()
        redis_pid = int(client.info("server")["process_id"])

        # The hub needs subscribe confirmations...
        subscriber = redis.Redis.from_url(services.redis_url)
        pubsub = subscriber.pubsub()
        pubsub.subscribe("buzz:selftest")
        confirmation = pubsub.get_message(timeout=5)
        assert confirmation is not None
        assert confirmation["type"] == "subscribe"
        assert client.publish("buzz:selftest", "hello") == 1
        message = pubsub.get_message(timeout=5)
        assert message is not None
        assert message["data"] == b"hello"
        # ...and chaos tests cut connections with CLIENT KILL.
        subscribed = [c for c in client.client_list() if int(c.get("sub", 0)) > 0]
        assert len(subscribed) == 1
        assert client.client_kill_filter(_id=subscribed[0]["id"]) == 1
        with pytest.raises(redis.ConnectionError):
            pubsub.get_message(timeout=5)
        pubsub.close()
        subscriber.close()
        client.close()
    finally:
        services.stop()
    services.stop()  # idempotent

    assert not psutil.pid_exists(postmaster) or psutil.Process(postmaster).status() == psutil.STATUS_ZOMBIE
    assert not psutil.pid_exists(redis_pid) or psutil.Process(redis_pid).status() == psutil.STATUS_ZOMBIE
    assert not _accepts(services.database_url)
    assert not _accepts(services.redis_url)

    again = start_embedded(var_dir, durable=False)
    try:
        assert again.database_url == services.database_url  # the recorded port is reused
        with psycopg.connect(again.database_url) as conn:
            assert conn.execute("SELECT value FROM kept").fetchall() == [("first run",)]
    finally:
        again.stop()


def test_environment_urls_starts_only_what_is_unset(var_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://someone@db.invalid/x")
    monkeypatch.setenv("REDIS_URL", "redis://cache.invalid/0")
    assert environment_urls(var_dir) == ({}, None)

    monkeypatch.delenv("REDIS_URL")
    env, services = environment_urls(var_dir)
    try:
        assert services is not None
        assert list(env) == ["REDIS_URL"]
        assert services.database_url == ""
        assert redis.Redis.from_url(env["REDIS_URL"]).ping()
        assert not (var_dir / "postgres").exists()
    finally:
        if services is not None:
            services.stop()
