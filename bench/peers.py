"""Benchmark: this relay beside a peer relay (nostr-relay from PyPI) and pgbench, in one run.

The peer is `nostr-relay` (pinned, PEER_VERSION: a Python relay on SQLite, served by gunicorn with
one uvicorn worker), installed with pip into a throwaway venv (--peer-venv, default under /tmp; never
a project dependency) and started on a free port with its own SQLite file under var/bench/.

The same closed-loop load drives each, 8 connections (--clients), one EVENT in flight each, for
--seconds after --warmup:
  peer     kind 1, no AUTH (the peer has none by default), OK true counted
  kind 9   this relay, NIP-42 AUTH, kind-9 messages in one shared open channel
  revisions this relay, NIP-AR revisions in one channel: 1 create : 3 updates (25% creates), each
           update naming the previous revision as prev
and pgbench's simple-update (`pgbench -N -c 8`) on the same PostgreSQL is the baseline. One round
runs pgbench, the peer, kind 9 and the revisions in turn; --rounds rounds (default 3), interleaved,
and the figures are medians over the rounds. This relay serves --workers uvicorn worker processes
(default 1; `make run` serves one per core), the write quota off.

The relay's database is new (bench_peers, dropped and created again), with autovacuum off on its
tables, so the rounds run on tables that are never analyzed, as the relay keeps them. --analyze adds
the same rounds again after VACUUM ANALYZE. --idle-syncs N holds N NIP-AR sync subscriptions
(`["REQ", sub, {"artifact": "current", "#h": [channel]}]`, bench/sync.py) open during every round on
a channel nobody writes in (the sync bench's idle syncs), to show there is no cliff with them.

Printed: per round and as medians, events/s of each, pgbench tps, the ratios (kind 9 / pgbench,
kind 9 / peer, revisions / pgbench, peer / pgbench) and the p99 EVENT -> OK latency of each relay.

    python bench/peers.py [--rounds 3] [--seconds 10] [--clients 8] [--workers 1] [--analyze]
                          [--idle-syncs 1000] [--peer-venv DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import artifact_writes
import common
import ingest
import sync
from common import BenchError, LoopResult, Op, Server

PEER_PACKAGE = "nostr-relay"
PEER_VERSION = "1.14"
DEFAULT_PEER_VENV = Path(tempfile.gettempdir()) / f"buzz-bench-nostr-relay-{PEER_VERSION}"
RELAY_DB = "bench_peers"
UPDATES_PER_CREATE = 3  # 25% creates
TARGETS = {"kind9_vs_pgbench": 0.30, "kind9_vs_peer": 2.0, "revisions_vs_pgbench": 0.25}
FILLER = "the quick brown fox jumps over the lazy dog; bench text to make a realistic chat line"


# --- the peer ------------------------------------------------------------------------------------


def peer_venv(path: Path) -> Path:
    """The peer's venv, created and installed by pip when it is not there yet; returns its entry point."""
    entry = path / "bin" / "nostr-relay"
    marker = path / f".installed-{PEER_PACKAGE}-{PEER_VERSION}"
    if entry.exists() and marker.exists():
        return entry
    print(f"installing {PEER_PACKAGE}=={PEER_VERSION} into {path} (once; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    result = subprocess.run([*pip, f"{PEER_PACKAGE}=={PEER_VERSION}"], capture_output=True, text=True)
    if result.returncode != 0 or not entry.exists():
        raise BenchError(f"pip install {PEER_PACKAGE}=={PEER_VERSION} failed:\n{result.stdout}\n{result.stderr}")
    marker.touch()
    return entry


def peer_config(directory: Path, port: int) -> Path:
    """The peer's config: its defaults, a SQLite file of this run, one worker, quiet logs."""
    db = directory / "peer.sqlite3"
    db.unlink(missing_ok=True)
    config = {
        "DEBUG": False,
        "storage": {
            "sqlalchemy.url": f"sqlite+aiosqlite:///{db}",
            "num_concurrent_reqs": 10,
            "num_concurrent_adds": 2,
            "validators": [
                "nostr_relay.validators.is_not_too_large",
                "nostr_relay.validators.is_signed",
                "nostr_relay.validators.is_recent",
                "nostr_relay.validators.is_not_hellthread",
            ],
        },
        "verification": {"nip05_verification": "disabled"},
        "gunicorn": {"bind": f"127.0.0.1:{port}", "workers": 1, "loglevel": "warning", "reload": False},
        "authentication": {"enabled": False},
        "message_timeout": 1800,
        "subscription_limit": 32,
        "max_limit": 6000,
        "hellthread_limit": 100,
        "logging": {
            "version": 1,
            "handlers": {"console": {"class": "logging.StreamHandler", "level": "WARNING"}},
            "root": {"level": "WARNING", "handlers": ["console"]},
        },
    }
    path = directory / "peer-config.json"  # YAML is a superset of JSON: the peer reads it as YAML
    path.write_text(json.dumps(config, indent=1))
    return path


def start_peer(stack: contextlib.ExitStack, entry: Path) -> Server:
    common.VAR_DIR.mkdir(parents=True, exist_ok=True)
    port = common.free_port()
    config = peer_config(common.VAR_DIR, port)
    log = common.VAR_DIR / "peer.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "BUZZ"))}
    proc = common.spawn(stack, [str(entry), "-c", str(config), "serve"], env, log)
    common.wait_for_port(port, proc, 60.0, log)
    return Server(port=port, proc=proc, host_header=f"127.0.0.1:{port}", log=log)


# --- the loads ---------------------------------------------------------------------------------


@dataclass
class Tally:
    sent: int = 0
    ok_true: int = 0
    refused: int = 0
    first_refusal: str = ""


async def _send(ws: Any, event_id: str, frame: str, tally: Tally) -> None:
    tally.sent += 1
    await ws.send(frame)
    while True:
        msg = json.loads(await ws.recv())
        if isinstance(msg, list) and msg[:2] == ["OK", event_id]:
            break
        if not (isinstance(msg, list) and msg and msg[0] in ("NOTICE", "EVENT", "EOSE")):
            raise BenchError(f"expected OK for {event_id[:12]}, got {str(msg)[:200]}")
    if msg[2] is not True:
        tally.refused += 1
        tally.first_refusal = tally.first_refusal or str(msg[3])
        raise BenchError(f"EVENT refused: {msg[3]!r}")
    tally.ok_true += 1


class Signed:
    """Events signed ahead for one client; signed on the spot when they run out."""

    def __init__(self, make: Any, ahead: int) -> None:
        self.make = make
        self.queue = [make() for _ in range(ahead)]

    def take(self) -> tuple[str, str]:
        if self.queue:
            return self.queue.pop()
        return self.make()  # type: ignore[no-any-return]


_serial = itertools.count()


def _content() -> str:
    """Distinct content for every event: two events signed in the same second must not share an id."""
    return f"{FILLER} #{next(_serial)}"


def _frame(event: Any) -> tuple[str, str]:
    return event.id, json.dumps(["EVENT", event.to_dict()], separators=(",", ":"))


def peer_client(server: Server, feed: Signed, tally: Tally) -> Any:
    @contextlib.asynccontextmanager
    async def setup() -> AsyncIterator[Op]:
        async with common.ws_connect(server) as ws:

            async def op() -> int:
                event_id, frame = feed.take()
                await _send(ws, event_id, frame, tally)
                return 1

            yield op

    return setup


def relay_client(server: Server, signer: Any, feed: Signed, tally: Tally) -> Any:
    @contextlib.asynccontextmanager
    async def setup() -> AsyncIterator[Op]:
        async with common.ws_connect(server) as ws:
            await common.authenticate(ws, signer, server.public_url)

            async def op() -> int:
                event_id, frame = feed.take()
                await _send(ws, event_id, frame, tally)
                return 1

            yield op

    return setup


def revisions_client(server: Server, feed: artifact_writes.Feed, tally: artifact_writes.Tally) -> Any:
    timing = artifact_writes.Timing()
    return artifact_writes.writer(server, feed, tally, timing)


async def loop(clients: int, seconds: float, warmup: float, make: Any, server: Server) -> LoopResult:
    # `make(k)` gives client k's set-up, an async context manager factory yielding its operation.
    return await common.closed_loop(clients, seconds, lambda k: make(k)(), warmup=warmup, server=server)


# --- this relay ----------------------------------------------------------------------------------


def with_workers(stack: contextlib.ExitStack, env: dict[str, str], relay: Server, workers: int) -> Server:
    """The relay again on its port, as `workers` uvicorn worker processes (make run WORKERS=N)."""
    if workers <= 1:
        return relay
    common.stop_process(relay.proc)
    log = common.VAR_DIR / "relay.log"
    proc = common.spawn(
        stack, [*common.uvicorn_args(common.RELAY_APP, relay.port), "--workers", str(workers)], env, log
    )
    common.wait_for_port(relay.port, proc, 90.0, log)
    # The port answers once the parent has bound it; give the workers time to load Django.
    time.sleep(3.0)
    return Server(port=relay.port, proc=proc, host_header=relay.host_header, log=log, public_url=relay.public_url)


def autovacuum_off(database_url: str) -> int:
    """Keep the relay's tables as they are: no autovacuum (and so no automatic ANALYZE) on any of them."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
        for table in tables:
            conn.execute(f'ALTER TABLE "{table}" SET (autovacuum_enabled = false)')  # type: ignore[arg-type]
    return len(tables)


def analyze(database_url: str) -> float:
    import psycopg

    t0 = time.perf_counter()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - t0


# --- rounds --------------------------------------------------------------------------------------


@dataclass
class Round:
    pgbench_tps: float = 0.0
    peer: dict[str, Any] = field(default_factory=dict)
    kind9: dict[str, Any] = field(default_factory=dict)
    revisions: dict[str, Any] = field(default_factory=dict)


def _figures(res: LoopResult) -> dict[str, Any]:
    lat = sorted(res.latencies_ms)
    return {
        "rate": res.rate,
        "ops": res.ops,
        "errors": res.errors,
        "first_error": res.first_error,
        "p50_ms": common.percentile(lat, 50) if lat else float("nan"),
        "p99_ms": common.percentile(lat, 99) if lat else float("nan"),
    }


def median(rounds: list[Round], pick: Any) -> float:
    values = [pick(r) for r in rounds]
    return statistics.median(values) if values else float("nan")


def summary(rounds: list[Round]) -> dict[str, float]:
    pg = median(rounds, lambda r: r.pgbench_tps)
    peer = median(rounds, lambda r: r.peer["rate"])
    kind9 = median(rounds, lambda r: r.kind9["rate"])
    revs = median(rounds, lambda r: r.revisions["rate"])
    return {
        "pgbench_tps": pg,
        "peer_per_s": peer,
        "kind9_per_s": kind9,
        "revisions_per_s": revs,
        "peer_p99_ms": median(rounds, lambda r: r.peer["p99_ms"]),
        "kind9_p99_ms": median(rounds, lambda r: r.kind9["p99_ms"]),
        "revisions_p99_ms": median(rounds, lambda r: r.revisions["p99_ms"]),
        # Ratios of the medians, and the median of each round's own ratio (same-round baselines).
        "kind9_vs_pgbench": median(rounds, lambda r: r.kind9["rate"] / r.pgbench_tps),
        "kind9_vs_peer": median(rounds, lambda r: r.kind9["rate"] / r.peer["rate"] if r.peer["rate"] else 0.0),
        "revisions_vs_pgbench": median(rounds, lambda r: r.revisions["rate"] / r.pgbench_tps),
        "peer_vs_pgbench": median(rounds, lambda r: r.peer["rate"] / r.pgbench_tps),
    }


def print_summary(label: str, rounds: list[Round]) -> dict[str, float]:
    s = summary(rounds)
    print("-" * 90)
    print(f"{label}: medians of {len(rounds)} interleaved rounds (ratios: median of each round's own ratio)")
    print(f"  pgbench -N -c 8        {s['pgbench_tps']:9.1f} tps")
    print(
        f"  peer {PEER_PACKAGE} {PEER_VERSION}, kind 1  {s['peer_per_s']:9.1f} /s   "
        f"= {s['peer_vs_pgbench']:.3f} x pgbench   p99 OK {s['peer_p99_ms']:.1f} ms"
    )
    print(
        f"  this relay, kind 9     {s['kind9_per_s']:9.1f} /s   = {s['kind9_vs_pgbench']:.3f} x pgbench"
        f" (target {TARGETS['kind9_vs_pgbench']:.2f})   = {s['kind9_vs_peer']:.2f} x the peer"
        f" (target {TARGETS['kind9_vs_peer']:.1f})   p99 OK {s['kind9_p99_ms']:.1f} ms"
    )
    print(
        f"  this relay, revisions  {s['revisions_per_s']:9.1f} /s   = {s['revisions_vs_pgbench']:.3f} x pgbench"
        f" (target {TARGETS['revisions_vs_pgbench']:.2f}; 25% creates)   p99 OK {s['revisions_p99_ms']:.1f} ms"
    )
    return s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per load")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes of this relay")
    parser.add_argument("--analyze", action="store_true", help="then the same rounds after VACUUM ANALYZE")
    parser.add_argument("--idle-syncs", type=int, default=0, help="NIP-AR sync subscriptions held open")
    parser.add_argument("--ahead", type=int, default=1500, help="events signed ahead per client and load")
    parser.add_argument("--peer-venv", type=Path, default=DEFAULT_PEER_VENV)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.clients < 1 or not 0 < args.seconds <= 600 or args.workers < 1:
        parser.error("--rounds, --clients, --workers >= 1 and --seconds in (0, 600]")

    common.exit_on_sigterm()
    from buzz.nostr import Signer

    entry = peer_venv(args.peer_venv)
    common.header(
        f"peers: this relay beside {PEER_PACKAGE} {PEER_VERSION} and pgbench, {args.clients} connections, closed loop",
        [
            f"{args.rounds} rounds, each: pgbench -N, the peer (kind 1), kind 9 (AUTH), revisions (25% creates);"
            f" {args.seconds:g} s measured after {args.warmup:g} s warm-up",
            f"this relay: {args.workers} uvicorn worker process(es), write quota off; tables never analyzed"
            " (autovacuum off)" + (", then the rounds again after VACUUM ANALYZE" if args.analyze else ""),
            f"{args.idle_syncs} idle NIP-AR sync subscriptions held open (on a channel of their own)",
        ],
    )
    signers = [Signer.generate() for _ in range(args.clients)]
    reader = Signer.generate()
    results: dict[str, Any] = {"rounds": {}, "summary": {}}
    failed = 0
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        env["BUZZ_WRITES_PER_SECOND"] = "0"
        env["DATABASE_URL"] = common.with_dbname(env["DATABASE_URL"], RELAY_DB)
        relay_db = env["DATABASE_URL"]
        relay = common.start_relay(stack, env, [s.pubkey for s in signers] + [reader.pubkey])
        tables = autovacuum_off(relay_db)
        relay = with_workers(stack, env, relay, args.workers)
        peer = start_peer(stack, entry)
        print(
            f"relay pid {relay.pid} on {relay.port} ({args.workers} worker(s)); peer pid {peer.pid} on {peer.port};"
            f" autovacuum off on {tables} tables",
            flush=True,
        )
        chat = common.run_async(ingest.setup_channels(relay, signers, "shared"))[0]
        desk = common.run_async(artifact_writes.make_channel(relay, signers))
        # The idle syncs read a channel of their own that nobody writes in (bench/sync.py's "idle").
        idle = common.run_async(artifact_writes.make_channel(relay, [signers[0], reader]))

        async def run_rounds(label: str) -> list[Round]:
            rounds: list[Round] = []
            async with contextlib.AsyncExitStack() as syncs:
                if args.idle_syncs:
                    await sync.open_syncs(relay, reader, idle, args.idle_syncs, syncs)
                    print(f"{args.idle_syncs} syncs open", flush=True)
                for i in range(args.rounds):
                    r = Round()
                    pg = await asyncio.to_thread(
                        common.pgbench_tps, relay_db, clients=args.clients, seconds=args.pgbench_seconds
                    )
                    r.pgbench_tps = pg.tps
                    peer_feeds = [
                        Signed(lambda s=s: _frame(s.sign_event(kind=1, tags=[], content=_content())), args.ahead)
                        for s in signers
                    ]
                    peer_tally = Tally()
                    res = await loop(
                        args.clients,
                        args.seconds,
                        args.warmup,
                        lambda k, f=peer_feeds, t=peer_tally: peer_client(peer, f[k], t),
                        peer,
                    )
                    r.peer = {**_figures(res), "refused": peer_tally.refused, "first_refusal": peer_tally.first_refusal}
                    chat_feeds = [
                        Signed(
                            lambda s=s: _frame(s.sign_event(kind=9, tags=[["h", chat]], content=_content())), args.ahead
                        )
                        for s in signers
                    ]
                    chat_tally = Tally()
                    res = await loop(
                        args.clients,
                        args.seconds,
                        args.warmup,
                        lambda k, f=chat_feeds, t=chat_tally: relay_client(relay, signers[k], f[k], t),
                        relay,
                    )
                    r.kind9 = {
                        **_figures(res),
                        "refused": chat_tally.refused,
                        "first_refusal": chat_tally.first_refusal,
                    }
                    cycles = max(1, args.ahead // (UPDATES_PER_CREATE + 1))
                    rev_tally = artifact_writes.Tally()
                    rev_feeds = [
                        artifact_writes.Feed(
                            s,
                            desk,
                            k,
                            UPDATES_PER_CREATE,
                            [
                                artifact_writes.sign_cycle(s, desk, k, 1000 * i + n, UPDATES_PER_CREATE)
                                for n in range(cycles)
                            ],
                        )
                        for k, s in enumerate(signers)
                    ]
                    res = await loop(
                        args.clients,
                        args.seconds,
                        args.warmup,
                        lambda k, f=rev_feeds, t=rev_tally: revisions_client(relay, f[k], t),
                        relay,
                    )
                    r.revisions = {
                        **_figures(res),
                        "refused": rev_tally.refused,
                        "first_refusal": rev_tally.first_refusal,
                        "creates": rev_tally.ok_create,
                        "updates": rev_tally.ok_update,
                    }
                    print(
                        f"{label} round {i + 1}: pgbench {r.pgbench_tps:.1f} tps; peer {r.peer['rate']:.1f}/s"
                        f" (p99 {r.peer['p99_ms']:.1f} ms); kind 9 {r.kind9['rate']:.1f}/s (p99 {r.kind9['p99_ms']:.1f}"
                        f" ms); revisions {r.revisions['rate']:.1f}/s (p99 {r.revisions['p99_ms']:.1f} ms;"
                        f" {rev_tally.ok_create} creates, {rev_tally.ok_update} updates)",
                        flush=True,
                    )
                    for name, fig in (("peer", r.peer), ("kind 9", r.kind9), ("revisions", r.revisions)):
                        if fig["errors"] or fig["refused"]:
                            print(f"  {name}: {fig['errors']} errors, {fig['refused']} refused: {fig['first_error']}")
                    rounds.append(r)
            return rounds

        labels = ["never analyzed"]
        by_label = {"never analyzed": common.run_async(run_rounds("never analyzed"))}
        if args.analyze:
            took = analyze(relay_db)
            print(f"VACUUM ANALYZE took {took:.1f} s", flush=True)
            labels.append("after ANALYZE")
            by_label["after ANALYZE"] = common.run_async(run_rounds("after ANALYZE"))
    for label in labels:
        rounds = by_label[label]
        results["rounds"][label] = [r.__dict__ for r in rounds]
        results["summary"][label] = print_summary(label, rounds)
        failed += sum(
            1 for r in rounds for fig in (r.peer, r.kind9, r.revisions) if fig["errors"] or fig.get("refused")
        )
    results.update(
        {
            "benchmark": "peers",
            "peer": f"{PEER_PACKAGE}=={PEER_VERSION}",
            "clients": args.clients,
            "workers": args.workers,
            "idle_syncs": args.idle_syncs,
            "nproc": common.nproc(),
            "targets": TARGETS,
        }
    )
    common.write_json(args.json, results)
    return 1 if failed else 0


if __name__ == "__main__":
    common.run_main(main)
