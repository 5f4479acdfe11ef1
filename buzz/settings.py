"""Settings for the Buzz artifact relay.

The environment is read here and nowhere else. Outside dev mode every secret and
every connection string is required: a missing one stops start-up instead of
falling back to something unsafe.

A missing or malformed variable raises ConfigurationError. Left uncaught (manage.py,
uvicorn loading buzz.asgi, python -m buzz.dev.serve), it prints one line that says what
to set, instead of a traceback; every other exception keeps its traceback.
"""

from __future__ import annotations

import builtins
import secrets
import sys
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import django_stubs_ext
import environ
from django.core.exceptions import ImproperlyConfigured

from buzz.flags import parse_flag

# Lets the admin classes be written with type parameters (ModelAdmin[Model]).
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent


class ConfigurationError(ImproperlyConfigured):
    """The environment lacks a setting, or has one in the wrong form. The message says what to set."""

    # Read by the excepthook below (a marker, not the class: a second import makes a new class).
    buzz_configuration_error = True


def _report_in_one_line(
    kind: type[BaseException], exc: BaseException, tb: TracebackType | None, *, previous: Any
) -> None:
    if getattr(exc, "buzz_configuration_error", False):
        print(f"configuration error: {exc}", file=sys.stderr)
    else:
        previous(kind, exc, tb)


def _config_error(message: str) -> ConfigurationError:
    """The error to raise; if nothing catches it, the process prints just its message and exits 1."""
    if not getattr(sys.excepthook, "buzz_one_line", False):
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            _report_in_one_line(kind, exc, tb, previous=previous)

        hook.buzz_one_line = True  # type: ignore[attr-defined]
        sys.excepthook = hook
    return ConfigurationError(message)


class _Env(environ.Env):  # type: ignore[misc]
    """django-environ, with a value that doesn't parse (BUZZ_MAX_LIMIT=abc) reported as a ConfigurationError."""

    def get_value(
        self, var: str, cast: Any = None, default: Any = environ.Env.NOTSET, parse_default: bool = False
    ) -> Any:
        try:
            return super().get_value(var, cast=cast, default=default, parse_default=parse_default)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(cast, f"a valid {getattr(cast, '__name__', 'value')}")
            raise _config_error(f"{var} must be {kind}, not {self.ENVIRON.get(var, '')!r}") from None

    def bool(self, var: str, default: Any = environ.Env.NOTSET) -> builtins.bool:
        """An on/off variable (buzz.flags): a value that is neither word is refused, not read as off."""
        if var not in self.ENVIRON:
            if default is environ.Env.NOTSET:
                raise _config_error(f"set {var} in the environment")
            return builtins.bool(default)
        flag = parse_flag(self.ENVIRON[var])
        if flag is None:
            raise _config_error(f"{var} must be 1/true/yes/on or 0/false/no/off, not {self.ENVIRON[var]!r}")
        return flag

    def list(self, var: str, cast: Any = None, default: Any = environ.Env.NOTSET) -> builtins.list[Any]:
        """A comma-separated list, each item stripped of spaces and empty ones dropped ("a, b," is a and b)."""
        return [item.strip() for item in super().list(var, cast=cast, default=default) if item.strip()]


env = _Env()

DEV_MODE: bool = env.bool("BUZZ_DEV", default=False)

# Without these the relay does not start; outside dev mode, the secret and the host names too.
# All the missing ones are named at once, so a fresh deployment is fixed in one try.
_WHAT_TO_SET = {
    "SECRET_KEY": "a long random string",
    "ALLOWED_HOSTS": "the relay's host names, comma-separated",
    "DATABASE_URL": "e.g. postgres://buzz@127.0.0.1:5432/buzz",
    "REDIS_URL": "e.g. redis://127.0.0.1:6379/0",
}
_missing = [
    name
    for name in _WHAT_TO_SET
    if (not DEV_MODE or name.endswith("_URL")) and not env.str(name, default="").strip(", ")
]
if _missing:
    raise _config_error(
        "set "
        + ", ".join(f"{name} ({_WHAT_TO_SET[name]})" for name in _missing)
        + " in the environment"
        + ("" if DEV_MODE else " (required outside dev mode, BUZZ_DEV=1; .env.example lists them)")
    )


