"""Benchmark: the relay's CPU per ordinary REQ for one live event (buzz.ws.req.ReqSubscription.on_message).

In-process, no sockets: --reqs REQ subscriptions (default 1000) on one channel, past EOSE, each with a host whose
outbound queue only counts what it is given; the same decoded kind-9 message (as the hub hands one message to every
subscription of the process) is offered to each in turn, --rounds times. Printed: microseconds per REQ per event
(the minimum and the median of 7 repetitions), beside the same-run cost of serializing the event once
(buzz.ws.req.dumps), which every REQ paid per event before the text was shared (one serialization per event per
process), as a ratio. Every event is checked delivered to every REQ.

    python bench/req_fanout.py [--reqs 1000] [--rounds 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import inprocess

inprocess.setup()

from buzz.nostr import Signer  # noqa: E402
from buzz.nostr.filters import parse_filter  # noqa: E402
from buzz.ws import req  # noqa: E402

REPEATS = 7


class _Outbound:
    def __init__(self) -> None:
        self.count = 0

    def try_put(self, text: str, *, notice: bool = False) -> None:
        self.count += 1


class _Limits:
    outbound_max_messages = 1000


class _Host:
    community = None
    actor = None
    limits = _Limits()
    reads = None

    def __init__(self) -> None:
        self.outbound = _Outbound()

    def subscription_ended(self, sub: Any, reason: str) -> None:
        raise RuntimeError(f"a REQ ended: {reason}")

    def abort(self) -> None:
        raise RuntimeError("a connection was aborted")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reqs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    channel = uuid.uuid4()
    event = (
        Signer.generate()
        .sign_event(kind=9, tags=[["h", str(channel)]], content="a line of chat, as long as most of them are")
        .to_dict()
    )
    flt = parse_filter({"kinds": [9], "#h": [str(channel)]}, max_values=100, max_limit=500, default_limit=500)
    subs = []
    for i in range(args.reqs):
        sub = req.ReqSubscription(_Host(), f"s{i}", [flt], [channel])  # type: ignore[arg-type]
        sub._eose, sub._sent_ids = True, None  # past EOSE and the stored ids' grace
        sub._epochs = {str(channel): 1}  # its reader's access decided at the event's epoch
        subs.append(sub)
    message = {"t": "event", "event": event, "epoch": 1}
    per_req: list[float] = []
    for _ in range(REPEATS):
        # A new decoded message each repetition, as the hub decodes each one it receives.
        message = {"t": "event", "event": dict(event), "epoch": 1}
        start = time.perf_counter()
        for _ in range(args.rounds):
            for sub in subs:
                sub.on_message("bench", message)
        per_req.append((time.perf_counter() - start) / (args.rounds * args.reqs) * 1e6)
    delivered = {sub.host.outbound.count for sub in subs}  # type: ignore[attr-defined]
    if delivered != {REPEATS * args.rounds}:
        raise SystemExit(f"not every event reached every REQ: {sorted(delivered)[:5]}")
    serialize: list[float] = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(args.rounds * args.reqs):
            req.dumps(event)
        serialize.append((time.perf_counter() - start) / (args.rounds * args.reqs) * 1e6)
    median, baseline = statistics.median(per_req), statistics.median(serialize)
    print(f"REQs: {args.reqs}, one channel, {args.rounds} events x {REPEATS} repetitions, in-process")
    print(f"  on_message per REQ per event: min {min(per_req):.2f} us, median {median:.2f} us")
    print(f"  baseline, one serialization of the event (buzz.ws.req.dumps): median {baseline:.2f} us")
    print(f"  ratio on_message / one serialization: {median / baseline:.2f}")
    figures = {"reqs": args.reqs, "on_message_us": median, "serialize_us": baseline, "ratio": median / baseline}
    common.write_json(args.json, figures)


if __name__ == "__main__":
    main()
