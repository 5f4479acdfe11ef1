"""REQ pages on a large channel: the plan walks an index in the page's order, and stored reads are bounded.

The plans are PostgreSQL's own (EXPLAIN ANALYZE) of the statements buzz.events.query runs, on a
channel of 20,000 messages and 5,000 artifact revisions beside 20,000 events in fifty others: no
sequential scan, no sort of the channel's rows, and the walk stops at the page. The
read slots bound the statements that run at once, per connection and per process
(test_read_slots.py tests the object): PostgreSQL's pg_stat_activity never shows more of a
relay's stored reads running than its slots, and a relay with one slot still completes every REQ.
The statement budget (BUZZ_READ_STATEMENT_BUDGET_MS) ends a REQ or a COUNT whose statement runs past
it with CLOSED "error: ...": no EOSE, no count, and the connection goes on serving.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from buzz.events.query import page_statement
from buzz.models import Community
from buzz.nostr import Signer
from buzz.nostr.filters import Filter, parse_filter
from tests.support.factories import make_channel, make_community
from tests.support.wire import query
from tests.support.wsclient import RelayClient, naming

HOST = "pages.test"
BIG = 20_000
CHANNEL = uuid.UUID("11111111-1111-1111-1111-111111111111")

# Rows the size of a chat message (about 700 bytes of raw JSON), written in bulk by SQL.
_FILL = """
INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw, received_at)
SELECT md5(%(seed)s || g::text) || md5(g::text), %(community)s, repeat('a', 64),
       CASE WHEN g %% %(every)s = 0 THEN 45010 ELSE 9 END, 1700000000 + g, {channel},
       '{{"content":"' || repeat(md5(g::text), 20) || '"}}', now()
