"""Benchmark: NIP-AR artifact revisions accepted per second, and the database round trips each one costs.

N authenticated clients (default 8), each with its own pubkey, all members of ONE
channel (client 0 creates it over the wire with NIP-29 kind 9007 and adds the
others with kind 9000). Closed loop, one EVENT in flight per client: send a signed
kind-45010 revision, wait for its ["OK", id, true, ""]. Each client repeats a
cycle: create a new artifact (op=create), then --updates updates (default 3) of
that artifact, each naming the head the previous OK accepted as prev. So the mix
is 1 create : 3 updates, and every update advances the head by compare-and-set.
Counted for --seconds (default 10) after --warmup (default 2). Events are signed
before the run (the chain's ids are known in advance), so the clients spend their
CPU on the WebSocket only.

The relay runs with BUZZ_WRITES_PER_SECOND=0 (write quota off). Baseline in the
same run: pgbench simple-update (-N) with the same client count, before the relay
starts and after it stops (the mean is the baseline; the machine is shared).

Database round trips per revision, create and update separately: after the
measured run the relay is stopped, `ALTER DATABASE <db> SET log_statement = 'all'`
is set for the bench database only (PostgreSQL superuser; pg_stat_statements is
not loaded on this server, and it would need shared_preload_libraries and a
restart), and a fresh relay process (new backends pick the setting up) takes
--count-cycles cycles per client: first the creates only, then the updates only,
with the server log's byte offset taken between the phases. Every statement the
relay's backends execute is one line "LOG:  statement: ..." or "LOG:  execute
<name>: ..." (BEGIN and COMMIT included); psycopg waits for each one's result,
so lines = round trips. The count is per phase divided by the revisions
accepted in it, with the statements grouped by their first words; log_duration gives
each one's server time (COMMIT's includes the deferred foreign-key checks and the WAL
flush). The settings are reset afterwards; the measured run above had logging off.

Verified at the end: artifacts_revision rows == OK true (every phase), one
artifact per accepted create, every artifact's head_id == the last revision the
relay accepted for it, and its current-tag rows == (name, first value) of that
head's tags (auth excluded), as artifacts.services writes them.

    python bench/artifact_writes.py [--clients 8] [--seconds 10] [--updates 3] [--json out.json]
                                    [--db bench_artifact_writes] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import BenchError, LoopResult, Op, Server

TARGET_RATIO = 0.25
KIND = 45010
STATUSES = ("open", "doing", "review", "done")
DESCRIPTION = (
    "Bench task: move the artifact relay's write path through its paces; this text stands in for a "
    "short task description of about two hundred bytes, which is what a tracker item usually carries."
)


# --- revisions ----------------------------------------------------------------------------------


@dataclass
class Revision:
    id: str
    frame: str
    op: str  # "create" or "update"
    d: str
    tags: list[list[str]]


def files_digest(paths: tuple[str, ...]) -> str:
    """A short content hash of the relay files a figure depends on (other engineers edit the tree)."""
    import hashlib

    out = []
    for rel in paths:
        try:
            out.append(f"{rel} {hashlib.sha1((common.REPO / rel).read_bytes(), usedforsecurity=False).hexdigest()[:8]}")
        except OSError:
            out.append(f"{rel} missing")
    return ", ".join(out)


def event_frame(event: Any) -> str:
    return json.dumps(["EVENT", event.to_dict()], separators=(",", ":"))


def sign_cycle(signer: Any, channel: str, client: int, serial: int, updates: int) -> list[Revision]:
    """One create and `updates` updates of the same artifact, each update naming the previous id as prev."""
    d = str(uuid.uuid4())
    out: list[Revision] = []
    prev: str | None = None
    for step in range(updates + 1):
        op = "create" if step == 0 else "update"
        tags = [["ar", "1"], ["d", d], ["h", channel], ["type", "buzz.task"],
                ["title", f"task {client}-{serial} v{step}"], ["op", op]]  # fmt: skip
        if prev is not None:
            tags.append(["prev", prev])
        tags += [["status", STATUSES[step % len(STATUSES)]], ["assignee", signer.pubkey], ["priority", str(step % 3)]]
        ev = signer.sign_event(kind=KIND, tags=tags, content=f"{DESCRIPTION} ({client}-{serial}-{step})")
        out.append(Revision(ev.id, event_frame(ev), op, d, tags))
        prev = ev.id
    return out


@dataclass
class Tally:
    """Every EVENT of the whole run, warm-up and every phase included (for the checks at the end)."""

    sent: int = 0
    ok_true: int = 0
    ok_create: int = 0
    ok_update: int = 0
    refused: int = 0
    duplicates: int = 0
    signed_inline: int = 0
    first_refusal: str = ""
    # d -> the last revision the relay accepted for it (what the head must be).
    heads: dict[str, Revision] = field(default_factory=dict)


@dataclass
class Feed:
    """A client's pre-signed cycles; a refusal skips the rest of its cycle (the chain is broken there)."""

    signer: Any
    channel: str
    client: int
    updates: int
    cycles: list[list[Revision]]
    serial: int = 0
    pos: int = 0

    def next(self, tally: Tally) -> Revision:
        while self.cycles and self.pos >= len(self.cycles[0]):
            self.cycles.pop(0)
            self.pos = 0
        if not self.cycles:
            tally.signed_inline += self.updates + 1
            self.serial += 1
            self.cycles.append(sign_cycle(self.signer, self.channel, self.client, 10**6 + self.serial, self.updates))
        rev = self.cycles[0][self.pos]
        self.pos += 1
        return rev

    def abandon_cycle(self) -> None:
        self.pos = len(self.cycles[0]) if self.cycles else 0


