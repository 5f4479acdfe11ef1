"""A relay connects to the database and Redis before it serves (buzz.asgi's startup): its first request pays for
no connection inside its own budget. An incremental read's authentication has two seconds, and a cold pool
opened inside them once answered an invalid request 503 statement_budget instead of 400 on a loaded machine.
Observed from outside: the relay process's established TCP connections, before any request is sent."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import psutil
import psycopg
import pytest

from tests.support.relay import relay_database_url


@pytest.mark.django_db(transaction=True)
def test_a_relay_holds_its_database_and_redis_connections_before_its_first_request(relay_factory: Any) -> None:
    relay = relay_factory()
    established = [
        c for c in psutil.Process(relay.pid).net_connections(kind="tcp") if c.raddr and c.status == "ESTABLISHED"
    ]
    redis_port = urlsplit(os.environ["REDIS_URL"]).port or 6379
    assert any(c.raddr.port == redis_port for c in established), established
    with psycopg.connect(relay_database_url(), autocommit=True) as admin:
        backends = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND client_port = ANY(%s)",
            [[c.laddr.port for c in established]],
        ).fetchone()
    # The main pool's first connections (BUZZ_DB_POOL_MIN, 2 by default).
    assert backends is not None and backends[0] >= 2, (backends, established)
