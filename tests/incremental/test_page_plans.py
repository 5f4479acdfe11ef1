"""The plans of incremental pages (artifacts.incremental._plans): a page with a tag predicate is planned for its
parameters every time (force_custom_plan); a page without one, initial or later, is planned once, generically
(force_generic_plan), and that plan reads no table whole, and about a page of rows, on never-analyzed tables.

Method: passes of one-row pages run in-process through artifacts.incremental.read_page on buzz.runtime's read
pool against the test database, enough times that psycopg prepares each page statement and PostgreSQL has
made its five custom plans. Then every connection of the pool is asked for its prepared statements
(pg_prepared_statements, PostgreSQL 14+) and the page statements' plan counters are read. A later page's
generic plan and an initial page's are also explained on never-analyzed tables.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import uuid
from typing import Any

import pytest

from artifacts import incremental
from artifacts.query import ArtifactQuery
from buzz.events.ingest import ingest
from buzz.identity.actor import Actor
from buzz.nostr import Signer
from buzz.runtime import runtime
from tests.chat import test_hot_plans
from tests.chat.test_hot_plans import (
    OTHER_CHANNELS,
    Fresh,
    Prepared,
    _brief,
    _md5,
    assert_searched,
    first_columns,
    nodes,
)
from tests.support.factories import make_channel, make_community, revision
from tests.support.inprocess import actor_of, every_connection

HOST = "incremental-plans.test"
ARTIFACTS = 4
PASSES = 4  # of ARTIFACTS one-row pages each: past the prepare threshold and the five custom plans
PLAIN = {"artifact": "current", "#type": ["buzz.task"]}
TAGGED = {"artifact": "current", "#status": ["open"]}
fresh = test_hot_plans.fresh  # the fixture of never-analyzed tables


@pytest.fixture
def reader(transactional_db: None, settings: Any) -> tuple[Actor, Signer, uuid.UUID]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    settings.BUZZ_INCREMENTAL = {
        **settings.BUZZ_INCREMENTAL,
        "enabled": True,
        "signing_key": "plans-" + "k" * 40,
        "page_rows": 1,
    }
    alice = Signer.generate()
    community = make_community(HOST, members=[alice])
    channel = make_channel(community, alice, visibility="private")
    return actor_of(community, alice), alice, channel


async def _pass(actor: Actor, query: dict[str, Any], checkpoint: str | None = None) -> tuple[str, set[str]]:
    """One pass to its end: (its checkpoint, the artifacts its upserts named)."""
    extra = {} if checkpoint is None else {"checkpoint": checkpoint}
    request = incremental.parse_request([{"artifact": "incremental", "query": query, **extra}])
    named: set[str] = set()
    while True:
        body = json.loads(await incremental.read_page(actor, request, asyncio.get_running_loop().time() + 8))
        named |= {c["artifactId"] for c in body["changes"] if c["type"] == "upsert"}
        if body["nextCursor"] is None:
            return str(body["checkpoint"]), named
        request = incremental.Request(query=request.query, digest=request.digest, cursor=body["nextCursor"])


async def _page_statements() -> list[tuple[int, int, str]]:
    """(generic plans, custom plans, text) of every prepared page statement of the incremental reads' pool."""
    found: list[tuple[int, int, str]] = []
    async with every_connection(await incremental.read_pool()) as connections:
        for conn in connections:
            rows = await (
                await conn.execute(
                    "SELECT generic_plans, custom_plans, statement FROM pg_prepared_statements"
                    " WHERE statement LIKE '%artifacts_revision%'"
                )
            ).fetchall()
            found.extend(rows)
            # A page planned without a sort turned enable_sort off for itself only (SET LOCAL, then COMMIT).
            setting = await (await conn.execute("SELECT current_setting('enable_sort')")).fetchone()
            assert setting == ("on",), setting
    return found


def _counts(statements: list[tuple[int, int, str]]) -> dict[str, tuple[int, int]]:
    """(generic plans, custom plans) by statement text, summed over the pool's connections."""
    counts: dict[str, tuple[int, int]] = {}
    for generic, custom, text in statements:
        was = counts.get(text, (0, 0))
        counts[text] = (was[0] + generic, was[1] + custom)
    return counts


def _kind(text: str) -> tuple[bool, bool]:
    """(a later page, a tag predicate) of a page statement's text."""
    return "WITH u AS" in text, "artifacts_currenttag" in text


