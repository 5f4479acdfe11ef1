"""NIP-AR query limits, strict filter parsing and the execution budget, against real relay processes.

The bounds are read from the relay's NIP-11 document (GET / with Accept: application/nostr+json,
object "artifacts"), then each is exercised: at the bound the query runs (200), one past it the
relay refuses it with 400 and a reason naming the limit. Malformed or unsupported filters are 400.

The budget: a second relay started with BUZZ_QUERY_BUDGET_MS=1 reads a community holding 5,000
artifacts (bulk-inserted in SQL exactly as artifacts.services writes them); its statements can't
finish in 1 ms, and the answer is a 503 saying so, with no partial result. The same queries on
the ordinary relay succeed, so the 503 is the budget's doing.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection, transaction

from buzz.models import Community
from buzz.nostr import Signer
from tests.artifacts.query_model import Author, Channel, World
from tests.support.factories import make_channel, make_community, nip98
from tests.support.relay import RelayProcess, relays_key
from tests.support.wire import publish, raw_request
from tests.support.wsclient import RelayClient

# The test database must exist; the tests only read the module's committed data through the relays.
pytestmark = pytest.mark.django_db

HOST = "query-limits.test"
BULK_HOST = "query-budget.test"
BULK = 5000
LONG_NAME = "n" * 128
LONG_VALUE = "v" * 4096
WIDE_NAME = "é" * 64  # 128 UTF-8 bytes
WIDE_VALUE = "ü" * 2048  # 4096 UTF-8 bytes


@dataclass
class Env:
    relay: RelayProcess
    budget_relay: RelayProcess
    w: Signer
    channel: str
    bulk_channel: str
    edge_id: str  # the revision carrying tags at the envelope's name and value limits


async def post(relay: RelayProcess, signer: Signer, body: bytes, path: str = "/query", host: str = HOST) -> Any:
    headers = {
        "Host": host,
        "Content-Type": "application/json",
        "Authorization": nip98(signer, host, "POST", path, body),
    }
    status, raw = await asyncio.to_thread(raw_request, relay, "POST", path, headers, body, 30)
    return status, json.loads(raw)


async def run(env: Env, filt: Any, path: str = "/query") -> tuple[int, Any]:
    """One filter (or, when `filt` is bytes, a literal body) as the writer, who reads everything."""
    body = filt if isinstance(filt, bytes) else json.dumps([filt]).encode()
    return await post(env.relay, env.w, body, path)


async def nip11(relay: RelayProcess, host: str = HOST) -> dict[str, Any]:
    status, raw = await asyncio.to_thread(
        raw_request, relay, "GET", "/", {"Host": host, "Accept": "application/nostr+json"}, b"", 30
    )
    assert status == 200, raw
    doc: dict[str, Any] = json.loads(raw)
    return doc


# --- data ------------------------------------------------------------------------------

_BULK_SQL = [
    """
    INSERT INTO artifacts_artifact (community_id, d, type, head_id, home, root, deleted, retired, created_at,
                                    changed_at)
    SELECT %(c)s, gen_random_uuid(), 'bulk.item', md5('head' || i) || md5('item' || i), %(h)s, NULL, false, false,
           now(), clock_timestamp()
    FROM generate_series(1, %(n)s) AS i
    """,
    """
    INSERT INTO artifacts_revision (id, community_id, artifact_id, op, channel, prev, root, pubkey, created_at, raw,
                                    seq, accepted_at)
    SELECT a.head_id, a.community_id, a.id, 'create', a.home, NULL, NULL, %(pk)s, 0,
           json_build_object('id', a.head_id, 'kind', 45010, 'pubkey', %(pk)s, 'created_at', 0,
                             'tags', json_build_array(json_build_array('d', a.d::text)), 'content', '',
                             'sig', repeat('0', 128))::text,
           nextval('artifacts_accept_seq'), clock_timestamp()
    FROM artifacts_artifact a WHERE a.community_id = %(c)s
    """,
    # Every tag's (name, first value), envelope tags included, as a create writes them.
    """
    INSERT INTO artifacts_currenttag (artifact_id, name, value)
    SELECT a.id, t.name, t.value
    FROM artifacts_artifact a,
         LATERAL (VALUES ('ar', '1'), ('d', a.d::text), ('h', a.home::text), ('type', a.type), ('title', 'bulk'),
                         ('op', 'create'), ('k1', (a.id %% 7)::text), ('k2', (a.id %% 11)::text),
                         ('k3', (a.id %% 13)::text)) AS t(name, value)
    WHERE a.community_id = %(c)s
    """,
    "ANALYZE artifacts_artifact",
    "ANALYZE artifacts_revision",
    "ANALYZE artifacts_currenttag",
]


def _setup() -> tuple[Signer, str, str]:
    w = Signer.generate()
    ids = []
    for host in (HOST, BULK_HOST):
        community = make_community(host, members=[w])
        cid = make_channel(community, w, name="main")
        ids.append(str(cid))
        if host == BULK_HOST:
            # One transaction: the head pointer and its revision row refer to each other (deferred FK).
            with transaction.atomic(), connection.cursor() as cur:
                for sql in _BULK_SQL:
                    cur.execute(sql, {"c": community.id, "h": cid, "n": BULK, "pk": w.pubkey})
    return w, ids[0], ids[1]


async def _write(relay: RelayProcess, w: Signer, channel: str) -> str:
    world = World(channels={channel: Channel(channel, members={w.pubkey})})
    author = Author(world, w)
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(w))[2] is True
        edge = author.revision(
            str(uuid.uuid4()), "create", h=channel, type_name="test.limits",
            tags=[[LONG_NAME, LONG_VALUE], [WIDE_NAME, WIDE_VALUE], ["x", "a"]],
        )  # fmt: skip
        for event in (edge, author.revision(str(uuid.uuid4()), "create", h=channel, type_name="test.limits")):
            reply = await publish(client, event)
            assert reply[2] is True, reply
    return str(edge["id"])


def _drop() -> None:
    # The artifact rows in SQL first (the ORM's cascade would collect 50,000 rows in Python).
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT id FROM buzz_community WHERE host = ANY(%s)", [[HOST, BULK_HOST]])
        ids = [row[0] for row in cur.fetchall()]
        cur.execute(
            "DELETE FROM artifacts_currenttag WHERE artifact_id IN"
            " (SELECT id FROM artifacts_artifact WHERE community_id = ANY(%s))",
            [ids],
        )
        for table in ("artifacts_moveremoval", "artifacts_revision", "artifacts_artifact"):
            cur.execute(f"DELETE FROM {table} WHERE community_id = ANY(%s)", [ids])  # noqa: S608
    Community.objects.filter(host__in=[HOST, BULK_HOST]).delete()


@pytest.fixture(scope="module")
def env(django_db_setup: None, django_db_blocker: Any) -> Iterator[Env]:
    with django_db_blocker.unblock():
        _drop()
        w, channel, bulk_channel = _setup()
    relay = RelayProcess(env={"BUZZ_WRITES_PER_SECOND": "0"})
    budget_relay = RelayProcess(env={"BUZZ_WRITES_PER_SECOND": "0", "BUZZ_QUERY_BUDGET_MS": "1"})
    try:
        relay.start()
        budget_relay.start()
        edge = asyncio.run(_write(relay, w, channel))
        yield Env(relay, budget_relay, w, channel, bulk_channel, edge)
    finally:
        relay.stop()
        budget_relay.stop()
        with django_db_blocker.unblock():
            _drop()


@pytest.fixture(autouse=True)
def _relay_log(request: pytest.FixtureRequest, env: Env) -> None:
    request.node.stash[relays_key] = [env.relay, env.budget_relay]


@pytest.fixture(scope="module")
def bounds(env: Env) -> dict[str, int]:
    doc = asyncio.run(nip11(env.relay))
    limits: dict[str, int] = doc["artifacts"]["limits"]
    return limits


# --- NIP-11 ----------------------------------------------------------------------------


async def test_every_query_limit_is_advertised(env: Env, bounds: dict[str, int]) -> None:
    doc = await nip11(env.relay)
    artifacts = doc["artifacts"]
    assert artifacts["modes"] == ["current", "history", "head"]
    for key in (
        "max_predicates", "max_values", "max_predicate_name_bytes", "max_predicate_value_bytes",
        "max_predicate_bytes", "default_limit", "max_limit", "max_offset",
        "max_tags", "max_tag_name_bytes", "max_tag_value_bytes", "max_total_tag_bytes",
    ):  # fmt: skip
        assert isinstance(bounds.get(key), int) and bounds[key] > 0, key
    assert artifacts["query_budget_ms"] == 5000
    # A predicate can name any tag a revision may carry.
    assert bounds["max_predicate_name_bytes"] >= bounds["max_tag_name_bytes"]
    assert bounds["max_predicate_value_bytes"] >= bounds["max_tag_value_bytes"]
    assert (await nip11(env.budget_relay))["artifacts"]["query_budget_ms"] == 1


# --- bounds: at the bound passes, one past fails with 400 ------------------------------


async def _at_and_past(env: Env, at: dict[str, Any], past: dict[str, Any], reason: str) -> Any:
    for path in ("/query", "/count"):
        status, body = await run(env, at, path)
        assert status == 200, (path, body)
        status, err = await run(env, past, path)
        assert status == 400, (path, err)
        assert set(err) == {"error"} and err["error"].startswith("invalid: ") and reason in err["error"], err
    return (await run(env, at))[1]


async def test_name_and_value_sizes(env: Env, bounds: dict[str, int]) -> None:
    name_max, value_max = bounds["max_predicate_name_bytes"], bounds["max_predicate_value_bytes"]
    base = {"artifact": "current"}
    # ASCII and multi-byte names: the bound is in UTF-8 bytes.
    hits = await _at_and_past(
        env, {**base, "#" + "n" * name_max: [LONG_VALUE]}, {**base, "#" + "n" * (name_max + 1): ["v"]}, str(name_max)
    )
    assert [e["id"] for e in hits] == [env.edge_id]
    hits = await _at_and_past(
        env, {**base, "#" + "é" * (name_max // 2): [WIDE_VALUE]}, {**base, "#" + "é" * (name_max // 2) + "a": ["v"]},
        str(name_max),
    )  # fmt: skip
    assert [e["id"] for e in hits] == [env.edge_id]
    hits = await _at_and_past(
        env, {**base, "#" + LONG_NAME: ["v" * value_max]}, {**base, "#" + LONG_NAME: ["v" * (value_max + 1)]},
        str(value_max),
    )  # fmt: skip
    assert [e["id"] for e in hits] == [env.edge_id]
    wide = "ü" * (value_max // 2)
    hits = await _at_and_past(
        env, {**base, "#" + WIDE_NAME: [wide]}, {**base, "#" + WIDE_NAME: [wide + "a"]}, str(value_max)
    )
    assert [e["id"] for e in hits] == [env.edge_id]


@pytest.mark.parametrize("fill", ["v", "\x01"], ids=["ascii", "escaped-in-json"])
async def test_total_predicate_bytes(env: Env, bounds: dict[str, int], fill: str) -> None:
    total, value_max = bounds["max_predicate_bytes"], bounds["max_predicate_value_bytes"]
    # One name byte plus values up to the total, each within the value bound. Filled with a control
    # character, every byte is a six-character escape in the JSON body: still a filter within the limits.
    left = total - 1
    values: list[str] = []
    while left:
        n = min(value_max, left)
        values.append(f"{len(values):04d}".ljust(n, fill))
        left -= n
    assert sum(len(v) for v in values) + 1 == total and len(values) <= bounds["max_values"]
    past = [*values[:-1], values[-1] + fill] if len(values[-1]) < value_max else [*values, fill]
    await _at_and_past(env, {"artifact": "current", "#x": values}, {"artifact": "current", "#x": past}, str(total))


async def test_predicate_and_value_counts(env: Env, bounds: dict[str, int]) -> None:
    n, v = bounds["max_predicates"], bounds["max_values"]
    base = {"artifact": "current"}
    many = {f"#p{i}": ["a"] for i in range(n)}
    await _at_and_past(env, {**base, **many}, {**base, **many, "#one-more": ["a"]}, str(n))
    # Values across all predicates.
    half = v // 2
    at = {**base, "#x": [f"a{i}" for i in range(half)], "#y": [f"b{i}" for i in range(v - half)]}
    past = {**at, "#z": ["c"]}
    await _at_and_past(env, at, past, str(v))
    await _at_and_past(
        env, {**base, "#x": ["a", *(f"v{i}" for i in range(v - 1))]}, {**base, "#x": [f"v{i}" for i in range(v + 1)]},
        str(v),
    )  # fmt: skip
    # The value that matches is found among many.
    _, hits = await run(env, {**base, "#x": [*(f"v{i}" for i in range(v - 1)), "a"]})
    assert [e["id"] for e in hits] == [env.edge_id]


async def test_page_size_and_offset(env: Env, bounds: dict[str, int]) -> None:
    limit_max, offset_max = bounds["max_limit"], bounds["max_offset"]
    base = {"artifact": "current"}
    await _at_and_past(env, {**base, "limit": limit_max}, {**base, "limit": limit_max + 1}, str(limit_max))
    await _at_and_past(env, {**base, "limit": 1}, {**base, "limit": 0}, "limit")
    await _at_and_past(env, {**base, "offset": offset_max}, {**base, "offset": offset_max + 1}, str(offset_max))
    await _at_and_past(env, {**base, "offset": 0}, {**base, "offset": -1}, "offset")
    for mode in ("history", "head"):
        f = {"artifact": mode, "#d": [str(uuid.uuid4())]} if mode == "head" else {"artifact": mode}
        await _at_and_past(env, {**f, "limit": limit_max}, {**f, "limit": limit_max + 1}, str(limit_max))
    # The default page size applies without a limit.
    assert bounds["default_limit"] <= limit_max
    status, page = await run(env, {**base, "limit": 1})
    assert status == 200 and len(page) == 1
    status, page = await run(env, {**base, "offset": 1})
    assert status == 200 and len(page) == 1


# --- malformed and unsupported ---------------------------------------------------------

MALFORMED: list[tuple[str, Any]] = [
    ("not JSON", b"{not json"),
    ("a bare filter object", b'{"artifact": "current"}'),
    ("a string", b'"current"'),
    ("a number", b"1"),
    ("null", b"null"),
    ("an empty array", b"[]"),
    ("two filters", b'[{"artifact": "current"}, {"artifact": "current"}]'),
    ("a filter that is not an object", b'["current"]'),
    ("a filter that is an array", b"[[]]"),
    ("no artifact mode", {}),
    ("an unknown mode", {"artifact": "incremental-ish"}),
    ("a mode that is not a string", {"artifact": 1}),
    ("a predicate that is not an array", {"artifact": "current", "#x": "a"}),
    ("a predicate with no values", {"artifact": "current", "#x": []}),
    ("a number value", {"artifact": "current", "#x": [1]}),
    ("a null value", {"artifact": "current", "#x": [None]}),
    ("a mixed array", {"artifact": "current", "#x": ["a", 2]}),
    ("a nested array", {"artifact": "current", "#x": [["a"]]}),
    ("an object value", {"artifact": "current", "#x": {"a": 1}}),
    ("kinds of another kind", {"artifact": "current", "kinds": [1]}),
    ("kinds with another kind too", {"artifact": "current", "kinds": [45010, 1]}),
    ("the removal kind", {"artifact": "current", "kinds": [45011]}),
    ("empty kinds", {"artifact": "current", "kinds": []}),
    ("kinds as a number", {"artifact": "current", "kinds": 45010}),
    ("kinds as strings", {"artifact": "current", "kinds": ["45010"]}),
    ("limit 0", {"artifact": "current", "limit": 0}),
    ("limit true", {"artifact": "current", "limit": True}),
    ("limit false", {"artifact": "current", "limit": False}),
    ("limit 1.5", {"artifact": "current", "limit": 1.5}),
    ("limit 10.0", {"artifact": "current", "limit": 10.0}),
    ("limit as a string", {"artifact": "current", "limit": "10"}),
    ("limit null", {"artifact": "current", "limit": None}),
    ("offset true", {"artifact": "current", "offset": True}),
    ("offset 2.0", {"artifact": "current", "offset": 2.0}),
    ("ids", {"artifact": "current", "ids": ["00" * 32]}),
    ("authors", {"artifact": "current", "authors": ["00" * 32]}),
    ("since", {"artifact": "current", "since": 0}),
    ("until", {"artifact": "current", "until": 0}),
    ("search", {"artifact": "current", "search": "x"}),
    ("a bare #", {"artifact": "current", "#": ["x"]}),
    ("an unknown key", {"artifact": "current", "status": ["open"]}),
    ("history with a client tag", {"artifact": "history", "#status": ["open"]}),
    ("head without #d", {"artifact": "head"}),
    ("head with another predicate", {"artifact": "head", "#d": [str(uuid.uuid4())], "#type": ["buzz.task"]}),
]


@pytest.mark.parametrize("what,filt", MALFORMED, ids=[m[0] for m in MALFORMED])
async def test_malformed_filters_are_refused(env: Env, what: str, filt: Any) -> None:
    for path in ("/query", "/count"):
        status, body = await run(env, filt, path)
        assert status == 400, (what, path, body)
        assert set(body) == {"error"} and body["error"].startswith("invalid: "), body


async def test_well_formed_neighbours_pass(env: Env) -> None:
    for filt in (
        {"artifact": "current", "kinds": [45010]},
        {"artifact": "history", "kinds": [45010], "#type": ["test.limits"], "#d": [str(uuid.uuid4())]},
        {"artifact": "head", "#d": [str(uuid.uuid4())], "#h": [env.channel]},
        {"artifact": "current", "#x": [""]},
        {"artifact": "current", "limit": 10, "offset": 0},
    ):
        for path in ("/query", "/count"):
            status, body = await run(env, filt, path)
            assert status == 200, (filt, body)


# --- the execution budget --------------------------------------------------------------

# Each needs tens of milliseconds on the bulk data: the tag index for many values of several
# names, or a sort of every revision to reach a deep offset. (A plain page of current heads is fast
# enough to fit in 1 ms on a warm connection, so it is not among them.)
HEAVY_CURRENT: dict[str, Any] = {
    "artifact": "current", "#op": ["create"], "#ar": ["1"], "#title": ["bulk"], "#k1": ["1", "2", "3"],
    "#k2": ["1", "2", "3", "4"], "#k3": [str(i) for i in range(12)], "limit": 1000,
}  # fmt: skip
HEAVY: list[tuple[str, dict[str, Any]]] = [
    ("/query", HEAVY_CURRENT),
    ("/count", HEAVY_CURRENT),
    ("/query", {"artifact": "history", "limit": 1000, "offset": BULK - 1000}),
]


async def test_budget_overrun_is_503_without_a_partial_result(env: Env) -> None:
    for _ in range(3):  # and on warm connections
        for path, filt in HEAVY:
            status, answer = await post(env.budget_relay, env.w, json.dumps([filt]).encode(), path, host=BULK_HOST)
            assert status == 503, (filt, path, answer)
            assert isinstance(answer, dict) and set(answer) == {"error"}, answer
            assert answer["error"].startswith("error: ") and "budget" in answer["error"], answer
    # The same queries within the ordinary budget: complete answers.
    status, answer = await post(env.relay, env.w, json.dumps([HEAVY_CURRENT]).encode(), "/count", BULK_HOST)
    assert status == 200 and 0 < answer["count"] < BULK, answer
    status, page = await post(env.relay, env.w, json.dumps([HEAVY_CURRENT]).encode(), "/query", BULK_HOST)
    assert status == 200 and len(page) == min(1000, answer["count"])
    status, page = await post(env.relay, env.w, json.dumps([HEAVY[2][1]]).encode(), "/query", BULK_HOST)
    assert status == 200 and len(page) == 1000
    status, answer = await post(env.relay, env.w, json.dumps([{"artifact": "current"}]).encode(), "/count", BULK_HOST)
    assert (status, answer) == (200, {"count": BULK})
