"""The summary table of each suite in bench/run.py: its figures beside their same-run baselines.

Each function takes the suite's rounds: one dict per round, from a step's key (bench/run.py
Step.key) to the figures its script wrote with --json, plus "exit_code". With more than one
round, the table ends with the spread (min .. max) of the figures over the rounds.
"""

from __future__ import annotations

import math
from typing import Any

import common

Rounds = list[dict[str, dict[str, Any]]]
WIDTH = 118


def num(value: Any) -> float:
    """A figure for a format spec: None (a zero baseline) prints as nan."""
    return float("nan") if value is None else float(value)


def quotient(value: float, base: float) -> float:
    """A ratio for the spread (common.ratio formats one for a table)."""
    return value / base if base > 0 else float("nan")


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """min..max of a figure over the rounds, and half the range as a percentage of the midpoint."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    if len(values) == 1:
        return fmt.format(lo)
    mid = (lo + hi) / 2
    return f"{fmt.format(lo)}..{fmt.format(hi)} (±{50 * (hi - lo) / mid if mid else 0.0:.0f}%)"


def prefix(i: int, rounds: Rounds) -> str:
    return f"{i}: " if len(rounds) > 1 else ""


def row(name: str, value: float, unit: str, base_name: str, base: float, cpu_ms: float | None = None) -> str:
    cpu = f"{cpu_ms:9.3f}" if cpu_ms is not None else " " * 9
    return f"{name:<31}{value:>10.1f} {unit:<13}{cpu}   {base_name:<19}{base:>10.1f}{common.ratio(value, base):>8}"


def row_header() -> None:
    print(f"{'measure':<31}{'value':>10} {'unit':<13}{'CPU ms/op':>9}   {'baseline':<19}{'value':>10}{'ratio':>8}")
    print("  (CPU ms/op = relay process CPU per operation)")


def relay_split(r: dict[str, Any]) -> str:
    """The relay's main thread: % of the window on a CPU / % runnable but waiting for one."""
    p, secs = r.get("relay_proc") or {}, r["relay"]["seconds"]
    if not p or not secs:
        return "n/a"
    return f"{100 * p['run_s'] / secs:.0f}%/{100 * p['runqueue_s'] / secs:.0f}%"


# --- handshakes, frames -------------------------------------------------------


def handshakes(rounds: Rounds) -> None:
    row_header()
    for i, res in enumerate(rounds, 1):
        auth, p = res["auth_handshakes"], prefix(i, rounds)
        a, e = auth["relay"], auth["echo"]
        cpu = a["server_cpu_per_op_ms"]
        print(row(f"{p}AUTH handshakes", a["rate"], "handshakes/s", "echo handshakes/s", e["rate"], cpu))
        print(row(f"{p}AUTH handshakes", a["rate"], "handshakes/s", "pgbench -N tps", auth["pgbench"]["tps"], cpu))
        print(
            f"{f'{p}echo handshakes (baseline)':<31}{e['rate']:>10.1f} {'handshakes/s':<13}"
            f"{e['server_cpu_per_op_ms']:9.3f}"
        )
        print(
            f"  load: machine busy during pgbench {auth['pgbench']['machine_busy_pct']:.0f}% of {100 * common.nproc()}%"
        )
    if len(rounds) > 1:
        rs = [res["auth_handshakes"] for res in rounds]
        print("spread over rounds (min..max):")
        print(
            f"  handshakes/s {spread([r['relay']['rate'] for r in rs])}; "
            f"echo {spread([r['echo']['rate'] for r in rs])}; "
            f"pgbench {spread([r['pgbench']['tps'] for r in rs])}; "
            f"ratio /echo {spread([quotient(r['relay']['rate'], r['echo']['rate']) for r in rs], '{:.3f}')}, "
            f"/pgbench {spread([quotient(r['relay']['rate'], r['pgbench']['tps']) for r in rs], '{:.3f}')}"
        )