@dataclass
class Timing:
    """End time and latency of every OK, by op, to split the measured window's latencies."""

    create: list[tuple[float, float]] = field(default_factory=list)
    update: list[tuple[float, float]] = field(default_factory=list)


async def send_revision(ws: Any, rev: Revision, tally: Tally) -> None:
    tally.sent += 1
    await ws.send(rev.frame)
    msg = json.loads(await ws.recv())
    if not (isinstance(msg, list) and msg[:2] == ["OK", rev.id]):
        raise BenchError(f"expected OK for {rev.id[:12]}, got {str(msg)[:200]}")
    if msg[2] is not True:
        tally.refused += 1
        tally.first_refusal = tally.first_refusal or str(msg[3])
        raise BenchError(f"{rev.op} refused: {msg[3]!r}")
    if str(msg[3]).startswith("duplicate:"):
        tally.duplicates += 1
    tally.ok_true += 1
    if rev.op == "create":
        tally.ok_create += 1
    else:
        tally.ok_update += 1
    tally.heads[rev.d] = rev


def writer(relay: Server, feed: Feed, tally: Tally, timing: Timing) -> Any:
    @contextlib.asynccontextmanager
    async def setup() -> AsyncIterator[Op]:
        async with common.ws_connect(relay) as ws:
            await common.authenticate(ws, feed.signer, relay.public_url)

            async def op() -> int:
                rev = feed.next(tally)
                began = time.perf_counter()
                try:
                    await send_revision(ws, rev, tally)
                except BenchError:
                    feed.abandon_cycle()
                    raise
                ended = time.perf_counter()
                getattr(timing, rev.op).append((ended, 1000 * (ended - began)))
                return 1

            yield op

    return setup


# --- set-up over the wire -------------------------------------------------------------------------


async def send_and_confirm(ws: Any, signer: Any, kind: int, tags: list[list[str]]) -> None:
    event = signer.sign_event(kind=kind, tags=tags, content="")
    await ws.send(event_frame(event))
    while True:
        async with asyncio.timeout(30):
            msg = json.loads(await ws.recv())
        if isinstance(msg, list) and msg[:2] == ["OK", event.id]:
            break
    if msg[2] is not True:
        raise BenchError(f"kind {kind} with tags {tags} refused: {msg[3]!r}")


async def make_channel(relay: Server, signers: list[Any]) -> str:
    """Client 0 creates the channel (9007) and adds every other client (9000)."""
    channel = str(uuid.uuid4())
    async with common.ws_connect(relay) as ws:
        await common.authenticate(ws, signers[0], relay.public_url)
        await send_and_confirm(ws, signers[0], 9007, [["h", channel], ["name", "bench artifacts"]])
        for s in signers[1:]:
            await send_and_confirm(ws, signers[0], 9000, [["h", channel], ["p", s.pubkey]])
    return channel


