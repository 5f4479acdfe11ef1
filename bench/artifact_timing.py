"""Benchmark: can the time of an answer tell an unreadable artifact from a missing one? (issue 9, item 12)

NIP-AR's non-disclosure rule ("Errors MUST NOT disclose inaccessible artifact details") answers an
edit of an artifact the sender can't read exactly like an edit of a missing d ("conflict: head
unavailable"). This measures whether the time of that answer gives it away, as a prober would:

* alice creates an artifact in her private channel; mallory, a relay member who is not in it, sends
  updates with a random prev: to that d ("unreadable"), to a fresh random d ("missing"), and, as the
  same-run control, to another fresh random d ("control", the same path as "missing");
* --tries tries of each (default 150), interleaved in a random order per round after a warm-up, over
  one WebSocket (send EVENT -> its OK) and over HTTP POST /events (NIP-98, one keep-alive connection);
  events and NIP-98 headers are signed before the clock starts;
* a classifier learns a threshold and a direction from the even-numbered tries (the midpoint of the
  two paths' medians) and labels groups of k tries of the odd-numbered ones by their median, then the
  halves swap; accuracy is the share labelled right over many random groups. 0.5 is chance; the
  control pair (missing vs control, two draws of the same path) shows what chance measures as on this
  machine, with these sample sizes. --runs repeats the whole measure (default 3; mean and range).

The figure printed for issue 9 is the median-of-11 accuracy (target <= 0.65), next to 0.5 and the
control's. tests/db/test_artifact_statement_parity.py pins the cause deterministically (the same
statements in the same order on both paths); this shows the effect from outside.

    python bench/artifact_timing.py [--tries 150] [--k 11] [--runs 3] [--warmup 20] [--no-http] [--json out.json]
                                    [--db bench_artifact_timing]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import http.client
import json
import random
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import BenchError, Server

PATHS = ("unreadable", "missing", "control")
HEAD_UNAVAILABLE = "conflict: head unavailable"


def revision(signer: Any, d: str, h: str, op: str, prev: str | None) -> Any:
    tags = [["ar", "1"], ["d", d], ["h", h], ["type", "buzz.task"], ["title", "Probe"], ["op", op]]
    if prev is not None:
        tags.append(["prev", prev])
    return signer.sign_event(kind=45010, tags=tags, content=json.dumps({"version": 1, "n": secrets.token_hex(4)}))


def nip98(signer: Any, host: str, body: bytes) -> str:
    tags = [
        ["u", f"http://{host}/events"],
        ["method", "POST"],
        ["nonce", secrets.token_hex(8)],
        ["payload", hashlib.sha256(body).hexdigest()],
    ]
    event = signer.sign_event(kind=27235, tags=tags, content="")
    return "Nostr " + base64.b64encode(json.dumps(event.to_dict()).encode()).decode()


@dataclass
class Samples:
    """Latency (ms) of every try, per path, in the order they were taken."""

    ms: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PATHS})

    def add(self, path: str, ms: float) -> None:
        self.ms[path].append(ms)


def _fold(train_a: list[float], train_b: list[float], test_a: list[float], test_b: list[float], k: int,
          draws: int, rng: random.Random) -> float:  # fmt: skip
    ma, mb = statistics.median(train_a), statistics.median(train_b)
    threshold, a_slower = (ma + mb) / 2, ma > mb
    if k == 1:
        right = sum((x > threshold) == a_slower for x in test_a) + sum((x > threshold) != a_slower for x in test_b)
        return right / (len(test_a) + len(test_b))
    right = 0
    for _ in range(draws):
        right += (statistics.median(rng.sample(test_a, k)) > threshold) == a_slower
        right += (statistics.median(rng.sample(test_b, k)) > threshold) != a_slower
    return right / (2 * draws)


def accuracy(a: list[float], b: list[float], k: int, rng: random.Random, draws: int = 2000) -> float:
    """Share of median-of-k groups labelled right: a threshold and a direction learned from half the tries
    (even-numbered), groups of k drawn from the other half; then the halves swap, and the two are averaged."""
    even_a, odd_a, even_b, odd_b = a[0::2], a[1::2], b[0::2], b[1::2]
    return (_fold(even_a, even_b, odd_a, odd_b, k, draws, rng) + _fold(odd_a, odd_b, even_a, even_b, k, draws, rng)) / 2


@dataclass
class Setup:
    relay: Server
    alice: Any
    mallory: Any
    secret: str  # alice's private channel
    d: str  # alice's artifact in it


async def prepare(stack: contextlib.ExitStack, env: dict[str, str], db: str) -> Setup:
    from buzz.nostr import Signer

    alice, mallory = Signer.generate(), Signer.generate()
    env["DATABASE_URL"] = common.with_dbname(env["DATABASE_URL"], db)
    env["BUZZ_WRITES_PER_SECOND"] = "0"  # the write quota would throttle the probe, not the paths
    relay = common.start_relay(stack, env, [alice.pubkey, mallory.pubkey])
    secret = str(uuid.uuid4())
    common.checked(
        common.manage(env, "channel", "create", "--host", relay.host_header, "--name", "secret",
                      "--owner", alice.pubkey, "--id", secret, "--visibility", "private"),
        "manage.py channel create",
    )  # fmt: skip
    d = str(uuid.uuid4())
    async with common.ws_connect(relay) as ws:
        await common.authenticate(ws, alice, relay.public_url)
        event = revision(alice, d, secret, "create", None)
        await ws.send(json.dumps(["EVENT", event.to_dict()]))
        reply = json.loads(await ws.recv())
        if reply[:3] != ["OK", event.id, True]:
            raise BenchError(f"alice's create was refused: {reply!r}")
    return Setup(relay, alice, mallory, secret, d)


def guess(setup: Setup, path: str) -> Any:
    """An update with a random prev: of alice's d, or of a fresh random d."""
    d = setup.d if path == "unreadable" else str(uuid.uuid4())
    return revision(setup.mallory, d, setup.secret, "update", secrets.token_hex(32))


