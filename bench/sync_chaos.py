"""Benchmark (long run): NIP-AR sync under chaos, with the issue's sizes.

Runs the chaos test (tests/sync/test_sync_chaos.py, engine in tests/sync/chaos.py) with
--writes random writes of every kind (default 10,000), --syncs syncs over two relay nodes (100),
--hub-kills CLIENT KILLs of a hub connection (20), --redis-restarts (2) and --node-kills (1), and
prints its counts: sync instances, how many were told (resync, error, disconnect), how many converged
live to a fresh sync's digest, and the silent divergences, which must be 0. The baseline is the fault-free
expectation itself: every instance either told or converged.

It uses DATABASE_URL / REDIS_URL like the test suite (embedded servers when unset); the chaos run
starts its own redis-server for the relays, so that it can restart it.

    python bench/sync_chaos.py [--writes 10000] [--syncs 100] [--hub-kills 20] [--redis-restarts 2]
                               [--node-kills 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=10_000)
    parser.add_argument("--syncs", type=int, default=100)
    parser.add_argument("--artifacts", type=int, default=400)
    parser.add_argument("--hub-kills", type=int, default=20)
    parser.add_argument("--redis-restarts", type=int, default=2)
    parser.add_argument("--node-kills", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        report_path = Path(f.name)
    env = dict(os.environ)
    env.update(
        CHAOS_WRITES=str(args.writes),
        CHAOS_SYNCS=str(args.syncs),
        CHAOS_ARTIFACTS=str(args.artifacts),
        CHAOS_HUB_KILLS=str(args.hub_kills),
        CHAOS_REDIS_RESTARTS=str(args.redis_restarts),
        CHAOS_NODE_KILLS=str(args.node_kills),
        CHAOS_SEED=str(args.seed),
        CHAOS_REPORT=str(report_path),
        CHAOS_TIMEOUT="3600",
    )
    common.header("NIP-AR sync chaos", [f"{vars(args)}", common.code_version()])
    cmd = [common.PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=3600",
           "tests/sync/test_sync_chaos.py"]  # fmt: skip
    status = subprocess.run(cmd, cwd=common.REPO, env=env, check=False).returncode
    text = report_path.read_text() if report_path.exists() else ""
    report_path.unlink(missing_ok=True)
    if not text:
        print(f"error: the chaos run wrote no report (pytest exit {status})", file=sys.stderr)
        return 1
    result = json.loads(text)
    r = result["report"]
    told = r["told_resync"] + r["told_error"] + r["told_disconnect"]
    print(
        f"{r['writes']} writes, {r['sync_instances']} sync instances over 2 nodes in {r['seconds']:.0f} s;"
        f" faults: {r['hub_kills']} hub kills, {r['redis_restarts']} Redis restarts, {r['node_kills']} node kills"
    )
    print(
        f"told: {told} ({r['told_resync']} resync, {r['told_error']} error, {r['told_disconnect']} disconnect);"
        f" converged live to a fresh sync's digest: {r['converged']}; timed out: {r['timed_out']};"
        f" SILENT DIVERGENCES: {r['silent_divergences']} (must be 0)"
    )
    common.write_json(args.json, result)
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