# --- CPU of the PostgreSQL backends in the window ------------------------------------------------------


@dataclass
class BackendCpu:
    seconds: float = 0.0
    backends: int = 0
    redis_publish: float = 0.0
    redis_cpu_s: float = 0.0


async def backend_cpu(env: dict[str, str], warmup: float, seconds: float, out: BackendCpu) -> None:
    def sample() -> tuple[dict[int, float], dict[str, float]]:
        pids = common.backend_pids(env["DATABASE_URL"])
        return {p: common.cpu_seconds(p) for p in pids}, common.redis_counters(env["REDIS_URL"])

    start = time.perf_counter() + warmup
    await asyncio.sleep(warmup)
    pg0, r0 = await asyncio.to_thread(sample)
    await asyncio.sleep(max(0.0, start + seconds - time.perf_counter()))
    pg1, r1 = await asyncio.to_thread(sample)
    both = set(pg0) & set(pg1)
    out.backends = len(both)
    out.seconds = sum(pg1[p] - pg0[p] for p in both)
    out.redis_publish = r1.get("publish", 0.0) - r0.get("publish", 0.0)
    out.redis_cpu_s = r1.get("cpu_s", 0.0) - r0.get("cpu_s", 0.0)


async def measure(
    env: dict[str, str], relay: Server, feeds: list[Feed], tally: Tally, seconds: float, warmup: float
) -> tuple[LoopResult, BackendCpu, Timing, float]:
    timing = Timing()
    cpu = BackendCpu()
    window_start = time.perf_counter() + warmup
    sampler = asyncio.get_running_loop().create_task(backend_cpu(env, warmup, seconds, cpu))
    try:
        res = await common.closed_loop(
            len(feeds), seconds, lambda i: writer(relay, feeds[i], tally, timing)(), warmup=warmup, server=relay
        )
        await asyncio.wait_for(sampler, 30)
    finally:
        sampler.cancel()
    return res, cpu, timing, window_start


def in_window(samples: list[tuple[float, float]], start: float, seconds: float) -> list[float]:
    return sorted(lat for ended, lat in samples if start <= ended <= start + seconds)


# --- round trips per revision, from the server log -------------------------------------------------

# "LOG:  statement: BEGIN" (simple protocol) or "LOG:  execute <unnamed>: ..." / "execute _pg3_0: ..." (extended).
_STATEMENT = re.compile(r"\[(\d+)\] (?:\S*@(\S+) )?LOG:  (?:statement|execute [^:]*): (.*)$")


