"""Run the NIP-AR write and current-view query benchmarks (issue 45) and print one summary table.

    python bench/run_issue45.py [--runs 2] [--clients 8] [--seconds 10] [--requests 300] [--no-propose]

Each round runs, as separate processes and one after the other (they would share the CPUs
otherwise): bench/artifact_writes.py (revisions/s against pgbench -N in the same run, round
trips per create and per update, the checks) and bench/query_current.py (POST /query against
one hand-written SQL statement in the same run; with the proposals unless --no-propose). Each
carries its own same-run baseline. With --runs > 1 the rounds repeat and the table ends with
the spread (min .. max) of every figure, because the machine is shared and other processes move
the figures. When DATABASE_URL and REDIS_URL are unset the embedded servers are started once
here and shared.
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

WRITES_OVERHEAD_S = 300  # two pgbench -i and runs, migrate, manage.py calls, the round-trip count, the checks
QUERY_OVERHEAD_S = 900  # signing the data set the first time, COPY, VACUUM, plans, the auto_explain captures


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """min..max of a figure over the rounds, and half the range as a percentage of the midpoint."""
    values = [v for v in values if v == v]  # drop NaN
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    if len(values) == 1:
        return fmt.format(lo)
    mid = (lo + hi) / 2
    return f"{fmt.format(lo)}..{fmt.format(hi)} (±{50 * (hi - lo) / mid if mid else 0.0:.0f}%)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds of each write run")
    parser.add_argument("--requests", type=int, default=300, help="timed requests per query")
    parser.add_argument("--no-propose", action="store_true", help="skip the query proposals")
    parser.add_argument("--only", choices=("writes", "query"), help="run one of the two benchmarks only")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs >= 1")
    common.exit_on_sigterm()
    common.header(
        "run_issue45: NIP-AR revisions/s (vs pgbench -N) and current-view POST /query (vs one SQL statement)",
        [
            f"{args.runs} round(s); writes: {args.clients} clients x {args.seconds:g} s, 1 create : 3 updates; "
            f"queries: {args.requests} requests each, sequential",
            "the relay runs with BUZZ_WRITES_PER_SECOND=0 in the write benchmark (write quota off)",
        ],
    )
    rounds: list[dict[str, dict[str, Any]]] = []
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        writes_args = ["--clients", str(args.clients), "--seconds", f"{args.seconds:g}"]
        query_args = ["--requests", str(args.requests), *([] if args.no_propose else ["--propose"])]
        # A request of the unchanged relay takes up to ~1 s on this data set: budget for it.
        query_timeout = QUERY_OVERHEAD_S + 2 * (args.requests + 60) * 1.5
        for i in range(args.runs):
            print(f"\n##### round {i + 1} of {args.runs}", flush=True)
            results: dict[str, dict[str, Any]] = {}
            if args.only != "query":
                results["writes"] = run("artifact_writes.py", writes_args, env, args.seconds + 2 + WRITES_OVERHEAD_S)
                print(flush=True)
            if args.only != "writes":
                results["query"] = run("query_current.py", query_args, env, query_timeout)
            rounds.append(results)

    width = 118
    print()
    print("=" * width)
    print(f"summary (nproc={common.nproc()}, machine shared with other sessions; write quota off)")
    if args.only != "query":
        print_writes(rounds)
    if args.only is None:
        print("-" * width)
    if args.only != "writes":
        print_queries(rounds)
    if len(rounds) > 1:
        print("-" * width)
        print("spread over rounds (min..max):")
        if args.only != "query":
            ws = [res["writes"] for res in rounds]
            print(
                f"  writes  rev/s {spread([w['relay']['rate'] for w in ws])}; "
                f"pgbench {spread([w['pgbench']['tps'] for w in ws])}; "
                f"ratio {spread([w['ratio'] for w in ws], '{:.3f}')}; "
                f"p50 {spread([w['relay']['p50_ms'] for w in ws], '{:.2f}')} ms; "
                f"p99 {spread([w['relay']['p99_ms'] for w in ws], '{:.2f}')} ms; "
                f"relay CPU/rev {spread([w['relay']['server_cpu_per_op_ms'] for w in ws], '{:.3f}')} ms"
            )
        if args.only != "writes":
            for phase in rounds[0]["query"]["phases"]:
                for name in rounds[0]["query"]["phases"][phase]["queries"]:
                    qs = [r["query"]["phases"][phase]["queries"][name] for r in rounds if phase in r["query"]["phases"]]
                    print(
                        f"  {phase + ' / ' + name:<26} relay p50 {spread([q['relay_p50_ms'] for q in qs], '{:.1f}')}; "
                        f"SQL p50 {spread([q['sql_p50_ms'] for q in qs], '{:.1f}')}; "
                        f"ratio p50 {spread([q['ratio_p50'] for q in qs], '{:.2f}')}"
                    )
    print("=" * width)
    failed = [f"round {i} {name}" for i, res in enumerate(rounds, 1) for name, r in res.items() if r.get("exit_code")]
    if failed:
        print(f"WARNING: {', '.join(failed)} reported errors or failed checks")
    return 1 if failed else 0


def print_writes(rounds: list[dict[str, dict[str, Any]]]) -> None:
    print(
        f"{'round / writes':<22}{'rev/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'relay ms':>9}{'pg ms':>7}{'pgbench':>9}"
        f"{'ratio':>7}{'RT create':>10}{'RT update':>10}{'mix c/u':>11}{'checks':>8}"
    )
    for i, res in enumerate(rounds, 1):
        w = res["writes"]
        s = w["relay"]
        rt = w.get("round_trips", {})
        print(
            f"{f'{i}: 8 clients, 1 chan':<22}{s['rate']:8.1f}{s['p50_ms']:8.2f}{s['p99_ms']:8.2f}"
            f"{s['server_cpu_per_op_ms']:9.3f}{w['pg_backend_cpu_per_rev_ms']:7.3f}{w['pgbench']['tps']:9.1f}"
            f"{w['ratio']:7.3f}{rt.get('create', {}).get('per_revision', float('nan')):10.2f}"
            f"{rt.get('update', {}).get('per_revision', float('nan')):10.2f}"
            f"{w['mix']['window_creates']:>6}/{w['mix']['window_updates']:<4}{'OK' if w['verified'] else 'FAIL':>8}"
        )
    print(
        "  (relay ms / pg ms: CPU per revision of the relay / of its PostgreSQL backends; pgbench: -N tps, mean of "
        "before and after;\n   ratio = revisions/s / pgbench tps, target >= 0.25; RT: database round trips per "
        "revision, from log_statement=all)"
    )


def print_queries(rounds: list[dict[str, dict[str, Any]]]) -> None:
    print(
        f"{'round / query':<34}{'relay p50':>10}{'p99':>9}{'SQL p50':>9}{'p99':>9}{'ratio p50':>10}{'p99':>7}"
        f"{'same ids':>10}"
    )
    for i, res in enumerate(rounds, 1):
        for phase, data in res["query"]["phases"].items():
            for name, q in data["queries"].items():
                print(
                    f"{f'{i}: {phase} / {name}':<34}{q['relay_p50_ms']:10.2f}{q['relay_p99_ms']:9.2f}"
                    f"{q['sql_p50_ms']:9.2f}{q['sql_p99_ms']:9.2f}{q['ratio_p50']:10.2f}{q['ratio_p99']:7.2f}"
                    f"{'yes' if not data['mismatches'] else 'NO':>10}"
                )
    print("  (ms, sequential requests; ratio = relay POST /query / the hand-written SQL statement, target <= 2;")
    print("   'as is' is the relay unchanged; the other rows add the proposals one after another)")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as err:
        print(f"bench failed: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted; the processes this benchmark started were stopped", file=sys.stderr)
        sys.exit(130)
