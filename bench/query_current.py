"""Benchmark: POST /query on the NIP-AR current view over a large data set, against one hand-written SQL query.

Data set (seeded straight into the tables, the rows artifacts.services writes for a
create): --artifacts artifacts (default 200,000) over --channels private channels
(default 2,000), about 100 per channel. Each artifact is one accepted kind-45010
create revision, signed for real, with the envelope tags (ar, d, h, type, title, op)
and type (10 values; the type tag doubles as the artifact's type column), status
(5 values), assignee (100 pubkeys). Rows: artifacts_artifact (the head),
artifacts_revision (the revision, raw = the event), artifacts_currenttag ((name,
first value) of every tag but auth: 8 per artifact, via artifacts.envelope.match_tags),
buzz_channel (what the channel service writes; no messages, so no buzz_messagecounter rows) and
buzz_membership (5 authors per channel, and the reader in --reader-channels of them,
default 200). The signed events are cached under var/bench/query_current/ so a
second run loads the same data set without signing again. VACUUM ANALYZE after the
load (autovacuum would get there on its own; the bench does not wait for it).

Queries (rotating through 10 parameter sets each, the same sequence for the relay and
the baseline):
  scope   {"artifact":"current", "#type":[T], "#status":[S], "limit":100}: no #h, so the
          reader's scope is its 200 channels (readable_channels)
  h5      {"artifact":"current", "#h":[5 of the reader's channels], "#status":[S], "limit":100}

Relay side: POST /query over HTTP/1.1 keep-alive with `Authorization: Bearer <token>`
(manage.py token create --scope messages:read), timed from sending the request to
the last byte of the body. Baseline: ONE hand-written SQL statement per request,
executed through psycopg on one connection from this process, that does the same
work: token check, ban check, the reader's scope (memberships and listed open
channels), the predicates, ORDER BY d, LIMIT 100; timed to the last row fetched. Both
sides are verified first to return the same event ids in the same order for every
parameter set. --concurrency 1 (default) runs relay and baseline requests one at a
time, alternating (relay, SQL, relay, SQL, ...), so both see the same machine; with
N > 1 there are N worker threads, each with its own HTTP and SQL connection.

Plans: EXPLAIN (ANALYZE, BUFFERS) of the relay's statement, built by
artifacts.selectors.current_where with the real parameters, and of the hand-written
one; and the plan the relay's own backend actually ran, captured with auto_explain
(session_preload_libraries set for the bench database only, in a separate relay
process, after the prepared statement's first executions). --propose tries an index
proposal in the bench database (plans and latencies before/after; the relay's code is
not touched).

    python bench/query_current.py [--requests 300] [--concurrency 1] [--propose] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import queue
import random
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import artifact_writes
import common
from common import BenchError, Server

TARGET_RATIO = 2.0
CAPTURE_REQUESTS = 40
TYPES = tuple(
    f"buzz.{t}" for t in ("task", "bug", "doc", "decision", "risk", "note", "spec", "incident", "goal", "idea")
)
STATUSES = ("open", "doing", "review", "done", "closed")
AUTHORS = 50
ASSIGNEES = 100
MEMBERS_PER_CHANNEL = 5
DATASET_VERSION = 1
CACHE_DIR = common.VAR_DIR / "query_current"
_WORD_TEXT = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo "
    "sierra tango uniform victor whiskey xray yankee zulu"
)
WORDS = tuple(_WORD_TEXT.split())


# --- the data set ------------------------------------------------------------------------------------


@dataclass
class Dataset:
    channels: list[str]  # channel uuids
    members: list[list[str]]  # per channel: the author pubkeys that are members (first = owner)
    raws: list[str]  # one signed kind-45010 create per artifact

    @property
    def artifacts(self) -> int:
        return len(self.raws)


def generate(n_artifacts: int, n_channels: int, seed: int) -> Dataset:
    from buzz.nostr import Signer
    from buzz.nostr.event import Event, compute_id

    rng = random.Random(seed)
    authors = [Signer(hashlib.sha256(f"bench author {seed} {i}".encode()).hexdigest()) for i in range(AUTHORS)]
    assignees = [hashlib.sha256(f"bench assignee {seed} {i}".encode()).hexdigest() for i in range(ASSIGNEES)]
    channels = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n_channels)]
    members = [[a.pubkey for a in rng.sample(authors, MEMBERS_PER_CHANNEL)] for _ in channels]
    by_pubkey = {a.pubkey: a for a in authors}
    now = int(time.time())
    raws = []
    for i in range(n_artifacts):
        c = rng.randrange(n_channels)
        signer = by_pubkey[members[c][rng.randrange(MEMBERS_PER_CHANNEL)]]
        tags = [
            ["ar", "1"],
            ["d", str(uuid.UUID(int=rng.getrandbits(128), version=4))],
            ["h", channels[c]],
            ["type", rng.choice(TYPES)],
            ["title", " ".join(rng.choices(WORDS, k=4)) + f" #{i}"],
            ["op", "create"],
            ["status", rng.choice(STATUSES)],
            ["assignee", rng.choice(assignees)],
        ]
        content = " ".join(rng.choices(WORDS, k=24))
        created_at = now - rng.randrange(30 * 86400)
        event_id = compute_id(signer.pubkey, created_at, 45010, tags, content)
        sig = signer.sign_digest(bytes.fromhex(event_id))
        ev = Event(event_id, signer.pubkey, created_at, 45010, tuple(tuple(t) for t in tags), content, sig)
        raws.append(ev.to_json())
    return Dataset(channels, members, raws)


def dataset(n_artifacts: int, n_channels: int, seed: int) -> tuple[Dataset, str]:
    """The cached data set for these parameters, generated (and cached) the first time."""
    path = CACHE_DIR / f"dataset-v{DATASET_VERSION}-{n_artifacts}-{n_channels}-s{seed}.jsonl"
    if path.exists():
        with path.open(encoding="utf-8") as f:
            head = json.loads(f.readline())
            raws = [line.rstrip("\n") for line in f]
        if len(raws) == n_artifacts:
            return Dataset(head["channels"], head["members"], raws), f"loaded from {path}"
    t0 = time.perf_counter()
    ds = generate(n_artifacts, n_channels, seed)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"channels": ds.channels, "members": ds.members}) + "\n")
        for raw in ds.raws:
            f.write(raw + "\n")
    tmp.replace(path)
    return ds, f"generated and signed in {time.perf_counter() - t0:.0f} s, cached in {path}"


ARTIFACT_TABLES = ("artifacts_artifact", "artifacts_revision", "artifacts_currenttag")


def load(database_url: str, community_id: int, ds: Dataset, reader: str, reader_channels: list[int]) -> dict[str, Any]:
    """COPY the data set into the tables, as the write path would have written it, then VACUUM ANALYZE.

    For speed the load runs with session_replication_role = replica (no FK triggers: the rows are
    consistent by construction) and the artifact tables' secondary indexes are dropped first and
    created again afterwards from their own definitions (pg_indexes), so the schema ends up as migrated.
    """
    import psycopg

    from artifacts.envelope import match_tags

    t0 = time.perf_counter()
    counts: dict[str, Any] = {"artifacts": 0, "revisions": 0, "current_tags": 0, "channels": 0, "memberships": 0}
    with psycopg.connect(database_url, connect_timeout=10) as conn:
        with conn.cursor() as cur:
            cur.execute("SET LOCAL session_replication_role = replica")
            secondary = cur.execute(
                "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.schemaname = 'public'"
                " AND i.tablename = ANY(%s) AND NOT EXISTS (SELECT 1 FROM pg_constraint c"
                " WHERE c.conname = i.indexname)",
                (list(ARTIFACT_TABLES),),
            ).fetchall()
            for name, _ in secondary:
                cur.execute(f'DROP INDEX "{name}"')
            with cur.copy(
                "COPY buzz_channel (community_id, uuid, name, about, topic, purpose, visibility, listed, type,"
                " created_by, created_at) FROM STDIN"
            ) as copy:
                for i, (ch, mem) in enumerate(zip(ds.channels, ds.members, strict=True)):
                    copy.write_row((community_id, ch, f"bench channel {i}", "", "", "", "private", True, "stream",
                                    mem[0], "now"))  # fmt: skip
            ids: dict[str, int] = dict(
                cur.execute("SELECT uuid::text, id FROM buzz_channel WHERE community_id = %s", (community_id,))
            )
            counts["channels"] = len(ids)
            with cur.copy("COPY buzz_membership (channel_id, pubkey, role, joined_at, read_mark) FROM STDIN") as copy:
                for ch, mem in zip(ds.channels, ds.members, strict=True):
                    for j, pk in enumerate(mem):
                        copy.write_row((ids[ch], pk, "owner" if j == 0 else "member", "now", 0))
                        counts["memberships"] += 1
                for c in reader_channels:
                    copy.write_row((ids[ds.channels[c]], reader, "member", "now", 0))
                    counts["memberships"] += 1
            events = [json.loads(raw) for raw in ds.raws]
            with cur.copy(
                "COPY artifacts_artifact (id, community_id, d, type, head_id, home, root, deleted, retired,"
                " created_at, changed_at) FROM STDIN"
            ) as copy:
                for i, ev in enumerate(events, 1):
                    t = {tag[0]: tag[1] for tag in ev["tags"]}
                    at = time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(ev["created_at"]))
                    copy.write_row((i, community_id, t["d"], t["type"], ev["id"], t["h"], None, False, False, at, at))
            with cur.copy(
                "COPY artifacts_revision (id, community_id, artifact_id, op, channel, prev, root, pubkey, created_at,"
                " raw, seq, accepted_at) FROM STDIN"
            ) as copy:
                for i, (ev, raw) in enumerate(zip(events, ds.raws, strict=True), 1):
                    t = {tag[0]: tag[1] for tag in ev["tags"]}
                    at = time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(ev["created_at"]))
                    copy.write_row((ev["id"], community_id, i, "create", t["h"], None, None, ev["pubkey"],
                                    ev["created_at"], raw, i, at))  # fmt: skip
            with cur.copy("COPY artifacts_currenttag (artifact_id, name, value) FROM STDIN") as copy:
                for i, ev in enumerate(events, 1):
                    for name, value in match_tags(SimpleNamespace(tags=ev["tags"])):  # type: ignore[arg-type]
                        copy.write_row((i, name, value))
                        counts["current_tags"] += 1
            n = len(events)
            counts["artifacts"] = counts["revisions"] = n
            cur.execute("SELECT setval('artifacts_accept_seq', %s)", (n,))
            cur.execute("SELECT setval(pg_get_serial_sequence('artifacts_artifact', 'id'), %s)", (n,))
            for _, definition in secondary:
                cur.execute(definition)
        conn.commit()
    counts["load_s"] = time.perf_counter() - t0
    counts["rebuilt_indexes"] = [name for name, _ in secondary]
    t1 = time.perf_counter()
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        for table in (*ARTIFACT_TABLES, "buzz_channel", "buzz_membership", "buzz_apitoken",
                      "buzz_ban", "buzz_timeout"):  # fmt: skip
            conn.execute(f"VACUUM (ANALYZE) {table}")
    counts["vacuum_s"] = time.perf_counter() - t1
    return counts


# --- the two queries ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuerySpec:
    name: str
    filters: list[dict[str, Any]]  # one filter per parameter set, used in rotation


def query_specs(ds: Dataset, reader_channels: list[int]) -> list[QuerySpec]:
    scope = [
        {"artifact": "current", "#type": [TYPES[k]], "#status": [STATUSES[(k * 3) % len(STATUSES)]], "limit": 100}
        for k in range(10)
    ]
    h5 = [
        {
            "artifact": "current",
            "#h": [ds.channels[reader_channels[(5 * k + j) % len(reader_channels)]] for j in range(5)],
            "#status": [STATUSES[k % len(STATUSES)]],
            "limit": 100,
        }
        for k in range(10)
    ]
    return [QuerySpec("scope", scope), QuerySpec("h5", h5)]


# The hand-written statement: the checks, the scope and the predicates in one query. Its shape is fixed on
# purpose: the candidates come from the scope (artifact_home index), each candidate is probed in the tag
# index (EXISTS ... OFFSET 0 keeps the probe a per-row subplan), and only the page of 100 is joined to its
# revision. MATERIALIZED keeps the planner from turning it back into a scan of every artifact carrying the
# tag value (its estimate for the (name, md5(value), value) clauses is far too low, see the plans).
BASELINE_SQL = """
WITH auth AS (
  SELECT k.pubkey FROM buzz_apitoken k
  WHERE k.token_hash = %(token_hash)s AND k.community_id = %(community)s AND k.revoked_at IS NULL
    AND (k.expires_at IS NULL OR k.expires_at > now()) AND k.scopes ? 'messages:read'
    AND NOT EXISTS (SELECT 1 FROM buzz_ban b WHERE b.community_id = %(community)s AND b.pubkey = k.pubkey
                    AND b.lifted_at IS NULL AND (b.expires_at IS NULL OR b.expires_at > now()))
), scope AS (
  SELECT c.uuid FROM buzz_channel c
  WHERE c.community_id = %(community)s AND c.deleted_at IS NULL {channel_filter}
    AND (c.id IN (SELECT m.channel_id FROM buzz_membership m, auth
                  WHERE m.pubkey = auth.pubkey AND m.removed_at IS NULL)
         OR (c.visibility = 'open' AND c.type <> 'dm' AND {open_ok} AND EXISTS (SELECT 1 FROM auth)))
), candidates AS MATERIALIZED (
  SELECT a.id, a.d, a.head_id FROM artifacts_artifact a
  WHERE a.community_id = %(community)s AND a.home IN (SELECT uuid FROM scope) AND NOT a.deleted AND NOT a.retired
    {column_predicates}
), page AS MATERIALIZED (
  SELECT c.d, c.head_id FROM candidates c
  WHERE true {tag_predicates}
  ORDER BY c.d LIMIT %(limit)s
)
SELECT r.raw FROM page JOIN artifacts_revision r ON r.community_id = %(community)s AND r.id = page.head_id
ORDER BY page.d
"""


def baseline_statement(f: dict[str, Any], community: int, token_hash: str) -> tuple[str, dict[str, Any]]:
    """The hand-written query for one filter: #h narrows the scope (all must be readable), #type is the
    type column, any other #tag a probe of the current-tag index."""
    params: dict[str, Any] = {"community": community, "token_hash": token_hash, "limit": f.get("limit", 100)}
    columns: list[str] = []
    tags: list[str] = []
    channel_filter = ""
    open_ok = "c.listed"
    for key, values in f.items():
        if not key.startswith("#"):
            continue
        name = key[1:]
        if name == "h":
            channel_filter = "AND c.uuid = ANY(%(h)s::uuid[])"
            open_ok = "true"  # an explicitly named open channel is readable even when unlisted
            params["h"] = values
        elif name == "type":
            columns.append("AND a.type = ANY(%(type)s)")
            params["type"] = values
        else:
            p = f"t{len(tags)}"
            tags.append(
                f"AND EXISTS (SELECT 1 FROM artifacts_currenttag t WHERE t.artifact_id = c.id AND t.name = %({p}_n)s"  # noqa: S608 - placeholders only
                f" AND md5(t.value) = ANY(%({p}_m)s) AND t.value = ANY(%({p}_v)s) OFFSET 0)"
            )
            params[f"{p}_n"], params[f"{p}_v"] = name, values
            params[f"{p}_m"] = [hashlib.md5(v.encode(), usedforsecurity=False).hexdigest() for v in values]
    sql = BASELINE_SQL.format(channel_filter=channel_filter, open_ok=open_ok, column_predicates=" ".join(columns),
                              tag_predicates="\n    ".join(tags))  # fmt: skip
    return sql, params


