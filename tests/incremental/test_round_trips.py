"""Pinned: the database round trips of one incremental page behind a bearer token, and of one behind an
authenticated actor (NIP-98 authenticates before the read). Method as tests/artifacts/test_query_round_trips.py:
artifacts.incremental.read_page runs in-process on buzz.runtime's pool, traced by libpq; a round trip is
one wait for the server (a Sync or a simple Query); counts are a warmed-up connection's (no prepares).
The pages are checked to return the artifacts and to follow each other.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async

from artifacts import incremental
from buzz.access.policy import BANNED, Denied
from buzz.chat import bans
from buzz.events.ingest import ingest
from buzz.identity.actor import Actor
from buzz.models import Community
from buzz.nostr import Signer
from buzz.runtime import pipeline, runtime
from tests.support.factories import make_channel, make_community, make_token, revision
from tests.support.inprocess import WAIT, Harness, actor_of, community_info

HOST = "incremental-trips.test"
WARMUP = 6
DEADLINE_S = 8.0
PROBE_LOCK = 4_242_001  # an advisory lock key of test_a_page_in_one_round_trip_is_one_read_only_snapshot

PINNED = {
    # The first page of a pass whose reader and scope this process knows from the reader's last page of the
    # query: the head (the budget, clock, stamp and TTL channels, the token and its holder's admission, the
    # policy's scope statements and the page's plan settings) and the page over the remembered scope (up to
    # the clock read with it), in one pipeline, its implicit transaction (the page is used because the scope
    # read with it is the same).
    "bearer page": 1,
    "actor page": 1,
    # A continuation: the same, its page planned from its cursor.
    "bearer continuation": 1,
    "actor continuation": 1,
    # The first request of a token: its holder is not known yet, so the scope is a round trip of its own.
    "bearer first page": 3,
    # With #h: the reader's standing and the named channels' facts are the scope statements. The first #h
    # page of a known holder: its scope is not remembered yet, so the page is a round trip of its own.
    "#h first page": 2,
    "#h page": 1,
    "#h continuation": 1,
    # The first page of a later pass (a checkpoint), for each reader.
    "bearer later page": 1,
    "#h later page": 1,
}
# The statements those round trips send (every statement costs the relay a psycopg execute and the server a
# bind and an execute): a page of one round trip is two, the head and the page. The first request of a
# token: BEGIN and the head (with the token); the scope; the page's plan settings, the page and COMMIT. The
# first #h page: BEGIN and the head (with the token, the reader's standing and the named channels' facts);
# the plan settings, the page and COMMIT.
STATEMENTS = {label: 2 for label in PINNED} | {"bearer first page": 6, "#h first page": 5}


@pytest.fixture
def desk(transactional_db: None, settings: Any) -> tuple[Community, Signer, uuid.UUID, str]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    settings.BUZZ_INCREMENTAL = {
        **settings.BUZZ_INCREMENTAL,
        "enabled": True,
        "signing_key": "trips-" + "k" * 40,
        "page_rows": 2,  # three artifacts: a first page and a continuation
    }
    alice = Signer.generate()
    community = make_community(HOST, members=[alice])
    channel = make_channel(community, alice, visibility="private")
    return community, alice, channel, make_token(community, alice, ["messages:read"])


async def three_artifacts(writer: Actor, alice: Signer, channel: uuid.UUID) -> set[str]:
    """Three artifacts created in `channel` through the write path; their revision ids."""
    ids = set()
    for _ in range(3):
        event = revision(alice, d=uuid.uuid4(), h=channel)
        _, result = await ingest(writer, event)
        assert result.ok, result
        ids.add(event["id"])
    return ids


async def test_round_trips_per_incremental_page(desk: tuple[Community, Signer, uuid.UUID, str]) -> None:
    community, alice, channel, token = desk
    writer = actor_of(community, alice)
    ids = await three_artifacts(writer, alice, channel)
    info = community_info(community)
    request = incremental.parse_request([{"artifact": "incremental", "query": {"artifact": "current"}}])
    named = incremental.parse_request(
        [{"artifact": "incremental", "query": {"artifact": "current", "#h": [str(channel)]}}]
    )
    incremental._HOLDERS.clear()
    incremental._SCOPES.clear()
    got: dict[str, int] = {}
    sent: dict[str, int] = {}
    async with Harness.open(await incremental.read_pool()) as h:
        loop_time = asyncio.get_running_loop().time
        bearer = incremental.Bearer(info, f"Bearer {token}")

        async def page(label: str, who: Any, req: incremental.Request, i: int) -> dict[str, Any]:
            trips, _, body = await h.measure(incremental.read_page(who, req, loop_time() + DEADLINE_S))
            assert trips.prepares == 0 or i < WARMUP, trips
            got[label] = trips.total
            sent[label] = sum(len(trip.split(" + ")) for trip in trips.statements)
            return dict(json.loads(body))

        async def full_pass(label: str, who: Any, req: incremental.Request, i: int) -> str:
            """A pass of two pages over the three artifacts; its checkpoint."""
            first = await page(f"{label}page", who, req, i)
            assert len(first["changes"]) == 2 and first["nextCursor"], first
            more = incremental.Request(query=req.query, digest=req.digest, cursor=first["nextCursor"])
            rest = await page(f"{label}continuation", who, more, i)
            assert rest["nextCursor"] is None and rest["checkpoint"], rest
            assert {c["event"]["id"] for c in first["changes"] + rest["changes"]} == ids
            return str(rest["checkpoint"])

        await page("bearer first page", bearer, request, 0)
        await page("#h first page", bearer, named, 0)
        for i in range(WARMUP + 1):
            checkpoint = await full_pass("bearer ", bearer, request, i)
            await full_pass("actor ", writer, request, i)
            named_checkpoint = await full_pass("#h ", bearer, named, i)
            # A later pass right after: the three heads are in its window (start - 120 s), its first page two.
            for label, req, saved in (("bearer ", request, checkpoint), ("#h ", named, named_checkpoint)):
                later = incremental.Request(query=req.query, digest=req.digest, checkpoint=saved)
                body = await page(f"{label}later page", bearer, later, i)
                assert len(body["changes"]) == 2 and body["nextCursor"], body
                assert {c["event"]["id"] for c in body["changes"]} <= ids, body
    assert got == PINNED, f"{got}, pinned {PINNED}"
    assert sent == STATEMENTS, f"{sent}, pinned {STATEMENTS}"


def _reading(desk: tuple[Community, Signer, uuid.UUID, str], named: bool) -> tuple[incremental.Request, Any]:
    """A pass's first request (wide, or #h naming the desk's channel) and the desk token's credential, with
    nothing remembered of any reader's scope."""
    community, _, channel, token = desk
    query: dict[str, Any] = {"artifact": "current", **({"#h": [str(channel)]} if named else {})}
    incremental._SCOPES.clear()
    request = incremental.parse_request([{"artifact": "incremental", "query": query}])
    return request, incremental.Bearer(community_info(community), f"Bearer {token}")


