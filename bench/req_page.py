"""Benchmark: a 1000-row REQ on a 20,000-message channel, against the hand-written SQL, in the same run.

The REQ the issue measured (`["REQ", sub, {"kinds":[9], "#h":[channel], "limit":1000}]`,
1.08 s before the page indexes): one authenticated connection sends it, reads the 1000
events and EOSE, and CLOSEs it, --requests times. The baseline is one hand-written SQL
statement returning the same 1000 raw events in the same order, on one psycopg connection
from this process, timed to its last row. Relay and SQL requests alternate, so both see the
same machine. Both are checked first to return the same ids in the same order.

Data set: a channel created over the relay (kind 9007), then --messages kind-9 events of
about 700 bytes of raw JSON written straight into buzz_storedevent and buzz_eventtag (the
rows the write path stores; not signed: a REQ returns them as they are), beside as many
again in 50 other channels of the community, then VACUUM ANALYZE.

    python bench/req_page.py [--requests 30] [--messages 20000] [--limit 1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import BenchError, Server

# The raw column of a kind-9 message: an event object whose content is about 640 characters.
_SEED = """
INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw, received_at)
SELECT ev.id, %(community)s, %(pubkey)s::text, 9, ev.created_at, ev.channel,
       json_build_object('id', ev.id, 'pubkey', %(pubkey)s::text, 'created_at', ev.created_at, 'kind', 9,
                         'tags', json_build_array(json_build_array('h', ev.channel::text)),
                         'content', repeat(md5(ev.id), 20), 'sig', repeat(md5(ev.id), 4))::text,
       now()
FROM (SELECT encode(sha256((%(seed)s::text || g::text)::bytea), 'hex') AS id, %(start)s::bigint + g AS created_at,
             CASE WHEN %(others)s::boolean THEN ('22222222-2222-2222-2222-' || lpad((g %% 50)::text, 12, '0'))::uuid
                  ELSE %(channel)s::uuid END AS channel
      FROM generate_series(1, %(n)s) g) ev
