"""Benchmark: NIP-AR sync (REQ {"artifact": "current", "#h": [...]}), each figure beside a same-run baseline.

1. Time to EOSE for --artifacts (default 4096) artifacts in one channel, beside a bare keyset read of the
   same rows (one REPEATABLE READ READ ONLY transaction, pages of 1000 ordered by d, psycopg) plus JSON
   encoding of each as an EVENT frame, in the same run, --rounds times interleaved; medians and the ratio
   (target <= 1.5).
2. Write-to-head delivery with --syncs (default 1000) open syncs over two relay nodes (32 per connection):
   a writer on node A sends --writes paced revisions of artifacts in the synced channel; every sync on both
   nodes receives each head. Latency from the write's send to each head's arrival: p50/p99, beside a bare
   Redis PUBLISH -> SUBSCRIBE round trip in the same run (target <= 10x), measured twice: back to back, and
   paced as the writes are (one every PACE seconds, so each starts from an idle machine as each write does;
   on the 2-core bench VM waking the processes a message passes through costs more than the message), and
   beside a bare fan-out of the same events to the same number of subscriptions over two uvicorn processes
   (bench/fanout_app.py: Redis, the event loop and the WebSocket writes, nothing else), which is the floor
   any relay in Python pays: once with one socket write per connection per event (as the relay writes) and
   once with one per frame.
   The CPU seconds of each relay (or fan-out) process, of this client and of the rest of the machine over
   the writes are printed too: the client is Python on the same cores. --profile DIR py-spys all of them.
   The client reads the syncs' frames with common.FrameReader (--client frames, the default), which
   splits each read of the socket into frames: about 5 µs of this client's CPU per frame, where
   websockets' recv() (--client websockets) cost about 13. With a thousand syncs the thousandth head
   waited for the client's 999 parses, on the cores the relays need: 4 to 7 ms more at the p50 in the
   runs measured. The bare fan-out is read the same way; delivery to ONE sync (one frame per write) reads
   with recv().
   Then, as a figure of its own, delivery to ONE sync on node A while node A holds --syncs - 1 syncs of
   other channels (the common case: a write reaches few syncs), beside the same PUBLISH round trip, with
   the write's own OK latency (commit and confirmed PUBLISH) beside it.
3. Memory per idle sync: node A's RSS before and after opening --syncs idle syncs (32 per connection),
   divided by the syncs (target <= 64 KiB), with the cost per connection reported apart.
4. Write throughput (8 closed-loop writers, revisions in a channel no sync watches) with --syncs idle syncs
   open vs none, --rounds interleaved rounds, medians (target: no more than a 10% drop).

    python bench/sync.py [--artifacts 4096] [--syncs 1000] [--writes 200] [--rounds 3] [--seconds 8]
                         [--json out.json] [--only eose,delivery,memory,throughput] [--profile DIR]
                         [--client frames|websockets]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import BenchError, Op, Server

SUBS_PER_CONNECTION = 32
# The relay's default BUZZ_SYNC_PAGE_ROWS: the baseline reads in pages of the same size.
PAGE_ROWS = 1000
# Seconds between the writer's revisions in the delivery figures.
PACE = 0.03
PARTS = ("eose", "delivery", "memory", "throughput")


def _signer() -> Any:
    from buzz.nostr import Signer

    return Signer.generate()


def revision(signer: Any, d: str, h: str, op: str, prev: str | None = None, content: str = "") -> dict[str, Any]:
    tags = [["ar", "1"], ["d", d], ["h", h], ["type", "bench.task"], ["title", f"task {d[:8]}"], ["op", op]]
    if prev:
        tags.append(["prev", prev])
    tags.append(["status", "open"])
    body = content or json.dumps({"n": time.monotonic_ns()})
    return dict(signer.sign_event(kind=45010, tags=tags, content=body).to_dict())


def channel_setup(env: dict[str, str], host: str, owner: str, members: list[str]) -> dict[str, str]:
    """Channels big, live, idle, tput and solo, private, owned by `owner`, with every member added."""
    ids = {name: str(uuid.uuid4()) for name in ("big", "live", "idle", "tput", "solo")}
    for name, cid in ids.items():
        common.checked(
            common.manage(
                env,
                "channel",
                "create",
                "--host",
                host,
                "--name",
                name,
                "--owner",
                owner,
                "--id",
                cid,
                "--visibility",
                "private",
            ),
            f"manage.py channel create {name}",
        )
        for pk in members:
            common.checked(common.manage(env, "channel", "add-member", "--host", host, cid, pk), "add-member")
    return ids


@contextlib.asynccontextmanager
async def connected(server: Server, signer: Any) -> AsyncIterator[Any]:
    async with common.ws_connect(server, max_size=None, max_queue=None) as ws:
        await common.authenticate(ws, signer, server.public_url)
        yield ws


async def send_ok(ws: Any, event: dict[str, Any]) -> None:
    await ws.send(json.dumps(["EVENT", event]))
    while True:
        m = json.loads(await ws.recv())
        if m[0] == "OK" and m[1] == event["id"]:
            if m[2] is not True:
                raise BenchError(f"write refused: {m}")
            return


async def load(server: Server, owner: Any, channel: str, n: int) -> None:
    async def part(k: int) -> None:
        async with connected(server, owner) as ws:
            for _ in range(k):
                await send_ok(ws, revision(owner, str(uuid.uuid4()), channel, "create", content="x" * 300))

    workers = 8
    await asyncio.gather(*(part(n // workers + (1 if i < n % workers else 0)) for i in range(workers)))


async def time_to_eose(server: Server, reader: Any, channel: str) -> tuple[float, int]:
    async with connected(server, reader) as ws:
        began = time.perf_counter()
        await ws.send(json.dumps(["REQ", "s", {"artifact": "current", "#h": [channel]}]))
        n = 0
        while True:
            text = await ws.recv()
            if text.startswith('["EVENT"'):
                n += 1
            elif text.startswith('["EOSE"'):
                return time.perf_counter() - began, n
            else:
                raise BenchError(f"sync did not complete: {text[:200]}")


def bare_keyset_read(database_url: str, community: int, channel: str) -> tuple[float, int]:
    """The same rows, one snapshot, keyset pages of the relay's page size by d, each encoded as an EVENT frame."""
    import psycopg

    sql = (
        "SELECT a.d, r.seq, r.raw FROM artifacts_artifact a"
        " JOIN artifacts_revision r ON r.community_id = a.community_id AND r.id = a.head_id"
        " WHERE a.community_id = %s AND a.home = %s AND NOT a.deleted AND NOT a.retired AND a.d > %s"
        " ORDER BY a.d LIMIT %s"
    )
    began = time.perf_counter()
    n = 0
    with psycopg.connect(database_url) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        after = uuid.UUID(int=0)
        while True:
            rows = conn.execute(sql, (community, uuid.UUID(channel), after, PAGE_ROWS)).fetchall()
            for _, _, raw in rows:
                json.dumps(["EVENT", "s", json.loads(raw)], ensure_ascii=False, separators=(",", ":"))
                n += 1
            if len(rows) < PAGE_ROWS:
                break
            after = rows[-1][0]
        conn.rollback()
    return time.perf_counter() - began, n