async def test_which_pages_are_planned_once(reader: tuple[Actor, Signer, uuid.UUID]) -> None:
    actor, alice, channel = reader
    # More channels named than an initial page merges (the others don't exist: they are left out of the scope).
    more = [str(uuid.uuid4()) for _ in range(incremental.MERGED_CHANNELS)]
    named = {"artifact": "current", "#h": [str(channel), *more], "#type": ["buzz.task"]}
    heads = set()
    try:
        for _ in range(ARTIFACTS):
            d = str(uuid.uuid4())
            assert (await ingest(actor, revision(alice, d=d, h=channel, extra=[["status", "open"]])))[1].ok
            heads.add(d)
        queries = (("plain", PLAIN), ("tagged", TAGGED))
        start = {name: (await _pass(actor, query))[0] for name, query in queries}
        for _ in range(PASSES):
            for name, query in queries:
                assert (await _pass(actor, query))[1] == heads  # initial passes
                # Later passes: every head changed in the window (and the reader's grant replays them).
                assert (await _pass(actor, query, start[name]))[1] == heads
        statements = await _page_statements()
        # Then passes naming the channel and more: the same statement texts as the wide read's pages (one
        # channel's heads, merged).
        checkpoint = (await _pass(actor, named))[0]
        for _ in range(PASSES):
            assert (await _pass(actor, named))[1] == heads
            assert (await _pass(actor, named, checkpoint))[1] == heads
        after_named = await _page_statements()
    finally:
        await runtime.aclose()
    shapes = {
        kind: [s for s in statements if _kind(s[2]) == kind] for kind in itertools.product((False, True), repeat=2)
    }
    assert all(shapes.values()), [s[2][:80] for s in statements]
    # A tag predicate: forced custom plans, never a generic one, initial and later.
    tagged = shapes[(False, True)] + shapes[(True, True)]
    assert all(generic == 0 and custom > 0 for generic, custom, _ in tagged), tagged
    # Without one, the wide read's initial pages and its later pages: generic plans only.
    plain = shapes[(False, False)] + shapes[(True, False)]
    assert all(generic > 0 and custom == 0 for generic, custom, _ in plain), [s[:2] for s in plain]
    # Naming more channels than a page merges: its initial pages are planned for their parameters (custom
    # plans, and no more executions of the generic one); its later pages use the generic plan.
    before = _counts(plain)
    initial = {text: counts for text, counts in _counts(after_named).items() if _kind(text) == (False, False)}
    assert sum(custom for _, custom in initial.values()) >= PASSES * ARTIFACTS, initial
    assert all(initial[text][0] == before.get(text, (0, 0))[0] for text in initial), (before, initial)
    later = {text: counts for text, counts in _counts(after_named).items() if _kind(text) == (True, False)}
    assert later and all(custom == 0 for _, custom in later.values()), later
    # The page's size is in the text, so a generic plan knows it returns a page.
    assert all(f"LIMIT {incremental.page_rows() + 1}" in text for _, _, text in statements), statements


# --- the later page's generic plan on never-analyzed tables ------------------------------------------------
# tests/chat/test_hot_plans.py's fresh tables: one channel with ROWS // 4 artifacts (changed now), 1,000 more
# channels of the community, the reader (their author) a member of each since the fixture made them, so the
# window holds every head and a grant of every channel.


def _fresh_reader(fresh: Fresh) -> tuple[Actor, list[uuid.UUID], ArtifactQuery, int]:
    """The fresh tables' reader, every channel it reads (sorted), the plain query and the database clock (µs)."""
    now = fresh.conn.execute("SELECT clock_timestamp()").fetchone()
    assert now is not None
    channels = sorted([fresh.channel, *(uuid.UUID(_md5(f"ch{i}")) for i in range(1, OTHER_CHANNELS + 1))])
    query = incremental.parse_request([{"artifact": "incremental", "query": PLAIN}]).query
    return fresh.actor, channels, query, incremental.micros(now[0])