FROM generate_series(1, %(n)s) g
"""
_TAGS = """
INSERT INTO buzz_eventtag (event_key, name, value)
SELECT key, 'h', channel_id::text FROM buzz_storedevent WHERE community_id = %(community)s
"""


def _fill(community: int, *, flagged: bool) -> None:
    with connection.cursor() as cur:
        big: dict[str, Any] = {
            "seed": "a",
            "community": community,
            "every": 5,
            "n": BIG * 5 // 4,
            "channel": str(CHANNEL),
        }
        cur.execute(_FILL.format(channel="%(channel)s::uuid"), big)
        others = "('22222222-2222-2222-2222-' || lpad((g %% 50)::text, 12, '0'))::uuid"
        cur.execute(_FILL.format(channel=others), {"seed": "b", "community": community, "every": 5, "n": BIG})
        if flagged:
            # As the relay stores them now: the h names the row's channel, and no tag row repeats it.
            cur.execute("UPDATE buzz_storedevent SET h_is_channel = true WHERE community_id = %s", [community])
        else:
            # As rows stored before h_is_channel are: an h row each.
            cur.execute(_TAGS, {"community": community})
        cur.execute("ANALYZE buzz_storedevent")
        cur.execute("ANALYZE buzz_eventtag")


@pytest.fixture(params=[False, True], ids=["h-rows", "h-is-channel"])
def big_channel(db: None, request: pytest.FixtureRequest) -> Iterator[int]:
    community = Community.objects.create(host=HOST, name="Pages", relay_secret="1" * 64, relay_pubkey="2" * 64)
    _fill(community.pk, flagged=request.param)
    yield community.pk


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _plan(sql: str, args: list[Any]) -> list[dict[str, Any]]:
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", args)
        (document,) = cur.fetchone()
    return list(_nodes(document[0]["Plan"]))


def _filter(raw: dict[str, Any]) -> Filter:
    return parse_filter(raw, max_values=1000, max_limit=1000, default_limit=500)


@pytest.mark.parametrize(
    ("shape", "index"),
    [
        # The channel's messages: its time index or the kind one, whichever the planner prices lower.
        ({"kinds": [9], "#h": [str(CHANNEL)], "limit": 1000}, None),
        # A kind that is a fifth of the channel (artifact revisions): only the rows of that kind are read.
        ({"kinds": [45010], "#h": [str(CHANNEL)], "limit": 1000}, "event_page_kind"),
        # Without kinds: the channel's time index, ties on created_at put in id order as they come.
        ({"#h": [str(CHANNEL)], "limit": 1000}, "event_channel_time"),
    ],
)
def test_a_page_of_a_20000_message_channel_walks_an_index_without_sorting(
    big_channel: int, shape: dict[str, Any], index: str | None
) -> None:
    f = _filter(shape)
    for after in (None, (1700000000 + BIG // 2, "8" * 64)):  # the first page, and one from the middle
        sql, args = page_statement(big_channel, f, [CHANNEL], after=after, rows=100)
        nodes = _plan(sql, args)
        # Nodes that ran: the tag-index probe of rows stored before h_is_channel never runs for the others.
        types = [n["Node Type"] for n in nodes if n["Actual Loops"] > 0]
        assert "Seq Scan" not in types and "Bitmap Heap Scan" not in types, types
        assert "Sort" not in types, types  # an Incremental Sort sorts only rows of equal created_at
        [scan] = [n for n in nodes if n.get("Relation Name") == "buzz_storedevent"]
        assert scan["Node Type"] == "Index Scan", scan
        if index is not None:
            assert scan["Index Name"] == index, scan
        # The walk stops at the page: a hundred rows or so read, not the channel's 25,000.
        assert scan["Actual Rows"] <= 101 and scan.get("Rows Removed by Filter", 0) <= 100, scan


def _members_channel(host: str, *, seed: str, n: int, h_rows: bool = True) -> tuple[Signer, uuid.UUID]:
    """A reader and a channel of theirs in a new community at `host`, holding `n` messages written in bulk: with
    an h row each in the tag index (as rows stored before h_is_channel are), or flagged h_is_channel (as the
    relay stores them now). The table is analyzed afterwards."""
    reader = Signer.generate()
    community = make_community(host, members=[reader])
    channel = make_channel(community, reader, name="c")
    with connection.cursor() as cur:
        args: dict[str, Any] = {
            "seed": seed,
            "community": community.pk,
            "every": 10**9,
            "n": n,
            "channel": str(channel),
        }
        cur.execute(_FILL.format(channel="%(channel)s::uuid"), args)
        if h_rows:
            cur.execute(_TAGS, {"community": community.pk})
        else:
            cur.execute("UPDATE buzz_storedevent SET h_is_channel = true WHERE community_id = %s", [community.pk])
        cur.execute("ANALYZE buzz_storedevent")
    return reader, channel


@pytest.fixture
def stocked(transactional_db: None) -> tuple[Signer, uuid.UUID]:
    return _members_channel("slots.test", seed="s", n=350)


async def test_reqs_beyond_the_read_slots_wait_and_all_complete(
    stocked: tuple[Signer, uuid.UUID], relay_factory: Any
) -> None:
    reader, channel = stocked
    relay = relay_factory(BUZZ_READ_SLOTS="1", BUZZ_READS_PER_CONNECTION="1")

    async def one_client(n: int) -> list[int]:
        async with RelayClient.connect(relay.ws_url, host="slots.test") as client:
            assert (await client.auth(reader))[2] is True
            subs = [f"c{n}-{i}" for i in range(4)]
            for sub in subs:  # four REQs of four pages each, in flight at once on one connection
                await client.send_json(["REQ", sub, {"kinds": [9], "#h": [str(channel)], "limit": 350}])
            counts = {sub: 0 for sub in subs}
            ended: set[str] = set()
            while ended != set(subs):
                m = await client.recv_json(timeout=60)
                if m[0] == "EVENT":
                    counts[m[1]] += 1
                elif m[0] == "EOSE":
                    ended.add(m[1])
                else:
                    raise AssertionError(f"unexpected {m!r}")
            return [counts[s] for s in subs]

    results = await asyncio.gather(*(one_client(n) for n in range(6)))
    assert results == [[350] * 4] * 6
    async with RelayClient.connect(relay.ws_url, host="slots.test") as client:
        assert (await client.auth(reader))[2] is True
        await client.send_json(["COUNT", "n", {"kinds": [9], "#h": [str(channel)]}])
        assert (await client.expect("COUNT"))[2] == {"count": 350}
        final, events = await query(client, "q", {"kinds": [9], "#h": [str(channel)], "limit": 5})
        assert final[0] == "EOSE" and len(events) == 5


@pytest.fixture
def slow_channel(transactional_db: None) -> tuple[Signer, uuid.UUID]:
    return _members_channel("slow-reads.test", seed="r", n=BIG)


def _running_reads(stop: threading.Event, seen: list[int]) -> None:
    """Sample how many of the relay's stored reads PostgreSQL is running, until `stop`."""
    import psycopg

    from tests.support.relay import relay_database_url

    with psycopg.connect(relay_database_url(), autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'active'"
                " AND query LIKE 'SELECT e.raw, e.id, e.created_at FROM buzz_storedevent e%%'"
            ).fetchone()
            seen.append(int(row[0]) if row else 0)