def _required(name: str) -> str:
    value = env.str(name, default="")
    if not value:
        raise _config_error(f"set {name} in the environment (BUZZ_DEV is off, so there is no default)")
    return value


# Django's own deployment check asks as much of a secret: at least 50 characters, 5 of them distinct, and
# not one of its generated development keys. A placeholder (.env.example's) or a short word is refused.
SECRET_KEY_MIN_LENGTH = 50
SECRET_KEY_MIN_DISTINCT = 5


def _strong_secret(value: str) -> str:
    if (
        len(value) < SECRET_KEY_MIN_LENGTH
        or len(set(value)) < SECRET_KEY_MIN_DISTINCT
        or value.startswith("django-insecure-")
    ):
        raise _config_error(
            f"SECRET_KEY must be a long random string (at least {SECRET_KEY_MIN_LENGTH} characters,"
            f" {SECRET_KEY_MIN_DISTINCT} of them distinct); make one with"
            """ python3 -c 'import secrets; print(secrets.token_urlsafe(50))'"""
        )
    return value


if DEV_MODE:
    SECRET_KEY = env.str("SECRET_KEY", default="") or secrets.token_urlsafe(50)
    ALLOWED_HOSTS: list[str] = env.list("ALLOWED_HOSTS", default=["*"])
else:
    SECRET_KEY = _strong_secret(_required("SECRET_KEY"))
    ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=[])
    if not ALLOWED_HOSTS or "*" in ALLOWED_HOSTS:
        raise _config_error(
            "set ALLOWED_HOSTS to the relay's host names, comma-separated: * is refused outside dev mode"
        )

DEBUG: bool = DEV_MODE and env.bool("DJANGO_DEBUG", default=False)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Admin login throttling (the block "Admin login throttling" below).
    "axes",
    "buzz",
    "artifacts",
    "moderation",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # STATIC_URL from STATIC_ROOT (whitenoise), before sessions and the rest: buzz/web/static.py.
    "buzz.web.static.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes requires: turns a lockout into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "buzz.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ASGI_APPLICATION = "buzz.asgi.application"

# `make run` and the test suite start embedded servers and set these when they are unset.
DATABASE_URL = _required("DATABASE_URL")
if DATABASE_URL.partition("://")[0] not in ("postgres", "postgresql", "pgsql"):
    raise _config_error("set DATABASE_URL to a PostgreSQL URL, e.g. postgres://buzz@127.0.0.1:5432/buzz")
try:
    _database = env.db_url_config(DATABASE_URL)
except ValueError as _err:  # a port that is not a number
    raise _config_error(f"DATABASE_URL is malformed ({_err}): e.g. postgres://buzz@127.0.0.1:5432/buzz") from None
if not _database.get("NAME"):
    # libpq would pick a database (and, with no host, a server) of its own.
    raise _config_error("DATABASE_URL names no database: e.g. postgres://buzz@127.0.0.1:5432/buzz")
DATABASES = {"default": _database}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["TEST"] = {"NAME": env.str("TEST_DATABASE_NAME", default="test_buzz")}

REDIS_URL: str = _required("REDIS_URL")
if not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise _config_error("set REDIS_URL to a Redis URL, e.g. redis://127.0.0.1:6379/0")


