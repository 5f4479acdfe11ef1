"""Benchmark: NIP-AR incremental reads over POST /query, beside hand-written SQL returning the same rows.

Data set: --artifacts current heads (default 100,000) of type buzz.task, over --channels private channels
(default 4) that the reader is a member of (manage.py channel create / add-member, the product path), so
every artifact is readable. The heads and their create revisions are seeded in one INSERT ... SELECT
generate_series each, as the write path stores them (raw = the event's JSON; the signatures are
placeholders, which no read checks), with head changes spread over the day before and the memberships two days old, so
they are older than any later pass's window (a grant in the window would replay its channel).
VACUUM ANALYZE after the load.

Figures, each beside its baseline in the same run, alternating (relay, SQL, relay, SQL, ...):
  initial  a full initial pass {"artifact":"incremental","query":{"artifact":"current","#type":["buzz.task"]}}
           over HTTP/1.1 keep-alive with a bearer token: every page (100 rows) to its last byte, JSON
           decoded, following nextCursor to the checkpoint. The client writes each request in one send
           and parses the response with httptools (C), as psycopg parses the baseline's in C.
           Baseline: the same keyset pages as hand-written SQL (ORDER BY changed_at, d LIMIT 100, on the
           reader's channels), fetched through psycopg on one connection.
  (reference) the same initial pass through the standard library's http.client (headers parsed in
           Python: about 0.1 ms more per page), in the same alternation; the same initial pass
           in-process (artifacts.incremental.read_page, no HTTP or authentication), once; one
           ordinary current-view POST /query of 100 rows, per page; and the CPU each initial pass cost a
           page, relay and SQL alike: the relay process's, this client's, and the rest of the machine's
           (PostgreSQL), from /proc, medians.
  later    1,000 heads then change (one UPDATE ... FROM a revision INSERT, changed_at = clock_timestamp()),
           and a later pass from the initial pass's checkpoint (repeatable: the window keeps them), 21
           times per side (at least --runs).
           Baseline: hand-written SQL paging the head changes in the window [start - 120 s, now].
Both sides are checked first to return the same (artifact id, head event id) sequence.

    python bench/incremental.py [--artifacts 100000] [--channels 4] [--runs 3] [--json out.json]
                                [--profile DIR]   (py-spy the relay over extra initial passes, after the timed ones)
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import secrets
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httptools

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import BenchError, Server

QUERY = {"artifact": "current", "#type": ["buzz.task"]}
PAGE_ROWS = 100
OVERLAP_S = 120
# Timed later passes per side (at least --runs).
LATER_RUNS = 21

_SEED_HEADS = """
INSERT INTO artifacts_artifact (community_id, d, type, head_id, home, root, deleted, retired, p_tags, created_at,
                                changed_at)
SELECT %(community)s, md5('d' || i)::uuid, 'buzz.task', md5('r' || i) || md5('s' || i),
       (%(channels)s::uuid[])[1 + i %% %(k)s], NULL, false, false, '{}', now(),
       now() - interval '1 day' + i * interval '1 millisecond'
FROM generate_series(1, %(n)s) AS i
"""

# The revision's raw is the event as stored (key order id, pubkey, created_at, kind, tags, content, sig).
_RAW = """json_build_object(
  'id', {id}, 'pubkey', %(pubkey)s::text, 'created_at', 1796000000, 'kind', 45010,
  'tags', json_build_array(json_build_array('ar', '1'), json_build_array('d', a.d::text),
          json_build_array('h', a.home::text), json_build_array('type', 'buzz.task'),
          json_build_array('title', 'Task ' || a.id), json_build_array('op', {op}){prev}),
  'content', '{{"version":1,"n":' || a.id || '}}', 'sig', repeat('0', 128))::text"""

_SEED_REVISIONS = f"""
INSERT INTO artifacts_revision (seq, id, community_id, artifact_id, op, channel, prev, root, pubkey, created_at, raw,
                                accepted_at)
