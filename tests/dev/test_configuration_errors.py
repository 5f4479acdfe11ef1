"""A configuration error is one line that says what to set, not a traceback: from manage.py, from
`python -m buzz.dev.serve`, and from uvicorn loading buzz.asgi as production does. Any other
exception keeps its traceback."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.checkout import DevCheckout, fresh_environment

BASE_DIR = Path(__file__).resolve().parents[2]
UNREACHABLE = {"DATABASE_URL": "postgres://buzz@127.0.0.1:1/buzz", "REDIS_URL": "redis://127.0.0.1:1/0"}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python ARGS` from the checkout, in a fresh environment plus `env`."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=BASE_DIR,
        env=fresh_environment(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_manage_py_names_every_missing_setting_in_one_line() -> None:
    # BUZZ_DEV=0: production settings, so nothing is looked up in var/.
    line = one_line(run("manage.py", "check", env={"BUZZ_DEV": "0"}))
    assert line.startswith("configuration error: set SECRET_KEY (")
    for name in ("SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"):
        assert name in line


SECRET = secrets.token_urlsafe(50)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({**UNREACHABLE, "BUZZ_DEV": "1", "BUZZ_MAX_LIMIT": "lots"}, "BUZZ_MAX_LIMIT must be an integer, not 'lots'"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "DATABASE_URL": "mysql://x@y/z"}, "set DATABASE_URL to a PostgreSQL URL"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "REDIS_URL": "127.0.0.1:6379"}, "set REDIS_URL to a Redis URL"),
        ({**UNREACHABLE, "SECRET_KEY": SECRET, "ALLOWED_HOSTS": "*"}, "set ALLOWED_HOSTS to the relay's host names"),
        # 0 is PostgreSQL's "no statement timeout": a budget of 0 would be none at all.
        ({**UNREACHABLE, "BUZZ_DEV": "1", "BUZZ_READ_STATEMENT_BUDGET_MS": "0"}, "BUZZ_READ_STATEMENT_BUDGET_MS must"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "BUZZ_QUERY_BUDGET_MS": "-5"}, "BUZZ_QUERY_BUDGET_MS must be at least 1"),
        # The two variables a TLS-terminating proxy needs (docs/operations.md), outside dev mode.
        (
            {**UNREACHABLE, "SECRET_KEY": SECRET, "ALLOWED_HOSTS": "x", "CSRF_TRUSTED_ORIGINS": "http://x.example"},
            "CSRF_TRUSTED_ORIGINS: 'http://x.example' must start with https://",
        ),
        (
            {**UNREACHABLE, "SECRET_KEY": SECRET, "ALLOWED_HOSTS": "x", "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"},
            "SECURE_PROXY_SSL_HEADER must look like 'X-Forwarded-Proto: https'",
        ),
        # An on/off variable holds an on/off word: a typo is not read as off (BUZZ_SYNC_ENABLED=tru would
        # silently stop advertising sync), nor BUZZ_DEV's as production by one reader and dev by the other.
        ({**UNREACHABLE, "BUZZ_DEV": "1", "BUZZ_SYNC_ENABLED": "tru"}, "BUZZ_SYNC_ENABLED must be 1/true/yes/on or"),
        ({**UNREACHABLE, "BUZZ_DEV": "enabled"}, "BUZZ_DEV must be 1/true/yes/on or 0/false/no/off, not 'enabled'"),
        # A lockout of 0 s never locks anyone out; 0 failures locks every login out.
        ({**UNREACHABLE, "BUZZ_DEV": "1", "BUZZ_ADMIN_LOCKOUT_SECONDS": "0"}, "BUZZ_ADMIN_LOCKOUT_SECONDS must be"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "BUZZ_ADMIN_LOGIN_FAILURES": "-1"}, "BUZZ_ADMIN_LOGIN_FAILURES must be"),
        # Connection URLs that libpq or redis-py would complete with servers of their own choosing.
        ({**UNREACHABLE, "BUZZ_DEV": "1", "DATABASE_URL": "postgres://u@h:port/db"}, "DATABASE_URL is malformed"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "DATABASE_URL": "postgres://"}, "DATABASE_URL names no database"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "REDIS_URL": "redis://"}, "REDIS_URL needs a host"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "REDIS_URL": "redis://:6379/0"}, "REDIS_URL needs a host"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "REDIS_URL": "redis://h:abc/0"}, "REDIS_URL needs a port that is a number"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "REDIS_URL": "redis://h:6379/x"}, "REDIS_URL needs a database number"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "REDIS_URL": "unix://"}, "REDIS_URL needs a socket path"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "BUZZ_REDIS_PREFIX": ""}, "BUZZ_REDIS_PREFIX must not be empty"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "BUZZ_CREATED_AT_PAST": "-1"}, "BUZZ_CREATED_AT_PAST must be 0 or more"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "BUZZ_SYNC_PAGE_ROWS": "0"}, "BUZZ_SYNC_PAGE_ROWS must be at least 1"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "BUZZ_SYNC_MAX_EVENTS": "-1"}, "BUZZ_SYNC_MAX_EVENTS must be at least 1"),
        ({**UNREACHABLE, "BUZZ_DEV": "1", "LOG_LEVEL": "LOUD"}, "LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or"),
        (
            {
                **UNREACHABLE,
                "BUZZ_DEV": "1",
                "BUZZ_ARTIFACT_INCREMENTAL_ENABLED": "1",
                "BUZZ_INCREMENTAL_SIGNING_KEY": "a" * 40,
            },
            "set BUZZ_INCREMENTAL_SIGNING_KEY to a random string of at least 32 characters (5 of them distinct)",
        ),
    ],
)
def test_a_malformed_or_missing_setting_is_one_line(env: dict[str, str], expected: str) -> None:
    line = one_line(run("manage.py", "check", env=env))
    assert line.startswith("configuration error: ") and expected in line, line


def test_lists_and_words_are_read_as_an_operator_writes_them() -> None:
    code = (
        "import django; django.setup(); from django.conf import settings as s;"
        " print(s.ALLOWED_HOSTS, s.CSRF_TRUSTED_ORIGINS, s.BUZZ_SYNC['enabled'], s.LOGGING['root']['level'])"
    )
    env = {
        **UNREACHABLE,
        "DJANGO_SETTINGS_MODULE": "buzz.settings",
        "SECRET_KEY": SECRET,
        "ALLOWED_HOSTS": " a.example, b.example ,",
        "CSRF_TRUSTED_ORIGINS": "https://a.example, https://b.example",
        "BUZZ_SYNC_ENABLED": " Off ",
        "LOG_LEVEL": "warning",
    }
    result = run("-c", code, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "['a.example', 'b.example'] ['https://a.example', 'https://b.example'] False WARNING"
    )


def test_manage_py_in_a_checkout_without_make_run_says_to_start_it() -> None:
    with DevCheckout.create() as checkout:
        result = checkout.shell(".venv/bin/python manage.py community list")
    line = one_line(result)
    assert line.startswith("error: DATABASE_URL and REDIS_URL are not set, and no `make run` is serving this checkout")
    assert "start `make run` in another shell" in line


def test_uvicorn_loading_the_relay_in_production_prints_one_line() -> None:
    line = one_line(run("-m", "uvicorn", "buzz.asgi:application", "--port", "1", env={"BUZZ_DEV": "0"}))
    assert line.startswith("configuration error: set SECRET_KEY (")


def test_serve_reports_the_configuration_error_before_starting_anything() -> None:
    result = run("-m", "buzz.dev.serve", "--port", "1", env={**UNREACHABLE, "BUZZ_DEV": "0"})
    line = one_line(result)
    assert line.startswith("configuration error: set SECRET_KEY (")
    assert "Operations to perform" not in result.stdout  # migrate never ran


def test_other_errors_keep_their_traceback() -> None:
    # The one-line report is for configuration errors only: a bug raised afterwards still shows where.
    code = "try:\n    import buzz.settings\nexcept Exception:\n    pass\nraise RuntimeError('a real bug')\n"
    result = run("-c", code, env={"BUZZ_DEV": "0"})
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in result.stderr
    assert "RuntimeError: a real bug" in result.stderr
