"""The test session's environment, loaded as `-p tests.support.environment` (pyproject addopts).

pytest imports -p plugins before pytest-django loads buzz.settings, which requires
DATABASE_URL and REDIS_URL. So this plugin, ahead of pytest-django:
- starts embedded PostgreSQL and Redis for whichever of the two is unset, in a
  directory of this run's own (var/test/run-<pid>/, deleted at the end), so runs
  started at the same time from one checkout never share a server;
- with an external DATABASE_URL (.ci/run uses this machine's PostgreSQL), names the
  test database test_buzz_<pid> so concurrent runs don't drop each other's, and drops
  the ones left by runs that died;
- fixes the rest: dev mode, a known SECRET_KEY, a Redis key prefix of this run's own.
Relay processes started by tests inherit all of it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import pytest

from buzz.dev.devservices import Services, environment_urls, stop_leftovers

BASE_DIR = Path(__file__).resolve().parents[2]
TEST_VAR_DIR = BASE_DIR / "var" / "test"
TEST_SECRET_KEY = "buzz-test-secret-key-0123456789-not-for-production"
_RUN_DIR_RE = re.compile(r"^run-(\d+)$")
_RUN_DB_RE = re.compile(r"^test_buzz_(\d+)$")
_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}

_services: Services | None = None
_run_dir: Path | None = None
_embedded: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    global _services, _run_dir
    os.environ["BUZZ_DEV"] = "1"
    os.environ["SECRET_KEY"] = TEST_SECRET_KEY
    # Every key and pub/sub topic the relay uses starts with this, so a run never sees
    # another run's traffic, even on a shared Redis.
    os.environ.setdefault("BUZZ_REDIS_PREFIX", f"buzztest-{secrets.token_hex(4)}:")
    namespace = early_config.known_args_namespace
    if getattr(namespace, "help", False) or getattr(namespace, "version", False):
        return
    if os.environ.get("DATABASE_URL"):
        os.environ.setdefault("TEST_DATABASE_NAME", f"test_buzz_{os.getpid()}")
        _drop_dead_runs_databases(os.environ["DATABASE_URL"])
    if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
        return
    _remove_dead_run_dirs()
    _run_dir = TEST_VAR_DIR / f"run-{os.getpid()}"
    # Test data may be lost on a crash: fsync off makes the suite's DDL and commits cheap.
    env, _services = environment_urls(_run_dir, durable=False)
    _embedded.update(env)
    os.environ.update(env)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    for name in ("DATABASE_URL", "REDIS_URL"):
        source = f"embedded, {_run_dir.relative_to(BASE_DIR)}" if name in _embedded and _run_dir else "from environment"
        lines.append(f"{name}: {os.environ.get(name, '')} ({source})")
    lines.append(f"test database: {os.environ.get('TEST_DATABASE_NAME', 'test_buzz')}")
    lines.append(f"BUZZ_REDIS_PREFIX: {os.environ.get('BUZZ_REDIS_PREFIX', '')}")
    return lines


def pytest_unconfigure(config: pytest.Config) -> None:
    if _services is not None:
        _services.stop()
    if _run_dir is not None:
        shutil.rmtree(_run_dir, ignore_errors=True)


def _remove_dead_run_dirs() -> None:
    """Delete var/test/run-<pid> directories of runs that ended without cleaning up."""
    if not TEST_VAR_DIR.is_dir():
        return
    for path in TEST_VAR_DIR.iterdir():
        match = _RUN_DIR_RE.match(path.name)
        if not match or psutil.pid_exists(int(match.group(1))):
            continue
        if not stop_leftovers(path):
            shutil.rmtree(path, ignore_errors=True)


def _drop_dead_runs_databases(database_url: str) -> None:
    """Drop test_buzz_<pid> databases whose run (a process on this machine) is gone.

    Only on a local server: the pid says nothing about runs on other machines.
    DROP DATABASE without FORCE refuses a database still in use, which covers the rest.
    """
    import psycopg
    from psycopg import sql

    parts = urlsplit(database_url)
    if parts.hostname not in _LOCAL_HOSTS:
        return
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    with contextlib.suppress(psycopg.Error), psycopg.connect(maintenance, autocommit=True, connect_timeout=5) as conn:
        names = [row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'test_buzz_%'")]
        for name in names:
            match = _RUN_DB_RE.match(name)
            if match and not psutil.pid_exists(int(match.group(1))):
                with contextlib.suppress(psycopg.Error):
                    conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)))
