"""The chaos run for NIP-AR sync: random writes, many syncs over two relay nodes, and injected faults.

Used by tests/sync/test_sync_chaos.py (sized for CI) and by `bench/sync_chaos.py` (the long run). Writers
make every kind of revision over artifacts that move in and out of the syncs' scope; sync clients behave as
the spec says (rule 7: commit at EOSE, apply live entries, start again on any resync, error or disconnect);
meanwhile the hub connections are cut (CLIENT KILL), Redis restarts and a relay node is killed and
replaced. At the end every sync instance either was told (CLOSED resync/error or a dropped connection), or
its live-maintained digest equals a fresh sync's digest after quiescence. Anything else is a silent
divergence, which the run counts and the test requires to be zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from tests.support.wsclient import RelayClient, naming
from tests.sync.support import SyncState, World, open_sync, revision

HOST_TIMEOUT = 30.0


@dataclass
class ChaosParams:
    writes: int = 1500
    writers: int = 4
    artifacts: int = 120
    syncs: int = 20
    hub_kills: int = 5
    redis_restarts: int = 1
    node_kills: int = 1
    seed: int = 1


@dataclass
class ChaosReport:
    writes: int = 0
    duplicates_after_reconnect: int = 0
    sync_instances: int = 0
    told_resync: int = 0
    told_error: int = 0
    told_disconnect: int = 0
    # A sync that got neither EOSE nor CLOSED in time: counted apart (a relay that stops answering).
    timed_out: int = 0
    converged: int = 0
    silent_divergences: int = 0
    hub_kills: int = 0
    redis_restarts: int = 0
    node_kills: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


class Cluster:
    """What the run needs from its environment: live node URLs and the faults."""

    def __init__(
        self,
        urls: Callable[[], list[str]],
        kill_hub: Callable[[], Awaitable[bool]],
        restart_redis: Callable[[], Awaitable[None]],
        replace_node: Callable[[], Awaitable[None]],
        host: str,
    ) -> None:
        self.urls = urls
        self.kill_hub = kill_hub
        self.restart_redis = restart_redis
        self.replace_node = replace_node
        self.host = host


def filters(world: World) -> list[dict[str, Any]]:
    a, b = str(world.a), str(world.b)
    return [
        {"artifact": "current", "#h": [a, b]},
        {"artifact": "current", "#h": [a]},
        {"artifact": "current", "#h": [b], "#status": ["open"]},
        {"artifact": "current", "#h": [a, b], "#status": ["done"], "#type": ["buzz.task"]},
    ]


async def _connect(cluster: Cluster, world: Any, signer: Any, rng: random.Random) -> tuple[Any, RelayClient]:
    while True:
        url = rng.choice(cluster.urls())
        cm = RelayClient.connect(url, host=cluster.host, open_timeout=5.0)
        try:
            client = await cm.__aenter__()
            ok = await client.auth(signer)
            if ok[2] is True:
                return cm, client
            await cm.__aexit__(None, None, None)
        except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake, InvalidStatus):
            with contextlib.suppress(Exception):
                await cm.__aexit__(None, None, None)
        await asyncio.sleep(0.2)


async def _writer(
    cluster: Cluster, world: World, ds: list[uuid.UUID], quota: list[int], rng: random.Random, report: ChaosReport
) -> None:
    heads: dict[uuid.UUID, tuple[str, str, bool]] = {}
    homes = [world.a, world.b, world.private]
    cm, w = await _connect(cluster, world, world.owner, rng)
    try:
        while quota[0] > 0:
            quota[0] -= 1
            d = rng.choice(ds)
            status = rng.choice(["open", "done"])
            if d not in heads:
                ev = revision(world.owner, d, rng.choice(homes), "create", tags=[["status", status]])
            else:
                prev, home, deleted = heads[d]
                if deleted:
                    ev = revision(world.owner, d, home, "restore", prev=prev, tags=[["status", status]])
                else:
                    op = rng.choice(["update", "update", "move", "delete"])
                    target = rng.choice([h for h in homes if str(h) != home]) if op == "move" else home
                    ev = revision(world.owner, d, target, op, prev=prev, tags=[["status", status]])
            while True:
                try:
                    await w.send_json(["EVENT", ev])
                    ok = await w.expect("OK", HOST_TIMEOUT, where=naming(ev["id"]))
                    break
                except (ConnectionClosed, TimeoutError, OSError):
                    # The node went away: resubmit the same event elsewhere (a duplicate if it was accepted).
                    with contextlib.suppress(Exception):
                        await cm.__aexit__(None, None, None)
                    cm, w = await _connect(cluster, world, world.owner, rng)
                    report.duplicates_after_reconnect += 1
            assert ok[2] is True, ok
            report.writes += 1
            tags = {t[0]: t[1] for t in ev["tags"]}
            heads[d] = (ev["id"], tags["h"], tags["op"] == "delete")
    finally:
        with contextlib.suppress(Exception):
            await cm.__aexit__(None, None, None)


@dataclass
class _Instance:
    flt: dict[str, Any]
    state: SyncState | None = None
    told: str | None = None
    # A sync still open when the run stops keeps its connection for the final comparison.
    client: RelayClient | None = None
    cm: Any = None
    why: str = ""


async def _sync_client(
    cluster: Cluster, world: World, flt: dict[str, Any], stop: asyncio.Event, rng: random.Random,
    instances: list[_Instance],
) -> None:  # fmt: skip
    """A spec-following client: one sync at a time, a new one after it is told (with a small backoff)."""
    while not stop.is_set():
        inst = _Instance(flt)
        instances.append(inst)
        cm, c = await _connect(cluster, world, world.reader, rng)
        try:
            state = await open_sync(c, "chaos", flt, timeout=HOST_TIMEOUT)
            if not state.eose:
                inst.told = "error" if (state.closed or "").startswith("error:") else "resync"
            else:
                inst.state = state
                while not stop.is_set():
                    try:
                        m = await c.recv_json(0.5)
                    except TimeoutError:
                        continue
                    if len(m) < 2 or m[1] != "chaos":
                        continue
                    if m[0] == "EVENT":
                        state.apply(m[2])
                    elif m[0] == "CLOSED":
                        inst.told = "resync" if m[2].startswith("resync:") else "error"
                        break
        except (ConnectionClosed, OSError) as exc:
            inst.told = "disconnect"
            inst.why = f"{type(exc).__name__}: {exc}"
        except TimeoutError:
            inst.told = "timeout"
        finally:
            # A sync still open when the run stops keeps its connection for the final comparison.
            if inst.told is not None:
                with contextlib.suppress(Exception):
                    await cm.__aexit__(None, None, None)
        if inst.told is None:
            inst.client, inst.cm = c, cm
            return
        await asyncio.sleep(rng.uniform(0, 0.3))


async def run_chaos(cluster: Cluster, world: World, params: ChaosParams) -> ChaosReport:
    report = ChaosReport()
    rng = random.Random(params.seed)
    started = time.monotonic()
    ds = [uuid.uuid4() for _ in range(params.artifacts)]
    quota = [params.writes]
    stop = asyncio.Event()
    instances: list[_Instance] = []
    flts = filters(world)
    syncers = [
        asyncio.create_task(
            _sync_client(cluster, world, flts[i % len(flts)], stop, random.Random(params.seed + i), instances)
        )
        for i in range(params.syncs)
    ]
    writers = asyncio.gather(
        *(
            _writer(cluster, world, ds[i :: params.writers], quota, random.Random(params.seed * 100 + i), report)
            for i in range(params.writers)
        )
    )
    faults = [("hub", params.hub_kills), ("redis", params.redis_restarts), ("node", params.node_kills)]
    plan = [kind for kind, n in faults for _ in range(n)]
    rng.shuffle(plan)
    total = params.writes
    for i, kind in enumerate(plan):
        # Spread the faults over the run, by writes done.
        target = total * (i + 1) // (len(plan) + 1)
        while params.writes - quota[0] < target and not writers.done():
            await asyncio.sleep(0.05)
        if kind == "hub":
            if await cluster.kill_hub():
                report.hub_kills += 1
        elif kind == "redis":
            await cluster.restart_redis()
            report.redis_restarts += 1
        else:
            await cluster.replace_node()
            report.node_kills += 1
    await writers
    stop.set()
    await asyncio.gather(*syncers)
    # Quiescence: every sync that was never told must converge to a fresh sync's set.
    report.sync_instances = len(instances)
    for inst in instances:
        if inst.told == "resync":
            report.told_resync += 1
        elif inst.told == "error":
            report.told_error += 1
        elif inst.told == "disconnect":
            report.told_disconnect += 1
        elif inst.told == "timeout":
            report.timed_out += 1
    survivors = [i for i in instances if i.told is None and i.state is not None and i.client is not None]
    fresh_digest: dict[str, str] = {}
    cm, fresh = await _connect(cluster, world, world.reader, rng)
    try:
        for n, flt in enumerate(flts):
            got = await open_sync(fresh, f"fresh{n}", flt, timeout=HOST_TIMEOUT)
            assert got.eose, got.closed
            fresh_digest[repr(flt)] = got.digest()
    finally:
        await cm.__aexit__(None, None, None)
    for inst in survivors:
        client, state = inst.client, inst.state
        assert client is not None and state is not None
        wanted = fresh_digest[repr(inst.flt)]
        deadline = time.monotonic() + 20.0
        try:
            while state.digest() != wanted and time.monotonic() < deadline:
                try:
                    m = await client.recv_json(0.5)
                except TimeoutError:
                    continue
                if len(m) >= 2 and m[1] == "chaos":
                    if m[0] == "EVENT":
                        state.apply(m[2])
                    elif m[0] == "CLOSED":
                        inst.told = "resync" if m[2].startswith("resync:") else "error"
                        break
        except (ConnectionClosed, OSError) as exc:
            inst.told = "disconnect"
            inst.why = f"at the end: {type(exc).__name__}: {exc}"
        if inst.told is not None:
            report.told_disconnect += inst.told == "disconnect"
            report.told_resync += inst.told == "resync"
            report.told_error += inst.told == "error"
        elif state.digest() == wanted:
            report.converged += 1
        else:
            report.silent_divergences += 1
            report.notes.append(f"silent divergence: filter {inst.flt}, {len(state.heads)} heads")
        with contextlib.suppress(Exception):
            await inst.cm.__aexit__(None, None, None)
    report.notes += sorted({i.why for i in instances if i.why})
    report.seconds = time.monotonic() - started
    return report


def hub_connection_ids(client: redis.Redis, pid: int) -> list[int]:
    prefix = f"buzz-hub-pubsub-{pid}-"
    return [int(c["id"]) for c in client.client_list() if str(c.get("name", "")).startswith(prefix)]