def relay_statement(f: dict[str, Any], community: int, channels: list[uuid.UUID]) -> tuple[str, list[Any]]:
    """The statement artifacts.selectors.query_events runs, built by its own current_where."""
    from artifacts import selectors
    from artifacts.query import parse_query_body

    q = parse_query_body([f])
    actor = SimpleNamespace(community=SimpleNamespace(id=community))
    where, args = selectors.current_where(actor, q, channels)  # type: ignore[arg-type]
    table, order = selectors._FROM[q.mode]
    sql = f"SELECT r.raw FROM {table} WHERE {where} ORDER BY {order} LIMIT %s OFFSET %s"  # noqa: S608 - as selectors does
    return sql, [*args, q.limit, q.offset]


def setup_django(env: dict[str, str]) -> None:
    for key in ("DATABASE_URL", "REDIS_URL", "BUZZ_DEV"):
        os.environ[key] = env[key]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "buzz.settings")
    import django

    django.setup()


# --- clients --------------------------------------------------------------------------------------------------


class RelayHttp:
    """One keep-alive HTTP/1.1 connection to the relay, sending the community's Host header."""

    def __init__(self, relay: Server, token: str) -> None:
        self.relay, self.token = relay, token
        self.conn = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=30)

    def query(self, f: dict[str, Any]) -> bytes:
        body = json.dumps([f], separators=(",", ":"))
        headers = {"Host": self.relay.host_header, "Authorization": f"Bearer {self.token}",
                   "Content-Type": "application/json"}  # fmt: skip
        self.conn.request("POST", "/query", body=body, headers=headers)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise BenchError(f"POST /query answered {resp.status}: {data[:300]!r}")
        return data

    def close(self) -> None:
        self.conn.close()


