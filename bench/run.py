"""Run a named benchmark suite: `make bench SUITE=<name> [BENCH_ARGS="..."]`.

    python bench/run.py                      list the suites
    python bench/run.py <suite> [--runs N] [arguments for the suite's script(s)]
    python bench/run.py <suite> --help       the suite, and its script's own options

A suite is one or more benchmark scripts in bench/ (each measures its figure and a
baseline in the same run and prints them with their ratio), run as separate processes
one after the other, then a summary table of the suite's figures beside their
baselines. --runs N repeats the suite N times and adds the spread (min .. max) of each
figure: the machine is shared, and other processes move the figures. Every argument
but --runs goes to each of the suite's scripts; `all` takes --runs and --seconds only
(--seconds goes to the scripts that measure for a fixed time). When DATABASE_URL and
REDIS_URL are unset the embedded servers are started once here and shared.

A new suite is one line in SUITES below: its name, what it measures, its Step(s) (the
script, fixed arguments, the start-up budget), and optionally a summary from
bench/summaries.py; without one, the scripts' own tables are its figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import summaries
from common import BenchError
from summaries import Rounds

Budget = Callable[[argparse.Namespace], float]


def timed(default_s: float, runs: int = 1) -> Budget:
    """A script that measures `runs` windows of --seconds each (plus ~2 s of warm-up each)."""
    return lambda o: runs * ((o.seconds or default_s) + 2)


def paced(count: int, rate: float) -> Budget:
    """A script that sends --count messages (and 50 of warm-up) at --rate per second."""
    return lambda o: ((o.count or count) + 50) / (o.rate or rate)


def requests(n: int) -> Budget:
    """query_current.py: --requests per query, two queries, relay and SQL; a request may take ~1.5 s."""
    return lambda o: 2 * ((o.requests or n) + 60) * 1.5


TEN_SECONDS = timed(10.0)


@dataclass(frozen=True)
class Step:
    """One process of a suite: bench/<script> with fixed arguments, then the caller's."""

    script: str
    # The runner's backstop, in seconds: start-up, migrate, manage.py calls, pgbench -i and
    # its runs (overhead_s), plus the measured part, computed from the caller's options.
    overhead_s: float = 300.0
    measured_s: Budget = TEN_SECONDS
    args: tuple[str, ...] = ()
    # The key of this step's figures in a round (the summaries read them by it).
    label: str = ""
    # Whether the script measures for --seconds (`all --seconds S` passes it only there).
    takes_seconds: bool = True

    @property
    def key(self) -> str:
        return self.label or Path(self.script).stem

    def timeout(self, options: argparse.Namespace) -> float:
        return self.overhead_s + self.measured_s(options)


@dataclass(frozen=True)
class Suite:
    name: str
    about: str
    steps: tuple[Step, ...]
    summary: Callable[[Rounds], None] | None = None
    runs: int = 1  # default rounds


SUITES: dict[str, Suite] = {}
ALL = "all"


def register(
    name: str, about: str, *steps: Step, summary: Callable[[Rounds], None] | None = None, runs: int = 1
) -> None:
    if name in SUITES or name == ALL:
        raise ValueError(f"suite {name!r} is registered twice")
    SUITES[name] = Suite(name, about, steps, summary, runs)


# The registry: one call per suite; `all` runs them in this order.
register(
    "handshakes",
    "NIP-42 AUTH handshakes/s vs a bare echo app and pgbench -N",
    Step("auth_handshakes.py", 180, timed(10, runs=2)),
    summary=summaries.handshakes,
)
register(
    "frames",
    "REQ / bad-signature EVENT / garbage frames/s vs a bare echo app and pgbench -N",
    Step("frames.py", 180, timed(8, runs=4)),
    summary=summaries.frames,
)
register(
    "ingest",
    "kind-9 messages/s (one shared channel; own channels) vs pgbench -N",
    Step("ingest.py", 240, timed(10), ("--channels", "shared"), "shared"),
    Step("ingest.py", 240, timed(10), ("--channels", "own"), "own"),
    summary=summaries.ingest,
    runs=2,
)
register(
    "live",
    "cross-node live latency, node A -> node B, vs a bare Redis PUBLISH->SUBSCRIBE",
    Step("live_latency.py", 240, paced(2000, 200.0), takes_seconds=False),
    summary=summaries.live,
    runs=2,
)
register(
    "incremental",
    "NIP-AR incremental reads: a full initial pass over 100k artifacts and a later pass after 1k changes, "
    "each vs hand-written SQL returning the same rows",
    Step("incremental.py", 600, lambda o: 0.0, takes_seconds=False),
)
register(
    "artifact-writes",
    "NIP-AR revisions/s, 1 create : 3 updates in one channel, vs pgbench -N",
    Step("artifact_writes.py", 300, timed(10), label="writes"),
    summary=summaries.artifact_writes,
    runs=2,
)
register(
    "query-current",
    "POST /query on 200k artifacts vs one hand-written SQL statement",
    Step("query_current.py", 900, requests(300), label="query", takes_seconds=False),
    summary=summaries.query_current,
    runs=2,
)