"""
_TAGS = """
INSERT INTO buzz_eventtag (event_key, name, value)
SELECT key, 'h', channel_id::text FROM buzz_storedevent WHERE community_id = %(community)s
"""
# What the relay's answer is: the newest `limit` kind-9 events of the channel, newest first.
BASELINE_SQL = (
    "SELECT id, raw FROM buzz_storedevent WHERE community_id = %s AND channel_id = %s AND kind = 9"
    " AND deleted_at IS NULL ORDER BY created_at DESC, id LIMIT %s"
)


async def send_and_confirm(ws: Any, signer: Any, kind: int, tags: list[list[str]]) -> None:
    event = signer.sign_event(kind=kind, tags=tags, content="")
    await ws.send(json.dumps(["EVENT", event.to_dict()], separators=(",", ":")))
    async with asyncio.timeout(30):
        while True:
            msg = json.loads(await ws.recv())
            if msg[:2] == ["OK", event.id]:
                break
    if msg[2] is not True:
        raise BenchError(f"kind {kind} refused: {msg[3]!r}")


async def create_channel(relay: Server, owner: Any) -> str:
    channel = str(uuid.uuid4())
    async with common.ws_connect(relay) as ws:
        await common.authenticate(ws, owner, relay.public_url)
        await send_and_confirm(ws, owner, 9007, [["h", channel], ["name", "bench req page"]])
    return channel


def seed(database_url: str, host: str, channel: str, pubkey: str, n: int) -> int:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT id FROM buzz_community WHERE host = %s", (host,)).fetchone()
        if row is None:
            raise BenchError(f"no community for {host}")
        community = int(row[0])
        start = int(time.time()) - 2 * n
        for others, tag in ((False, "a"), (True, "b")):
            conn.execute(
                _SEED,
                {"community": community, "pubkey": pubkey, "seed": tag, "start": start, "n": n,
                 "others": others, "channel": channel},
            )  # fmt: skip
        conn.execute(_TAGS, {"community": community})
        for table in ("buzz_storedevent", "buzz_eventtag"):
            conn.execute(f"VACUUM (ANALYZE) {table}")
    return community


FIRST_EVENT: list[float] = []  # seconds from REQ to its first EVENT, per relay request


async def relay_request(ws: Any, n: int, channel: str, limit: int) -> tuple[float, list[str]]:
    sub = f"page{n}"
    began = time.perf_counter()
    await ws.send(json.dumps(["REQ", sub, {"kinds": [9], "#h": [channel], "limit": limit}]))
    ids: list[str] = []
    while True:
        msg = json.loads(await ws.recv())
        if msg[0] == "EVENT" and msg[1] == sub:
            if not ids:
                FIRST_EVENT.append(time.perf_counter() - began)
            ids.append(msg[2]["id"])
        elif msg[0] == "EOSE" and msg[1] == sub:
            break
        elif msg[0] == "CLOSED":
            raise BenchError(f"REQ closed: {msg!r}")
    elapsed = time.perf_counter() - began
    await ws.send(json.dumps(["CLOSE", sub]))
    return elapsed, ids


def sql_request(conn: Any, community: int, channel: str, limit: int) -> tuple[float, list[str]]:
    began = time.perf_counter()
    rows = conn.execute(BASELINE_SQL, (community, channel, limit)).fetchall()
    elapsed = time.perf_counter() - began
    return elapsed, [r[0] for r in rows]


async def measure(
    relay: Server, reader: Any, database_url: str, community: int, channel: str, requests: int, limit: int
) -> tuple[list[float], list[float]]:
    import psycopg

    relay_times: list[float] = []
    sql_times: list[float] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        async with common.ws_connect(relay, max_size=None) as ws:
            await common.authenticate(ws, reader, relay.public_url)
            # Warm-up, and the check that both sides give the same answer.
            _, relay_ids = await relay_request(ws, -1, channel, limit)
            _, sql_ids = sql_request(conn, community, channel, limit)
            if relay_ids != sql_ids or len(relay_ids) != limit:
                raise BenchError(f"relay and SQL differ: {len(relay_ids)} vs {len(sql_ids)} ids, or not in order")
            for n in range(requests):
                relay_times.append((await relay_request(ws, n, channel, limit))[0])
                sql_times.append(sql_request(conn, community, channel, limit)[0])
    return relay_times, sql_times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": statistics.median(ordered) * 1000,
        "p90_ms": common.percentile(ordered, 90) * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--json")
    common.add_app_option(parser)
    args = parser.parse_args()
    common.exit_on_sigterm()
    from buzz.nostr import Signer

    reader = Signer.generate()
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        env["BUZZ_WRITES_PER_SECOND"] = "0"
        relay = common.start_relay(stack, env, [reader.pubkey], app=args.app, app_dir=args.app_dir)
        channel = common.run_async(create_channel(relay, reader))
        community = seed(env["DATABASE_URL"], relay.host_header, channel, reader.pubkey, args.messages)
        relay_times, sql_times = common.run_async(
            measure(relay, reader, env["DATABASE_URL"], community, channel, args.requests, args.limit)
        )
    r, s = summary(relay_times), summary(sql_times)
    common.header(
        f"REQ of {args.limit} rows on a {args.messages:,}-message channel, {args.requests} requests each",
        [
            "relay: REQ to EOSE over one authenticated WebSocket; SQL: one hand-written statement, same rows",
            "alternating relay, SQL, relay, SQL ...",
        ],
    )
    print(f"{'':14}{'median ms':>12}{'p90 ms':>12}{'max ms':>12}")
    for name, figures in (("relay REQ", r), ("SQL baseline", s)):
        print(f"{name:14}{figures['median_ms']:12.1f}{figures['p90_ms']:12.1f}{figures['max_ms']:12.1f}")
    first = summary(FIRST_EVENT[1:])  # the warm-up request is left out
    print(f"{'relay, 1st EVENT':14}{first['median_ms']:12.1f}{first['p90_ms']:12.1f}{first['max_ms']:12.1f}")
    print(f"median relay / SQL: {common.ratio(r['median_ms'], s['median_ms'])}")
    common.write_json(
        args.json,
        {
            "suite": "req-page",
            "messages": args.messages,
            "limit": args.limit,
            "requests": args.requests,
            "relay": r,
            "sql": s,
            "relay_first_event": first,
            "ratio_median": r["median_ms"] / s["median_ms"] if s["median_ms"] else None,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