class Baseline:
    def __init__(self, database_url: str, community: int, token_hash: str) -> None:
        import psycopg

        self.conn = psycopg.connect(database_url, autocommit=True, connect_timeout=10)
        self.community, self.token_hash = community, token_hash

    def query(self, f: dict[str, Any]) -> list[str]:
        sql, params = baseline_statement(f, self.community, self.token_hash)
        return [r[0] for r in self.conn.execute(sql, params).fetchall()]

    def close(self) -> None:
        self.conn.close()


def ids_of_relay(body: bytes) -> list[str]:
    return [e["id"] for e in json.loads(body)]


def ids_of_rows(rows: list[str]) -> list[str]:
    return [json.loads(r)["id"] for r in rows]


@dataclass
class Latencies:
    relay: list[float] = field(default_factory=list)
    sql: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        r, s = sorted(self.relay), sorted(self.sql)
        out = {
            "requests": len(r),
            "relay_p50_ms": common.percentile(r, 50),
            "relay_p99_ms": common.percentile(r, 99),
            "sql_p50_ms": common.percentile(s, 50),
            "sql_p99_ms": common.percentile(s, 99),
            "rows_mean": sum(self.rows) / max(1, len(self.rows)),
            "seconds": self.seconds,
        }
        out["ratio_p50"] = out["relay_p50_ms"] / out["sql_p50_ms"] if out["sql_p50_ms"] else float("nan")
        out["ratio_p99"] = out["relay_p99_ms"] / out["sql_p99_ms"] if out["sql_p99_ms"] else float("nan")
        return out


