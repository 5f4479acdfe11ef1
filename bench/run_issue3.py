"""Run the ingest and live-latency benchmarks (issue 3) and print one summary table.

    python bench/run_issue3.py [--runs 2] [--clients 8] [--seconds 10] [--count 2000] [--rate 200]

Each round runs, as separate processes: bench/ingest.py --channels shared,
bench/ingest.py --channels own, bench/live_latency.py. Each carries its own
same-run baseline (pgbench -N before and after the relay; Redis PUBLISH ->
SUBSCRIBE before and after). With --runs > 1 the rounds repeat and the table
ends with the spread (min .. max) of every figure, because the machine is shared
and other processes move the figures. When DATABASE_URL and REDIS_URL are unset
the embedded servers are started once here and shared.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import BenchError
from run_all import run

FIXED_OVERHEAD_S = 240  # start-up, migrate, manage.py calls, two pgbench -i and runs


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    if len(values) == 1:
        return fmt.format(lo)
    mid = (lo + hi) / 2
    pct = 100 * (hi - lo) / mid if mid else 0.0
    return f"{fmt.format(lo)}..{fmt.format(hi)} (±{pct / 2:.0f}%)"


def relay_split(r: dict[str, Any]) -> str:
    """The relay's main thread: % of the window on a CPU / % runnable but waiting for one."""
    p, secs = r.get("relay_proc") or {}, r["relay"]["seconds"]
    if not p or not secs:
        return "n/a"
    return f"{100 * p['run_s'] / secs:.0f}%/{100 * p['runqueue_s'] / secs:.0f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds of each ingest run")
    parser.add_argument("--count", type=int, default=2000, help="measured messages of each live-latency run")
    parser.add_argument("--rate", type=float, default=200.0)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs >= 1")
    common.exit_on_sigterm()
    common.header(
        "run_issue3: kind-9 ingest (shared channel, own channels) and cross-node live latency",
        [
            f"{args.runs} round(s); {args.clients} clients x {args.seconds:g} s per ingest run; "
            f"{args.count} live messages at {args.rate:g}/s",
            "the relay runs with BUZZ_WRITES_PER_SECOND=0 in every benchmark here (write quota off)",
        ],
    )
    rounds: list[dict[str, dict[str, Any]]] = []
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        ingest_args = ["--clients", str(args.clients), "--seconds", f"{args.seconds:g}"]
        live_args = ["--count", str(args.count), "--rate", f"{args.rate:g}"]
        ingest_timeout = args.seconds + 2 + FIXED_OVERHEAD_S
        live_timeout = (args.count + 50) / args.rate + FIXED_OVERHEAD_S
        for i in range(args.runs):
            print(f"\n##### round {i + 1} of {args.runs}", flush=True)
            results: dict[str, dict[str, Any]] = {}
            for mode in ("shared", "own"):
                print(flush=True)
                results[mode] = run("ingest.py", [*ingest_args, "--channels", mode], env, ingest_timeout)
            print(flush=True)
            results["live"] = run("live_latency.py", live_args, env, live_timeout)
            rounds.append(results)

    width = 118
    print()
    print("=" * width)
    print(f"summary (nproc={common.nproc()}, machine shared with other sessions; write quota off)")
    print(
        f"{'round / measure':<26}{'msgs/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'relay ms':>9}{'pg ms':>7}"
        f"{'pgbench':>9}{'ratio':>7}{'xact/msg':>9}{'no loss':>8}{'other CPU':>10}{'relay cpu/wait':>15}"
    )
    print("-" * width)
    for i, res in enumerate(rounds, 1):
        for mode in ("shared", "own"):
            r = res[mode]
            s = r["relay"]
            print(
                f"{f'{i}: ingest {mode}':<26}{s['rate']:8.1f}{s['p50_ms']:8.2f}{s['p99_ms']:8.2f}"
                f"{s['server_cpu_per_op_ms']:9.3f}{r['pg_backend_cpu_per_msg_ms']:7.3f}{r['pgbench']['tps']:9.1f}"
                f"{r['ratio']:7.3f}{r['xact_per_msg']:9.3f}{'yes' if r['no_loss'] else 'NO':>8}"
                f"{r['other_cpu_pct']:>9.0f}%{relay_split(r):>15}"
            )
    print("  (relay ms / pg ms: CPU per message of the relay process / of its PostgreSQL backends; pgbench: "
          "-N tps, mean of before and after; ratio = msgs/s / pgbench; target >= 0.30;\n"
          "   other CPU: machine CPU used by processes that are not this benchmark's, of 200% = 2 CPUs; "
          "relay cpu/wait: main thread on a CPU / runnable but waiting for a CPU)")  # fmt: skip
    print("-" * width)
    print(
        f"{'round / live latency':<26}{'send->rx p50':>13}{'p99':>8}{'OK->rx p50':>11}{'p99':>8}"
        f"{'redis p50':>10}{'p99':>8}{'ratio p50':>10}{'p99':>7}{'missing':>8}"
    )
    for i, res in enumerate(rounds, 1):
        r = res["live"]
        print(
            f"{f'{i}: node A -> node B':<26}{r['send_to_receipt']['p50_ms']:13.3f}{r['send_to_receipt']['p99_ms']:8.3f}"
            f"{r['ok_to_receipt']['p50_ms']:11.3f}{r['ok_to_receipt']['p99_ms']:8.3f}"
            f"{r['redis']['p50_ms']:10.3f}{r['redis']['p99_ms']:8.3f}"
            f"{r['ratio_p50']:10.2f}{r['ratio_p99']:7.2f}{r['missing']:8d}"
        )
    print("  (ms; ratio = send->receipt / Redis PUBLISH->SUBSCRIBE round trip, for p50 and for p99)")
    if len(rounds) > 1:
        print("-" * width)
        print("spread over rounds (min..max):")
        for mode in ("shared", "own"):
            rs = [res[mode] for res in rounds]
            print(
                f"  ingest {mode:<7} msgs/s {spread([r['relay']['rate'] for r in rs])}; "
                f"pgbench {spread([r['pgbench']['tps'] for r in rs])}; "
                f"ratio {spread([r['ratio'] for r in rs], '{:.3f}')}; "
                f"p99 {spread([r['relay']['p99_ms'] for r in rs], '{:.2f}')} ms"
            )
        ls = [res["live"] for res in rounds]
        print(
            f"  live           send->rx p50 {spread([r['send_to_receipt']['p50_ms'] for r in ls], '{:.3f}')} ms, "
            f"p99 {spread([r['send_to_receipt']['p99_ms'] for r in ls], '{:.3f}')} ms; "
            f"ratio p50 {spread([r['ratio_p50'] for r in ls], '{:.2f}')}, "
            f"p99 {spread([r['ratio_p99'] for r in ls], '{:.2f}')}"
        )
    print("=" * width)
    failed = [f"round {i} {name}" for i, res in enumerate(rounds, 1) for name, r in res.items() if r.get("exit_code")]
    if failed:
        print(f"WARNING: {', '.join(failed)} reported errors or losses")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as err:
        print(f"bench failed: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted; the processes this benchmark started were stopped", file=sys.stderr)
        sys.exit(130)
