"""Run every benchmark in bench/ one after another and print a summary table.

    python bench/run_all.py [--clients 8] [--seconds S] [--seed 0]

Each benchmark runs as its own process (so each starts and stops its own relay
and echo app); --seconds, when given, is passed to each (per mix for frames).
When DATABASE_URL and REDIS_URL are unset the embedded servers are started once
here and shared. The Redis PUBLISH -> SUBSCRIBE round trip is measured here too,
as the floor for benchmarks that fan events out through Redis.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import BenchError

# (script, default measured seconds, how many measured runs of that length it makes)
BENCHMARKS = [("auth_handshakes.py", 10.0, 2), ("frames.py", 8.0, 4)]
FIXED_OVERHEAD_S = 180  # start-up, migrate, manage.py calls, pgbench -i and its run


def run(script: str, args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    try:
        proc = subprocess.Popen(
            [common.PYTHON, str(common.BENCH_DIR / script), *args, "--json", str(out)], cwd=common.REPO, env=env
        )
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM lets the benchmark's finally blocks stop its relay and echo app.
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            raise BenchError(f"{script} did not finish within {timeout:.0f} s") from None
        finally:
            if proc.poll() is None:  # KeyboardInterrupt or another error here
                proc.terminate()
                proc.wait(30)
        text = out.read_text()
        if not text:
            raise BenchError(f"{script} exited with {proc.returncode} and wrote no figures")
        result: dict[str, Any] = json.loads(text)
        result["exit_code"] = proc.returncode
        return result
    finally:
        out.unlink(missing_ok=True)


def row(name: str, value: float, unit: str, base_name: str, base: float, cpu_ms: float | None = None) -> str:
    cpu = f"{cpu_ms:9.3f}" if cpu_ms is not None else " " * 9
    return f"{name:<28}{value:>10.1f} {unit:<13}{cpu}   {base_name:<19}{base:>10.1f}{common.ratio(value, base):>8}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0, help="passed to frames.py")
    args = parser.parse_args(argv)
    common.exit_on_sigterm()

    common.header(
        "run_all: every benchmark in bench/, one after another",
        [f"{args.clients} clients; each benchmark prints its own header and figures below"],
    )
    results: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        rtt = common.run_async(common.redis_roundtrip(env["REDIS_URL"]))
        print(
            f"redis PUBLISH->SUBSCRIBE round trip: p50 {rtt.p50_ms:.3f} ms, p99 {rtt.p99_ms:.3f} ms "
            f"(mean {rtt.mean_ms:.3f} ms, {rtt.count} round trips)",
            flush=True,
        )
        for script, default_s, runs in BENCHMARKS:
            seconds = args.seconds or default_s
            extra = ["--clients", str(args.clients), "--seconds", f"{seconds:g}"]
            if script == "frames.py":
                extra += ["--seed", str(args.seed)]
            print(flush=True)
            results[script] = run(script, extra, env, timeout=runs * (seconds + 2) + FIXED_OVERHEAD_S)

    auth = results["auth_handshakes.py"]
    frames = results["frames.py"]
    width = 98
    print()
    print("=" * width)
    print(f"summary (nproc={common.nproc()}, {args.clients} clients; CPU ms/op = relay process CPU per operation)")
    print(f"{'measure':<28}{'value':>10} {'unit':<13}{'CPU ms/op':>9}   {'baseline':<19}{'value':>10}{'ratio':>8}")
    print("-" * width)
    a = auth["relay"]
    cpu = a["server_cpu_per_op_ms"]
    print(row("AUTH handshakes", a["rate"], "handshakes/s", "echo handshakes/s", auth["echo"]["rate"], cpu))
    print(row("AUTH handshakes", a["rate"], "handshakes/s", "pgbench -N tps", auth["pgbench"]["tps"], cpu))
    echo_rate = frames["echo"]["response_rate"]
    for mix, r in frames["relay"].items():
        cpu = r["server_cpu_per_op_ms"]
        if mix == "req":
            print(row("REQ -> EOSE round trips", r["rate"], "REQs/s", "echo frames/s", echo_rate, cpu))
            print(row("REQ frames (EVENT+EOSE)", r["response_rate"], "frames/s", "echo frames/s", echo_rate))
            print(
                row(
                    "REQ frames (EVENT+EOSE)",
                    r["response_rate"],
                    "frames/s",
                    "pgbench -N tps",
                    frames["pgbench"]["tps"],
                )
            )
        else:
            label = {"badsig": "bad-signature EVENT -> OK", "garbage": "garbage -> NOTICE"}.get(mix, mix)
            print(row(label, r["response_rate"], "frames/s", "echo frames/s", echo_rate, cpu))
            print(row(label, r["response_rate"], "frames/s", "pgbench -N tps", frames["pgbench"]["tps"], cpu))
    e = frames["echo"]
    print(f"{'echo frames (baseline)':<28}{echo_rate:>10.1f} {'frames/s':<13}{e['server_cpu_per_op_ms']:9.3f}")
    a = auth["echo"]
    print(f"{'echo handshakes (baseline)':<28}{a['rate']:>10.1f} {'handshakes/s':<13}{a['server_cpu_per_op_ms']:9.3f}")
    print(
        f"{'redis PUB->SUB round trip':<28}{rtt.p50_ms:>10.3f} {'ms p50':<13}{'':9}   {'p99 ms':<19}{rtt.p99_ms:>10.3f}"
    )
    print("-" * width)
    print(
        "load: machine busy during pgbench "
        f"{auth['pgbench']['machine_busy_pct']:.0f}% / {frames['pgbench']['machine_busy_pct']:.0f}% of "
        f"{100 * common.nproc()}%; other sessions' processes on this machine move these figures"
    )
    failed = [s for s, r in results.items() if r.get("exit_code")]
    if failed:
        print(f"WARNING: {', '.join(failed)} reported errors")
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