@pytest.mark.parametrize("named", [False, True], ids=["wide", "#h"])
@pytest.mark.parametrize("which", ["continuation", "later first page"])
async def test_a_page_whose_scope_guess_is_wrong_is_read_again(
    desk: tuple[Community, Signer, uuid.UUID, str], named: bool, which: str
) -> None:
    community, alice, channel, _ = desk
    ids = await three_artifacts(actor_of(community, alice), alice, channel)
    request, bearer = _reading(desk, named)
    async with Harness.open(await incremental.read_pool()) as h:
        loop_time = asyncio.get_running_loop().time
        first = json.loads(await incremental.read_page(bearer, request, loop_time() + DEADLINE_S))
        more = incremental.Request(query=request.query, digest=request.digest, cursor=first["nextCursor"])
        if which == "later first page":
            rest = json.loads(await incremental.read_page(bearer, more, loop_time() + DEADLINE_S))
            more = incremental.Request(query=request.query, digest=request.digest, checkpoint=rest["checkpoint"])
        # Another channel than the reader's: the page read with it is not the answer.
        for key in list(incremental._SCOPES):
            incremental._SCOPES[key] = [uuid.uuid4()]
        trips, _, body = await h.measure(incremental.read_page(bearer, more, loop_time() + DEADLINE_S))
        page = json.loads(body)
        assert trips.total > 1, trips
        if which == "continuation":
            assert {c["event"]["id"] for c in first["changes"] + page["changes"]} == ids
            assert page["checkpoint"] and page["nextCursor"] is None
        assert list(incremental._SCOPES.values()) == [[channel]]  # the guess is the fresh scope again
        if which == "later first page":
            # The later window holds the three heads (and the channel's grant, seconds old): the same changes as a
            # read with nothing remembered, and as one with the right guess (one round trip).
            incremental._SCOPES.clear()
            fresh = json.loads(await incremental.read_page(bearer, more, loop_time() + DEADLINE_S))
            trips, _, body = await h.measure(incremental.read_page(bearer, more, loop_time() + DEADLINE_S))
            guessed = json.loads(body)
            assert trips.total == 1, trips
            assert len(page["changes"]) == 2 and page["nextCursor"], page
            assert page["changes"] == fresh["changes"] == guessed["changes"]
            assert {c["event"]["id"] for c in page["changes"]} <= ids
            assert first["startedAt"] < page["startedAt"] < fresh["startedAt"] < guessed["startedAt"]