async def probe_ws(setup: Setup, tries: int, warmup: int, rng: random.Random) -> Samples:
    samples = Samples()
    async with common.ws_connect(setup.relay) as ws:
        await common.authenticate(ws, setup.mallory, setup.relay.public_url)
        for round_no in range(warmup + tries):
            order = list(PATHS)
            rng.shuffle(order)
            for path in order:
                event = guess(setup, path)
                frame = json.dumps(["EVENT", event.to_dict()], separators=(",", ":"))
                began = time.perf_counter()
                await ws.send(frame)
                reply = json.loads(await ws.recv())
                ms = (time.perf_counter() - began) * 1000
                if reply != ["OK", event.id, False, HEAD_UNAVAILABLE]:
                    raise BenchError(f"{path}: expected head unavailable, got {reply!r}")
                if round_no >= warmup:
                    samples.add(path, ms)
    return samples


def probe_http(setup: Setup, tries: int, warmup: int, rng: random.Random) -> Samples:
    samples = Samples()
    conn = http.client.HTTPConnection("127.0.0.1", setup.relay.port, timeout=10)
    try:
        for round_no in range(warmup + tries):
            order = list(PATHS)
            rng.shuffle(order)
            for path in order:
                event = guess(setup, path)
                body = json.dumps(event.to_dict()).encode()
                headers = {
                    "Host": setup.relay.host_header,
                    "Content-Type": "application/json",
                    "Authorization": nip98(setup.mallory, setup.relay.host_header, body),
                }
                began = time.perf_counter()
                conn.request("POST", "/events", body=body, headers=headers)
                response = conn.getresponse()
                answer = json.loads(response.read())
                ms = (time.perf_counter() - began) * 1000
                if response.status != 409 or answer.get("message") != HEAD_UNAVAILABLE:
                    raise BenchError(f"{path}: expected 409 head unavailable, got {response.status} {answer!r}")
                if round_no >= warmup:
                    samples.add(path, ms)
    finally:
        conn.close()
    return samples