def timed_run(relay: Server, token: str, db_url: str, community: int, token_hash: str, spec: QuerySpec,
              requests: int, concurrency: int, warmup: int) -> Latencies:  # fmt: skip
    """`requests` relay requests and as many baseline queries, alternating, on `concurrency` workers."""
    out = Latencies()
    work: queue.Queue[int] = queue.Queue()
    for i in range(requests):
        work.put(i)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        http_client = RelayHttp(relay, token)
        base = Baseline(db_url, community, token_hash)
        try:
            for i in range(warmup):
                f = spec.filters[(i + w) % len(spec.filters)]
                http_client.query(f)
                base.query(f)
            barrier.wait(60)
            while True:
                try:
                    i = work.get_nowait()
                except queue.Empty:
                    return
                f = spec.filters[i % len(spec.filters)]
                t0 = time.perf_counter()
                body = http_client.query(f)
                t1 = time.perf_counter()
                rows = base.query(f)
                t2 = time.perf_counter()
                with lock:
                    out.relay.append(1000 * (t1 - t0))
                    out.sql.append(1000 * (t2 - t1))
                    out.rows.append(len(rows))
                del body
        except BaseException as err:
            errors.append(err)
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.abort()
        finally:
            http_client.close()
            base.close()

    barrier = threading.Barrier(concurrency + 1)
    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(concurrency)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(120)
    t0 = time.perf_counter()
    for t in threads:
        t.join(600)
    out.seconds = time.perf_counter() - t0
    if errors:
        raise BenchError(f"a query worker failed: {type(errors[0]).__name__}: {errors[0]}")
    return out