register(
    "peers",
    "kind-9 messages/s and NIP-AR revisions/s (25% creates) beside nostr-relay (kind 1) and pgbench -N, 8"
    " connections, 3 interleaved rounds, medians, p99 OK latency; --analyze, --idle-syncs 1000, --workers N",
    # pip installs the peer once (minutes); each round: pgbench, then three loads of --seconds + warm-up.
    Step("peers.py", 900, lambda o: 2 * 3 * (4 * ((o.seconds or 10.0) + 4) + 30)),
)
register(
    "sync",
    "NIP-AR sync: time to EOSE vs a bare keyset read, delivery with 1000 syncs vs bare Redis, memory per idle"
    " sync, write throughput with 1000 idle syncs vs none",
    Step("sync.py", 900, timed(8, runs=6)),
)
register(
    "sync-chaos",
    "NIP-AR sync under chaos: 10k writes, 100 syncs over 2 nodes, hub kills, Redis restarts, a node killed;"
    " counts the silent divergences (must be 0)",
    Step("sync_chaos.py", 3600, lambda o: 0.0, takes_seconds=False),
)
register(
    "artifact-timing",
    'does the time of "head unavailable" tell an unreadable d from a missing one? median-of-11 accuracy vs 0.5',
    Step("artifact_timing.py", 600, lambda o: 0.0, takes_seconds=False),
)
register(
    "req-fanout",
    "CPU per ordinary REQ for one live event, 1000 REQs on a channel, in-process, vs one serialization of the event",
    Step("req_fanout.py", 120, lambda o: 10.0, takes_seconds=False),
)
register(
    "sync-fanout",
    "CPU per NIP-AR sync for one change, 500 syncs on a channel past EOSE, in-process, vs each frame built and queued",
    Step("sync_fanout.py", 120, lambda o: 10.0, takes_seconds=False),
)
register(
    "front",
    "what buzz.web.front costs a POST /query answered at once with a 50 kB body, in-process, vs bare ASGI messages",
    Step("front.py", 120, lambda o: 10.0, takes_seconds=False),
)
register(
    "req-page",
    "REQ of 1000 rows on a 20,000-message channel vs one hand-written SQL statement",
    Step("req_page.py", 300, lambda o: 60.0, label="req", takes_seconds=False),
)
register(
    "retention",
    "retention expiry (manage.py retention run) revisions/s vs the same batches of plain UPDATEs",
    Step("retention.py", 300, lambda o: 120.0, takes_seconds=False),
)


