"""Settings fail closed outside dev mode: no default secret, no wildcard hosts, no default services."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

BASE = Path(__file__).resolve().parents[2]
GOOD = {
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "relay.example.com",
    "DATABASE_URL": "postgres://u@127.0.0.1:1/db",
    "REDIS_URL": "redis://127.0.0.1:1/0",
}


def load_settings(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in (*GOOD, "BUZZ_DEV")}
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-c", "import buzz.settings as s; print(s.DEBUG, s.ALLOWED_HOSTS)"],
        cwd=BASE,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_production_settings_load_with_everything_set() -> None:
    result = load_settings(GOOD)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False ['relay.example.com']"


@pytest.mark.parametrize("missing", ["SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"])
def test_each_required_setting_fails_closed(missing: str) -> None:
    env = {k: v for k, v in GOOD.items() if k != missing}
    result = load_settings(env)
    assert result.returncode != 0
    # One line that says what to set (buzz.settings.ConfigurationError), not a traceback.
    assert result.stderr.startswith("configuration error: set ") and missing in result.stderr


def test_wildcard_hosts_are_refused_outside_dev_mode() -> None:
    result = load_settings({**GOOD, "ALLOWED_HOSTS": "*"})
    assert result.returncode != 0 and "ALLOWED_HOSTS" in result.stderr


def test_dev_mode_relaxes_secret_and_hosts_only() -> None:
    dev = load_settings({"BUZZ_DEV": "1", "DATABASE_URL": GOOD["DATABASE_URL"], "REDIS_URL": GOOD["REDIS_URL"]})
    assert dev.returncode == 0, dev.stderr
    assert dev.stdout.strip() == "False ['*']"
    no_db = load_settings({"BUZZ_DEV": "1", "REDIS_URL": GOOD["REDIS_URL"]})
    assert no_db.returncode != 0 and "DATABASE_URL" in no_db.stderr


@pytest.mark.parametrize(
    "secret",
    [
        "change-me",  # a placeholder
        "x" * 50,  # long, but one character
        "abcd" * 20,  # long, four distinct characters
        secrets.token_urlsafe(50)[:49],  # random, one character short
        "django-insecure-" + secrets.token_urlsafe(50),  # Django's generated development key
    ],
)
def test_a_weak_secret_key_is_refused_outside_dev_mode(secret: str) -> None:
    result = load_settings({**GOOD, "SECRET_KEY": secret})
    assert result.returncode != 0
    assert result.stderr.startswith("configuration error: SECRET_KEY must be a long random string"), result.stderr


@pytest.mark.parametrize("name", ["BUZZ_AUTH_WINDOW", "BUZZ_HTTP_AUTH_WINDOW"])
@pytest.mark.parametrize(
    ("value", "loads"), [("0", False), ("-5", False), ("1", True), ("3600", True), ("3601", False)]
)
def test_an_authentication_window_is_from_1_to_3600_seconds(name: str, value: str, loads: bool) -> None:
    result = load_settings({**GOOD, name: value})
    if loads:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0
        assert result.stderr.startswith(f"configuration error: {name} must be from 1 to 3600"), result.stderr