def _redis_url_problem(url: str) -> str | None:
    """What is missing from a Redis URL (redis-py would fall back to localhost:6379 without a host), or None."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return None if parts.path else "a socket path"
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        return "a port that is a number"
    if not parts.hostname:
        return "a host"
    if parts.path.strip("/") and not parts.path.strip("/").isdigit():
        return "a database number as its path"
    return None


if (_problem := _redis_url_problem(REDIS_URL)) is not None:
    raise _config_error(f"REDIS_URL needs {_problem}: e.g. redis://127.0.0.1:6379/0")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- Static files -------------------------------------------------------------------
# `manage.py collectstatic` (run by `make run`) fills STATIC_ROOT; buzz.web.static serves it.
STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(BASE_DIR / "var" / "static")))

# --- Admin login throttling (django-axes) --------------------------------------------
# Failed admin logins are counted per (username, client address): past the limit that pair is locked
# out (HTTP 429) for the cool-off time, and a good login resets the count. Behind a proxy the client
# address is the proxy's unless uvicorn runs with --proxy-headers (docs/operations.md).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT: int = env.int("BUZZ_ADMIN_LOGIN_FAILURES", default=5)
AXES_COOLOFF_TIME = timedelta(seconds=env.int("BUZZ_ADMIN_LOCKOUT_SECONDS", default=900))
# 0 or less would lock every login out (failures) or never lock anyone out (cool-off).
for _name, _value in (
    ("BUZZ_ADMIN_LOGIN_FAILURES", AXES_FAILURE_LIMIT),
    ("BUZZ_ADMIN_LOCKOUT_SECONDS", AXES_COOLOFF_TIME.total_seconds()),
):
    if _value < 1:
        raise _config_error(f"{_name} must be at least 1")
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True

# --- Running behind a TLS-terminating proxy ------------------------------------------
# SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https" makes a request that the proxy marks so count as
# HTTPS (set it only when the proxy sets that header itself and strips it from clients).
# CSRF_TRUSTED_ORIGINS: comma-separated origins (scheme://host[:port]) the admin's forms may come from
# when they differ from the request's own. Outside dev mode cookies are always Secure, and every
# trusted origin must be https: there is no setting that turns either off.
CSRF_TRUSTED_ORIGINS: list[str] = env.list("CSRF_TRUSTED_ORIGINS", default=[])
for _origin in CSRF_TRUSTED_ORIGINS:
    if not (_origin.startswith("https://") or (DEV_MODE and _origin.startswith("http://"))):
        raise _config_error(
            f"CSRF_TRUSTED_ORIGINS: {_origin!r} must start with https://"
            + ("" if DEV_MODE else " outside dev mode")
            + " (e.g. https://relay.example.com)"
        )
_proxy_ssl_header = env.str("SECURE_PROXY_SSL_HEADER", default="").strip()
if _proxy_ssl_header:
    _name, _sep, _value = _proxy_ssl_header.partition(":")
    _name, _value = _name.strip(), _value.strip()
    if not _sep or not _name or not _value or not all(c.isalnum() or c in "-_" for c in _name):
        raise _config_error(
            f"SECURE_PROXY_SSL_HEADER must look like 'X-Forwarded-Proto: https', not {_proxy_ssl_header!r}"
        )
    _meta = _name.upper().replace("-", "_")
    SECURE_PROXY_SSL_HEADER = (_meta if _meta.startswith("HTTP_") else f"HTTP_{_meta}", _value)
SESSION_COOKIE_SECURE = not DEV_MODE
CSRF_COOKIE_SECURE = not DEV_MODE
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

_log_level = env.str("LOG_LEVEL", default="INFO").strip().upper()
if _log_level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise _config_error(f"LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not {_log_level!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": _log_level},
    # django-axes announces itself at every start (each manage.py command too); its lockouts stay logged.
    "loggers": {"axes.apps": {"level": "WARNING"}},
}

# Relay protocol limits. Each one is enforced by the relay and advertised in NIP-11.
BUZZ_LIMITS = {
    "max_message_length": env.int("BUZZ_MAX_MESSAGE_LENGTH", default=512 * 1024),
    "max_subscriptions": env.int("BUZZ_MAX_SUBSCRIPTIONS", default=32),
    "max_filters": env.int("BUZZ_MAX_FILTERS", default=16),
    "max_limit": env.int("BUZZ_MAX_LIMIT", default=1000),
    "default_limit": env.int("BUZZ_DEFAULT_LIMIT", default=500),
    "max_subid_length": env.int("BUZZ_MAX_SUBID_LENGTH", default=64),
    "max_event_tags": env.int("BUZZ_MAX_EVENT_TAGS", default=256),
    "max_content_length": env.int("BUZZ_MAX_CONTENT_LENGTH", default=256 * 1024),
    "created_at_lower_limit": env.int("BUZZ_CREATED_AT_PAST", default=900),
    "created_at_upper_limit": env.int("BUZZ_CREATED_AT_FUTURE", default=900),
    "auth_window": env.int("BUZZ_AUTH_WINDOW", default=600),
    "http_auth_window": env.int("BUZZ_HTTP_AUTH_WINDOW", default=60),
    # Outbound queue per connection: a client that stops reading is cut off at this bound.
    "outbound_max_messages": env.int("BUZZ_OUTBOUND_MAX_MESSAGES", default=1024),
    "outbound_max_bytes": env.int("BUZZ_OUTBOUND_MAX_BYTES", default=4 * 1024 * 1024),
}
# A negative window would refuse every event.
for _name, _key in (
    ("BUZZ_CREATED_AT_PAST", "created_at_lower_limit"),
    ("BUZZ_CREATED_AT_FUTURE", "created_at_upper_limit"),
):
    if BUZZ_LIMITS[_key] < 0:
        raise _config_error(f"{_name} must be 0 or more (seconds)")
# An authentication's created_at window bounds how long a captured AUTH or NIP-98 event stays usable (and
# how long the NIP-98 replay guard keeps its id): an hour at most, and never 0 or less (every login refused).
MAX_AUTH_WINDOW = 3600
for _name, _key in (("BUZZ_AUTH_WINDOW", "auth_window"), ("BUZZ_HTTP_AUTH_WINDOW", "http_auth_window")):
    if not 1 <= BUZZ_LIMITS[_key] <= MAX_AUTH_WINDOW:
        raise _config_error(f"{_name} must be from 1 to {MAX_AUTH_WINDOW} (seconds)")

BUZZ_SOFTWARE = "buzz-artifact-relay"
BUZZ_VERSION = "0.1.0"

# Async PostgreSQL pool for the relay's hot paths (buzz.runtime).
BUZZ_DB_POOL = {
    "min_size": env.int("BUZZ_DB_POOL_MIN", default=2),
    "max_size": env.int("BUZZ_DB_POOL_MAX", default=10),
    "timeout": env.float("BUZZ_DB_POOL_TIMEOUT", default=10.0),
    # Separate connections for long read-only snapshots (NIP-AR sync): they never starve the write path.
    "snapshot_max_size": env.int("BUZZ_SNAPSHOT_POOL_MAX", default=4),
    # The write statements of kind-9 messages and NIP-AR revisions, on connections of their own: reads
    # holding the main pool never make a write wait (buzz.runtime.write_pool).
    "write_max_size": env.int("BUZZ_WRITE_POOL_MAX", default=6),
}

# Concurrent stored reads (a REQ page, a COUNT; buzz.events.query): in the whole process, and per connection.
# Past them a read waits (10 s at most, then rate-limited:). The default leaves 4 pool connections to writes.
BUZZ_READ_SLOTS: int = env.int("BUZZ_READ_SLOTS", default=max(1, BUZZ_DB_POOL["max_size"] - 4))
BUZZ_READS_PER_CONNECTION: int = env.int("BUZZ_READS_PER_CONNECTION", default=2)

# Write quota per pubkey (token bucket shared by all nodes through Redis). per_second 0 disables it.
BUZZ_WRITE_QUOTA = {
    "per_second": env.float("BUZZ_WRITES_PER_SECOND", default=20.0),
    "burst": env.float("BUZZ_WRITE_BURST", default=100.0),
}
# Live signals waiting for Redis past which new writes are refused with error: before they commit
# (buzz.live.publisher: a committed signal is never dropped).
BUZZ_PUBLISH_MAX_PENDING: int = env.int("BUZZ_PUBLISH_MAX_PENDING", default=100_000)
# Key prefix for everything the relay keeps in Redis (quotas, NIP-98 replay guard, pub/sub topics).
BUZZ_REDIS_PREFIX: str = env.str("BUZZ_REDIS_PREFIX", default="buzz:")
if not BUZZ_REDIS_PREFIX.strip():
    # Without one the relay's keys and topics would mix with whatever else uses that Redis.
    raise _config_error("BUZZ_REDIS_PREFIX must not be empty (the default is buzz:)")

# NIP-AR queries: every /query and /count runs inside this statement budget; past it, HTTP 503.
BUZZ_QUERY_BUDGET_MS: int = env.int("BUZZ_QUERY_BUDGET_MS", default=5000)
# Every statement on the main pool's connections (buzz.runtime.pool: NIP-01 REQ pages and COUNT, the access,
# token and counter reads, sync's live head reads) is cancelled past this (their sessions' statement_timeout;
# a read with a budget of its own, a /query or an incremental page, sets it for its transaction). A REQ or
# COUNT past it ends with CLOSED "error: ...", never with a partial result presented as complete.
BUZZ_READ_STATEMENT_BUDGET_MS: int = env.int("BUZZ_READ_STATEMENT_BUDGET_MS", default=5000)
# 0 would be PostgreSQL's "no timeout": no budget at all.
if BUZZ_QUERY_BUDGET_MS < 1:
    raise _config_error("BUZZ_QUERY_BUDGET_MS must be at least 1 (milliseconds)")
if BUZZ_READ_STATEMENT_BUDGET_MS < 1:
    raise _config_error("BUZZ_READ_STATEMENT_BUDGET_MS must be at least 1 (milliseconds)")

# NIP-AR sync (REQ {"artifact": "current", "#h": [...]}).
BUZZ_SYNC = {
    # Advertise sync in NIP-11 (artifacts.sync, websocket_query_extensions). Turn it off only while some node
    # serving this community does not run sync: a relay advertises only what every backend runs.
    "enabled": env.bool("BUZZ_SYNC_ENABLED", default=True),
    # The largest set a sync serves, and the bound of its held list (advertised as max_events).
    "max_events": env.int("BUZZ_SYNC_MAX_EVENTS", default=4096),
    # How long the initial snapshot may stay open (not advertised); past it, CLOSED "error: ...".
    "snapshot_budget_ms": env.int("BUZZ_SYNC_SNAPSHOT_BUDGET_MS", default=10000),
    # Rows per keyset page of the initial read (all pages come from one snapshot).
    "page_rows": env.int("BUZZ_SYNC_PAGE_ROWS", default=1000),
    # Bytes of the initial set a sync may buffer between the snapshot and the connection's send queue.
    "buffer_bytes": env.int("BUZZ_SYNC_BUFFER_BYTES", default=8 * 1024 * 1024),
}
# 0 or less would refuse every sync (a set of at most 0, a budget of none, an empty buffer) or, for the
# page, end every initial read with an error.
for _name, _key in (
    ("BUZZ_SYNC_MAX_EVENTS", "max_events"),
    ("BUZZ_SYNC_SNAPSHOT_BUDGET_MS", "snapshot_budget_ms"),
    ("BUZZ_SYNC_PAGE_ROWS", "page_rows"),
    ("BUZZ_SYNC_BUFFER_BYTES", "buffer_bytes"),
):
    if BUZZ_SYNC[_key] < 1:
        raise _config_error(f"{_name} must be at least 1")

# NIP-AR incremental reads (POST /query {"artifact": "incremental", ...}): off by default. Cursors and
# checkpoints are signed with BUZZ_INCREMENTAL_SIGNING_KEY, which every instance serving the community
# must share (one instance verifies what another signed); there is no server-side state.
BUZZ_INCREMENTAL = {
    "enabled": env.bool("BUZZ_ARTIFACT_INCREMENTAL_ENABLED", default=False),
    "signing_key": env.str("BUZZ_INCREMENTAL_SIGNING_KEY", default=""),
    # Advertised in NIP-11 (artifacts.incremental); the defaults are the spec's.
    "page_rows": env.int("BUZZ_INCREMENTAL_PAGE_ROWS", default=100),
    "response_bytes": env.int("BUZZ_INCREMENTAL_RESPONSE_BYTES", default=8 * 1024 * 1024),
}
if BUZZ_INCREMENTAL["enabled"]:
    _key_text = str(BUZZ_INCREMENTAL["signing_key"]).strip()
    if len(_key_text) < 32 or len(set(_key_text)) < SECRET_KEY_MIN_DISTINCT:
        raise _config_error(
            f"set BUZZ_INCREMENTAL_SIGNING_KEY to a random string of at least 32 characters"
            f" ({SECRET_KEY_MIN_DISTINCT} of them distinct), the same on every"
            " instance (BUZZ_ARTIFACT_INCREMENTAL_ENABLED is on; docs/operations.md says how to make one)"
        )
    if not 1 <= int(BUZZ_INCREMENTAL["page_rows"]) <= 1000:
        raise _config_error("BUZZ_INCREMENTAL_PAGE_ROWS must be from 1 to 1000")
    if int(BUZZ_INCREMENTAL["response_bytes"]) < 4608:
        # artifacts.incremental.MIN_RESPONSE_BYTES: a page reserves 2304 bytes for its envelope and cursor.
        raise _config_error("BUZZ_INCREMENTAL_RESPONSE_BYTES must be at least 4608")