def statement_lines(text: str, dbname: str, *, with_durations: bool = False) -> list[tuple[int, str]]:
    """(backend pid, statement text) of every statement the database's sessions logged.

    A multi-line statement continues on lines that start with a tab (the stderr log format).
    with_durations: log_duration lines too, as (pid, "\\x00duration <ms>"), in log order.
    """
    out: list[tuple[int, str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("\t"):
            if current is not None:
                current.append(line[1:])
            continue
        if current is not None:
            out[-1] = (out[-1][0], "\n".join(current))
            current = None
        m = _STATEMENT.search(line)
        if m and (m.group(2) is None or m.group(2) == dbname):
            out.append((int(m.group(1)), m.group(3)))
            current = [m.group(3)]
        elif with_durations:
            d = _DURATION.search(line)
            if d and (d.group(2) is None or d.group(2) == dbname):
                out.append((int(d.group(1)), f"\x00duration {d.group(3)}"))
    if current is not None:
        out[-1] = (out[-1][0], "\n".join(current))
    return out


def statement_key(sql: str) -> str:
    """A short name for a statement: a WITH by its CTE names, anything else by its first words."""
    words = " ".join(sql.split())
    if words.upper().startswith("WITH"):
        names = re.findall(r"(?:WITH|\),) (\w+) AS \(", words)
        return f"WITH {', '.join(names)} ... (one statement)"
    if "FROM (SELECT 1) AS one" in words:
        return "SELECT EXISTS(ban), max(timeout), channel, membership, token (policy read)"
    text = words if len(words) <= 80 else words[:77] + "..."
    return text + (" [FOR UPDATE]" if "FOR UPDATE" in words and "FOR UPDATE" not in text else "")


_DURATION = re.compile(r"\[(\d+)\] (?:\S*@(\S+) )?LOG:  duration: ([0-9.]+) ms$")


def server_times(text: str, dbname: str) -> dict[str, float]:
    """Server time (ms, log_duration) per statement key.

    With the extended protocol a backend logs the durations of Parse and Bind BEFORE the statement's
    "execute" line and the duration of Execute right after it: the first duration after a statement
    line is its own, any further ones belong to the next statement of that backend.
    """
    out: dict[str, float] = {}
    last: dict[int, str | None] = {}
    executed: dict[int, bool] = {}
    pending: dict[int, float] = {}
    for pid, sql in statement_lines(text, dbname, with_durations=True):
        if sql.startswith("\x00duration "):
            ms = float(sql.split()[1])
            if last.get(pid) is not None and not executed.get(pid, True):
                key = last[pid]
                assert key is not None
                out[key] = out.get(key, 0.0) + ms
                executed[pid] = True
            else:
                pending[pid] = pending.get(pid, 0.0) + ms
            continue
        key = statement_key(sql)
        out[key] = out.get(key, 0.0) + pending.pop(pid, 0.0)
        last[pid], executed[pid] = key, False
    return out


@dataclass
class PhaseCount:
    revisions: int
    statements: int
    by_statement: dict[str, int]
    backends: int
    server_ms: dict[str, float] = field(default_factory=dict)

    @property
    def per_revision(self) -> float:
        return self.statements / self.revisions if self.revisions else float("nan")


async def counted_phase(relay: Server, signers: list[Any], channel: str, cycles: int, updates: int,
                        tally: Tally, log: common.ServerLog, dbname: str) -> dict[str, PhaseCount]:  # fmt: skip
    """Creates first (every client), then the updates of those artifacts; the log offset between phases."""
    chains = [[sign_cycle(s, channel, i, 2 * 10**6 + n, updates) for n in range(cycles)] for i, s in enumerate(signers)]
    async with contextlib.AsyncExitStack() as stack:
        sockets = [await stack.enter_async_context(common.ws_connect(relay)) for _ in signers]
        for ws, s in zip(sockets, signers, strict=True):
            await common.authenticate(ws, s, relay.public_url)
        # A first revision per connection so the pool's connections exist and nothing lazy is counted.
        warm = [sign_cycle(s, channel, i, 3 * 10**6, 0)[0] for i, s in enumerate(signers)]
        await asyncio.gather(*(send_revision(ws, r, tally) for ws, r in zip(sockets, warm, strict=True)))
        marks = [await asyncio.to_thread(log.wait_quiet)]
        ok0 = tally.ok_true

        async def run(client: int, steps: list[int]) -> None:
            for cycle in chains[client]:
                for step in steps:
                    await send_revision(sockets[client], cycle[step], tally)

        await asyncio.gather(*(run(i, [0]) for i in range(len(signers))))
        marks.append(await asyncio.to_thread(log.wait_quiet))
        ok1 = tally.ok_true
        await asyncio.gather(*(run(i, list(range(1, updates + 1))) for i in range(len(signers))))
        marks.append(await asyncio.to_thread(log.wait_quiet))
        ok2 = tally.ok_true
    out = {}
    for name, (a, b), n in (("create", marks[0:2], ok1 - ok0), ("update", marks[1:3], ok2 - ok1)):
        lines = statement_lines(await asyncio.to_thread(log.read, a, b), dbname)
        by: dict[str, int] = {}
        for _, sql in lines:
            key = statement_key(sql)
            by[key] = by.get(key, 0) + 1
        out[name] = PhaseCount(revisions=n, statements=len(lines), by_statement=by, backends=len({p for p, _ in lines}),
                               server_ms=server_times(await asyncio.to_thread(log.read, a, b), dbname))  # fmt: skip
    return out


# --- an experiment: the write path without the indexes nothing reads ---------------------------------

# (table, pattern of pg_indexes.indexdef): a prefix of a composite index on the same table, or a LIKE copy.
REDUNDANT = (
    ("artifacts_artifact", r"USING btree \(community_id\)$"),  # prefix of artifact_home (community_id, home, d)
    ("artifacts_artifact", r"varchar_pattern_ops"),  # Django's LIKE copy of the head_id FK index
    ("artifacts_revision", r"USING btree \(community_id\)$"),  # prefix of revision_channel
    ("artifacts_revision", r"USING btree \(artifact_id\)$"),  # prefix of revision_history (artifact_id, seq)
    ("artifacts_revision", r"varchar_pattern_ops"),  # Django's LIKE copy of the primary key
)


def drop_redundant_indexes(database_url: str) -> list[str]:
    import psycopg

    dropped = []
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
        ).fetchall()
        for table, name, definition in rows:
            if any(table == t and re.search(p, definition) for t, p in REDUNDANT):
                conn.execute(f'DROP INDEX "{name}"')
                dropped.append(name)
    return dropped


# The tables a write inserts into whose rows name their community: each foreign key into buzz_community is a
# check at COMMIT (a SELECT ... FOR KEY SHARE of the community's row, which concurrent writers of one
# community share as a multixact) for every row inserted.
WRITTEN_WITH_COMMUNITY = (
    "buzz_storedevent",
    "artifacts_revision",
    "artifacts_artifact",
    "buzz_mention",
    "artifacts_moveremoval",
)


def drop_community_fks(database_url: str) -> list[str]:
    import psycopg

    dropped = []
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE contype = 'f'"
            " AND confrelid = 'buzz_community'::regclass AND conrelid::regclass::text = ANY(%s)",
            (list(WRITTEN_WITH_COMMUNITY),),
        ).fetchall()
        for table, name in rows:
            conn.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"')
            dropped.append(f"{table}.{name}")
    return dropped