async def test_postgresql_never_runs_more_of_a_relays_stored_reads_than_its_slots(
    slow_channel: tuple[Signer, uuid.UUID], relay_factory: Any
) -> None:
    reader, channel = slow_channel
    relay = relay_factory(BUZZ_READ_SLOTS="2", BUZZ_READS_PER_CONNECTION="2", BUZZ_DB_POOL_MAX="10")
    # No event has a t tag: each REQ walks the channel's 20,000 rows testing it, tens of ms per statement.
    slow = {"kinds": [9], "#h": [str(channel)], "#t": ["none"], "limit": 100}
    seen: list[int] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_running_reads, args=(stop, seen))

    async def client(n: int) -> None:
        async with RelayClient.connect(relay.ws_url, host="slow-reads.test") as c:
            assert (await c.auth(reader))[2] is True
            subs = [f"r{n}-{i}" for i in range(6)]
            for sub in subs:
                await c.send_json(["REQ", sub, slow])
            for sub in subs:
                assert (await c.expect("EOSE", timeout=60, where=naming(sub)))[1] == sub

    sampler.start()
    try:
        await asyncio.gather(*(client(n) for n in range(4)))
    finally:
        stop.set()
        sampler.join(10)
    # The sampler saw the reads run (unbounded, the same load shows 10 at once: the pool's size), never more
    # than the slots.
    assert 1 <= max(seen) <= 2, f"{max(seen)} stored reads at once, in {len(seen)} samples"


@pytest.fixture
def budget_channel(transactional_db: None) -> tuple[Signer, uuid.UUID]:
    return _members_channel("budget-reads.test", seed="g", n=20, h_rows=False)


async def test_a_stored_read_past_the_statement_budget_ends_with_closed(
    budget_channel: tuple[Signer, uuid.UUID], relay_factory: Any
) -> None:
    import psycopg

    from tests.support.relay import relay_database_url

    reader, channel = budget_channel
    relay = relay_factory(BUZZ_READ_STATEMENT_BUDGET_MS="25")
    everything = {"kinds": [9], "#h": [str(channel)]}
    reason = "error: the query ran past the relay's 25 ms statement budget; narrow the filter and try again"
    async with RelayClient.connect(relay.ws_url, host="budget-reads.test") as c:
        assert (await c.auth(reader))[2] is True
        # While another transaction holds the stored events' table, a read of it waits, and the statement's time
        # runs out as a long scan's would: PostgreSQL cancels it at the budget, whatever it was doing.
        with psycopg.connect(relay_database_url()) as holder:
            holder.execute("LOCK TABLE buzz_storedevent IN ACCESS EXCLUSIVE MODE")
            await c.send_json(["REQ", "slow", everything])
            # CLOSED, and nothing before it: neither an event nor an EOSE that would call a partial set complete.
            assert await c.recv_json(timeout=60) == ["CLOSED", "slow", reason]
            await c.send_json(["COUNT", "n", everything])
            assert await c.recv_json(timeout=60) == ["CLOSED", "n", reason]
            holder.rollback()
        # The same reads within the budget, on the same connection: the set and its count.
        final, events = await query(c, "q", {**everything, "limit": 50})
        assert final[0] == "EOSE" and len(events) == 20
        await c.send_json(["COUNT", "m", everything])
        assert (await c.expect("COUNT"))[2] == {"count": 20}