SELECT nextval('artifacts_accept_seq'), a.head_id, a.community_id, a.id, 'create', a.home, NULL, NULL, %(pubkey)s::text,
       1796000000, {_RAW.format(id="a.head_id", op="'create'", prev="")}, a.changed_at
FROM artifacts_artifact a WHERE a.community_id = %(community)s
"""  # noqa: S608 - composed from constants

_CHANGE = f"""
WITH pick AS (
  SELECT a.id FROM artifacts_artifact a WHERE a.community_id = %(community)s ORDER BY a.id %(step)s
), rev AS (
  INSERT INTO artifacts_revision (seq, id, community_id, artifact_id, op, channel, prev, root, pubkey, created_at, raw,
                                  accepted_at)
  SELECT nextval('artifacts_accept_seq'), md5('u' || a.id || %(salt)s) || md5('v' || a.id || %(salt)s), a.community_id,
         a.id, 'update', a.home, a.head_id, NULL, %(pubkey)s::text, 1796000000,
         {
    _RAW.format(
        id="md5('u' || a.id || %(salt)s) || md5('v' || a.id || %(salt)s)",
        op="'update'",
        prev=", json_build_array('prev', a.head_id)",
    )
},
         clock_timestamp()
  FROM artifacts_artifact a JOIN pick ON pick.id = a.id
  RETURNING artifact_id, id
)
UPDATE artifacts_artifact a SET head_id = rev.id, changed_at = clock_timestamp() FROM rev WHERE a.id = rev.artifact_id
"""  # noqa: S608 - composed from constants

_BASELINE = """
SELECT a.changed_at, a.d, r.raw FROM artifacts_artifact a
JOIN artifacts_revision r ON r.community_id = a.community_id AND r.id = a.head_id
WHERE a.community_id = %s AND a.home = ANY(%s) AND NOT a.deleted AND NOT a.retired AND a.type = 'buzz.task'
  AND a.changed_at >= %s AND a.changed_at <= %s AND (a.changed_at, a.d) > (%s, %s::uuid)
ORDER BY a.changed_at, a.d LIMIT %s
"""


def _id_of(raw: str) -> str:
    return str(json.loads(raw)["id"])


class Relay:
    """POST /query on one keep-alive connection, with a bearer token: the request written in one send, the
    response parsed by httptools (the C parser uvicorn uses), so a page costs the client about what a
    psycopg page costs the baseline's client. `StdlibRelay` is the same client through http.client."""

    def __init__(self, server: Server, token: str) -> None:
        self.server, self.token = server, token
        self.sock: socket.socket | None = None

    def _head(self, length: int) -> bytes:
        return (
            f"POST /query HTTP/1.1\r\nHost: {self.server.host_header}\r\nAuthorization: Bearer {self.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        ).encode()

    def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=60)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = self.sock
        parts: list[bytes] = []
        complete: list[bool] = []

        class Response:
            def on_body(self, body: bytes) -> None:
                parts.append(body)

            def on_message_complete(self) -> None:
                complete.append(True)

        parser = httptools.HttpResponseParser(Response())
        sock.sendall(request)
        while not complete:
            data = sock.recv(1 << 18)
            if not data:
                raise ConnectionError("the relay closed the connection")
            parser.feed_data(data)
        return parser.get_status_code(), b"".join(parts)

    def post(self, body: Any) -> Any:
        data = json.dumps(body).encode()
        request = self._head(len(data)) + data
        try:
            status, payload = self._exchange(request)
        except (OSError, httptools.HttpParserError):
            # uvicorn closes a keep-alive connection idle for 5 s (while the baseline ran): open a new one.
            if self.sock is not None:
                self.sock.close()
            self.sock = None
            status, payload = self._exchange(request)
        if status != 200:
            raise BenchError(f"POST /query: {status} {payload[:300]!r}")
        return json.loads(payload)

    def run(self, checkpoint: str | None) -> tuple[list[tuple[str, str]], str, int, str]:
        """One pass: ((artifact id, head id) in order, its checkpoint, pages, startedAt)."""
        rows: list[tuple[str, str]] = []
        extra: dict[str, Any] = {} if checkpoint is None else {"checkpoint": checkpoint}
        pages = 0
        while True:
            body = self.post([{"artifact": "incremental", "query": QUERY, **extra}])
            pages += 1
            for change in body["changes"]:
                if change["type"] != "upsert":
                    raise BenchError(f"unexpected change {change}")
                rows.append((change["artifactId"], change["event"]["id"]))
            if body["nextCursor"] is None:
                return rows, body["checkpoint"], pages, body["startedAt"]
            extra = {"cursor": body["nextCursor"]}