def community_id(env: dict[str, str], host: str) -> int:
    out = common.checked(
        common.manage(
            env, "shell", "-c", f"from buzz.models import Community as C; print(C.objects.get(host={host!r}).pk)"
        ),
        "community id",
    )
    return int(out.strip().splitlines()[-1])


async def open_syncs(
    server: Server, reader: Any, channel: str, count: int, stack: contextlib.AsyncExitStack
) -> list[Any]:
    """`count` syncs of `channel`, SUBS_PER_CONNECTION per connection, all at EOSE."""
    conns = []
    left = count
    while left > 0:
        ws = await stack.enter_async_context(connected(server, reader))
        k = min(SUBS_PER_CONNECTION, left)
        for i in range(k):
            await ws.send(json.dumps(["REQ", f"s{i}", {"artifact": "current", "#h": [channel]}]))
        done = 0
        while done < k:
            text = await ws.recv()
            if text.startswith('["EOSE"'):
                done += 1
            elif text.startswith('["CLOSED"'):
                raise BenchError(f"sync refused: {text}")
        conns.append(ws)
        left -= k
    return conns


class CpuWindow:
    """CPU seconds spent by the relay processes, this client process and the whole machine over a window."""

    def __init__(self, servers: dict[str, Server]) -> None:
        self._servers = servers
        self._start: dict[str, float] = {}
        self.spent: dict[str, float] = {}

    def _sample(self) -> dict[str, float]:
        out = {name: s.cpu() for name, s in self._servers.items()}
        out["client"] = time.process_time()
        out["machine"] = common.machine_busy_seconds()
        out["wall"] = time.perf_counter()
        return out

    def __enter__(self) -> CpuWindow:
        self._start = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._sample()
        self.spent = {k: end[k] - self._start[k] for k in end}

    def describe(self) -> str:
        s = self.spent
        named = " ".join(f"{k} {v:.2f}" for k, v in s.items() if k not in ("machine", "wall"))
        rest = s["machine"] - sum(v for k, v in s.items() if k not in ("machine", "wall"))
        return (
            f"CPU s over {s['wall']:.1f} s: {named}, rest of the machine {rest:.2f} (of {2 * s['wall']:.1f} on 2 cores)"
        )