# --- checks after the run ----------------------------------------------------------------------------------


def verify(database_url: str, tally: Tally) -> tuple[bool, list[str]]:
    import psycopg

    from artifacts.envelope import match_tags
    from buzz.nostr.event import parse_event

    notes = []
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        revisions = conn.execute("SELECT count(*) FROM artifacts_revision").fetchone()[0]  # type: ignore[index]
        heads: dict[str, str] = dict(conn.execute("SELECT d::text, head_id FROM artifacts_artifact").fetchall())
        tag_rows: dict[str, set[tuple[str, str]]] = {}
        count_rows: dict[str, int] = {}
        for d, name, value in conn.execute(
            "SELECT a.d::text, t.name, t.value FROM artifacts_currenttag t JOIN artifacts_artifact a"
            " ON a.id = t.artifact_id"
        ):
            tag_rows.setdefault(d, set()).add((name, value))
            count_rows[d] = count_rows.get(d, 0) + 1
        raws: dict[str, str] = dict(
            conn.execute(
                "SELECT a.d::text, r.raw FROM artifacts_artifact a JOIN artifacts_revision r ON r.id = a.head_id"
            ).fetchall()
        )
    ok = True
    if revisions != tally.ok_true:
        ok = False
        notes.append(f"artifacts_revision holds {revisions} rows but {tally.ok_true} OK true were received")
    else:
        notes.append(f"artifacts_revision rows {revisions} == OK true {tally.ok_true}")
    if len(heads) != tally.ok_create:
        ok = False
        notes.append(f"{len(heads)} artifacts but {tally.ok_create} creates accepted")
    wrong_head = [d for d, rev in tally.heads.items() if heads.get(d) != rev.id]
    unknown = set(heads) - set(tally.heads)
    if wrong_head or unknown:
        ok = False
        notes.append(
            f"{len(wrong_head)} artifacts whose head is not the last accepted revision, {len(unknown)} unknown"
        )
    else:
        notes.append(f"all {len(heads)} artifacts: head_id == the last accepted revision")
    wrong_tags = 0
    for d, rev in tally.heads.items():
        expected = set(match_tags(parse_event(json.loads(raws.get(d, "null")) or {})) if d in raws else set())
        if (
            tag_rows.get(d, set()) != expected
            or count_rows.get(d, 0) != len(expected)
            or expected != {(t[0], t[1]) for t in rev.tags}
        ):
            wrong_tags += 1
    if wrong_tags:
        ok = False
        notes.append(f"{wrong_tags} artifacts whose current-tag rows differ from their head's tags")
    else:
        notes.append("current-tag rows == (name, first value) of each head's tags, for every artifact")
    return ok, notes