class StdlibRelay(Relay):
    """The same client through the standard library's http.client (its headers parsed in Python): shown for
    reference, as the client this bench used before."""

    def __init__(self, server: Server, token: str) -> None:
        super().__init__(server, token)
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)

    def post(self, body: Any) -> Any:
        data = json.dumps(body).encode()
        headers = {
            "Host": self.server.host_header,
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/json",
        }
        try:
            self.conn.request("POST", "/query", body=data, headers=headers)
            response = self.conn.getresponse()
        except (ConnectionError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=60)
            self.conn.request("POST", "/query", body=data, headers=headers)
            response = self.conn.getresponse()
        payload = response.read()
        if response.status != 200:
            raise BenchError(f"POST /query: {response.status} {payload[:300]!r}")
        return json.loads(payload)


class Baseline:
    def __init__(self, db_url: str, community: int, channels: list[uuid.UUID]) -> None:
        import psycopg

        self.conn = psycopg.connect(db_url, autocommit=True)
        self.community, self.channels = community, channels

    def run(self, lo: Any, hi: Any | None) -> tuple[list[tuple[str, str]], int]:
        import datetime as dt

        if hi is None:
            hi = self.conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        key: tuple[Any, Any] = (lo - dt.timedelta(microseconds=1), uuid.UUID(int=0))
        rows: list[tuple[str, str]] = []
        pages = 0
        while True:
            page = self.conn.execute(
                _BASELINE, (self.community, self.channels, lo, hi, key[0], key[1], PAGE_ROWS)
            ).fetchall()
            pages += 1
            rows.extend((str(d), _id_of(raw)) for _, d, raw in page)
            if len(page) < PAGE_ROWS:
                return rows, pages
            key = (page[-1][0], page[-1][1])


def service_pass(db_url: str, env: dict[str, str], host: str, pubkey: str) -> tuple[list[tuple[str, str]], float]:
    """The same initial pass through artifacts.incremental.read_page in this process (no HTTP, no
    authentication): where the relay's time goes. Returns (rows, seconds)."""
    import asyncio
    import os

    for key in (
        "DATABASE_URL",
        "REDIS_URL",
        "BUZZ_DEV",
        "BUZZ_ARTIFACT_INCREMENTAL_ENABLED",
        "BUZZ_INCREMENTAL_SIGNING_KEY",
    ):
        os.environ[key] = env[key]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "buzz.settings")
    import django

    django.setup()
    from asgiref.sync import sync_to_async

    from artifacts import incremental
    from buzz.identity import communities
    from buzz.identity.actor import Actor
    from buzz.runtime import runtime

    async def run() -> tuple[list[tuple[str, str]], float]:
        info = await sync_to_async(communities._load_info)(host)
        if info is None:
            raise BenchError("no bench community")
        actor = Actor(community=info, pubkey=pubkey)
        request = incremental.parse_request([{"artifact": "incremental", "query": QUERY}])
        await incremental.read_page(actor, request, asyncio.get_running_loop().time() + 8)  # warm the pool
        rows: list[tuple[str, str]] = []
        t = time.perf_counter()
        while True:
            body = json.loads(await incremental.read_page(actor, request, asyncio.get_running_loop().time() + 8))
            rows.extend((c["artifactId"], c["event"]["id"]) for c in body["changes"])
            if body["nextCursor"] is None:
                elapsed = time.perf_counter() - t
                await runtime.aclose()
                return rows, elapsed
            request = incremental.Request(query=request.query, digest=request.digest, cursor=body["nextCursor"])

    result: tuple[list[tuple[str, str]], float] = asyncio.run(run())
    return result


