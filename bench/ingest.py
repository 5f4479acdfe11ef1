"""Benchmark: kind-9 messages accepted per second (ingest), with the database work each one costs.

N authenticated clients (default 8), each with its own pubkey, one EVENT in
flight each (closed loop): send a signed kind-9 EVENT, wait for its
["OK", id, true, ""]. Counted for --seconds after --warmup.

  --channels shared   one open channel; client 0 creates it (NIP-29 9007) and puts
                      every other client in it (9000): all messages hit one channel
  --channels own      every client creates its own open channel and posts only there

The relay runs with BUZZ_WRITES_PER_SECOND=0 (the per-pubkey write quota is off;
with it on, a pubkey gets 20 writes/s after a burst of 100 and this would
measure the quota). Events are signed before the run, so the clients spend
their CPU on the WebSocket only.

Reported: messages/s, p50/p99 EVENT->OK latency, relay CPU per message, CPU of
the PostgreSQL backends serving the relay per message, and database round trips
per message: pg_stat_database.xact_commit of the relay's database over the whole
load (the relay's pool runs in autocommit, so one statement is one transaction),
divided by the messages accepted, plus rows written per table. Afterwards the
stored kind-9 events are counted and compared with the OKs true (no loss).
Baseline in the same run: pgbench simple-update (-N) with the same client count.

    python bench/ingest.py [--channels shared|own] [--clients 8] [--seconds 10] [--json out.json]
                           [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import BenchError, LoopResult, Op, Server

TARGET_RATIO = 0.30
# About 100 bytes, a short chat line.
FILLER = "the quick brown fox jumps over the lazy dog; bench text to make a realistic chat line"


# --- talking to the relay ------------------------------------------------------------------


def event_frame(event: Any) -> str:
    return json.dumps(["EVENT", event.to_dict()], separators=(",", ":"))


async def send_and_confirm(ws: Any, signer: Any, kind: int, tags: list[list[str]], content: str = "") -> None:
    """Send one signed event and require OK true for it."""
    event = signer.sign_event(kind=kind, tags=tags, content=content)
    await ws.send(event_frame(event))
    while True:
        async with asyncio.timeout(30):
            msg = json.loads(await ws.recv())
        if isinstance(msg, list) and msg[:2] == ["OK", event.id]:
            break
    if msg[2] is not True:
        raise BenchError(f"kind {kind} with tags {tags} refused: {msg[3]!r}")


async def setup_channels(relay: Server, signers: list[Any], mode: str) -> list[str]:
    """Create the channel(s) over the wire; returns the channel each client posts in."""
    if mode == "shared":
        channel = str(uuid.uuid4())
        owner, others = signers[0], signers[1:]
        async with common.ws_connect(relay) as ws:
            await common.authenticate(ws, owner, relay.public_url)
            await send_and_confirm(ws, owner, 9007, [["h", channel], ["name", "bench shared"]])
            for s in others:
                await send_and_confirm(ws, owner, 9000, [["h", channel], ["p", s.pubkey]])
        return [channel] * len(signers)

    async def own(signer: Any, i: int) -> str:
        channel = str(uuid.uuid4())
        async with common.ws_connect(relay) as ws:
            await common.authenticate(ws, signer, relay.public_url)
            await send_and_confirm(ws, signer, 9007, [["h", channel], ["name", f"bench own {i}"]])
        return channel

    return list(await asyncio.gather(*(own(s, i) for i, s in enumerate(signers))))


def presign(signers: list[Any], channels: list[str], per_client: int) -> list[list[tuple[str, str]]]:
    out = []
    for i, (signer, channel) in enumerate(zip(signers, channels, strict=True)):
        frames = []
        for n in range(per_client):
            ev = signer.sign_event(kind=9, tags=[["h", channel]], content=f"ingest {i}-{n}: {FILLER}")
            frames.append((ev.id, event_frame(ev)))
        out.append(frames)
    return out


@dataclass
class Tally:
    """Every EVENT of the whole run (warm-up and the last in-flight ones included), for the loss check."""

    sent: int = 0
    ok_true: int = 0
    duplicates: int = 0
    refused: int = 0
    signed_inline: int = 0
    first_refusal: str = ""


@dataclass
class ClientFeed:
    signer: Any
    channel: str
    frames: list[tuple[str, str]]
    next: int = 0
    serial: int = 0

    def take(self, tally: Tally, index: int) -> tuple[str, str]:
        if self.next < len(self.frames):
            item = self.frames[self.next]
            self.next += 1
            return item
        # Out of pre-signed events: sign here (costs client CPU; counted and reported).
        tally.signed_inline += 1
        self.serial += 1
        ev = self.signer.sign_event(
            kind=9, tags=[["h", self.channel]], content=f"ingest {index}-x{self.serial}: {FILLER}"
        )
        return ev.id, event_frame(ev)


def ingest_client(relay: Server, feed: ClientFeed, tally: Tally, index: int) -> Any:
    @contextlib.asynccontextmanager
    async def setup() -> AsyncIterator[Op]:
        async with common.ws_connect(relay) as ws:
            await common.authenticate(ws, feed.signer, relay.public_url)

            async def op() -> int:
                event_id, frame = feed.take(tally, index)
                tally.sent += 1
                await ws.send(frame)
                msg = json.loads(await ws.recv())
                if not (isinstance(msg, list) and msg[:2] == ["OK", event_id]):
                    raise BenchError(f"expected OK for {event_id[:12]}, got {str(msg)[:200]}")
                if msg[2] is not True:
                    tally.refused += 1
                    tally.first_refusal = tally.first_refusal or str(msg[3])
                    raise BenchError(f"EVENT refused: {msg[3]!r}")
                tally.ok_true += 1
                if str(msg[3]).startswith("duplicate:"):
                    tally.duplicates += 1
                return 1

            yield op

    return setup


# --- CPU of the PostgreSQL backends and Redis during the measured window ----------------------


@dataclass
class WindowCpu:
    pg_backends_s: float = 0.0
    pg_backends: int = 0
    redis_s: float = 0.0
    redis_publish: float = 0.0
    redis_evalsha: float = 0.0
    # What the relay's backends were doing, sampled every WAIT_SAMPLE_S: state or wait event -> samples.
    waits: dict[str, int] = field(default_factory=dict)
    # The relay process in the window: common.proc_times deltas.
    relay: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


WAIT_SAMPLE_S = 0.02


class WaitSampler(threading.Thread):
    """Samples pg_stat_activity of the relay's database (from the postgres database) until stopped."""

    def __init__(self, database_url: str, out: dict[str, int]) -> None:
        super().__init__(daemon=True, name="wait-sampler")
        self.url, self.out, self.halt = database_url, out, threading.Event()
        self.per_pid: dict[int, dict[str, int]] = {}

    def run(self) -> None:
        import psycopg

        name = common.dbname_of(self.url)
        with psycopg.connect(common.with_dbname(self.url, "postgres"), autocommit=True, connect_timeout=10) as conn:
            while not self.halt.wait(WAIT_SAMPLE_S):
                rows = conn.execute(
                    "SELECT pid, state, wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE datname = %s AND backend_type = 'client backend'",
                    (name,),
                ).fetchall()
                for pid, state, wtype, wevent in rows:
                    if state == "active":
                        key = f"active, waiting {wtype}:{wevent}" if wtype else "active, not waiting (CPU or run queue)"
                    else:
                        key = f"{state} (waiting for the relay to send)" if state == "idle" else str(state)
                    counts = self.per_pid.setdefault(pid, {})
                    counts[key] = counts.get(key, 0) + 1
        # Only the backends that worked in the window: the pool's, not idle ORM connections of the setup.
        for counts in self.per_pid.values():
            if any(k.startswith("active") for k in counts):
                for key, n in counts.items():
                    self.out[key] = self.out.get(key, 0) + n


