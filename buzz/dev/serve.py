"""Serve the relay for development (what `make run` runs): `python -m buzz.dev.serve [--host H] [--port P]
[--workers N]`.

With DATABASE_URL / REDIS_URL unset it starts embedded PostgreSQL and Redis with their
data under ./var/ (see buzz.dev.devservices); with them set it uses those. While it
serves, an embedded server that dies is restarted on the same port. It migrates,
collects the static files, makes sure a community exists for localhost, then serves with
uvicorn until Ctrl-C or
SIGTERM, and stops what it started.

`--workers N` (default: the number of cores) serves N uvicorn worker processes behind the one port
(uvicorn's supervisor: the port is bound once and shared). Each worker has its own database pools and
its own hub connection to Redis, like separate relay processes; the embedded servers are started
once, by this parent process, and the workers inherit their URLs.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from django.core.exceptions import ImproperlyConfigured

from buzz.dev.devservices import ServiceError, environment_urls

BASE_DIR = Path(__file__).resolve().parents[2]
DEFAULT_APP = "buzz.asgi:application"


def ws_implementation() -> str:
    """The relay's WebSocket protocol for uvicorn's `ws` (buzz.ws.transport).

    uvicorn's sans-I/O websockets protocol, whose send() waits while the transport is paused, so a
    client that stops reading can't make the relay buffer without bound (DESIGN.md, "daphne
    buffers..."); the relay's subclass also aborts a connection whose close can't be written in time.
    """
    from buzz.ws.transport import WS_PROTOCOL

    return WS_PROTOCOL


# uvicorn refuses a frame past this many times BUZZ_MAX_MESSAGE_LENGTH (close 1009) before
# the relay reads it; below that, the relay answers an oversized message itself.
TRANSPORT_FRAME_FACTOR = 4


def ws_max_size(max_message_length: int) -> int:
    """uvicorn's --ws-max-size for a relay whose message limit is `max_message_length`."""
    return TRANSPORT_FRAME_FACTOR * max_message_length


def default_workers() -> int:
    """One worker per core the process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _log_to_stderr(name: str) -> None:
    logger = logging.getLogger(name)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        # Django's root handler would print each record a second time.
        logger.propagate = False


def _configuration_problem() -> str | None:
    """The settings' one-line message (buzz.settings.ConfigurationError) if they don't load, else None."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "buzz.settings")
    from django.conf import settings

    try:
        settings.BUZZ_LIMITS  # noqa: B018  (loading the settings is the point)
    except ImproperlyConfigured as exc:
        return str(exc)
    return None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _manage(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), *args],
        cwd=BASE_DIR,
        check=False,
        text=True,
        capture_output=capture,
    )


def _ensure_local_community(port: int) -> None:
    result = _manage("community", "ensure-local", "--port", str(port), capture=True)
    if result.stdout:
        print(result.stdout, end="")
    if result.returncode == 0:
        if result.stderr:
            print(result.stderr, end="", file=sys.stderr)
        return
    if "Unknown command" in result.stderr:
        print("warning: `manage.py community` is not available yet; no community was set up for localhost")
        return
    print(result.stderr, end="", file=sys.stderr)
    raise SystemExit(f"`manage.py community ensure-local --port {port}` failed (exit {result.returncode})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m buzz.dev.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7777)
    parser.add_argument("--app", default=DEFAULT_APP, help=f"ASGI application to serve (default {DEFAULT_APP})")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="uvicorn worker processes behind the port (default: the number of cores; 0 means the same)",
    )
    args = parser.parse_args(argv)
    workers = args.workers or default_workers()
    if workers < 1:
        parser.error("--workers must be at least 1")
    # `make run | tee`, or a log file: each line as it happens, in order with the subprocesses' output.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)

    # SIGTERM takes the same path as Ctrl-C: uvicorn shuts down, then the services stop.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        env, services = environment_urls(BASE_DIR / "var")
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    os.environ.update(env)
    os.environ.setdefault("BUZZ_DEV", "1")
    for name, value in env.items():
        print(f"embedded {name}={value} (data in {BASE_DIR / 'var'})")
    if services is not None:
        # Until Django configures logging, the supervisor's warnings need a handler of their own.
        _log_to_stderr("buzz.dev.devservices")
        services.supervise()
    problem = _configuration_problem()
    if problem is not None:
        print(f"configuration error: {problem}", file=sys.stderr)
        if services is not None:
            services.stop()
        return 1

    try:
        migrate = _manage("migrate", "--noinput")
        if migrate.returncode != 0:
            print(f"error: migrate failed (exit {migrate.returncode})", file=sys.stderr)
            return 1
        # The admin's CSS and JavaScript, which the relay serves from STATIC_ROOT (buzz/web/static.py).
        if _manage("collectstatic", "--noinput", "--verbosity", "0").returncode != 0:
            print("warning: collectstatic failed; the admin will have no CSS", file=sys.stderr)
        _ensure_local_community(args.port)

        import uvicorn

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "buzz.settings")
        from django.conf import settings

        shown = f"{workers} worker processes" if workers > 1 else "1 process"
        print(f"Buzz relay: ws://localhost:{args.port}/  http://localhost:{args.port}/  ({shown}; Ctrl-C stops it)")
        uvicorn.run(
            args.app,
            host=args.host,
            port=args.port,
            ws=ws_implementation(),
            ws_max_size=ws_max_size(settings.BUZZ_LIMITS["max_message_length"]),
            # Relay frames are small JSON; zlib cost ~3% of the CPU per message (bench/ingest.py profile).
            ws_per_message_deflate=False,
            access_log=False,
            log_level="info",
            # More than one: uvicorn's supervisor starts them (each imports the app afresh), restarts one
            # that dies, and stops them all on Ctrl-C or SIGTERM before this process stops the servers.
            workers=workers if workers > 1 else None,
        )
    except KeyboardInterrupt:
        pass
    finally:
        # A second Ctrl-C must not cut the shutdown short and leave servers behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if services is not None:
            print("stopping embedded services")
            services.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