def figures(samples: Samples, k: int, rng: random.Random) -> dict[str, Any]:
    ms = samples.ms
    return {
        "tries": len(ms["unreadable"]),
        "median_ms": {p: statistics.median(ms[p]) for p in PATHS},
        "accuracy_1": accuracy(ms["unreadable"], ms["missing"], 1, rng),
        f"accuracy_{k}": accuracy(ms["unreadable"], ms["missing"], k, rng),
        "control_1": accuracy(ms["control"], ms["missing"], 1, rng),
        f"control_{k}": accuracy(ms["control"], ms["missing"], k, rng),
    }


def report(name: str, runs: list[dict[str, Any]], k: int) -> dict[str, Any]:
    print(f"{name}: update with a random prev, unreadable d vs missing d, {runs[0]['tries']} tries each per run")
    for i, run in enumerate(runs, 1):
        medians = "  ".join(f"{p} {run['median_ms'][p]:.3f}" for p in PATHS)
        print(
            f"  run {i}: median ms {medians}; accuracy 1 try {run['accuracy_1']:.3f} (control {run['control_1']:.3f}),"
            f" median of {k} {run[f'accuracy_{k}']:.3f} (control {run[f'control_{k}']:.3f})"
        )
    summary = {key: statistics.mean(run[key] for run in runs) for key in ("accuracy_1", f"accuracy_{k}", "control_1",
                                                                          f"control_{k}")}  # fmt: skip
    spread = {key: (min(run[key] for run in runs), max(run[key] for run in runs)) for key in summary}

    def line(key: str) -> str:
        lo, hi = spread[key]
        return f"{summary[key]:.3f} ({lo:.3f}..{hi:.3f})"

    print(f"  accuracy, 1 try          {line('accuracy_1')}   chance 0.500   same-run control {line('control_1')}")
    print(
        f"  accuracy, median of {k:<4} {line(f'accuracy_{k}')}   chance 0.500   same-run control"
        f" {line(f'control_{k}')}   target <= 0.65"
    )
    return {"runs": runs, "mean": summary, "range": spread}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=150, help="measured tries per path")
    parser.add_argument("--k", type=int, default=11, help="tries per classified group (median)")
    parser.add_argument("--warmup", type=int, default=20, help="rounds before measuring (not counted)")
    parser.add_argument("--runs", type=int, default=3, help="repeat the measure (mean and range printed)")
    parser.add_argument("--no-http", action="store_true", help="WebSocket only")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--db", default="bench_artifact_timing", help="scratch database (bench*), recreated")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.tries < 2 * args.k:
        raise SystemExit("--tries must be at least twice --k (half the tries train the threshold)")
    rng = random.Random(args.seed)
    common.exit_on_sigterm()
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        setup = common.run_async(prepare(stack, env, args.db))
        common.header(
            "NIP-AR: does the time of 'head unavailable' tell an unreadable artifact from a missing one?",
            [f"tries per path {args.tries} (+{args.warmup} warm-up rounds), groups of {args.k}, interleaved"],
        )
        results: dict[str, Any] = {}
        probes: list[tuple[str, Callable[[], Samples]]] = [
            ("WebSocket", lambda: common.run_async(probe_ws(setup, args.tries, args.warmup, rng)))
        ]
        if not args.no_http:
            probes.append(("HTTP POST /events", lambda: probe_http(setup, args.tries, args.warmup, rng)))
        for name, probe in probes:
            results[name] = report(name, [figures(probe(), args.k, rng) for _ in range(args.runs)], args.k)
        common.write_json(args.json, {"k": args.k, "results": results})
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