async def window_cpu(env: dict[str, str], relay_pid: int, warmup: float, seconds: float, out: WindowCpu) -> None:
    """Samples at the start and end of closed_loop's window (same clock, started at the same moment)."""
    now = time.perf_counter
    start = now() + warmup
    stop = start + seconds

    def sample() -> tuple[dict[int, float], dict[str, float]]:
        pids = common.backend_pids(env["DATABASE_URL"])
        return {p: common.cpu_seconds(p) for p in pids}, common.redis_counters(env["REDIS_URL"])

    await asyncio.sleep(max(0.0, start - now()))
    relay0 = common.proc_times(relay_pid)
    pg0, r0 = await asyncio.to_thread(sample)
    sampler = WaitSampler(env["DATABASE_URL"], out.waits)
    sampler.start()
    try:
        await asyncio.sleep(max(0.0, stop - now()))
    finally:
        sampler.halt.set()
    relay1 = common.proc_times(relay_pid)
    pg1, r1 = await asyncio.to_thread(sample)
    await asyncio.to_thread(sampler.join, 5)
    out.relay = {k: relay1[k] - relay0[k] for k in relay1}
    common_pids = set(pg0) & set(pg1)
    out.pg_backends = len(common_pids)
    out.pg_backends_s = sum(pg1[p] - pg0[p] for p in common_pids)
    if set(pg1) - set(pg0):
        out.notes.append(f"{len(set(pg1) - set(pg0))} backends connected during the window were not counted")
    if pg0 and not any(pg0.values()):
        out.notes.append("PostgreSQL backend CPU unreadable (/proc of another user?)")
    out.redis_s = r1.get("cpu_s", 0.0) - r0.get("cpu_s", 0.0)
    out.redis_publish = r1.get("publish", 0.0) - r0.get("publish", 0.0)
    out.redis_evalsha = r1.get("evalsha", 0.0) - r0.get("evalsha", 0.0)