def profiles(servers: dict[str, Server], directory: str | None, seconds: float) -> contextlib.ExitStack:
    """py-spy on every server and on this client while the body runs (nothing without --profile)."""
    stack = contextlib.ExitStack()
    pids = {name: s.pid for name, s in servers.items()}
    pids["client"] = os.getpid()
    for name, pid in pids.items():
        stack.enter_context(common.py_spy(pid, common.profile_path(directory, name, "raw"), seconds))
    return stack


def report_profiles(names: list[str], directory: str | None) -> None:
    for name in names:
        path = common.profile_path(directory, name, "raw")
        if path is not None:
            print(f"  profile of {name}:")
            common.report_profile(path)


# How the delivery figures' client reads its syncs' frames: "frames", common.FrameReader (about 5 µs of CPU
# per frame); "websockets", ws.recv() (about 13 µs per frame: with a thousand syncs the client queues).
CLIENTS = ("frames", "websockets")


def listen(
    conns: list[Any], on_frames_of: Callable[[Any], Callable[[float, list[common.Frame]], None]], client: str
) -> list[asyncio.Task[None]]:
    """Every frame each connection of `conns` receives from now on goes to `on_frames_of(ws)`, read as `client`
    says (CLIENTS); the tasks to cancel when done (none for "frames", which reads in the protocol itself)."""
    if client == "frames":
        for ws in conns:
            common.read_frames(ws, on_frames_of(ws))
        return []

    async def recv(ws: Any, on_frames: Callable[[float, list[common.Frame]], None]) -> None:
        while True:
            text = await ws.recv()
            on_frames(time.perf_counter(), [(0x1, text.encode())])

    return [asyncio.create_task(recv(ws, on_frames_of(ws))) for ws in conns]


