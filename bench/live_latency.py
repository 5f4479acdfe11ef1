"""Benchmark: live delivery latency across two relay nodes (one PostgreSQL, one Redis).

Node A and node B are two relay processes on the same database and Redis,
serving the same community. A subscriber (its own process) on node B sends
["REQ", sub, {"kinds":[9], "#h":[channel]}] and waits for EOSE; a publisher on
node A then posts kind-9 messages in that channel one at a time (send, await OK
true, then wait for the next slot of a fixed pace, default 200/s), so this
measures latency, not saturation. Each message's content carries the
publisher's time.perf_counter_ns() taken before signing (CLOCK_MONOTONIC, one
clock for every process on the machine). Three latencies per message:

  send -> receipt   from the publisher's ws.send of the EVENT to the subscriber's
                    ws.recv of the EVENT on node B (the user-visible figure)
  OK -> receipt     from the publisher's ws.recv of ["OK", id, true] from node A to
                    that receipt on node B ("accept to receipt"). Node A answers OK
                    only after Redis has acknowledged the PUBLISH, and Redis writes
                    the message to node B's subscription before it replies to A, so
                    both sides race from about the same instant: A relays the OK, B
                    decodes, matches and relays the EVENT. Negative values mean
                    delivery beat the OK.
  content -> receipt  from the timestamp in the content (includes signing, ~0.15 ms)

Baseline in the same run: a bare Redis PUBLISH -> SUBSCRIBE round trip, one
message in flight, from bench/common.py. The relay runs with
BUZZ_WRITES_PER_SECOND=0 (the write quota would refuse a 200/s publisher).

    python bench/live_latency.py [--count 2000] [--rate 200] [--warmup 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import BenchError, Server

# --- the subscriber (a separate process, so its loop and the publisher's do not share a core's time) ---


def _client_server(port: int, host_header: str, public_url: str) -> Server:
    # ws_connect only needs the port, the Host header and the public URL.
    return Server(port=port, proc=None, host_header=host_header, log=Path("/dev/null"), public_url=public_url)  # type: ignore[arg-type]


async def _subscribe(
    pipe: Any, node: Server, secret: str, channel: str, expected: int, idle_limit: float
) -> dict[str, Any]:
    from buzz.nostr import Signer

    signer = Signer(secret)
    received: list[tuple[str, str, int]] = []
    other: list[str] = []
    async with common.ws_connect(node, max_size=None) as ws:
        await common.authenticate(ws, signer, node.public_url)
        sub = "live"
        await ws.send(json.dumps(["REQ", sub, {"kinds": [9], "#h": [channel]}]))
        async with asyncio.timeout(30):
            while True:
                msg = json.loads(await ws.recv())
                if msg[:2] == ["EOSE", sub]:
                    break
                if msg[0] == "CLOSED":
                    raise BenchError(f"REQ closed: {msg!r}")
        pipe.send("ready")
        last = time.monotonic()
        while len(received) < expected:
            try:
                async with asyncio.timeout(0.25):
                    text = await ws.recv()
            except TimeoutError:
                if pipe.poll() and pipe.recv() == "stop":
                    break
                if time.monotonic() - last > idle_limit:
                    break
                continue
            t1 = time.perf_counter_ns()
            last = time.monotonic()
            if text.startswith('["EVENT"'):
                msg = json.loads(text)
                received.append((msg[2]["id"], msg[2]["content"], t1))
            else:
                other.append(text[:200])
                if text.startswith('["CLOSED"'):
                    break
    return {"received": received, "other": other}


def subscriber_main(
    pipe: Any, port: int, host_header: str, public_url: str, secret: str, channel: str, expected: int
) -> None:
    try:
        result = common.run_async(
            _subscribe(pipe, _client_server(port, host_header, public_url), secret, channel, expected, 20.0)
        )
        pipe.send(result)
    except BaseException as err:  # report anything to the parent, which decides
        pipe.send({"error": f"{type(err).__name__}: {err}"})


# --- the publisher --------------------------------------------------------------------------------


async def send_and_confirm(ws: Any, signer: Any, kind: int, tags: list[list[str]], content: str = "") -> None:
    event = signer.sign_event(kind=kind, tags=tags, content=content)
    await ws.send(json.dumps(["EVENT", event.to_dict()], separators=(",", ":")))
    async with asyncio.timeout(30):
        while True:
            msg = json.loads(await ws.recv())
            if msg[:2] == ["OK", event.id]:
                break
    if msg[2] is not True:
        raise BenchError(f"kind {kind} refused: {msg[3]!r}")


async def create_channel(node: Server, owner: Any, member: str) -> str:
    channel = str(uuid.uuid4())
    async with common.ws_connect(node) as ws:
        await common.authenticate(ws, owner, node.public_url)
        await send_and_confirm(ws, owner, 9007, [["h", channel], ["name", "bench live"]])
        await send_and_confirm(ws, owner, 9000, [["h", channel], ["p", member]])
    return channel


async def publish(node: Server, signer: Any, channel: str, total: int, rate: float) -> list[tuple[str, int, int, int]]:
    """total messages, one at a time, paced at `rate`/s; returns (id, content ns, send ns, OK ns) each."""
    out: list[tuple[str, int, int, int]] = []
    interval = 1.0 / rate
    async with common.ws_connect(node) as ws:
        await common.authenticate(ws, signer, node.public_url)
        begin = time.perf_counter()
        for i in range(total):
            t_content = time.perf_counter_ns()
            event = signer.sign_event(kind=9, tags=[["h", channel]], content=f"{t_content} live message {i}")
            frame = json.dumps(["EVENT", event.to_dict()], separators=(",", ":"))
            t_send = time.perf_counter_ns()
            await ws.send(frame)
            async with asyncio.timeout(30):
                msg = json.loads(await ws.recv())
            t_ok = time.perf_counter_ns()
            if msg[:3] != ["OK", event.id, True]:
                raise BenchError(f"message {i} not accepted: {msg!r}")
            out.append((event.id, t_content, t_send, t_ok))
            delay = begin + (i + 1) * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
    return out


def stats_ms(values_ns: list[int]) -> dict[str, float]:
    ms = sorted(v / 1e6 for v in values_ns)
    if not ms:
        return {"count": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "mean_ms": float("nan"),
                "min_ms": float("nan"), "max_ms": float("nan")}  # fmt: skip
    return {
        "count": len(ms),
        "p50_ms": common.percentile(ms, 50),
        "p99_ms": common.percentile(ms, 99),
        "mean_ms": statistics.fmean(ms),
        "min_ms": ms[0],
        "max_ms": ms[-1],
    }


def describe(name: str, s: dict[str, float]) -> str:
    return (
        f"{name:<18} p50 {s['p50_ms']:7.3f} ms  p99 {s['p99_ms']:7.3f} ms  "
        f"(mean {s['mean_ms']:.3f}, min {s['min_ms']:.3f}, max {s['max_ms']:.3f}; {s['count']} messages)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=2000, help="measured messages")
    parser.add_argument("--warmup", type=int, default=50, help="messages sent first and not counted")
    parser.add_argument("--rate", type=float, default=200.0, help="messages per second (paced)")
    parser.add_argument("--redis-count", type=int, default=2000, help="round trips of the Redis baseline")
    parser.add_argument("--json", help="also write the figures to this file")
    common.add_app_option(parser)
    args = parser.parse_args(argv)
    if args.count < 1 or args.warmup < 0 or not 0 < args.rate <= 5000:
        parser.error("--count >= 1, --warmup >= 0, --rate in (0, 5000]")

    common.exit_on_sigterm()
    from buzz.nostr import Signer

    total = args.warmup + args.count
    common.header(
        "live_latency: kind-9 accepted on node A -> EVENT on a REQ subscription on node B",
        [
            f"{args.count} messages after {args.warmup} warm-up, one at a time, paced at {args.rate:g}/s; "
            "publisher and subscriber are separate processes",
            "two relay processes (A, B) on one PostgreSQL database and one Redis; "
            "BUZZ_WRITES_PER_SECOND=0: the write quota is OFF for this run",
            "baseline: bare Redis PUBLISH -> SUBSCRIBE round trip (one in flight) in the same run",
        ],
    )
    publisher, subscriber = Signer.generate(), Signer.generate()
    ctx = mp.get_context("spawn")
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        env["BUZZ_WRITES_PER_SECOND"] = "0"
        others = common.other_sessions_on(env["DATABASE_URL"], common.dbname_of(env["DATABASE_URL"]))
        if others:
            raise BenchError(
                "another session is using the scratch database; not dropping it:\n  " + "\n  ".join(others)
            )
        rtt_before = common.run_async(common.redis_roundtrip(env["REDIS_URL"], count=args.redis_count))
        node_a = common.start_relay(
            stack, env, [publisher.pubkey, subscriber.pubkey], app=args.app, app_dir=args.app_dir
        )
        node_b = common.start_relay_node(stack, env, node_a, name="relay-b", app=args.app, app_dir=args.app_dir)
        print(f"node A pid {node_a.pid} port {node_a.port}; node B pid {node_b.pid} port {node_b.port}; "
              f"Host {node_a.host_header}", flush=True)  # fmt: skip
        channel = common.run_async(create_channel(node_a, publisher, subscriber.pubkey))

        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(
            target=subscriber_main,
            args=(child_end, node_b.port, node_b.host_header, node_b.public_url, subscriber.secret_hex, channel, total),
            daemon=True,
        )
        child.start()

        def reap() -> None:
            child.join(5)
            if child.is_alive():
                child.kill()
                child.join(5)

        stack.callback(reap)
        if not parent_end.poll(60):
            raise BenchError("the subscriber did not get EOSE within 60 s")
        ready = parent_end.recv()
        if ready != "ready":
            raise BenchError(f"subscriber failed: {ready}")

        cpu_a0, cpu_b0, t0 = node_a.cpu(), node_b.cpu(), time.monotonic()
        sent = common.run_async(publish(node_a, publisher, channel, total, args.rate))
        elapsed = time.monotonic() - t0
        cpu_a, cpu_b = node_a.cpu() - cpu_a0, node_b.cpu() - cpu_b0
        if not parent_end.poll(30):
            parent_end.send("stop")
            if not parent_end.poll(10):
                raise BenchError("the subscriber did not report")
        result = parent_end.recv()
        if "error" in result:
            raise BenchError(f"subscriber failed: {result['error']}")
        rtt_after = common.run_async(common.redis_roundtrip(env["REDIS_URL"], count=args.redis_count))

    got = {eid: (content, t1) for eid, content, t1 in result["received"]}
    measured = sent[args.warmup :]
    send_rx, ok_rx, content_rx = [], [], []
    missing = 0
    for eid, t_content, t_send, t_ok in measured:
        if eid not in got:
            missing += 1
            continue
        content, t1 = got[eid]
        if not content.startswith(f"{t_content} "):
            raise BenchError(f"content of {eid[:12]} does not carry its send time")
        send_rx.append(t1 - t_send)
        ok_rx.append(t1 - t_ok)
        content_rx.append(t1 - t_content)
    order_ok = [eid for eid, _, _ in result["received"]] == [s[0] for s in sent][: len(result["received"])]
    s_send, s_ok, s_content = stats_ms(send_rx), stats_ms(ok_rx), stats_ms(content_rx)
    s_pubok = stats_ms([t_ok - t_send for _, _, t_send, t_ok in measured])
    negative = sum(1 for v in ok_rx if v < 0)
    rtt_p50 = (rtt_before.p50_ms + rtt_after.p50_ms) / 2
    rtt_p99 = (rtt_before.p99_ms + rtt_after.p99_ms) / 2

    print("-" * 78)
    print(describe("send -> receipt", s_send))
    print(describe("OK -> receipt", s_ok) + f"; {negative} negative (delivery before OK)")
    print(describe("content -> receipt", s_content))
    print(describe("EVENT -> OK on A", s_pubok))
    print(
        f"redis PUB->SUB     p50 {rtt_before.p50_ms:7.3f} / {rtt_after.p50_ms:.3f} ms  "
        f"p99 {rtt_before.p99_ms:7.3f} / {rtt_after.p99_ms:.3f} ms  (before / after the relay run)"
    )
    print(
        "ratio send->receipt / redis round trip (mean of before and after): "
        f"p50 {common.ratio(s_send['p50_ms'], rtt_p50)}, "
        f"p99 {common.ratio(s_send['p99_ms'], rtt_p99)}"
    )
    print(
        f"ratio OK->receipt / redis round trip: p50 {common.ratio(s_ok['p50_ms'], rtt_p50)}, "
        f"p99 {common.ratio(s_ok['p99_ms'], rtt_p99)} (can be near 0 or negative: see the doc string)"
    )
    print(
        f"delivery: {len(measured)} measured messages accepted, {len(measured) - missing} received on node B, "
        f"{missing} missing; order {'kept' if order_ok else 'NOT kept'}; {len(result['other'])} other frames"
        + (f" (first: {result['other'][0]})" if result["other"] else "")
    )
    n = max(1, len(sent))
    print(
        f"relay CPU per message: node A {1000 * cpu_a / n:.3f} ms, node B {1000 * cpu_b / n:.3f} ms "
        f"({len(sent)} messages in {elapsed:.1f} s = {len(sent) / elapsed:.0f}/s achieved)"
    )
    common.write_json(
        args.json,
        {
            "benchmark": "live_latency",
            "nproc": common.nproc(),
            "count": args.count,
            "rate": args.rate,
            "quota": "off (BUZZ_WRITES_PER_SECOND=0)",
            "send_to_receipt": s_send,
            "ok_to_receipt": s_ok,
            "content_to_receipt": s_content,
            "event_to_ok": s_pubok,
            "ok_to_receipt_negative": negative,
            "redis": {"p50_ms": rtt_p50, "p99_ms": rtt_p99, "before": rtt_before.__dict__, "after": rtt_after.__dict__},
            "ratio_p50": s_send["p50_ms"] / rtt_p50 if rtt_p50 else None,
            "ratio_p99": s_send["p99_ms"] / rtt_p99 if rtt_p99 else None,
            "missing": missing,
            "order_kept": order_ok,
            "relay_cpu_per_msg_ms": {"a": 1000 * cpu_a / n, "b": 1000 * cpu_b / n},
            "achieved_rate": len(sent) / elapsed,
        },
    )
    return 1 if missing or not order_ok else 0


if __name__ == "__main__":
    common.run_main(main)