def run_script(step: Step, args: Sequence[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run one benchmark script to its end (or its timeout) and return the figures it wrote."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [common.PYTHON, str(common.BENCH_DIR / step.script), *step.args, *args, "--json", str(out)]
    try:
        proc = subprocess.Popen(cmd, cwd=common.REPO, env=env)
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
            raise BenchError(f"{step.script} did not finish within {timeout:.0f} s") from None
        finally:
            if proc.poll() is None:  # KeyboardInterrupt or another error here
                proc.terminate()
                proc.wait(30)
        text = out.read_text()
        if not text:
            raise BenchError(f"{step.script} exited with {proc.returncode} and wrote no figures")
        result: dict[str, Any] = json.loads(text)
        result["exit_code"] = proc.returncode
        return result
    finally:
        out.unlink(missing_ok=True)


def budget_options(args: Sequence[str]) -> argparse.Namespace:
    """The few options the timeouts depend on, read from the arguments passed through."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--seconds", type=float)
    p.add_argument("--count", type=int)
    p.add_argument("--rate", type=float)
    p.add_argument("--requests", type=int)
    return p.parse_known_args(list(args))[0]


def run_suite(
    suite: Suite, runs: int, args: Sequence[str], env: dict[str, str], seconds: float | None = None
) -> Rounds:
    """`runs` rounds of the suite's steps; `seconds` (from `all --seconds`) goes to the steps that take it."""
    rounds: Rounds = []
    for i in range(runs):
        if runs > 1:
            print(f"\n##### {suite.name}: round {i + 1} of {runs}", flush=True)
        results: dict[str, dict[str, Any]] = {}
        for step in suite.steps:
            step_args = [*args, *(["--seconds", f"{seconds:g}"] if seconds and step.takes_seconds else [])]
            print(flush=True)
            results[step.key] = run_script(step, step_args, env, step.timeout(budget_options(step_args)))
        rounds.append(results)
    return rounds


def failures(name: str, rounds: Rounds) -> list[str]:
    return [
        f"{name} round {i} {key}" for i, res in enumerate(rounds, 1) for key, r in res.items() if r.get("exit_code")
    ]


def summarize(suite: Suite, rounds: Rounds) -> None:
    print()
    print("=" * summaries.WIDTH)
    print(f"{suite.name}: {suite.about}")
    print(f"  (nproc={common.nproc()}, machine shared with other sessions; {len(rounds)} round(s))")
    if suite.summary is None:
        print("  the figures and their ratios are in each script's own table above")
    else:
        suite.summary(rounds)
    print("=" * summaries.WIDTH)


def list_suites() -> None:
    print('usage: make bench SUITE=<name> [BENCH_ARGS="..."]   (python bench/run.py <name> [args])\n')
    print("suites:")
    for s in SUITES.values():
        scripts = ", ".join(dict.fromkeys(step.script for step in s.steps))
        print(f"  {s.name:<16} {s.about}")
        print(f"  {'':<16} ({scripts}; {s.runs} round(s) by default)")
    print(f"  {ALL:<16} every suite above, one after another, each with its default rounds")
    print(
        "\nBENCH_ARGS: --runs N (rounds, default per suite), then anything the suite's scripts take,\n"
        '  e.g. BENCH_ARGS="--seconds 2"; `python bench/run.py <name> --help` shows them.'
    )


def suite_help(suite: Suite) -> None:
    print(f"{suite.name}: {suite.about}; default {suite.runs} round(s) (--runs N).")
    for step in suite.steps:
        print(f"  step: bench/{step.script} {' '.join(step.args)}".rstrip())
    print("Every argument but --runs is passed to each step; the script's options:", flush=True)
    for script in dict.fromkeys(step.script for step in suite.steps):
        print(f"\n--- bench/{script} --help", flush=True)
        subprocess.run([common.PYTHON, str(common.BENCH_DIR / script), "--help"], cwd=common.REPO, check=False)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        list_suites()
        return 0
    name, rest = argv[0], argv[1:]
    if name != ALL and name not in SUITES:
        print(f"unknown suite {name!r}\n", file=sys.stderr)
        list_suites()
        return 2
    if name != ALL and ("-h" in rest or "--help" in rest):
        suite_help(SUITES[name])
        return 0

    parser = argparse.ArgumentParser(prog=f"bench/run.py {name}", allow_abbrev=False)
    parser.add_argument("--runs", type=int, default=None, help="rounds (default: the suite's)")
    if name == ALL:
        parser.add_argument("--seconds", type=float, help="measured seconds, for the scripts that take --seconds")
        opts = parser.parse_args(rest)
        passed: list[str] = []
    else:
        opts, passed = parser.parse_known_args(rest)
    if opts.runs is not None and opts.runs < 1:
        parser.error("--runs >= 1")
    chosen = list(SUITES.values()) if name == ALL else [SUITES[name]]
    common.exit_on_sigterm()
    common.header(
        f"bench suite {name}: {'every suite' if name == ALL else chosen[0].about}",
        [
            f"suites: {', '.join(s.name for s in chosen)}; arguments: {' '.join(rest) or '(defaults)'}",
            "each script below prints its own header and figures; the summary follows at the end",
        ],
    )

    done: list[tuple[Suite, Rounds]] = []
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        for suite in chosen:
            seconds = opts.seconds if name == ALL else None
            done.append((suite, run_suite(suite, opts.runs or suite.runs, passed, env, seconds)))

    failed: list[str] = []
    for suite, rounds in done:
        summarize(suite, rounds)
        failed += failures(suite.name, rounds)
    if failed:
        print(f"WARNING: {', '.join(failed)} reported errors, losses or failed checks")
    return 1 if failed else 0


if __name__ == "__main__":
    common.run_main(main)