async def delivery(
    a: Server,
    b: Server,
    owner: Any,
    reader: Any,
    channel: str,
    syncs: int,
    writes: int,
    profile: str | None = None,
    client: str = "frames",
) -> dict[str, Any]:
    """Heads are delivered as they are read: a sync may skip an intermediate revision (rule 4), so the
    latency is taken over the heads that arrive, and the run ends when every sync has the last one."""
    latencies: list[float] = []
    oks: list[float] = []
    sent: dict[str, float] = {}
    last: dict[str, str] = {}
    have_last = 0
    async with contextlib.AsyncExitStack() as stack:
        conns = await open_syncs(a, reader, channel, syncs // 2, stack)
        conns += await open_syncs(b, reader, channel, syncs - syncs // 2, stack)
        subs = [(ws, i) for ws in conns for i in range(SUBS_PER_CONNECTION)][:syncs]
        done = asyncio.Event()
        got_last: set[tuple[int, str]] = set()

        closed: list[str] = []

        def on_frames_of(ws: Any) -> Callable[[float, list[common.Frame]], None]:
            def on_frames(now: float, frames: list[common.Frame]) -> None:
                nonlocal have_last
                for opcode, payload in frames:
                    if payload.startswith(b'["EVENT"'):
                        # ["EVENT","sN",{"id":"<64 hex>"... : the id without decoding the whole frame.
                        sub = payload[10 : payload.index(b'"', 10)]
                        i = payload.index(b'"id":"') + 6
                        event_id = payload[i : i + 64].decode()
                        began = sent.get(event_id)
                        if began is not None:
                            latencies.append(1000 * (now - began))
                        if last.get("id") == event_id and (id(ws), sub) not in got_last:
                            got_last.add((id(ws), sub))
                            have_last += 1
                            if have_last >= len(subs):
                                done.set()
                    elif payload.startswith(b'["CLOSED"'):
                        closed.append(payload.decode(errors="replace"))
                        done.set()
                    elif opcode == 0x8:
                        code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
                        closed.append(f"the relay closed the connection (close code {code})")
                        done.set()

            return on_frames

        listeners = listen(conns, on_frames_of, client)
        servers = {"relay-a": a, "relay-b": b}
        cpu = CpuWindow(servers)
        try:
            async with connected(a, owner) as w:
                d = str(uuid.uuid4())
                prev = None
                with profiles(servers, profile, writes * PACE), cpu:
                    for n in range(writes):
                        ev = revision(owner, d, channel, "create" if prev is None else "update", prev)
                        if n == writes - 1:
                            last["id"] = ev["id"]
                        sent[ev["id"]] = began = time.perf_counter()
                        await send_ok(w, ev)
                        oks.append(1000 * (time.perf_counter() - began))
                        prev = ev["id"]
                        await asyncio.sleep(PACE)
            waiter = asyncio.create_task(done.wait())
            finished, _ = await asyncio.wait([waiter, *listeners], timeout=60, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                if task is not waiter and task.exception() is not None:
                    raise BenchError(f"a listener failed: {task.exception()}")
            if closed:
                raise BenchError(f"a sync was closed during the run: {closed[0]}")
            if not done.is_set():
                raise BenchError(f"only {have_last} of {len(subs)} syncs got the last head")
        finally:
            for t in listeners:
                t.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
    latencies.sort()
    return {
        "samples": len(latencies),
        "heads_per_sync": len(latencies) / len(subs),
        "p50_ms": common.percentile(latencies, 50),
        "p99_ms": common.percentile(latencies, 99),
        "ok_p50_ms": common.percentile(sorted(oks), 50),
        "ok_p99_ms": common.percentile(sorted(oks), 99),
        "cpu": cpu.spent,
        "cpu_text": cpu.describe(),
    }


def quiet_channels(env: dict[str, str], host: str, owner: str, count: int) -> list[str]:
    """`count` open channels (a relay member reads them without joining), made in one manage.py shell."""
    script = (
        "import uuid\n"
        "from buzz.chat.channels import channel_create\n"
        "from buzz.models import Community\n"
        f"c = Community.objects.get(host={host!r})\n"
        f"for i in range({count}):\n"
        "    u = uuid.uuid4()\n"
        f"    channel_create(community=c, channel_uuid=u, name=f'quiet {{i}}', creator={owner!r}, visibility='open')\n"
        "    print('channel', u)\n"
    )
    out = common.checked(common.manage(env, "shell", "-c", script, timeout=600), "create the quiet channels")
    ids = [line.split()[1] for line in out.splitlines() if line.startswith("channel ")]
    if len(ids) != count:
        raise BenchError(f"created {len(ids)} quiet channels, expected {count}")
    return ids


async def open_spread(server: Server, reader: Any, channels: list[str], stack: contextlib.AsyncExitStack) -> list[Any]:
    """One sync per channel, SUBS_PER_CONNECTION per connection, all at EOSE."""
    conns = []
    for start in range(0, len(channels), SUBS_PER_CONNECTION):
        ws = await stack.enter_async_context(connected(server, reader))
        part = channels[start : start + SUBS_PER_CONNECTION]
        for i, channel in enumerate(part):
            await ws.send(json.dumps(["REQ", f"s{i}", {"artifact": "current", "#h": [channel]}]))
        done = 0
        while done < len(part):
            text = await ws.recv()
            if text.startswith('["EOSE"'):
                done += 1
            elif text.startswith('["CLOSED"'):
                raise BenchError(f"sync refused: {text}")
        conns.append(ws)
    return conns


async def solo_delivery(
    a: Server, owner: Any, reader: Any, channel: str, quiet: list[str], writes: int
) -> dict[str, Any]:
    """One sync of `channel` on node A beside len(quiet) syncs of other channels on node A; the writer on
    node A. Latency from the write's send to the head's arrival at the one sync, and the write's own OK."""
    latencies: list[float] = []
    oks: list[float] = []
    arrived: dict[str, float] = {}
    arrival = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        await open_spread(a, reader, quiet, stack)
        [ws] = await open_syncs(a, reader, channel, 1, stack)

        async def listen() -> None:
            try:
                while True:
                    text = await ws.recv()
                    now = time.perf_counter()
                    if text.startswith('["CLOSED"'):
                        raise BenchError(f"the sync was closed during the run: {text}")
                    i = text.index('"id":"') + 6
                    arrived[text[i : i + 64]] = now
                    arrival.set()
            finally:
                arrival.set()  # the writer's loop sees the end

        listener = asyncio.create_task(listen())
        try:
            async with connected(a, owner) as w:
                d = str(uuid.uuid4())
                prev = None
                for _ in range(writes):
                    ev = revision(owner, d, channel, "create" if prev is None else "update", prev)
                    began = time.perf_counter()
                    await send_ok(w, ev)
                    oks.append(1000 * (time.perf_counter() - began))
                    async with asyncio.timeout(10):
                        while ev["id"] not in arrived:
                            if listener.done():
                                listener.result()
                            arrival.clear()
                            await arrival.wait()
                    latencies.append(1000 * (arrived[ev["id"]] - began))
                    prev = ev["id"]
                    await asyncio.sleep(PACE)
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
    latencies.sort()
    oks.sort()
    return {
        "samples": len(latencies),
        "other_syncs": len(quiet),
        "p50_ms": common.percentile(latencies, 50),
        "p99_ms": common.percentile(latencies, 99),
        "ok_p50_ms": common.percentile(oks, 50),
        "ok_p99_ms": common.percentile(oks, 99),
    }


def start_fanout(stack: contextlib.ExitStack, env: dict[str, str], topic: str, batch: bool) -> Server:
    port = common.free_port()
    log = common.VAR_DIR / f"fanout-{port}.log"
    args = [*common.uvicorn_args("fanout_app:application", port), "--app-dir", str(common.BENCH_DIR)]
    proc = common.spawn(stack, args, {**env, "FANOUT_TOPIC": topic, "FANOUT_BATCH": "1" if batch else "0"}, log)
    common.wait_for_port(port, proc, 30.0, log)
    return Server(port=port, proc=proc, host_header=f"127.0.0.1:{port}", log=log)


async def bare_fanout(
    stack: contextlib.ExitStack,
    env: dict[str, str],
    owner: Any,
    channel: str,
    syncs: int,
    writes: int,
    batch: bool,
    profile: str | None = None,
    client: str = "frames",
) -> dict[str, Any]:
    """The same paced events PUBLISHed to two bare fan-out processes holding `syncs` subscriptions.

    `batch`: each connection's frames for one event go out in one socket write (as the relay's do), or
    one write per frame."""
    import redis.asyncio as aioredis
    from websockets.asyncio.client import connect

    topic = f"bench:fanout:{uuid.uuid4()}"
    servers = [start_fanout(stack, env, topic, batch), start_fanout(stack, env, topic, batch)]
    cpu = CpuWindow({"fanout-a": servers[0], "fanout-b": servers[1]})
    latencies: list[float] = []
    sent: dict[str, float] = {}
    expected = syncs * writes
    done = asyncio.Event()
    async with contextlib.AsyncExitStack() as astack:
        conns = []
        for n, server in enumerate(servers):
            left = syncs // 2 if n == 0 else syncs - syncs // 2
            while left > 0:
                ws = await astack.enter_async_context(connect(f"ws://127.0.0.1:{server.port}/", max_size=None))
                k = min(SUBS_PER_CONNECTION, left)
                for i in range(k):
                    await ws.send(json.dumps(["SUB", f"s{i}"]))
                for _ in range(k):
                    await ws.recv()
                conns.append(ws)
                left -= k

        def on_frames_of(ws: Any) -> Callable[[float, list[common.Frame]], None]:
            def on_frames(now: float, frames: list[common.Frame]) -> None:
                for _, payload in frames:
                    i = payload.find(b'"id":"') + 6
                    began = sent.get(payload[i : i + 64].decode()) if i >= 6 else None
                    if began is not None:
                        latencies.append(1000 * (now - began))
                        if len(latencies) >= expected:
                            done.set()

            return on_frames

        listeners = listen(conns, on_frames_of, client)
        pub = aioredis.from_url(env["REDIS_URL"])
        try:
            await asyncio.sleep(0.5)  # both processes' SUBSCRIBE is in place
            d = str(uuid.uuid4())
            prev = None
            named = {"fanout-a": servers[0], "fanout-b": servers[1]}
            with profiles(named, profile, writes * PACE), cpu:
                for _ in range(writes):
                    ev = revision(owner, d, channel, "create" if prev is None else "update", prev)
                    raw = json.dumps(ev, separators=(",", ":"))
                    sent[ev["id"]] = time.perf_counter()
                    await pub.publish(topic, raw)
                    prev = ev["id"]
                    await asyncio.sleep(PACE)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 60)
        finally:
            await pub.aclose()
            for t in listeners:
                t.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
    if len(latencies) < expected:
        raise BenchError(f"bare fan-out delivered {len(latencies)} of {expected}")
    latencies.sort()
    return {
        "samples": len(latencies),
        "p50_ms": common.percentile(latencies, 50),
        "p99_ms": common.percentile(latencies, 99),
        "cpu": cpu.spent,
        "cpu_text": cpu.describe(),
    }


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError("no VmRSS")


async def memory(a: Server, reader: Any, channel: str, syncs: int) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        # Connections alone first (authenticated, no subscription), to separate their cost.
        conns = [await stack.enter_async_context(connected(a, reader)) for _ in range(-(-syncs // SUBS_PER_CONNECTION))]
        await asyncio.sleep(1.0)
        with_connections = rss(a.pid)
        for ws in conns:
            for i in range(SUBS_PER_CONNECTION):
                await ws.send(json.dumps(["REQ", f"s{i}", {"artifact": "current", "#h": [channel]}]))
        for ws in conns:
            done = 0
            while done < SUBS_PER_CONNECTION:
                text = await ws.recv()
                if text.startswith('["EOSE"'):
                    done += 1
        await asyncio.sleep(1.0)
        with_syncs = rss(a.pid)
        opened = len(conns) * SUBS_PER_CONNECTION
    return {
        "syncs": opened,
        "connections": len(conns),
        "per_sync_kib": (with_syncs - with_connections) / opened / 1024,
    }


def writer_op(server: Server, signer: Any, channel: str) -> Any:
    @contextlib.asynccontextmanager
    async def make(i: int) -> AsyncIterator[Op]:
        async with connected(server, signer) as ws:
            state: dict[str, Any] = {"d": str(uuid.uuid4()), "prev": None, "n": 0}

            async def op() -> int:
                if state["n"] % 4 == 0:
                    state["d"], state["prev"] = str(uuid.uuid4()), None
                ev = revision(
                    signer, state["d"], channel, "create" if state["prev"] is None else "update", state["prev"]
                )
                await send_ok(ws, ev)
                state["prev"] = ev["id"]
                state["n"] += 1
                return 1

            yield op

    return make


async def throughput(
    a: Server, owner: Any, reader: Any, ids: dict[str, str], syncs: int, rounds: int, seconds: float
) -> dict[str, Any]:
    none_rates, with_rates = [], []
    for _ in range(rounds):
        r = await common.closed_loop(8, seconds, writer_op(a, owner, ids["tput"]), server=a)
        none_rates.append(r.rate)
        async with contextlib.AsyncExitStack() as stack:
            await open_syncs(a, reader, ids["idle"], syncs, stack)
            r = await common.closed_loop(8, seconds, writer_op(a, owner, ids["tput"]), server=a)
            with_rates.append(r.rate)
    return {
        "without_syncs_rev_s": statistics.median(none_rates),
        "with_syncs_rev_s": statistics.median(with_rates),
        "rounds": {"without": none_rates, "with": with_rates},
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    parts = set(args.only.split(",")) if args.only else set(PARTS)
    owner, reader = _signer(), _signer()
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        env.update(BUZZ_WRITES_PER_SECOND="0", BUZZ_MAX_SUBSCRIPTIONS=str(SUBS_PER_CONNECTION))
        a = common.start_relay(stack, env, [owner.pubkey, reader.pubkey])
        b = common.start_relay_node(stack, env, a)
        ids = channel_setup(env, a.host_header, owner.pubkey, [reader.pubkey])
        cid = community_id(env, a.host_header)
        common.header(
            "NIP-AR sync",
            [
                f"{args.artifacts} artifacts, {args.syncs} syncs over 2 nodes, {args.rounds} rounds",
                common.code_version(),
            ],
        )
        if "eose" in parts:
            await load(a, owner, ids["big"], args.artifacts)
            relay_s, base_s = [], []
            for _ in range(args.rounds):
                t, n = await time_to_eose(a, reader, ids["big"])
                if n != args.artifacts:
                    raise BenchError(f"sync sent {n} events, expected {args.artifacts}")
                relay_s.append(t)
                t, n = await asyncio.to_thread(bare_keyset_read, env["DATABASE_URL"], cid, ids["big"])
                base_s.append(t)
            rm, bm = statistics.median(relay_s), statistics.median(base_s)
            out["eose"] = {"relay_ms": 1000 * rm, "baseline_ms": 1000 * bm, "ratio": rm / bm}
            print(
                f"time to EOSE, {args.artifacts} artifacts: relay {1000 * rm:.1f} ms, bare keyset read + JSON"
                f" {1000 * bm:.1f} ms -> {common.ratio(rm, bm)} (target <= 1.5)"
            )
        if "delivery" in parts:
            rtt = await common.redis_roundtrip(env["REDIS_URL"])
            # The same round trip paced as the writes below are: each starts from a machine left idle.
            paced = await common.redis_roundtrip(env["REDIS_URL"], count=args.writes, pace=PACE)
            d = await delivery(a, b, owner, reader, ids["live"], args.syncs, args.writes, args.profile, args.client)
            report_profiles(["relay-a", "relay-b", "client"], args.profile)
            f1 = await bare_fanout(
                stack, env, owner, ids["live"], args.syncs, args.writes, False, args.profile, args.client
            )
            report_profiles(["fanout-a", "fanout-b", "client"], args.profile)
            f = await bare_fanout(
                stack, env, owner, ids["live"], args.syncs, args.writes, True, args.profile, args.client
            )
            report_profiles(["fanout-a", "fanout-b", "client"], args.profile)
            out["delivery"] = {
                **d,
                "redis_p50_ms": rtt.p50_ms,
                "redis_p99_ms": rtt.p99_ms,
                "redis_paced_p50_ms": paced.p50_ms,
                "redis_paced_p99_ms": paced.p99_ms,
                "fanout_p50_ms": f["p50_ms"],
                "fanout_p99_ms": f["p99_ms"],
                "fanout_per_frame_p50_ms": f1["p50_ms"],
                "fanout_per_frame_p99_ms": f1["p99_ms"],
                "client": args.client,
                "fanout_cpu": f["cpu"],
                "fanout_per_frame_cpu": f1["cpu"],
            }
            print(
                f"write-to-head delivery, {args.syncs} syncs on 2 nodes, {d['samples']} heads"
                f" (this client reads with {args.client}):"
                f" p50 {d['p50_ms']:.2f} ms"
                f" / p99 {d['p99_ms']:.2f} ms; bare Redis PUBLISH->SUBSCRIBE p50 {rtt.p50_ms:.3f} / p99"
                f" {rtt.p99_ms:.3f} ms -> p50 {common.ratio(d['p50_ms'], rtt.p50_ms)}, p99"
                f" {common.ratio(d['p99_ms'], rtt.p99_ms)} (target <= 10)"
            )
            print(f"  {_paced_line(d, paced)}")
            for name, g in (("one socket write per connection per event", f), ("one socket write per frame", f1)):
                print(
                    f"  beside a bare fan-out of the same events to {args.syncs} subscriptions on 2 uvicorn processes,"
                    f" {name}: p50 {g['p50_ms']:.2f} / p99 {g['p99_ms']:.2f} ms"
                    f" -> p50 {common.ratio(d['p50_ms'], g['p50_ms'])}, p99 {common.ratio(d['p99_ms'], g['p99_ms'])}"
                )
            print(
                f"  the writer's own OK (commit and confirmed PUBLISH) in the relay run: p50 {d['ok_p50_ms']:.2f}"
                f" / p99 {d['ok_p99_ms']:.2f} ms (each head's latency includes its write's path up to the PUBLISH)"
            )
            print(f"  relay run: {d['cpu_text']}")
            print(f"  bare fan-out run (one write per connection per event): {f['cpu_text']}")
            print(f"  bare fan-out run (one write per frame): {f1['cpu_text']}")
            quiet = quiet_channels(env, a.host_header, owner.pubkey, args.syncs - 1)
            one = await solo_delivery(a, owner, reader, ids["solo"], quiet, args.writes)
            out["delivery_one"] = {
                **one,
                "redis_p50_ms": rtt.p50_ms,
                "redis_p99_ms": rtt.p99_ms,
                "redis_paced_p50_ms": paced.p50_ms,
                "redis_paced_p99_ms": paced.p99_ms,
            }
            print(
                f"write-to-head delivery to ONE sync on node A beside {one['other_syncs']} syncs of other channels"
                f" on node A (writer on node A), {one['samples']} heads: p50 {one['p50_ms']:.2f} / p99"
                f" {one['p99_ms']:.2f} ms; same bare Redis PUBLISH->SUBSCRIBE -> p50"
                f" {common.ratio(one['p50_ms'], rtt.p50_ms)}, p99 {common.ratio(one['p99_ms'], rtt.p99_ms)}"
                f" (target <= 10); the write's own OK: p50 {one['ok_p50_ms']:.2f} / p99 {one['ok_p99_ms']:.2f} ms"
            )
            print(f"  {_paced_line(one, paced)}")
        if "memory" in parts:
            m = await memory(a, reader, ids["idle"], args.syncs)
            out["memory"] = m
            print(
                f"memory per idle sync: {m['per_sync_kib']:.1f} KiB ({m['syncs']} syncs on {m['connections']}"
                " connections, connections' own cost excluded; target <= 64 KiB)"
            )
        if "throughput" in parts:
            t = await throughput(a, owner, reader, ids, args.syncs, args.rounds, args.seconds)
            out["throughput"] = t
            drop = 1 - t["with_syncs_rev_s"] / t["without_syncs_rev_s"]
            print(
                f"write throughput: {t['without_syncs_rev_s']:.0f} rev/s without syncs, {t['with_syncs_rev_s']:.0f}"
                f" with {args.syncs} idle syncs -> {100 * drop:+.1f}% drop (target <= 10%)"
            )
    return out


def _paced_line(d: dict[str, Any], paced: common.RedisRoundTrip) -> str:
    """The delivery beside the Redis round trip paced as its writes are (one every PACE seconds)."""
    return (
        f"beside the same PUBLISH->SUBSCRIBE round trip paced as the writes are (one every {1000 * PACE:.0f} ms, from"
        f" an idle machine, as each write starts): p50 {paced.p50_ms:.3f} / p99 {paced.p99_ms:.3f} ms -> p50"
        f" {common.ratio(d['p50_ms'], paced.p50_ms)}, p99 {common.ratio(d['p99_ms'], paced.p99_ms)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=int, default=4096)
    parser.add_argument("--syncs", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--json")
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="frames",
        help="how the delivery figures' client reads its frames: frames (common.FrameReader, the default) or "
        "websockets (ws.recv(), about 13 us of CPU per frame: with 1,000 syncs the client's own queue shows)",
    )
    parser.add_argument("--profile", metavar="DIR", help="py-spy the relays, the fan-out apps and this client (slower)")
    args = parser.parse_args()
    common.exit_on_sigterm()
    try:
        out = common.run_async(run(args))
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    common.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