@contextlib.contextmanager
def _cpu_window(into: list[dict[str, float]], relay_pid: int | None) -> Any:
    """The CPU seconds spent inside the block by the relay (`relay_pid`), by this client, and by the rest of
    the machine (PostgreSQL, as nothing else runs), appended to `into`."""
    relay0 = common.cpu_seconds(relay_pid) if relay_pid is not None else 0.0
    client0, busy0 = time.process_time(), common.machine_busy_seconds()
    yield
    relay = common.cpu_seconds(relay_pid) - relay0 if relay_pid is not None else 0.0
    client = time.process_time() - client0
    into.append({"relay": relay, "client": client, "rest": common.machine_busy_seconds() - busy0 - relay - client})


def _ms(values: list[float]) -> str:
    median, low, high = (1000 * f(values) for f in (statistics.median, min, max))
    return f"median {median:8.1f} ms (min {low:.1f}, max {high:.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=int, default=100_000)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--changes", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3, help="timed passes per side and figure")
    parser.add_argument("--db", default="bench_incremental", help="scratch database (bench*), recreated")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--profile", metavar="DIR", help="py-spy the relay over extra initial passes (untimed)")
    parser.add_argument("--profile-format", choices=("raw", "flamegraph", "speedscope"), default="raw")
    common.add_app_option(parser)
    args = parser.parse_args(argv)
    if not args.db.startswith("bench") or args.artifacts < 1 or not 1 <= args.changes <= args.artifacts:
        parser.error("--db must start with bench; --artifacts >= 1; 1 <= --changes <= --artifacts")
    common.exit_on_sigterm()
    common.header(
        "incremental: NIP-AR incremental reads over POST /query vs hand-written SQL returning the same rows",
        [
            f"{args.artifacts} readable artifacts over {args.channels} private channels of the reader",
            f"initial pass, then a later pass after {args.changes} changes; {args.runs} timed passes per side",
            "relay: HTTP/1.1 keep-alive, Authorization: Bearer (messages:read), pages of 100 JSON-decoded",
            "baseline: psycopg, the same keyset pages (ORDER BY changed_at, d LIMIT 100)",
        ],
    )
    from buzz.nostr import Signer

    reader, owner = Signer.generate(), Signer.generate()
    results: dict[str, Any] = {"benchmark": "incremental", "nproc": common.nproc(), "artifacts": args.artifacts}
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        env["DATABASE_URL"] = common.with_dbname(env["DATABASE_URL"], args.db)
        env["BUZZ_ARTIFACT_INCREMENTAL_ENABLED"] = "1"
        env["BUZZ_INCREMENTAL_SIGNING_KEY"] = secrets.token_urlsafe(48)
        db_url = env["DATABASE_URL"]
        relay = common.start_relay(stack, env, [reader.pubkey, owner.pubkey], app=args.app, app_dir=args.app_dir)
        channels = [uuid.uuid4() for _ in range(args.channels)]
        for channel in channels:
            common.checked(
                common.manage(env, "channel", "create", "--host", relay.host_header, "--name", str(channel)[:8],
                              "--owner", owner.pubkey, "--visibility", "private", "--id", str(channel)),
                "manage.py channel create",
            )  # fmt: skip
            common.checked(
                common.manage(env, "channel", "add-member", "--host", relay.host_header, str(channel), reader.pubkey),
                "manage.py channel add-member",
            )
        token = common.checked(
            common.manage(
                env, "token", "create", "--host", relay.host_header, reader.pubkey, "--scope", "messages:read"
            ),
            "manage.py token create",
        )
        token = next(line.strip() for line in token.splitlines() if line.strip().startswith("buzz_"))
        import psycopg

        with psycopg.connect(db_url, autocommit=True) as conn:
            row = conn.execute("SELECT id FROM buzz_community WHERE host = %s", (relay.host_header,)).fetchone()
            if row is None:
                raise BenchError("no bench community")
            community = int(row[0])
            t0 = time.monotonic()
            params = {"community": community, "channels": channels, "k": len(channels), "n": args.artifacts,
                      "pubkey": owner.pubkey}  # fmt: skip
            with conn.transaction():
                conn.execute(_SEED_HEADS, params)
                conn.execute(_SEED_REVISIONS, params)
                # The memberships are old too: a grant inside a later window would replay its channel.
                conn.execute(
                    "UPDATE buzz_membership m SET joined_at = now() - interval '2 days' FROM buzz_channel c"
                    " WHERE c.id = m.channel_id AND c.community_id = %(community)s",
                    params,
                )
            load_s = time.monotonic() - t0
            conn.execute("VACUUM ANALYZE artifacts_artifact")
            conn.execute("VACUUM ANALYZE artifacts_revision")
        print(f"seeded {args.artifacts} heads and revisions in {load_s:.1f} s (+ VACUUM ANALYZE)", flush=True)

        client = Relay(relay, token)
        stdlib = StdlibRelay(relay, token)
        base = Baseline(db_url, community, channels)
        import datetime as dt

        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        # Same rows, first.
        rows, checkpoint, pages, started = client.run(None)
        start = dt.datetime.strptime(started, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
        expected, base_pages = base.run(epoch, start)
        if rows != expected:
            raise BenchError(f"initial pass: relay {len(rows)} rows vs SQL {len(expected)}: not the same sequence")
        print(f"initial pass: same {len(rows)} rows in the same order ({pages} pages; SQL {base_pages})", flush=True)
        if stdlib.run(None)[0] != rows:
            raise BenchError("initial pass: the http.client pass returned other rows")
        relay_s: list[float] = []
        sql_s: list[float] = []
        stdlib_s: list[float] = []
        cpu: dict[str, list[dict[str, float]]] = {"relay": [], "sql": []}
        for _ in range(args.runs):
            with _cpu_window(cpu["relay"], relay.pid):
                t = time.perf_counter()
                client.run(None)
                relay_s.append(time.perf_counter() - t)
            with _cpu_window(cpu["sql"], None):
                t = time.perf_counter()
                base.run(epoch, None)
                sql_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            stdlib.run(None)
            stdlib_s.append(time.perf_counter() - t)
        results["initial"] = {
            "relay_s": relay_s, "sql_s": sql_s, "stdlib_s": stdlib_s, "rows": len(rows), "pages": pages, "cpu": cpu
        }  # fmt: skip
        profile = common.profile_path(args.profile, "incremental-initial", args.profile_format)
        if profile is not None:
            seconds = max(5.0, 3 * statistics.median(relay_s))
            with common.py_spy(relay.pid, profile, seconds, args.profile_format):
                until = time.monotonic() + seconds
                while time.monotonic() < until:
                    client.run(None)
        in_process, service_s = service_pass(db_url, env, relay.host_header, reader.pubkey)
        if in_process != rows:
            raise BenchError("the in-process pass returned other rows than the relay")
        results["initial"]["service_s"] = service_s

        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                _CHANGE.replace("%(step)s", f"LIMIT {args.changes} OFFSET 0"),
                {"community": community, "pubkey": owner.pubkey, "salt": "1"},
            )
            conn.execute("ANALYZE artifacts_artifact")
        lo = start - dt.timedelta(seconds=OVERLAP_S)
        later, _, later_pages, later_started = client.run(checkpoint)
        later_start = dt.datetime.strptime(later_started, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
        expected, _ = base.run(lo, later_start)
        if later != expected or len(later) != args.changes:
            raise BenchError(f"later pass: relay {len(later)} rows vs SQL {len(expected)}: not the same sequence")
        print(f"later pass: same {len(later)} rows in the same order ({later_pages} pages)", flush=True)
        relay_l: list[float] = []
        sql_l: list[float] = []
        # A later pass is about 30 ms: more of them, so that a moment of a busy machine moves the median less.
        for _ in range(max(args.runs, LATER_RUNS)):
            t = time.perf_counter()
            client.run(checkpoint)
            relay_l.append(time.perf_counter() - t)
            t = time.perf_counter()
            base.run(lo, None)
            sql_l.append(time.perf_counter() - t)
        results["later"] = {"relay_s": relay_l, "sql_s": sql_l, "rows": len(later), "pages": later_pages}
        # Reference, not a target: what one ordinary signed view request of 100 rows costs on this relay.
        view: list[float] = []
        for i in range(min(100, args.artifacts // PAGE_ROWS)):
            t = time.perf_counter()
            page = client.post([{**QUERY, "limit": PAGE_ROWS, "offset": i * PAGE_ROWS}])
            view.append(time.perf_counter() - t)
            if len(page) != PAGE_ROWS:
                raise BenchError(f"the current view returned {len(page)} rows, not {PAGE_ROWS}")
        results["view_page_s"] = view
        common.stop_process(relay.proc)

    print("-" * 78)
    for name in ("initial", "later"):
        r = results[name]
        ratio = statistics.median(r["relay_s"]) / statistics.median(r["sql_s"])
        r["ratio"] = ratio
        print(f"{name:<8} {r['rows']} rows, {r['pages']} pages", flush=True)
        print(f"  relay POST /query pass  {_ms(r['relay_s'])}", flush=True)
        print(f"  hand-written SQL pages  {_ms(r['sql_s'])}", flush=True)
        print(f"  ratio {common.ratio(statistics.median(r['relay_s']), statistics.median(r['sql_s']))}"
              f" (target <= 2x)", flush=True)  # fmt: skip
    stdlib_s = results["initial"]["stdlib_s"]
    print(
        f"(reference) the initial pass through http.client instead: {_ms(stdlib_s)},"
        f" {common.ratio(statistics.median(stdlib_s), statistics.median(results['initial']['sql_s']))} of the SQL",
        flush=True,
    )
    pages = results["initial"]["pages"]
    for side, label in (("relay", "relay pass"), ("sql", "SQL pass  ")):
        spent = {k: 1000 * statistics.median(w[k] for w in results["initial"]["cpu"][side]) / pages
                 for k in ("relay", "client", "rest")}  # fmt: skip
        print(
            f"CPU per page, {label}: relay {spent['relay']:.2f} ms, this client {spent['client']:.2f} ms,"
            f" the rest of the machine (PostgreSQL) {spent['rest']:.2f} ms",
            flush=True,
        )
    service_s = results["initial"]["service_s"]
    service_ratio = common.ratio(service_s, statistics.median(results["initial"]["sql_s"]))
    print(
        "where the initial pass goes: in-process, artifacts.incremental.read_page without HTTP or"
        f" authentication: {service_s * 1000:.1f} ms, {service_ratio} of the SQL",
        flush=True,
    )
    per_page = [1000 * v for v in results["view_page_s"]]
    inc_page = 1000 * statistics.median(results["initial"]["relay_s"]) / results["initial"]["pages"]
    sql_page = 1000 * statistics.median(results["initial"]["sql_s"]) / results["initial"]["pages"]
    print(
        f"per page of 100: incremental {inc_page:.1f} ms, SQL {sql_page:.1f} ms; reference, the ordinary"
        f" current view (POST /query, limit 100, offset pages) on the same relay: median"
        f" {statistics.median(per_page):.1f} ms",
        flush=True,
    )
    if profile is not None:
        common.report_profile(profile)
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