def verify_same(relay: Server, token: str, db_url: str, community: int, token_hash: str,
                spec: QuerySpec) -> list[str]:  # fmt: skip
    """Every parameter set: the relay's ids == the baseline's ids, same order. Returns mismatch notes."""
    http_client = RelayHttp(relay, token)
    base = Baseline(db_url, community, token_hash)
    notes = []
    try:
        for k, f in enumerate(spec.filters):
            a, b = ids_of_relay(http_client.query(f)), ids_of_rows(base.query(f))
            if a != b:
                notes.append(f"{spec.name}[{k}]: relay {len(a)} ids, baseline {len(b)} ids, differ")
            elif not a:
                notes.append(
                    f"{spec.name}[{k}]: both empty (a test that says nothing; with fewer --artifacts than the"
                    " default, some filters match no row)"
                )
    finally:
        http_client.close()
        base.close()
    return notes


# --- plans ---------------------------------------------------------------------------------------------------------


def explain(db_url: str, sql: str, params: Any, settings: dict[str, str] | None = None) -> str:
    import psycopg

    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn, conn.transaction():
        for k, v in (settings or {}).items():
            conn.execute(f"SET LOCAL {k} = {v}")
        conn.execute(sql, params)  # warm the cache: the timed runs see warm buffers too
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()
    return "\n".join(r[0] for r in rows)