async def measure(
    env: dict[str, str], relay: Server, feeds: list[ClientFeed], tally: Tally, seconds: float, warmup: float
) -> tuple[LoopResult, WindowCpu]:
    cpu = WindowCpu()
    sampler = asyncio.get_running_loop().create_task(window_cpu(env, relay.pid, warmup, seconds, cpu))
    try:
        res = await common.closed_loop(
            len(feeds),
            seconds,
            lambda i: ingest_client(relay, feeds[i], tally, i)(),
            warmup=warmup,
            server=relay,
        )
        await asyncio.wait_for(sampler, 30)
    finally:
        sampler.cancel()
    return res, cpu


# --- database facts after the run -------------------------------------------------------------


def stored_counts(database_url: str, pubkeys: list[str]) -> dict[str, int]:
    import psycopg

    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        kind9 = conn.execute(
            "SELECT count(*) FROM buzz_storedevent WHERE kind = 9 AND pubkey = ANY(%s)", (pubkeys,)
        ).fetchone()
        stats = conn.execute("SELECT coalesce(sum(message_count), 0) FROM buzz_messagecounter").fetchone()
    return {"kind9": int(kind9[0]) if kind9 else -1, "message_counter_sum": int(stats[0]) if stats else -1}


def table_deltas(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out = {}
    for table, counters in after.items():
        base = before.get(table, {})
        delta = {k: v - base.get(k, 0) for k, v in counters.items()}
        if any(delta.values()):
            out[table] = delta
    return out


def describe_tables(deltas: dict[str, dict[str, int]], messages: int) -> list[str]:
    lines = []
    for table, d in sorted(deltas.items(), key=lambda kv: -sum(kv[1].values())):
        per = {k: v / messages for k, v in d.items() if v}
        text = ", ".join(f"{k} {v:.2f}" for k, v in per.items())
        lines.append(f"    {table:<24} per message: {text}")
    return lines


# --- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--channels", choices=("shared", "own"), default="shared")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--presign", type=int, default=2500, help="events signed per client before the run")
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--json", help="also write the figures to this file")
    common.add_app_option(parser)
    parser.add_argument("--profile", metavar="DIR", help="py-spy the relay during the measured window")
    parser.add_argument("--profile-format", choices=("raw", "flamegraph", "speedscope"), default="raw")
    parser.add_argument(
        "--renice",
        type=int,
        metavar="N",
        help="set the relay's nice value (e.g. -10, needs root): on a busy machine py-spy also counts the time "
        "the relay waits for a CPU after waking a peer, which a higher priority mostly removes",
    )
    args = parser.parse_args(argv)
    if args.clients < 1 or not 0 < args.seconds <= 600 or not 0 <= args.warmup <= 60 or args.presign < 0:
        parser.error("--clients >= 1, --seconds in (0, 600], --warmup in [0, 60], --presign >= 0")

    common.exit_on_sigterm()
    from buzz.nostr import Signer

    common.header(
        f"ingest: kind-9 EVENT -> OK true, {args.channels} channel(s), one EVENT in flight per client",
        [
            f"{args.clients} clients (one pubkey each), {args.seconds:g} s measured after {args.warmup:g} s warm-up; "
            + (
                "one open channel for all (9007 by client 0, 9000 for the others)"
                if args.channels == "shared"
                else "each client in its own open channel (9007 each)"
            ),
            "relay runs with BUZZ_WRITES_PER_SECOND=0: the per-pubkey write quota is OFF for this run",
            "baseline: pgbench simple-update (-N) tps, same client count, "
            "run before the relay started and after it stopped",
            *(
                [f"relay app: {args.app} from {args.app_dir or 'the repository'} (a variant)"]
                if args.app != common.RELAY_APP
                else []
            ),
        ],
    )
    signers = [Signer.generate() for _ in range(args.clients)]
    pubkeys = [s.pubkey for s in signers]
    tally = Tally()
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        env["BUZZ_WRITES_PER_SECOND"] = "0"
        relay_db = env["DATABASE_URL"]
        others = common.other_sessions_on(relay_db, common.dbname_of(relay_db), common.PGBENCH_DB)
        if others:
            raise BenchError(
                "another session is using the scratch databases; not dropping them:\n  " + "\n  ".join(others)
            )
        # pgbench before and after the relay: the machine is shared, so the baseline brackets the run.
        pg_before = common.pgbench_tps(relay_db, clients=args.clients, seconds=args.pgbench_seconds)
        print(f"pgbench -N (before): {common.describe_pgbench(pg_before)}", flush=True)
        relay = common.start_relay(stack, env, pubkeys, app=args.app, app_dir=args.app_dir)
        print(f"relay pid {relay.pid} on 127.0.0.1:{relay.port} (Host {relay.host_header})", flush=True)
        if args.renice is not None:
            os.setpriority(os.PRIO_PROCESS, relay.pid, args.renice)
            # With sched_autogroup the relay (its own session) is its own group, and a thread's nice
            # only counts inside the group: set the group's nice too.
            with contextlib.suppress(OSError):
                Path(f"/proc/{relay.pid}/autogroup").write_text(str(args.renice))
            group = Path(f"/proc/{relay.pid}/autogroup")
            group_text = group.read_text().strip() if group.exists() else "no autogroup"
            print(f"relay reniced to {args.renice} ({group_text}); figures not comparable with an unreniced run")
        channels = common.run_async(setup_channels(relay, signers, args.channels))
        t0 = time.perf_counter()
        frames = presign(signers, channels, args.presign)
        print(
            f"{len(set(channels))} channel(s) created over the wire; {args.presign * args.clients} events "
            f"pre-signed in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        feeds = [ClientFeed(s, c, f) for s, c, f in zip(signers, channels, frames, strict=True)]

        db0 = common.database_counters(relay_db)
        tables0 = common.table_counters(relay_db)
        profile = common.profile_path(args.profile, f"ingest-{args.channels}", args.profile_format)
        # closed_loop's window opens after the warm-up; start py-spy with it.
        with contextlib.ExitStack() as prof:

            async def run() -> tuple[LoopResult, WindowCpu]:
                if profile is not None:

                    async def later() -> None:
                        await asyncio.sleep(args.warmup)
                        prof.enter_context(common.py_spy(relay.pid, profile, args.seconds, args.profile_format))

                    asyncio.get_running_loop().create_task(later())
                return await measure(env, relay, feeds, tally, args.seconds, args.warmup)

            res, wcpu = common.run_async(run())
        common.report_profile(profile)
        relay_cpu_total = relay.cpu()
        common.stop_process(relay.proc)  # the relay's backends exit and publish their last counts
        time.sleep(0.5)
        db1 = common.database_counters(relay_db)
        tables1 = common.table_counters(relay_db)
        stored = stored_counts(relay_db, pubkeys)
        pg_after = common.pgbench_tps(relay_db, clients=args.clients, seconds=args.pgbench_seconds)
    pg_tps = (pg_before.tps + pg_after.tps) / 2

    s = res.summary()
    xacts = db1.get("xact_commit", 0) - db0.get("xact_commit", 0)
    rollbacks = db1.get("xact_rollback", 0) - db0.get("xact_rollback", 0)
    deltas = table_deltas(tables0, tables1)
    msgs_total = max(1, tally.ok_true)
    pg_ms = 1000 * wcpu.pg_backends_s / res.ops if res.ops else float("nan")
    redis_ms = 1000 * wcpu.redis_s / res.ops if res.ops else float("nan")
    lost = tally.ok_true - stored["kind9"]
    print("-" * 78)
    print(f"relay ingest ({args.channels}): {res.describe('messages')}")
    print(f"pgbench -N (before): {common.describe_pgbench(pg_before)}")
    print(f"pgbench -N (after) : {common.describe_pgbench(pg_after)}")
    verdict = "meets" if pg_tps and res.rate / pg_tps >= TARGET_RATIO else "BELOW"
    print(
        f"ratio messages/s / pgbench tps (mean of before and after, {pg_tps:.1f}) = {common.ratio(res.rate, pg_tps)}"
        f"  ({verdict} the {TARGET_RATIO:.2f} target; against before {common.ratio(res.rate, pg_before.tps)}, "
        f"after {common.ratio(res.rate, pg_after.tps)})"
    )
    print(
        f"CPU per message in the window: relay {s['server_cpu_per_op_ms']:.3f} ms, "
        f"PostgreSQL backends {pg_ms:.3f} ms ({wcpu.pg_backends} backends), "
        f"Redis server {redis_ms:.3f} ms (whole server, shared with other users)"
    )
    ours = res.server_cpu_s + res.client_cpu_s + wcpu.pg_backends_s
    other = res.machine_cpu_s - ours - max(0.0, wcpu.redis_s)
    print(
        f"machine in the window: busy {100 * res.machine_cpu_s / res.seconds:.0f}% of {100 * common.nproc()}%; "
        f"relay + clients + its PostgreSQL backends {100 * ours / res.seconds:.0f}%, "
        f"everything else (other sessions, Redis, PostgreSQL background) {100 * other / res.seconds:.0f}%"
    )
    rp = wcpu.relay
    if rp:
        ops = max(1, res.ops)
        print(
            f"relay process in the window: user {1000 * rp['user_s'] / ops:.3f} + "
            f"system {1000 * rp['system_s'] / ops:.3f} ms per message; "
            f"main thread on a CPU {100 * rp['run_s'] / res.seconds:.0f}% and runnable but waiting "
            f"for a CPU {100 * rp['runqueue_s'] / res.seconds:.0f}% of the window; "
            f"{rp['involuntary'] / ops:.2f} preemptions and {rp['voluntary'] / ops:.2f} sleeps per message"
        )
    total_waits = sum(wcpu.waits.values())
    if total_waits:
        print(f"relay's PostgreSQL backends, sampled every {1000 * WAIT_SAMPLE_S:.0f} ms ({total_waits} samples):")
        for key, n in sorted(wcpu.waits.items(), key=lambda kv: -kv[1])[:8]:
            print(f"    {100 * n / total_waits:5.1f}%  {key}")
    for note in wcpu.notes:
        print(f"  note: {note}")
    print(
        f"database round trips: {xacts} transactions committed ({rollbacks} rolled back) for {tally.ok_true} "
        f"messages accepted over the whole load = {xacts / msgs_total:.3f} per message"
    )
    print(
        "  (autocommit pool: one statement = one transaction; the count also holds the clients' AUTH "
        "lookups and setup stragglers, a few dozen)"
    )
    print(*describe_tables(deltas, msgs_total), sep="\n")
    print(
        f"Redis in the window (server-wide): {wcpu.redis_publish / max(1, res.ops):.3f} PUBLISH and "
        f"{wcpu.redis_evalsha / max(1, res.ops):.3f} EVALSHA per message"
    )
    ok_loss = lost == 0 and tally.refused == 0 and tally.duplicates == 0
    print(
        f"loss check: {tally.sent} EVENTs sent, {tally.ok_true} OK true ({tally.duplicates} duplicate), "
        f"{tally.refused} refused, {tally.sent - tally.ok_true - tally.refused} unanswered; stored kind-9 "
        f"{stored['kind9']}, channel message_count sum {stored['message_counter_sum']} -> "
        + ("OK, stored == OK true" if ok_loss else f"MISMATCH ({lost:+d})")
    )
    if tally.signed_inline:
        print(f"note: {tally.signed_inline} events were signed during the run (pre-signed ones ran out)")
    print(f"relay process CPU over its whole life: {relay_cpu_total:.1f} s")
    errors = res.errors + (0 if ok_loss else 1)
    if res.errors:
        print(f"WARNING: {res.errors} client errors; first: {res.first_error}")
    common.write_json(
        args.json,
        {
            "benchmark": "ingest",
            "channels": args.channels,
            "nproc": common.nproc(),
            "clients": args.clients,
            "quota": "off (BUZZ_WRITES_PER_SECOND=0)",
            "relay": s,
            "pgbench": {"tps": pg_tps, "before": pg_before.__dict__, "after": pg_after.__dict__},
            "ratio": res.rate / pg_tps if pg_tps else None,
            "machine_busy_pct": 100 * res.machine_cpu_s / res.seconds,
            "other_cpu_pct": 100 * other / res.seconds,
            "pg_waits": wcpu.waits,
            "relay_proc": wcpu.relay,
            "pg_backend_cpu_per_msg_ms": pg_ms,
            "redis_cpu_per_msg_ms": redis_ms,
            "xact_per_msg": xacts / msgs_total,
            "xact_commit": xacts,
            "xact_rollback": rollbacks,
            "tables": deltas,
            "redis_publish_per_msg": wcpu.redis_publish / max(1, res.ops),
            "tally": tally.__dict__,
            "stored": stored,
            "no_loss": ok_loss,
            "profiled": profile is not None,
            "renice": args.renice,
        },
    )
    return 1 if errors else 0


if __name__ == "__main__":
    common.run_main(main)