@pytest.mark.parametrize("named", [False, True], ids=["wide", "#h"])
async def test_a_first_page_in_one_round_trip_refuses_a_reader_banned_since(
    desk: tuple[Community, Signer, uuid.UUID, str], named: bool
) -> None:
    """A reader banned after a pass starts a new one: the first page, read in one round trip over the scope
    remembered from the last pass, is refused as the usual read refuses it, and returns nothing."""
    community, alice, channel, _ = desk
    await three_artifacts(actor_of(community, alice), alice, channel)
    request, bearer = _reading(desk, named)
    async with Harness.open(await incremental.read_pool()) as h:
        loop_time = asyncio.get_running_loop().time
        await incremental.read_page(bearer, request, loop_time() + DEADLINE_S)  # the holder and scope are known
        await sync_to_async(bans.ban_add)(community=community, pubkey=alice.pubkey)
        refusals = []
        for remembered in (True, False):
            if not remembered:
                incremental._SCOPES.clear()
            with pytest.raises(Denied) as refused:
                async with h.tracer.window() as trips:
                    await incremental.read_page(bearer, request, loop_time() + DEADLINE_S)
            # With the scope remembered the page and its refusal are one round trip; without it, the usual read.
            assert (trips.total == 1) == remembered, trips
            refusals.append(refused.value.reason)
    assert refusals[0] == refusals[1] == BANNED


async def test_a_page_in_one_round_trip_is_one_read_only_snapshot(transactional_db: None) -> None:
    """What PostgreSQL makes of `_page_in_one_trip`'s transaction: the statements of one pipeline on a
    connection of the incremental reads' pool (`incremental._connection`, its sessions started with
    SESSION_OPTIONS), sent without BEGIN or COMMIT, are one REPEATABLE READ, READ ONLY transaction up to the
    pipeline's Sync, its first statement already within the statement budget. A row committed elsewhere
    between two of its statements is not seen by the second, a setting made SET LOCAL holds until the Sync,
    and the Sync commits it: the connection is idle after it, and its next statement sees the row."""
    pool = await runtime.pool()
    assert isinstance(pool.conninfo, str)
    other = await psycopg.AsyncConnection.connect(pool.conninfo, autocommit=True)
    try:
        await other.execute("CREATE TABLE one_trip_probe (n int)")
        await other.execute("SELECT pg_advisory_lock(%s)", (PROBE_LOCK,))
        async with incremental._connection() as conn:
            backend = conn.info.backend_pid

            probe = "SELECT count(*), current_setting('buzz.probe') FROM one_trip_probe"

            async def one_trip() -> tuple[Any, Any]:
                async with pipeline(conn):
                    first = await conn.execute(
                        "SELECT count(*), current_setting('transaction_isolation'),"
                        " current_setting('transaction_read_only'), set_config('buzz.probe', 'set', true),"
                        " current_setting('statement_timeout') FROM one_trip_probe"
                    )
                    await conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", (PROBE_LOCK,))
                    second = await conn.execute(probe)
                return await first.fetchone(), await second.fetchone()

            reading = asyncio.ensure_future(one_trip())
            # The pipeline's backend waits for the lock: its first statements have run, the snapshot is taken.
            waiting = "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory' AND NOT granted"
            deadline = asyncio.get_running_loop().time() + WAIT
            while not (await (await other.execute(waiting, (backend,))).fetchone() or (0,))[0]:
                assert asyncio.get_running_loop().time() < deadline, "the pipeline never reached the lock"
                await asyncio.sleep(0.01)
            await other.execute("INSERT INTO one_trip_probe VALUES (1)")
            await other.execute("SELECT pg_advisory_unlock(%s)", (PROBE_LOCK,))
            first, second = await asyncio.wait_for(reading, WAIT)
            assert first == (0, "repeatable read", "on", "set", f"{incremental.STATEMENT_BUDGET_MS // 1000}s")
            assert second == (0, "set")
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert await (await conn.execute(probe)).fetchone() == (1, "")
    finally:
        await other.execute("DROP TABLE IF EXISTS one_trip_probe")
        await other.close()
        await runtime.aclose()


@pytest.mark.parametrize("token", [False, True])
@pytest.mark.parametrize("plans", [None, True, False])
def test_every_head_is_short_enough_for_psycopg_to_keep_its_conversion(token: bool, plans: bool | None) -> None:
    """Every head a read sends (`incremental._head_sql`: with or without a token's lookup, each kind of
    scope, with or without the page's plan settings) passes buzz.sqltext.hot_statement, which refuses a
    text psycopg would convert again on every execute; and it embeds what it says it does."""
    from buzz.access import policy

    scopes: list[tuple[str | None, str | None]] = [
        (None, None),
        (policy._STANDING_AND_READABLE_SQL, None),
        (policy._STANDING_SQL, None),
        (policy._STANDING_SQL, policy._ACCESS_SQL),
    ]
    for scope, facts in scopes:
        text = incremental._head_sql(token, scope, facts, plans)
        assert ("AS head_token" in text) == token
        assert ("head_scope" in text) == (scope is not None) and ("head_facts" in text) == (facts is not None)
        assert ("plan_cache_mode" in text) == (plans is not None)
        assert ("enable_sort" in text) == (plans is False)