def frames(rounds: Rounds) -> None:
    row_header()
    for i, res in enumerate(rounds, 1):
        fr, p = res["frames"], prefix(i, rounds)
        echo_rate, pg_tps = fr["echo"]["response_rate"], fr["pgbench"]["tps"]
        for mix, r in fr["relay"].items():
            cpu = r["server_cpu_per_op_ms"]
            if mix == "req":
                print(row(f"{p}REQ -> EOSE round trips", r["rate"], "REQs/s", "echo frames/s", echo_rate, cpu))
                print(row(f"{p}REQ frames (EVENT+EOSE)", r["response_rate"], "frames/s", "echo frames/s", echo_rate))
                print(row(f"{p}REQ frames (EVENT+EOSE)", r["response_rate"], "frames/s", "pgbench -N tps", pg_tps))
            else:
                label = {"badsig": "bad-signature EVENT -> OK", "garbage": "garbage -> NOTICE"}.get(mix, mix)
                print(row(f"{p}{label}", r["response_rate"], "frames/s", "echo frames/s", echo_rate, cpu))
                print(row(f"{p}{label}", r["response_rate"], "frames/s", "pgbench -N tps", pg_tps, cpu))
        e = fr["echo"]
        print(f"{f'{p}echo frames (baseline)':<31}{echo_rate:>10.1f} {'frames/s':<13}{e['server_cpu_per_op_ms']:9.3f}")
        print(
            f"  load: machine busy during pgbench {fr['pgbench']['machine_busy_pct']:.0f}% of {100 * common.nproc()}%"
        )
    if len(rounds) > 1:
        rs = [res["frames"] for res in rounds]
        print("spread over rounds (min..max):")
        print(
            f"  echo frames/s {spread([r['echo']['response_rate'] for r in rs])}; "
            f"pgbench {spread([r['pgbench']['tps'] for r in rs])}"
        )
        for mix in rs[0]["relay"]:
            rates = [(r["relay"][mix]["response_rate"], r) for r in rs if mix in r["relay"]]
            by_echo = [quotient(v, r["echo"]["response_rate"]) for v, r in rates]
            by_pgbench = [quotient(v, r["pgbench"]["tps"]) for v, r in rates]
            print(
                f"  {mix:<8} frames/s {spread([v for v, _ in rates])}; "
                f"ratio /echo {spread(by_echo, '{:.3f}')}, /pgbench {spread(by_pgbench, '{:.3f}')}"
            )


# --- ingest, live -------------------------------------------------------------

INGEST_MODES = ("shared", "own")


def ingest(rounds: Rounds) -> None:
    print(
        f"{'round / measure':<26}{'msgs/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'relay ms':>9}{'pg ms':>7}"
        f"{'pgbench':>9}{'ratio':>7}{'xact/msg':>9}{'no loss':>8}{'other CPU':>10}{'relay cpu/wait':>15}"
    )
    for i, res in enumerate(rounds, 1):
        for mode in INGEST_MODES:
            r = res[mode]
            s = r["relay"]
            print(
                f"{f'{i}: ingest {mode}':<26}{s['rate']:8.1f}{s['p50_ms']:8.2f}{s['p99_ms']:8.2f}"
                f"{s['server_cpu_per_op_ms']:9.3f}{r['pg_backend_cpu_per_msg_ms']:7.3f}{r['pgbench']['tps']:9.1f}"
                f"{num(r['ratio']):7.3f}{r['xact_per_msg']:9.3f}{'yes' if r['no_loss'] else 'NO':>8}"
                f"{r['other_cpu_pct']:>9.0f}%{relay_split(r):>15}"
            )
    print("  (relay ms / pg ms: CPU per message of the relay process / of its PostgreSQL backends; pgbench: "
          "-N tps, mean of before and after; ratio = msgs/s / pgbench; target >= 0.30;\n"
          "   other CPU: machine CPU used by processes that are not this benchmark's, of 200% = 2 CPUs; "
          "relay cpu/wait: main thread on a CPU / runnable but waiting for a CPU; write quota off)")  # fmt: skip
    if len(rounds) > 1:
        print("spread over rounds (min..max):")
        for mode in INGEST_MODES:
            rs = [res[mode] for res in rounds]
            print(
                f"  ingest {mode:<7} msgs/s {spread([r['relay']['rate'] for r in rs])}; "
                f"pgbench {spread([r['pgbench']['tps'] for r in rs])}; "
                f"ratio {spread([num(r['ratio']) for r in rs], '{:.3f}')}; "
                f"p99 {spread([r['relay']['p99_ms'] for r in rs], '{:.2f}')} ms"
            )


