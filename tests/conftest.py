"""Shared fixtures. The environment itself (embedded services, env vars) is set up by
tests/support/environment.py, which pytest loads as a plugin before Django's settings.

Database: pytest-django creates the test database (settings TEST NAME, test_buzz) for
tests that ask for `db` / `transactional_db`; pure unit tests ask for neither.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from typing import Any

import psycopg
import pytest
import redis

from tests.support.relay import relay_factory, relays_key, with_database_name

__all__ = ["django_db_setup", "redis_client", "redis_flush", "redis_prefix", "redis_url", "relay_factory"]


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, whose DROP at the end can't be blocked by a stray session.

    Connections opened in sync_to_async worker threads, or by a relay killed mid-query,
    would make DROP DATABASE fail with "being accessed by other users".
    """
    yield
    from django.db import connection

    test_name = str(connection.settings_dict["NAME"])
    with (
        django_db_blocker.unblock(),
        psycopg.connect(
            with_database_name(os.environ["DATABASE_URL"], "postgres"), autocommit=True, connect_timeout=5
        ) as admin,
    ):
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [test_name],
        )


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis the relay processes of this run use."""
    return os.environ["REDIS_URL"]


@pytest.fixture(scope="session")
def redis_prefix() -> str:
    """This run's BUZZ_REDIS_PREFIX: every key and topic the relay uses starts with it."""
    return os.environ["BUZZ_REDIS_PREFIX"]


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _delete_prefixed(client: redis.Redis, prefix: str) -> None:
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)


@pytest.fixture
def redis_flush(redis_client: redis.Redis, redis_prefix: str) -> Iterator[redis.Redis]:
    """Delete this run's keys before and after the test (never other runs' keys: no FLUSHDB)."""
    _delete_prefixed(redis_client, redis_prefix)
    yield redis_client
    _delete_prefixed(redis_client, redis_prefix)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    # A failing test shows the log of every relay it started, taken before teardown stops them.
    if report.failed and report.when in ("setup", "call"):
        for relay in item.stash.get(relays_key, []):
            report.sections.append((f"relay {relay.host}:{relay.port} log", relay.log_text() or "(empty)"))
    return report