def _later_pages(fresh: Fresh) -> dict[str, tuple[str, list[Any]]]:
    actor, channels, query, start = _fresh_reader(fresh)
    since = start - 3600 * 1_000_000
    first = incremental.Pass(start=start, since=since, stamp=0)
    # A continuation inside the grants (in the replay of the big channel, after one of its artifacts) and one
    # inside the heads.
    joined = fresh.conn.execute(
        "SELECT m.joined_at FROM buzz_membership m JOIN buzz_channel c ON c.id = m.channel_id WHERE c.uuid = %s",
        (fresh.channel,),
    ).fetchone()
    assert joined is not None
    ident = f"{fresh.channel} {uuid.UUID(_md5('d1'))}"
    at = incremental.Position(incremental.micros(joined[0]), incremental.SRC_GRANT, ident)
    in_grants = incremental.Pass(start, since, 0, at)
    in_heads = incremental.Pass(
        start, since, 0, incremental.Position(since, incremental.SRC_HEAD, str(uuid.UUID(int=0)))
    )
    page = incremental.page_rows() + 1
    _keep_pass_start(fresh, start)
    return {
        name: incremental._later_sql(actor, query, channels, run, since, page, start_sql=name.endswith("one_trip"))
        for name, run in (
            ("first", first),
            ("in_grants", in_grants),
            ("in_heads", in_heads),
            # A first page sent in the round trip that reads the clock: up to the head's buzz.pass_start.
            ("first_in_one_trip", first),
        )
    }


def _keep_pass_start(fresh: Fresh, start: int) -> None:
    """The pass's start as the head keeps it for a first page sent with it (artifacts.incremental._head_sql),
    here for the test connection's session: the explained statements run in transactions of their own."""
    fresh.conn.execute("SELECT set_config('buzz.pass_start', %s::text, false)", (incremental.from_micros(start),))