def live(rounds: Rounds) -> None:
    print(
        f"{'round / live latency':<26}{'send->rx p50':>13}{'p99':>8}{'OK->rx p50':>11}{'p99':>8}"
        f"{'redis p50':>10}{'p99':>8}{'ratio p50':>10}{'p99':>7}{'missing':>8}"
    )
    for i, res in enumerate(rounds, 1):
        r = res["live_latency"]
        print(
            f"{f'{i}: node A -> node B':<26}{r['send_to_receipt']['p50_ms']:13.3f}{r['send_to_receipt']['p99_ms']:8.3f}"
            f"{r['ok_to_receipt']['p50_ms']:11.3f}{r['ok_to_receipt']['p99_ms']:8.3f}"
            f"{r['redis']['p50_ms']:10.3f}{r['redis']['p99_ms']:8.3f}"
            f"{num(r['ratio_p50']):10.2f}{num(r['ratio_p99']):7.2f}{r['missing']:8d}"
        )
    print("  (ms; ratio = send->receipt / Redis PUBLISH->SUBSCRIBE round trip, for p50 and for p99)")
    if len(rounds) > 1:
        ls = [res["live_latency"] for res in rounds]
        print("spread over rounds (min..max):")
        print(
            f"  live           send->rx p50 {spread([r['send_to_receipt']['p50_ms'] for r in ls], '{:.3f}')} ms, "
            f"p99 {spread([r['send_to_receipt']['p99_ms'] for r in ls], '{:.3f}')} ms; "
            f"ratio p50 {spread([num(r['ratio_p50']) for r in ls], '{:.2f}')}, "
            f"p99 {spread([num(r['ratio_p99']) for r in ls], '{:.2f}')}"
        )


# --- artifact-writes, query-current -------------------------------------------


def artifact_writes(rounds: Rounds) -> None:
    print(
        f"{'round / writes':<22}{'rev/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'relay ms':>9}{'pg ms':>7}{'pgbench':>9}"
        f"{'ratio':>7}{'RT create':>10}{'RT update':>10}{'mix c/u':>11}{'checks':>8}"
    )
    for i, res in enumerate(rounds, 1):
        w = res["writes"]
        s = w["relay"]
        rt = w.get("round_trips", {})
        label = f"{i}: {w['clients']} clients, 1 chan"
        print(
            f"{label:<22}{s['rate']:8.1f}{s['p50_ms']:8.2f}{s['p99_ms']:8.2f}"
            f"{s['server_cpu_per_op_ms']:9.3f}{w['pg_backend_cpu_per_rev_ms']:7.3f}{w['pgbench']['tps']:9.1f}"
            f"{num(w['ratio']):7.3f}{rt.get('create', {}).get('per_revision', float('nan')):10.2f}"
            f"{rt.get('update', {}).get('per_revision', float('nan')):10.2f}"
            f"{w['mix']['window_creates']:>6}/{w['mix']['window_updates']:<4}{'OK' if w['verified'] else 'FAIL':>8}"
        )
    print(
        "  (relay ms / pg ms: CPU per revision of the relay / of its PostgreSQL backends; pgbench: -N tps, mean of "
        "before and after;\n   ratio = revisions/s / pgbench tps, target >= 0.25; RT: database round trips per "
        "revision, from log_statement=all; write quota off)"
    )
    if len(rounds) > 1:
        ws = [res["writes"] for res in rounds]
        print("spread over rounds (min..max):")
        print(
            f"  writes  rev/s {spread([w['relay']['rate'] for w in ws])}; "
            f"pgbench {spread([w['pgbench']['tps'] for w in ws])}; "
            f"ratio {spread([num(w['ratio']) for w in ws], '{:.3f}')}; "
            f"p50 {spread([w['relay']['p50_ms'] for w in ws], '{:.2f}')} ms; "
            f"p99 {spread([w['relay']['p99_ms'] for w in ws], '{:.2f}')} ms; "
            f"relay CPU/rev {spread([w['relay']['server_cpu_per_op_ms'] for w in ws], '{:.3f}')} ms"
        )


def query_current(rounds: Rounds) -> None:
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
    print("   'as is' is the relay unchanged; with --propose the other rows add the proposals one after another)")
    if len(rounds) > 1:
        print("spread over rounds (min..max):")
        for phase in rounds[0]["query"]["phases"]:
            for name in rounds[0]["query"]["phases"][phase]["queries"]:
                qs = [r["query"]["phases"][phase]["queries"][name] for r in rounds if phase in r["query"]["phases"]]
                print(
                    f"  {phase + ' / ' + name:<26} relay p50 {spread([q['relay_p50_ms'] for q in qs], '{:.1f}')}; "
                    f"SQL p50 {spread([q['sql_p50_ms'] for q in qs], '{:.1f}')}; "
                    f"ratio p50 {spread([q['ratio_p50'] for q in qs], '{:.2f}')}"
                )
