"""Settings for running behind a TLS proxy, read from the environment; outside dev mode they fail
closed: cookies are always Secure, and a trusted origin must be https."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

BASE = Path(__file__).resolve().parents[2]
PRODUCTION = {
    "SECRET_KEY": secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "relay.example.com",
    "DATABASE_URL": "postgres://u@127.0.0.1:1/db",
    "REDIS_URL": "redis://127.0.0.1:1/0",
}
SHOW = (
    "import json, buzz.settings as s; print(json.dumps([getattr(s, 'SECURE_PROXY_SSL_HEADER', None),"
    " s.CSRF_TRUSTED_ORIGINS, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE]))"
)
NAMES = ("SECURE_PROXY_SSL_HEADER", "CSRF_TRUSTED_ORIGINS", "BUZZ_DEV")


def load(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in (*PRODUCTION, *NAMES)}
    return subprocess.run(
        [sys.executable, "-c", SHOW], cwd=BASE, env={**clean, **env}, capture_output=True, text=True, timeout=60
    )


def test_proxy_settings_from_the_environment() -> None:
    result = load(
        {
            **PRODUCTION,
            "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https",
            "CSRF_TRUSTED_ORIGINS": "https://relay.example.com,https://admin.example.com",
        }
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        ["HTTP_X_FORWARDED_PROTO", "https"],
        ["https://relay.example.com", "https://admin.example.com"],
        True,
        True,
    ]


def test_production_defaults_are_secure_cookies_and_no_proxy_header() -> None:
    result = load(PRODUCTION)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [None, [], True, True]


def test_an_http_trusted_origin_is_refused_outside_dev_mode() -> None:
    result = load({**PRODUCTION, "CSRF_TRUSTED_ORIGINS": "https://a.example.com,http://relay.example.com"})
    assert result.returncode != 0
    # One line, as every configuration error (tests/dev/test_configuration_errors.py), not a traceback.
    assert result.stderr.startswith("configuration error: CSRF_TRUSTED_ORIGINS: 'http://relay.example.com' must")
    assert "Traceback" not in result.stderr
    dev = load({**PRODUCTION, "BUZZ_DEV": "1", "CSRF_TRUSTED_ORIGINS": "http://localhost:7777"})
    assert dev.returncode == 0, dev.stderr
    assert json.loads(dev.stdout) == [None, ["http://localhost:7777"], False, False]


def test_a_malformed_proxy_header_is_refused() -> None:
    for value in ("X-Forwarded-Proto", "X-Forwarded-Proto:", ": https", "X Forwarded: https"):
        result = load({**PRODUCTION, "SECURE_PROXY_SSL_HEADER": value})
        assert result.returncode != 0, value
        assert "SECURE_PROXY_SSL_HEADER must look like 'X-Forwarded-Proto: https'" in result.stderr, value