def generic_plan(db_url: str, sql: str, params: list[Any]) -> str:
    """EXPLAIN ANALYZE of the statement as a prepared statement forced onto its generic plan."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        n = 0

        def dollar(_: Any) -> str:
            nonlocal n
            n += 1
            return f"${n}"

        text = re.sub(r"%s", dollar, sql)
        with conn.cursor() as cur:
            cur.execute("PREPARE bench_relay_stmt AS " + text)  # parameter types are inferred
            literal = ", ".join(_literal(conn, p) for p in params)
            rows = cur.execute(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_relay_stmt({literal})").fetchall()
    return "\n".join(r[0] for r in rows)


def _literal(conn: Any, value: Any) -> str:
    from psycopg import sql

    if isinstance(value, list) and value and isinstance(value[0], uuid.UUID):
        return sql.Literal([str(v) for v in value]).as_string(conn) + "::uuid[]"
    if isinstance(value, list):
        return sql.Literal(value).as_string(conn) + "::text[]"
    return sql.Literal(value).as_string(conn)


_PLAN_LINE = re.compile(r"duration: ([0-9.]+) ms  plan:")


def auto_explain_capture(log_text: str, dbname: str, marker: str) -> list[tuple[float, str]]:
    """(duration ms, plan text) of every auto_explain entry of the database whose query text holds marker."""
    out = []
    entry: list[str] | None = None
    duration = 0.0
    ours = False

    def flush() -> None:
        if entry is not None and ours and marker in "\n".join(entry):
            out.append((duration, "\n".join(entry)))

    for line in log_text.splitlines():
        if line.startswith("\t"):
            if entry is not None:
                entry.append(line[1:])
            continue
        flush()
        entry = None
        m = _PLAN_LINE.search(line)
        if m:
            duration = float(m.group(1))
            ours = f"@{dbname} " in line or "@" not in line
            entry = []
    flush()
    return out


def trim_plan(plan: str, limit: int = 40) -> str:
    """The plan without its Query Text line, at most `limit` lines."""
    keep = [ln for ln in plan.splitlines() if ln.strip() and not ln.startswith("Query Text:")]
    if len(keep) > limit:
        keep = [*keep[:limit], f"... ({len(keep) - limit} more lines)"]
    return "\n".join(keep)


def execution_ms(plan: str) -> float:
    m = re.search(r"Execution Time: ([0-9.]+) ms", plan)
    return float(m.group(1)) if m else float("nan")


# --- main ------------------------------------------------------------------------------------------------


def reader_scope(ds: Dataset, n: int) -> list[int]:
    """Every (channels / n)-th channel: the reader's channels."""
    step = max(1, len(ds.channels) // n)
    return list(range(0, len(ds.channels), step))[:n]


def issue_token(env: dict[str, str], relay: Server, pubkey: str) -> str:
    out = common.checked(
        common.manage(env, "token", "create", "--host", relay.host_header, pubkey, "--scope", "messages:read"),
        "manage.py token create",
    )
    for line in out.splitlines():
        if line.strip().startswith("buzz_"):
            return line.strip()
    raise BenchError(f"no token in the output of manage.py token create:\n{out}")


def community_id(db_url: str, host: str) -> int:
    import psycopg

    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT id FROM buzz_community WHERE host = %s", (host,)).fetchone()
    if row is None:
        raise BenchError(f"no community for {host}")
    return int(row[0])


@dataclass(frozen=True)
class Step:
    name: str
    what: str
    settings: dict[str, str]  # ALTER DATABASE ... SET, for the relay processes started from this step on
    sql: tuple[str, ...]  # run once in the bench database
    undo: tuple[str, ...]


# Cumulative: each step keeps the ones before it.
PROPOSAL_STEPS = (
    Step(
        "custom plans",
        "plan_cache_mode = force_custom_plan for the relay's sessions (ALTER DATABASE here; in the relay: SET LOCAL "
        "in its read transaction, or prepare=False for this statement)",
        {"plan_cache_mode": "force_custom_plan"},
        (),
        (),
    ),
    Step(
        "+ statistics",
        "CREATE STATISTICS (mcv, dependencies) ON name, value, md5(value) FROM artifacts_currenttag",
        {},
        (
            "CREATE STATISTICS bench_currenttag_match (mcv, dependencies) ON name, value, md5(value)"
            " FROM artifacts_currenttag",
            "ANALYZE artifacts_currenttag",
        ),
        ("DROP STATISTICS IF EXISTS bench_currenttag_match", "ANALYZE artifacts_currenttag"),
    ),
    Step(
        "+ scope index",
        "CREATE INDEX ON artifacts_artifact (community_id, home, type, d) INCLUDE (id, head_id) "
        "WHERE NOT deleted AND NOT retired",
        {},
        (
            "CREATE INDEX bench_artifact_scope ON artifacts_artifact (community_id, home, type, d)"
            " INCLUDE (id, head_id) WHERE NOT deleted AND NOT retired",
            "VACUUM (ANALYZE) artifacts_artifact",
        ),
        ("DROP INDEX IF EXISTS bench_artifact_scope",),
    ),
)


def run_sql(db_url: str, statements: tuple[str, ...]) -> None:
    import psycopg

    with psycopg.connect(db_url, autocommit=True, connect_timeout=10) as conn:
        for statement in statements:
            conn.execute(statement)


@dataclass
class Context:
    env: dict[str, str]
    db_url: str
    community: int
    token: str
    token_hash: str
    specs: list[QuerySpec]
    scope_uuids: list[uuid.UUID]
    args: Any
    # Built once, right after the relay started, from the same artifacts.selectors the relay imported.
    relay_sql: dict[str, tuple[str, list[Any]]] = field(default_factory=dict)


def measure_phase(ctx: Context, relay: Server, name: str, requests: int, *, generic: bool) -> dict[str, Any]:
    """Same-answer check, timed runs and plans of both queries against one relay process."""
    out: dict[str, Any] = {"mismatches": [], "queries": {}, "plans": {}}
    for spec in ctx.specs:
        out["mismatches"] += verify_same(relay, ctx.token, ctx.db_url, ctx.community, ctx.token_hash, spec)
    same = "yes, every parameter set" if not out["mismatches"] else "NO: " + "; ".join(out["mismatches"])
    print(f"[{name}] same event ids in the same order, relay vs hand-written: {same}", flush=True)
    for spec in ctx.specs:
        lat = timed_run(relay, ctx.token, ctx.db_url, ctx.community, ctx.token_hash, spec, requests,
                        ctx.args.concurrency, ctx.args.warmup)  # fmt: skip
        s = lat.summary()
        out["queries"][spec.name] = s
        print(
            f"[{name}] {spec.name:<6} relay POST /query p50 {s['relay_p50_ms']:7.2f} ms p99 {s['relay_p99_ms']:7.2f} ms"
            f" | SQL p50 {s['sql_p50_ms']:7.2f} ms p99 {s['sql_p99_ms']:7.2f} ms | ratio p50 {s['ratio_p50']:.2f}"
            f" p99 {s['ratio_p99']:.2f} | {s['rows_mean']:.0f} rows, {s['requests']} requests",
            flush=True,
        )
    for spec in ctx.specs:
        rsql, rargs = ctx.relay_sql[spec.name]
        bsql, bargs = baseline_statement(spec.filters[0], ctx.community, ctx.token_hash)
        plans = {
            "relay_sql": rsql,
            "relay": explain(ctx.db_url, rsql, rargs),
            "baseline": explain(ctx.db_url, bsql, bargs),
        }
        if generic:
            plans["relay_generic"] = generic_plan(ctx.db_url, rsql, rargs)
        out["plans"][spec.name] = plans
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=int, default=200_000)
    parser.add_argument("--channels", type=int, default=2_000)
    parser.add_argument("--reader-channels", type=int, default=200)
    parser.add_argument("--requests", type=int, default=300, help="timed requests per query (and as many SQL)")
    parser.add_argument("--propose-requests", type=int, default=100, help="timed requests per query per proposal step")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests per worker first")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--db", default="bench_query_current", help="scratch database (bench*), recreated")
    parser.add_argument("--propose", action="store_true", help="measure the proposals too (plans and latencies)")
    parser.add_argument("--no-capture", action="store_true", help="skip the auto_explain capture")
    parser.add_argument("--json", help="also write the figures to this file")
    common.add_app_option(parser)
    args = parser.parse_args(argv)
    if not (args.db.startswith("bench") and 1 <= args.concurrency <= 64 and args.requests >= 1):
        parser.error("--db must start with bench; --concurrency in 1..64; --requests >= 1")
    if args.reader_channels > args.channels:
        parser.error("--reader-channels <= --channels")

    common.exit_on_sigterm()
    common.header(
        "query_current: POST /query, NIP-AR current view, vs one hand-written SQL query",
        [
            f"{args.artifacts} artifacts over {args.channels} private channels; the reader is a member of "
            f"{args.reader_channels}",
            f"{args.requests} timed requests per query after {args.warmup} warm-up, "
            + ("sequential, relay and SQL alternating" if args.concurrency == 1 else f"{args.concurrency} workers"),
            "relay: HTTP/1.1 keep-alive, Authorization: Bearer (messages:read); baseline: psycopg, one statement",
            "relay files: "
            + artifact_writes.files_digest(
                (
                    "artifacts/selectors.py",
                    "artifacts/query.py",
                    "buzz/access/policy.py",
                    "buzz/identity/tokens.py",
                    "buzz/runtime.py",
                )
            ),
            *(
                ["then the proposals, cumulatively: " + "; ".join(s.name for s in PROPOSAL_STEPS)]
                if args.propose
                else []
            ),
        ],
    )
    from buzz.nostr import Signer

    ds, how = dataset(args.artifacts, args.channels, args.seed)
    print(f"data set: {how}", flush=True)
    reader = Signer.generate()
    chans = reader_scope(ds, args.reader_channels)
    results: dict[str, Any] = {"benchmark": "query_current", "nproc": common.nproc(), "concurrency": args.concurrency,
                               "requests": args.requests, "phases": {}}  # fmt: skip
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        env["DATABASE_URL"] = common.with_dbname(env["DATABASE_URL"], args.db)
        db_url = env["DATABASE_URL"]
        others = common.other_sessions_on(db_url, args.db)
        if others:
            raise BenchError(
                "another session is using the scratch database; not dropping it:\n  " + "\n  ".join(others)
            )
        setup_django(env)
        relay = common.start_relay(stack, env, [reader.pubkey], app=args.app, app_dir=args.app_dir)
        import artifacts.selectors  # noqa: F401 - now, so it is the code the relay just imported

        community = community_id(db_url, relay.host_header)
        token = issue_token(env, relay, reader.pubkey)
        counts = load(db_url, community, ds, reader.pubkey, chans)
        print(
            f"loaded {counts['artifacts']} artifacts + revisions, {counts['current_tags']} current tags, "
            f"{counts['channels']} channels, {counts['memberships']} memberships in {counts['load_s']:.0f} s; "
            f"VACUUM ANALYZE {counts['vacuum_s']:.0f} s",
            flush=True,
        )
        results["dataset"] = counts
        ctx = Context(env, db_url, community, token, hashlib.sha256(token.encode()).hexdigest(),
                      query_specs(ds, chans), [uuid.UUID(ds.channels[c]) for c in chans], args)  # fmt: skip
        for spec in ctx.specs:
            f = spec.filters[0]
            channels = [uuid.UUID(h) for h in f["#h"]] if "#h" in f else ctx.scope_uuids
            ctx.relay_sql[spec.name] = relay_statement(f, community, channels)
        results["phases"]["as is"] = measure_phase(ctx, relay, "as is", args.requests, generic=True)
        if not args.no_capture:
            results["phases"]["as is"]["captured"] = capture_relay_plans(stack, env, relay, token, ctx.specs, args.db)
        common.stop_process(relay.proc)

        if args.propose:
            undo: list[str] = []
            try:
                with contextlib.ExitStack() as settings_stack:
                    for step in PROPOSAL_STEPS:
                        if step.settings:
                            settings_stack.enter_context(common.database_settings(db_url, step.settings))
                        run_sql(db_url, step.sql)
                        undo = [*step.undo, *undo]
                        print(f"[{step.name}] {step.what}", flush=True)
                        node = common.start_relay_node(stack, env, relay, name="relay-proposal")
                        try:
                            results["phases"][step.name] = measure_phase(
                                ctx, node, step.name, args.propose_requests, generic=False
                            )
                        finally:
                            common.stop_process(node.proc)
                    if not args.no_capture:
                        results["phases"][PROPOSAL_STEPS[-1].name]["captured"] = capture_relay_plans(
                            stack, env, relay, token, ctx.specs, args.db
                        )
            finally:
                run_sql(db_url, tuple(undo))

    print_report(results)
    common.write_json(args.json, results)
    failed = any(p["mismatches"] for p in results["phases"].values())
    return 1 if failed else 0


