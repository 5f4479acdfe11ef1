"""What the pool's checkout check costs: a query through the pool with and without it.

    DATABASE_URL=postgres://... python bench/pool_checkout.py [--ops 3000] [--rounds 5]

buzz.runtime gives the async pool `check=check_pooled`, which looks at the socket
(no round trip) and queries only when the server has hung up. The baseline is the same
pool without a check, measured in the same run, interleaved round by round (in a rotating order); psycopg_pool's
own `check_connection` (one empty query per checkout) is printed beside them to show
what a round-trip check would cost. Each op is one checkout and one `SELECT 1`.
Last, the check alone on an idle connection, beside one `SELECT 1` round trip on the
same connection, since on a loaded machine the whole-op medians are noisier than the check.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "buzz.settings")
os.environ.setdefault("BUZZ_DEV", "1")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:1/0")  # never connected: settings require it

import django

django.setup()

from psycopg import AsyncConnection  # noqa: E402
from psycopg.rows import tuple_row  # noqa: E402
from psycopg_pool import AsyncConnectionPool  # noqa: E402

from buzz.runtime import check_pooled, conninfo_from_settings  # noqa: E402

VARIANTS: dict[str, Any] = {
    "no check (baseline)": None,
    "check_pooled (socket look)": check_pooled,
    "check_connection (round trip)": AsyncConnectionPool.check_connection,
}


async def one_round(check: Any, ops: int) -> float:
    pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
        conninfo_from_settings(),
        min_size=1,
        max_size=1,
        kwargs={"autocommit": True, "row_factory": tuple_row, "prepare_threshold": 2},
        open=False,
        check=check,
    )
    await pool.open(wait=True)
    try:
        for _ in range(200):  # warm up: connection, prepared statement
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
        start = time.perf_counter()
        for _ in range(ops):
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
        return (time.perf_counter() - start) / ops * 1e6
    finally:
        await pool.close()


async def check_alone(calls: int) -> tuple[float, float]:
    """(microseconds per check_pooled on an idle connection, per SELECT 1 round trip) on one connection."""
    conn = await AsyncConnection.connect(conninfo_from_settings(), autocommit=True)
    try:
        start = time.perf_counter()
        for _ in range(calls):
            await check_pooled(conn)
        check = (time.perf_counter() - start) / calls * 1e6
        start = time.perf_counter()
        for _ in range(calls // 50):
            await conn.execute("SELECT 1")
        trip = (time.perf_counter() - start) / (calls // 50) * 1e6
        return check, trip
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for r in range(args.rounds):
        # Rotate the order each round, so no variant always runs right after another.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            results[name].append(await one_round(VARIANTS[name], args.ops))
    base = statistics.median(results["no check (baseline)"])
    print(f"{args.rounds} rounds x {args.ops} ops, median microseconds per checkout + SELECT 1:")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"  {name:32s} {med:8.1f} us   ratio to baseline {med / base:5.2f}")
    check, trip = await check_alone(100_000)
    print(f"check_pooled alone: {check:.2f} us per call; a SELECT 1 round trip: {trip:.1f} us ({check / trip:.3f})")


if __name__ == "__main__":
    asyncio.run(main())