def _scans(explained: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's nodes that read a table."""
    return [node for node in nodes(explained["Plan"]) if node.get("Relation Name") is not None]


def _rows_read(explained: dict[str, Any]) -> dict[str, int]:
    """Rows each table's scans returned or filtered away, over all their loops."""
    read: dict[str, int] = {}
    for node in _scans(explained):
        removed = node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Join Filter", 0)
        relation = node["Relation Name"]
        read[relation] = read.get(relation, 0) + node["Actual Rows"] * node["Actual Loops"] + removed
    return read


def test_a_later_pages_generic_plan_reads_no_table_whole_on_never_analyzed_tables(fresh: Fresh) -> None:
    fresh.fill()
    assert fresh.never_analyzed(), "a fresh table has statistics"
    for name, (statement, args) in _later_pages(fresh).items():
        prepared = Prepared(fresh.conn)
        prepared.prepare(f"later_{name}", statement, args)
        explained = prepared.explain(f"later_{name}")
        assert "$1" in json.dumps(explained), f"{name}: not a generic plan"
        assert_searched(explained, name, first_columns(fresh.conn))
        for node in _scans(explained):
            assert node["Node Type"] != "Seq Scan" or node["Relation Name"] == "buzz_channel", f"{name}: {_brief(node)}"
        read = _rows_read(explained)
        # A page of the grants' replay reads a page of the big channel from its index, not the whole channel
        # sorted; the heads and the page's joins read a page.
        assert read.get("artifacts_artifact", 0) <= 3 * incremental.page_rows() + 10, (name, read)
        assert read.get("artifacts_revision", 0) <= incremental.page_rows() + 5, (name, read)
        # The reader's removals come from its own rows (membership_removals), not a probe of its membership in
        # every channel of the community: the channels and memberships read are the grants', once.
        granted = OTHER_CHANNELS + 1
        assert read.get("buzz_channel", 0) <= granted + 10 and read.get("buzz_membership", 0) <= granted + 10, (
            name,
            read,
        )
    assert fresh.never_analyzed()


# --- an initial page's generic plan on never-analyzed tables ----------------------------------------------
# The same fresh tables: every head of the big channel changed at one instant, so a continuation's keyset sits
# inside a tie on changed_at and is bounded by d alone.


def _initial_pages(fresh: Fresh) -> dict[str, tuple[str, list[Any]]]:
    actor, channels, query, start = _fresh_reader(fresh)
    middle = fresh.conn.execute(
        "SELECT changed_at, d FROM artifacts_artifact ORDER BY changed_at, d OFFSET %s LIMIT 1",
        (test_hot_plans.ROWS // 8,),
    ).fetchone()
    assert middle is not None
    at = incremental.Position(incremental.micros(middle[0]), incremental.SRC_HEAD, str(middle[1]))
    small = uuid.UUID(_md5("ch1"))
    page = incremental.page_rows() + 1
    _keep_pass_start(fresh, start)
    return {
        name: incremental._initial_sql(actor, query, scope, run, page, start_sql=name.endswith("one_trip"))
        for name, scope, run in (
            ("first", channels, incremental.Pass(start=start, since=None, stamp=0)),
            # First pages sent in the round trip that reads the clock: up to the head's buzz.pass_start.
            ("first_in_one_trip", channels, incremental.Pass(start=start, since=None, stamp=0)),
            ("one_channel_in_one_trip", [fresh.channel], incremental.Pass(start=start, since=None, stamp=0)),
            ("continued", channels, incremental.Pass(start, None, 0, at)),
            # At most MERGED_CHANNELS channels: each one's heads in change order, merged.
            ("one_channel", [fresh.channel], incremental.Pass(start, None, 0, at)),
            ("two_channels", [fresh.channel, small], incremental.Pass(start, None, 0, at)),
            # A channel with no heads, beside the big one: nothing of the big channel is read.
            ("small_channel", [small], incremental.Pass(start=start, since=None, stamp=0)),
        )
    }


def test_an_initial_pages_generic_plan_reads_a_page_on_never_analyzed_tables(fresh: Fresh) -> None:
    # The wide read's initial pages are planned as below: generically, without a sort.
    wide = incremental.parse_request([{"artifact": "incremental", "query": PLAIN}]).query
    assert incremental._plans(wide, later=False) == incremental.Plans("force_generic_plan", sort=False)
    fresh.fill()
    assert fresh.never_analyzed(), "a fresh table has statistics"
    for name, (statement, args) in _initial_pages(fresh).items():
        prepared = Prepared(fresh.conn)
        fresh.conn.execute("SET enable_sort = off")  # as artifacts.incremental.WALK_PLANS plans it
        prepared.prepare(f"initial_{name}", statement, args)
        explained = prepared.explain(f"initial_{name}")
        assert "$1" in json.dumps(explained), f"{name}: not a generic plan"
        assert_searched(explained, name, first_columns(fresh.conn))
        returned = explained["Plan"]["Actual Rows"]
        assert returned == (0 if name == "small_channel" else incremental.page_rows() + 1), (name, returned)
        for node in _scans(explained):
            assert node["Node Type"] != "Seq Scan", f"{name}: {_brief(node)}"
            assert "Parallel" not in node["Node Type"], f"{name}: {_brief(node)}"
        read = _rows_read(explained)
        # A page: the heads in change order from the keyset on, each joined to its revision.
        assert read.get("artifacts_artifact", 0) <= incremental.page_rows() + 5, (name, read)
        if name == "small_channel":
            assert read.get("artifacts_artifact", 0) == 0, read
        assert read.get("artifacts_revision", 0) <= incremental.page_rows() + 5, (name, read)
        prepared.close()
        fresh.conn.execute("RESET enable_sort")
    assert fresh.never_analyzed()


def test_a_pages_head_reads_only_the_ttl_channels_on_never_analyzed_tables(fresh: Fresh) -> None:
    """The head of every page (artifacts.incremental._head_sql) reads the community's TTL channels from their
    own index entries (buzz_channel's channel_ttl): the fresh community has 1,001 channels, none of them TTL.
    Without that index the plan read all of them and filtered them on ttl_seconds."""
    fresh.fill()
    assert fresh.never_analyzed(), "a fresh table has statistics"
    community = fresh.actor.community.id
    prepared = Prepared(fresh.conn)
    prepared.prepare("head", incremental._head_sql(False, None, None, None), {"budget": "2000", "community": community})
    explained = prepared.explain("head")
    assert_searched(explained, "head", first_columns(fresh.conn))
    # A generic plan compares with the statement's parameters ($2: the community), not with their values.
    assert re.search(r"= \$\d", json.dumps(explained)), "not a generic plan"
    channels = [node for node in nodes(explained["Plan"]) if node.get("Relation Name") == "buzz_channel"]
    assert channels, explained
    for node in channels:
        # The partial index (channel_ttl, named otherwise in the fresh schema): no TTL condition left to filter.
        assert node["Node Type"] in ("Index Scan", "Bitmap Heap Scan", "Index Only Scan"), _brief(node)
        assert "ttl_seconds" not in node.get("Filter", ""), _brief(node)
        removed = node.get("Rows Removed by Filter", 0)
        assert node["Actual Rows"] * node["Actual Loops"] + removed == 0, _brief(node)
    prepared.close()
    assert fresh.never_analyzed()