def capture_relay_plans(stack: contextlib.ExitStack, env: dict[str, str], relay: Server, token: str,
                        specs: list[QuerySpec], dbname: str) -> dict[str, Any]:  # fmt: skip
    """The plans the relay's own backends run, from auto_explain in a separate relay process."""
    try:
        log = common.ServerLog(env["DATABASE_URL"])
    except BenchError as err:
        return {"error": str(err)}
    settings = {
        "session_preload_libraries": "auto_explain",
        "auto_explain.log_min_duration": "0",
        "auto_explain.log_analyze": "on",
        "auto_explain.log_buffers": "on",
        "auto_explain.log_timing": "on",
        "auto_explain.log_nested_statements": "off",
        # Every statement too (BEGIN, SET and COMMIT included): the round trips of one request.
        "log_statement": "all",
        "log_parameter_max_length": "0",
    }
    out: dict[str, Any] = {}
    with common.database_settings(env["DATABASE_URL"], settings):
        node = common.start_relay_node(stack, env, relay, name="relay-explain")
        try:
            for spec in specs:
                client = RelayHttp(node, token)
                start = log.wait_quiet()
                try:
                    # Past psycopg's prepare threshold and the server's five custom plans, on every pooled connection.
                    for i in range(CAPTURE_REQUESTS):
                        client.query(spec.filters[i % len(spec.filters)])
                finally:
                    client.close()
                text = log.read(start, log.wait_quiet())
                found = auto_explain_capture(text, dbname, "ORDER BY a.d")
                statements = artifact_writes.statement_lines(text, dbname)
                by: dict[str, int] = {}
                for _, sql in statements:
                    key = artifact_writes.statement_key(sql)
                    by[key] = by.get(key, 0) + 1
                out[spec.name] = {
                    "statements_per_request": len(statements) / CAPTURE_REQUESTS,
                    "by_statement": {k: v / CAPTURE_REQUESTS for k, v in by.items()},
                    "count": len(found),
                    "first": found[0][1] if found else "",
                    "last": found[-1][1] if found else "",
                    "durations_ms": [d for d, _ in found],
                }
        finally:
            common.stop_process(node.proc)
    return out