# --- main ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--updates", type=int, default=3, help="updates after each create (the mix)")
    parser.add_argument("--presign", type=int, default=200, help="cycles signed per client before the run")
    parser.add_argument("--count-cycles", type=int, default=10, help="cycles per client in the round-trip count")
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--db", default="bench_artifact_writes", help="scratch database (bench*), recreated")
    parser.add_argument("--pgbench-db", default="bench_pgbench_artifacts", help="pgbench's scratch database")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--experiment",
        choices=("drop-redundant-indexes", "drop-community-fks"),
        help="NOT the relay as migrated, to weigh a proposal: drop-redundant-indexes drops the indexes the write "
        "path maintains that no read uses (single-column prefixes of composite indexes, varchar_pattern_ops "
        "copies); drop-community-fks drops the foreign keys into buzz_community of the tables a write inserts "
        "into (WRITTEN_WITH_COMMUNITY), whose checks lock the community's row at COMMIT for every row inserted",
    )
    common.add_app_option(parser)
    parser.add_argument("--profile", metavar="DIR", help="py-spy the relay during the measured window")
    parser.add_argument("--profile-format", choices=("raw", "flamegraph", "speedscope"), default="raw")
    args = parser.parse_args(argv)
    if args.clients < 1 or not 0 < args.seconds <= 600 or not 0 <= args.warmup <= 60 or args.updates < 0:
        parser.error("--clients >= 1, --seconds in (0, 600], --warmup in [0, 60], --updates >= 0")
    if not (args.db.startswith("bench") and args.pgbench_db.startswith("bench")):
        parser.error("--db and --pgbench-db must be scratch databases whose names start with bench")

    common.exit_on_sigterm()
    common.PGBENCH_DB = args.pgbench_db  # pgbench_tps reads it at call time
    from buzz.nostr import Signer

    common.header(
        "artifact_writes: NIP-AR kind-45010 revisions -> OK true, one channel, one EVENT in flight per client",
        [
            f"{args.clients} clients (one pubkey each, all members of one channel: 9007 + 9000 over the wire), "
            f"{args.seconds:g} s measured after {args.warmup:g} s warm-up",
            f"mix per client: 1 create then {args.updates} updates of that artifact (prev = the head just accepted)",
            "relay runs with BUZZ_WRITES_PER_SECOND=0: the per-pubkey write quota is OFF",
            "baseline: pgbench simple-update (-N), same client count, before the relay started and after it stopped",
            f"round trips: a second relay process with log_statement=all on database {args.db} only, "
            f"{args.count_cycles} cycles per client, creates then updates",
            "relay files: "
            + files_digest(
                (
                    "artifacts/services.py",
                    "artifacts/envelope.py",
                    "buzz/access/policy.py",
                    "buzz/events/ingest.py",
                    "buzz/runtime.py",
                    "buzz/live/publisher.py",
                )
            ),
        ],
    )
    signers = [Signer.generate() for _ in range(args.clients)]
    tally = Tally()
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        env["BUZZ_WRITES_PER_SECOND"] = "0"
        env["DATABASE_URL"] = common.with_dbname(env["DATABASE_URL"], args.db)
        db_url = env["DATABASE_URL"]
        others = common.other_sessions_on(db_url, args.db, args.pgbench_db)
        if others:
            raise BenchError(
                "another session is using the scratch databases; not dropping them:\n  " + "\n  ".join(others)
            )
        pg_before = common.pgbench_tps(db_url, clients=args.clients, seconds=args.pgbench_seconds)
        print(f"pgbench -N (before): {common.describe_pgbench(pg_before)}", flush=True)

        relay = common.start_relay(stack, env, [s.pubkey for s in signers], app=args.app, app_dir=args.app_dir)
        print(f"relay pid {relay.pid} on 127.0.0.1:{relay.port} (Host {relay.host_header}), database {args.db}")
        channel = common.run_async(make_channel(relay, signers))
        if args.experiment:
            dropped = (
                drop_redundant_indexes(db_url)
                if args.experiment == "drop-redundant-indexes"
                else drop_community_fks(db_url)
            )
            print("EXPERIMENT: dropped " + ", ".join(dropped) + " (the figures below are NOT the migrated schema's)")
        t0 = time.perf_counter()
        feeds = [
            Feed(s, channel, i, args.updates, [sign_cycle(s, channel, i, n, args.updates) for n in range(args.presign)])
            for i, s in enumerate(signers)
        ]
        print(
            f"channel {channel} created over the wire with {len(signers)} members; "
            f"{args.presign * (args.updates + 1) * len(signers)} revisions pre-signed "
            f"in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        db0 = common.database_counters(db_url)
        tables0 = common.table_counters(db_url)
        profile = common.profile_path(args.profile, "artifact-writes", args.profile_format)
        with common.py_spy(relay.pid, profile, args.seconds + args.warmup, args.profile_format):
            res, bcpu, timing, window_start = common.run_async(
                measure(env, relay, feeds, tally, args.seconds, args.warmup)
            )
        common.report_profile(profile)
        common.stop_process(relay.proc)  # its backends exit and publish their last counts
        time.sleep(0.6)
        db1 = common.database_counters(db_url)
        tables1 = common.table_counters(db_url)
        main_ok = tally.ok_true

        # Round trips: a fresh relay process whose backends log every statement.
        counts: dict[str, PhaseCount] = {}
        rt_note = ""
        try:
            log = common.ServerLog(db_url)
            with common.database_settings(
                db_url, {"log_statement": "all", "log_duration": "on", "log_parameter_max_length": "0"}
            ):
                counter = common.start_relay_node(
                    stack, env, relay, name="relay-rt", app=args.app, app_dir=args.app_dir
                )
                try:
                    counts = common.run_async(
                        counted_phase(counter, signers, channel, args.count_cycles, args.updates, tally, log, args.db)
                    )
                finally:
                    common.stop_process(counter.proc)
        except BenchError as err:
            rt_note = f"round trips not measured: {err}"
        ok_verified, notes = verify(db_url, tally)
        pg_after = common.pgbench_tps(db_url, clients=args.clients, seconds=args.pgbench_seconds)
    pg_tps = (pg_before.tps + pg_after.tps) / 2

    s = res.summary()
    creates = in_window(timing.create, window_start, args.seconds)
    updates = in_window(timing.update, window_start, args.seconds)
    xacts = db1.get("xact_commit", 0) - db0.get("xact_commit", 0)
    rollbacks = db1.get("xact_rollback", 0) - db0.get("xact_rollback", 0)
    pg_ms = 1000 * bcpu.seconds / res.ops if res.ops else float("nan")
    print("-" * 78)
    print(f"relay revisions: {res.describe('revisions')}")
    print(
        f"  mix in the window: {len(creates)} creates, {len(updates)} updates "
        f"({100 * len(creates) / max(1, res.ops):.0f}% / {100 * len(updates) / max(1, res.ops):.0f}%)"
    )
    for name, lat in (("create", creates), ("update", updates)):
        if lat:
            print(
                f"  {name} OK latency p50 {common.percentile(lat, 50):.2f} ms, p99 {common.percentile(lat, 99):.2f} ms"
            )
    print(f"pgbench -N (before): {common.describe_pgbench(pg_before)}")
    print(f"pgbench -N (after) : {common.describe_pgbench(pg_after)}")
    verdict = "meets" if pg_tps and res.rate / pg_tps >= TARGET_RATIO else "BELOW"
    print(
        f"ratio revisions/s / pgbench tps (mean {pg_tps:.1f}) = {common.ratio(res.rate, pg_tps)}  ({verdict} the "
        f"{TARGET_RATIO:.2f} target; against before {common.ratio(res.rate, pg_before.tps)}, "
        f"after {common.ratio(res.rate, pg_after.tps)})"
    )
    print(
        f"CPU per revision in the window: relay {s['server_cpu_per_op_ms']:.3f} ms, PostgreSQL backends "
        f"{pg_ms:.3f} ms ({bcpu.backends} backends); machine busy {100 * res.machine_cpu_s / res.seconds:.0f}% "
        f"of {100 * common.nproc()}%, of which relay + clients + its backends "
        f"{100 * (res.server_cpu_s + res.client_cpu_s + bcpu.seconds) / res.seconds:.0f}%"
    )
    print(
        f"Redis in the window (server-wide): {bcpu.redis_publish / max(1, res.ops):.2f} PUBLISH per revision "
        "(the post-commit signal)"
    )
    print(
        f"transactions: {xacts} committed ({rollbacks} rolled back) for {main_ok} revisions accepted over the "
        f"measured relay's whole load = {xacts / max(1, main_ok):.2f} per revision (autocommit pool: the "
        "duplicate check is one, the write transaction one)"
    )
    for table, d in sorted(_deltas(tables0, tables1).items()):
        per = ", ".join(f"{k} {v / max(1, main_ok):.2f}" for k, v in d.items() if v)
        print(f"    {table:<22} per revision: {per}")
    rt: dict[str, Any] = {}
    if counts:
        print("database round trips per revision (server log, log_statement=all, separate relay process):")
        for name, c in counts.items():
            print(
                f"  {name}: {c.statements} statements for {c.revisions} revisions = {c.per_revision:.2f} per "
                f"{name} ({c.backends} backends)"
            )
            total_ms = sum(c.server_ms.values()) / max(1, c.revisions)
            print(f"      per {name}: statements, server time ms (log_duration; total {total_ms:.3f} ms)")
            for key, n in sorted(c.by_statement.items(), key=lambda kv: -kv[1]):
                revs = max(1, c.revisions)
                print(f"      {n / revs:5.2f}  {c.server_ms.get(key, 0.0) / revs:7.3f}  {key}")
            rt[name] = {"per_revision": c.per_revision, "statements": c.statements, "revisions": c.revisions,
                        "by_statement": {k: v / max(1, c.revisions) for k, v in c.by_statement.items()},
                        "server_ms": {k: v / max(1, c.revisions) for k, v in c.server_ms.items()}}  # fmt: skip
    else:
        print(rt_note)
    print("checks: " + ("OK" if ok_verified else "FAILED"))
    for note in notes:
        print(f"  {note}")
    print(
        f"  {tally.sent} EVENTs sent, {tally.ok_true} OK true ({tally.ok_create} creates, {tally.ok_update} updates, "
        f"{tally.duplicates} duplicate), {tally.refused} refused"
        + (f" (first: {tally.first_refusal})" if tally.refused else "")
    )
    if tally.signed_inline:
        print(f"note: {tally.signed_inline} revisions were signed during the run (pre-signed ones ran out)")
    if res.errors:
        print(f"WARNING: {res.errors} client errors; first: {res.first_error}")
    common.write_json(
        args.json,
        {
            "benchmark": "artifact_writes",
            "experiment": args.experiment,
            "nproc": common.nproc(),
            "clients": args.clients,
            "mix": {"updates_per_create": args.updates, "window_creates": len(creates), "window_updates": len(updates)},
            "quota": "off (BUZZ_WRITES_PER_SECOND=0)",
            "relay": s,
            "create": {"p50_ms": common.percentile(creates, 50), "p99_ms": common.percentile(creates, 99)},
            "update": {"p50_ms": common.percentile(updates, 50), "p99_ms": common.percentile(updates, 99)},
            "pgbench": {"tps": pg_tps, "before": pg_before.__dict__, "after": pg_after.__dict__},
            "ratio": res.rate / pg_tps if pg_tps else None,
            "pg_backend_cpu_per_rev_ms": pg_ms,
            "machine_busy_pct": 100 * res.machine_cpu_s / res.seconds,
            "xact_per_rev": xacts / max(1, main_ok),
            "round_trips": rt,
            "verified": ok_verified,
            "checks": notes,
            "tally": {k: v for k, v in tally.__dict__.items() if k != "heads"},
        },
    )
    return 0 if ok_verified and not res.errors and tally.refused == 0 and counts else 1


def _deltas(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out = {}
    for table, counters in after.items():
        base = before.get(table, {})
        delta = {k: v - base.get(k, 0) for k, v in counters.items()}
        if any(delta.values()):
            out[table] = delta
    return out


if __name__ == "__main__":
    common.run_main(main)
