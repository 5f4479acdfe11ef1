"""Benchmark: the relay's CPU per NIP-AR sync for one change (artifacts.sync, past EOSE), in-process.

No sockets and no database: --syncs syncs (default 500, one node's share of bench/sync.py's delivery figure) on
one channel, past EOSE, 32 per connection, each connection with the relay's own bounded outbound queue
(buzz.ws.outbound.Outbound) and its writer task, whose send only counts the frames it is handed. For each of
--changes changes, the same decoded signal (as the hub hands one message to every subscription of the process)
is offered to each sync in turn; the process's head reader (artifacts.heads) batches their reads, and its one
query is answered from memory, after one turn of the event loop; each sync decides with the before/after rule
and queues its frame. A change is done when every writer has been handed every frame. Every head is checked
delivered to every sync.

Baseline, in the same run and alternating with it: the least any sync path does for a change, with the same
queues and writers: each sync's frame (its EVENT prefix and the head) built and queued. Printed: microseconds
per sync per change (the median of --repeats repetitions, and the minimum), the baseline's, and the ratio.
The head reader's own query and the hub's decoding are not in either side (bench/sync.py measures them with
the sockets, the database and Redis).

    python bench/sync_fanout.py [--syncs 500] [--changes 200] [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
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

import sync as sync_bench  # noqa: E402  (bench/sync.py: its revision())

from artifacts import heads  # noqa: E402
from artifacts.query import parse_sync_filter  # noqa: E402
from artifacts.sync import SyncSubscription  # noqa: E402

logging.getLogger("buzz.web.static").setLevel(logging.ERROR)  # buzz.asgi's import warns of the admin's CSS
from buzz.asgi import GC_THRESHOLDS  # noqa: E402
from buzz.live import signals  # noqa: E402
from buzz.nostr import Signer  # noqa: E402
from buzz.ws.outbound import Outbound  # noqa: E402

SUBS_PER_CONNECTION = 32
COMMUNITY = 1


class _Community:
    id = COMMUNITY


class _Host:
    actor = None
    community = _Community()

    def __init__(self, outbound: Outbound) -> None:
        self.outbound = outbound

    def subscription_ended(self, sub: Any, reason: str) -> None:
        raise RuntimeError(f"a sync ended: {reason}")

    def abort(self) -> None:
        raise RuntimeError("a connection was aborted")


class _Counter:
    def __init__(self) -> None:
        self.frames = 0

    async def send_text(self, text: str) -> None:
        self.frames += 1

    async def send_many(self, texts: list[str]) -> None:
        self.frames += len(texts)


async def _until(counter: _Counter, frames: int) -> None:
    while counter.frames < frames:
        await asyncio.sleep(0)


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    channel, signer, counter = uuid.uuid4(), Signer.generate(), _Counter()
    outs = []
    for _ in range(-(-args.syncs // SUBS_PER_CONNECTION)):
        out = Outbound(counter.send_text, max_messages=1000, max_bytes=1 << 22, send_many=counter.send_many)
        out.start()
        outs.append(out)
    query = parse_sync_filter({"artifact": "current", "#h": [str(channel)]})
    syncs = []
    for i in range(args.syncs):
        sync = SyncSubscription(_Host(outs[i // SUBS_PER_CONNECTION]), f"sync-{i}", query, [channel])  # type: ignore[arg-type]
        # As `_run` leaves it after EOSE: the scope granted, the reader's access decided at epoch 1, live.
        sync._grant(frozenset([channel]))
        sync._access = {str(channel): (1, 0)}
        sync._live_phase = True
        syncs.append(sync)
    total = args.changes * args.repeats
    ds = [str(uuid.uuid4()) for _ in range(total)]
    events = [
        sync_bench.revision(signer, d, str(channel), "update", content=json.dumps({"n": n})) for n, d in enumerate(ds)
    ]
    rows = {
        d: (d, channel, False, False, ev["id"], n + 1, json.dumps(ev, separators=(",", ":")), 1, 0)
        for n, (d, ev) in enumerate(zip(ds, events, strict=True))
    }

    async def answer(community_id: int, wanted: list[str]) -> dict[str, heads.Head]:
        await asyncio.sleep(0)  # the query's round trip, at its least
        return {d: heads.head_of(rows[d]) for d in wanted}

    heads.HeadReader._query = staticmethod(answer)  # type: ignore[method-assign]
    topic = signals.channel_topic(COMMUNITY, channel)
    relay: list[float] = []
    floor: list[float] = []
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)  # the relay's (buzz.asgi)
    for r in range(args.repeats):
        chunk = range(r * args.changes, (r + 1) * args.changes)
        start = time.process_time()
        for n in chunk:
            message = {"t": signals.EVENT, "event": events[n]}
            expected = counter.frames + args.syncs
            for sync in syncs:
                sync.on_message(topic, message)
            await _until(counter, expected)
        relay.append((time.process_time() - start) / (args.changes * args.syncs) * 1e6)
        start = time.process_time()
        for n in chunk:
            raw = rows[ds[n]][6]
            expected = counter.frames + args.syncs
            for sync in syncs:
                sync.host.outbound.try_put(f"{sync._prefix}{raw}]")
            await _until(counter, expected)
        floor.append((time.process_time() - start) / (args.changes * args.syncs) * 1e6)
    missing = [sync.sub_id for sync in syncs if len(sync._last) != total]
    if missing:
        raise SystemExit(f"{len(missing)} syncs did not send every head (first: {missing[0]})")
    for out in outs:
        await out.close()
    median, baseline = statistics.median(relay), statistics.median(floor)
    return {
        "syncs": args.syncs,
        "changes": args.changes,
        "repeats": args.repeats,
        "sync_us": median,
        "sync_min_us": min(relay),
        "floor_us": baseline,
        "floor_min_us": min(floor),
        "ratio": median / baseline,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--syncs", type=int, default=500)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    figures = asyncio.run(_measure(args))
    print(
        f"syncs: {args.syncs} on one channel, {SUBS_PER_CONNECTION} per connection; {args.changes} changes x "
        f"{args.repeats} repetitions, in-process (CPU time)"
    )
    print(f"  relay, per sync per change: min {figures['sync_min_us']:.2f} us, median {figures['sync_us']:.2f} us")
    print(
        f"  baseline, each sync's frame built and queued: min {figures['floor_min_us']:.2f} us, "
        f"median {figures['floor_us']:.2f} us"
    )
    print(f"  ratio relay / baseline: {figures['ratio']:.2f}")
    common.write_json(args.json, figures)


if __name__ == "__main__":
    main()