def print_report(results: dict[str, Any]) -> None:
    phases = results.get("phases", {})
    print("-" * 78)
    for phase, data in phases.items():
        for name, p in data.get("plans", {}).items():
            if phase == "as is":
                print(f"[{phase}] [{name}] relay statement (built by artifacts.selectors.current_where):")
                print("    " + " ".join(p["relay_sql"].split())[:400])
            label = "custom plan" if phase == "as is" else "custom plan (what the relay runs under force_custom_plan)"
            print(f"[{phase}] [{name}] EXPLAIN (ANALYZE, BUFFERS) relay statement, real parameters, {label}:")
            print("    " + trim_plan(p["relay"]).replace("\n", "\n    "))
            if "relay_generic" in p:
                print(f"[{phase}] [{name}] relay statement as a prepared statement, generic plan:")
                print("    " + trim_plan(p["relay_generic"]).replace("\n", "\n    "))
            print(f"[{phase}] [{name}] EXPLAIN (ANALYZE, BUFFERS) hand-written statement:")
            print("    " + trim_plan(p["baseline"], 60).replace("\n", "\n    "))
        for name, c in data.get("captured", {}).items():
            if name == "error":
                print(f"[{phase}] auto_explain capture: {c}")
                continue
            durations = ", ".join(f"{d:.0f}" for d in c["durations_ms"])
            print(
                f"[{phase}] [{name}] auto_explain in the relay's own backends: {c['count']} executions, ms: {durations}"
            )
            print(f"    database round trips per POST /query (log_statement=all): {c['statements_per_request']:.2f}")
            for key, n in sorted(c["by_statement"].items(), key=lambda kv: -kv[1]):
                print(f"      {n:5.2f}  {key}")
            if c["last"]:
                same = _shape(c["first"]) == _shape(c["last"])
                print(
                    f"    plan of the last one ({'same shape as the first' if same else 'NOT the shape of the first'}):"
                )
                print("    " + trim_plan(c["last"]).replace("\n", "\n    "))
    print("=" * 78)
    print(f"{'phase / query':<28}{'relay p50':>10}{'p99':>9}{'SQL p50':>9}{'p99':>9}{'ratio p50':>10}{'p99':>7}  same")
    for phase, data in phases.items():
        for name, s in data.get("queries", {}).items():
            print(
                f"{phase + ' / ' + name:<28}{s['relay_p50_ms']:10.2f}{s['relay_p99_ms']:9.2f}{s['sql_p50_ms']:9.2f}"
                f"{s['sql_p99_ms']:9.2f}{s['ratio_p50']:10.2f}{s['ratio_p99']:7.2f}"
                f"  {'yes' if not data['mismatches'] else 'NO'}"
            )
    print(f"(ms; ratio = relay POST /query latency / hand-written SQL latency, same run; target <= {TARGET_RATIO:g})")


def _shape(plan: str) -> list[str]:
    return [
        re.sub(r"\(.*", "", ln).strip() for ln in plan.splitlines() if "->" in ln or ln.lstrip().startswith("Limit")
    ]


if __name__ == "__main__":
    common.run_main(main)
