"""Every incremental-read error, forced for real against a relay: invalid requests, tampered tokens,
another reader's or another query's checkpoint, a policy change in the middle of a paged pass, an
expired checkpoint (minted with an older clock), the per-process concurrency limit and the statement
and operation budgets (a table held locked), and the response byte bound. No failure carries a cursor
or a checkpoint, and a reset never names a channel."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.core import signing

from artifacts.views import MAX_BODY
from buzz.chat import bans, channels
from buzz.nostr import Signer
from tests.incremental.support import SIGNING_KEY, current_ids, env, incremental, post
from tests.support.factories import make_channel, make_community, make_token, nip98, revision
from tests.support.proxy import StallableProxy
from tests.support.relay import RelayProcess, limited_role, relay_database_url, set_select
from tests.support.wire import accept, logged_in, raw_request

HOST = "incremental-errors.test"
QUERY = {"artifact": "current", "#type": ["buzz.task"]}
pytestmark = pytest.mark.timeout(300)
CHECKPOINT_SALT = "buzz.artifacts.incremental.checkpoint.v1"


class World:
    def __init__(self) -> None:
        self.w, self.r, self.other = Signer.generate(), Signer.generate(), Signer.generate()
        self.community = make_community(HOST, members=[self.w, self.r, self.other])
        self.p1 = make_channel(self.community, self.w, visibility="private", members=[self.r, self.other])
        self.secret = make_channel(self.community, self.w, visibility="private", name="secret-room")


@pytest.fixture
def world(transactional_db: None) -> World:
    return World()


async def _create(relay: RelayProcess, world: World, n: int, content: str | None = None) -> list[str]:
    ds = []
    async with logged_in(relay, world.w, host=HOST) as client:
        for _ in range(n):
            d = str(uuid.uuid4())
            await accept(client, revision(world.w, d=d, h=world.p1, content=content))
            ds.append(d)
    return ds


def _no_progress(body: dict[str, Any]) -> None:
    assert set(body) == {"error", "reason", "message"}, body
    assert "nextCursor" not in body and "checkpoint" not in body


async def _checkpoint(relay: RelayProcess, who: Signer | str, query: dict[str, Any] = QUERY) -> str:
    body: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    while True:
        status, body = await post(relay, HOST, who, incremental(query, **extra))
        assert status == 200, body
        if body["nextCursor"] is None:
            return str(body["checkpoint"])
        extra = {"cursor": body["nextCursor"]}


@pytest.mark.parametrize(
    "filt",
    [
        {"artifact": "incremental"},
        {"artifact": "incremental", "query": {"artifact": "history"}},
        {"artifact": "incremental", "query": {**QUERY, "limit": 5}},
        {"artifact": "incremental", "query": QUERY, "extra": 1},
        {"artifact": "incremental", "query": QUERY, "checkpoint": "a", "cursor": "b"},
        {"artifact": "incremental", "query": QUERY, "checkpoint": 7},
        {"artifact": "incremental", "action": "current", "query": QUERY, "artifactIds": []},
        {"artifact": "incremental", "action": "current", "query": QUERY, "artifactIds": ["a"] * 2},
        {"artifact": "incremental", "action": "current", "query": QUERY, "artifactIds": [str(i) for i in range(101)]},
        {"artifact": "incremental", "action": "current", "query": QUERY, "artifactIds": [""]},
        {"artifact": "incremental", "action": "current", "query": QUERY, "artifactIds": ["é" * 129]},
        {"artifact": "incremental", "action": "current", "query": QUERY, "artifactIds": [1]},
        {"artifact": "incremental", "action": "later", "query": QUERY, "artifactIds": ["a"]},
        {"artifact": "incremental", "action": "current", "query": QUERY, "artifactIds": ["a"], "cursor": "x"},
    ],
)
async def test_invalid_requests_are_400_incremental_invalid(
    world: World, relay_factory: Any, filt: dict[str, Any]
) -> None:
    relay = relay_factory(**env())
    status, body = await post(relay, HOST, world.r, [filt])
    assert status == 400 and body["error"] == "incremental_invalid", body
    _no_progress(body)


@pytest.mark.parametrize(
    "body",
    [
        json.dumps([{"artifact": "incremental", "query": QUERY}, {"artifact": "current"}]).encode(),  # two filters
        json.dumps({"artifact": "incremental", "query": QUERY}).encode(),  # not in an array
        b'[{"artifact": "\\u0069ncremental", "query": {"artifact": "current"}, "extra": 1}]',  # the word escaped
        # A key named twice: json.loads would keep the last (another query, or a cursor read as a first page).
        b'[{"artifact": "incremental", "query": {"artifact": "current", "#x": ["a"], "#x": ["b"]}}]',
        b'[{"artifact": "incremental", "query": {"artifact": "current"}, "cursor": "c", "cursor": null}]',
        # Larger than any valid request: invalid, not incremental_limit (which says "split the batch").
        json.dumps([{"artifact": "incremental", "query": QUERY, "cursor": "c" * MAX_BODY}]).encode(),
    ],
)
async def test_a_malformed_incremental_body_is_answered_as_an_incremental_read(
    world: World, relay_factory: Any, body: bytes
) -> None:
    relay = relay_factory(**env())
    status, answer = await post(relay, HOST, world.r, body)
    assert status == 400 and answer["error"] == "incremental_invalid", answer
    _no_progress(answer)


async def test_an_id_that_is_no_uuid_nul_included_is_answered_with_remove(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env())
    ids = ["a\x00b", "\x00" * 36, "not-a-uuid"]
    status, body = await post(relay, HOST, world.r, current_ids(QUERY, ids))
    assert status == 200, body
    assert body["changes"] == [{"type": "remove", "artifactId": i} for i in ids]


async def test_the_id_bounds_are_inclusive(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env())
    ids = [str(uuid.uuid4()) for _ in range(99)] + ["é" * 128]  # 100 ids, one of exactly 256 bytes
    status, body = await post(relay, HOST, world.r, current_ids(QUERY, ids))
    assert status == 200 and [c["type"] for c in body["changes"]] == ["remove"] * 100


async def test_tampered_tokens_other_readers_and_other_queries_are_400(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env(BUZZ_INCREMENTAL_PAGE_ROWS="2"))
    await _create(relay, world, 5)
    status, first = await post(relay, HOST, world.r, incremental(QUERY))
    assert status == 200 and first["nextCursor"]
    cursor = first["nextCursor"]
    checkpoint = await _checkpoint(relay, world.r)
    tampered: list[tuple[dict[str, Any], Signer | str, dict[str, Any]]] = [
        ({"cursor": cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")}, world.r, QUERY),
        ({"checkpoint": checkpoint[:10] + ("x" if checkpoint[10] != "x" else "y") + checkpoint[11:]}, world.r, QUERY),
        ({"checkpoint": cursor}, world.r, QUERY),  # a cursor is no checkpoint (each kind has its own salt)
        ({"cursor": checkpoint}, world.r, QUERY),
        ({"checkpoint": checkpoint}, world.other, QUERY),  # another reader
        ({"cursor": cursor}, world.other, QUERY),
        ({"checkpoint": checkpoint}, world.r, {**QUERY, "#type": ["buzz.note"]}),  # another query
        ({"cursor": cursor}, world.r, {"#type": ["buzz.task"], "artifact": "current", "#h": [str(world.p1)]}),
    ]
    token = await sync_to_async(make_token)(world.community, world.r)
    tampered.append(({"checkpoint": checkpoint}, token, QUERY))  # the same pubkey with a token is another reader
    for extra, who, query in tampered:
        status, body = await post(relay, HOST, who, incremental(query, **extra))
        assert status == 400 and body["error"] == "incremental_invalid" and body["reason"] == "token", (extra, body)
        _no_progress(body)
    # A token signed with another key (another deployment) is refused the same way.
    other = relay_factory(**env(BUZZ_INCREMENTAL_SIGNING_KEY="another-key-" + "k" * 40))
    status, body = await post(other, HOST, world.r, incremental(QUERY, checkpoint=checkpoint))
    assert status == 400 and body["error"] == "incremental_invalid"
    # The originals still work.
    status, _ = await post(relay, HOST, world.r, incremental(QUERY, cursor=cursor))
    assert status == 200
    status, _ = await post(relay, HOST, world.r, incremental(QUERY, checkpoint=checkpoint))
    assert status == 200


@pytest.mark.parametrize("change", ["visibility of an empty channel", "ban of another member", "channel deletion"])
async def test_a_policy_change_mid_pass_is_409_policy_changed(world: World, relay_factory: Any, change: str) -> None:
    relay = relay_factory(**env(BUZZ_INCREMENTAL_PAGE_ROWS="2"))
    await _create(relay, world, 5)
    checkpoint = await _checkpoint(relay, world.r)
    status, first = await post(relay, HOST, world.r, incremental(QUERY))
    assert status == 200 and first["nextCursor"]
    if change.startswith("visibility"):
        await sync_to_async(channels.channel_edit)(
            community=world.community, channel_uuid=world.secret, actor=None, changes={"visibility": "open"}
        )
    elif change.startswith("ban"):
        await sync_to_async(bans.ban_add)(community=world.community, pubkey=world.other.pubkey)
    else:
        await sync_to_async(channels.channel_delete)(community=world.community, channel_uuid=world.secret, actor=None)
    for extra in ({"cursor": first["nextCursor"]}, {"checkpoint": checkpoint}):
        status, body = await post(relay, HOST, world.r, incremental(QUERY, **extra))
        assert status == 409, body
        assert body["error"] == "incremental_reset" and body["reason"] == "policy_changed"
        assert str(world.secret) not in body["message"] and "secret-room" not in body["message"]
        _no_progress(body)
    # Recovery: a new initial read works.
    assert await _checkpoint(relay, world.r)


async def test_membership_changes_and_artifact_writes_do_not_reset(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env())
    checkpoint = await _checkpoint(relay, world.r)
    await _create(relay, world, 2)
    await sync_to_async(channels.member_remove)(
        community=world.community, channel_uuid=world.p1, actor=None, pubkey=world.other.pubkey
    )
    status, body = await post(relay, HOST, world.r, incremental(QUERY, checkpoint=checkpoint))
    assert status == 200, body


def _resigned(checkpoint: str, *, days_older: float) -> str:
    """The same checkpoint as if its pass had started `days_older` days earlier (an injected clock)."""
    payload = signing.loads(checkpoint, key=SIGNING_KEY, salt=CHECKPOINT_SALT)
    payload["s"] -= int(dt.timedelta(days=days_older).total_seconds() * 1_000_000)
    return signing.dumps(payload, key=SIGNING_KEY, salt=CHECKPOINT_SALT, compress=True)


async def test_a_checkpoint_older_than_30_days_is_409_checkpoint_expired(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env())
    checkpoint = await _checkpoint(relay, world.r)
    status, body = await post(
        relay, HOST, world.r, incremental(QUERY, checkpoint=_resigned(checkpoint, days_older=29.9))
    )
    assert status == 200, body
    status, body = await post(
        relay, HOST, world.r, incremental(QUERY, checkpoint=_resigned(checkpoint, days_older=30.01))
    )
    assert status == 409 and body["error"] == "incremental_reset" and body["reason"] == "checkpoint_expired", body
    _no_progress(body)


async def test_pages_shrink_to_the_byte_bound_and_one_oversized_result_is_413(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env(BUZZ_INCREMENTAL_RESPONSE_BYTES="16000"))
    small = await _create(relay, world, 6, content='{"pad": "' + "x" * 3000 + '"}')
    seen: list[str] = []
    extra: dict[str, Any] = {}
    pages = 0
    while True:
        status, raw = await post(relay, HOST, world.r, incremental(QUERY, **extra))
        assert status == 200, raw
        pages += 1
        assert len(raw["changes"]) < 6
        seen.extend(c["artifactId"] for c in raw["changes"])
        if raw["nextCursor"] is None:
            checkpoint = raw["checkpoint"]
            break
        extra = {"cursor": raw["nextCursor"]}
    assert sorted(seen) == sorted(small) and pages >= 2
    [big] = await _create(relay, world, 1, content='{"pad": "' + "x" * 20000 + '"}')
    # Each pass pages up to the big one (the pages before it are fine), which no page can hold.
    for start in (incremental(QUERY, checkpoint=checkpoint), incremental(QUERY)):
        body = start
        while True:
            status, failed = await post(relay, HOST, world.r, body)
            if status != 200:
                break
            assert failed["nextCursor"] is not None, "a pass that holds the big result can't complete"
            body = incremental(QUERY, cursor=failed["nextCursor"])
        assert status == 413 and failed["error"] == "incremental_limit", failed
        _no_progress(failed)
    status, failed = await post(relay, HOST, world.r, current_ids(QUERY, [big, *small[:1]]))
    assert status == 413 and failed["error"] == "incremental_limit", failed
    _no_progress(failed)
    status, ok = await post(relay, HOST, world.r, current_ids(QUERY, small[:2]))
    assert status == 200 and [c["type"] for c in ok["changes"]] == ["upsert", "upsert"]


async def test_a_change_that_fits_the_bound_with_its_envelope_is_served(world: World, relay_factory: Any) -> None:
    # The page keeps room for its envelope and one token (2304 bytes), no more: a change of about 6 KB fits
    # a bound of 8,192 bytes, in a page no larger than the bound.
    relay = relay_factory(**env(BUZZ_INCREMENTAL_RESPONSE_BYTES="8192"))
    [d] = await _create(relay, world, 1, content='{"pad": "' + "x" * 5000 + '"}')
    data = json.dumps(incremental(QUERY)).encode()
    headers = {
        "Host": HOST,
        "Content-Type": "application/json",
        "Authorization": nip98(world.r, HOST, "POST", "/query", data),
    }
    status, raw = await asyncio.to_thread(raw_request, relay, "POST", "/query", headers, data, 30)
    assert status == 200, raw
    assert len(raw) <= 8192
    body = json.loads(raw)
    assert [c["artifactId"] for c in body["changes"]] == [d] and body["checkpoint"]


async def test_the_concurrency_limit_and_the_statement_budget_are_503(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env())
    await _create(relay, world, 1)
    # Hold the artifact table: each read that gets a slot waits on it until its 2 s statement budget ends.
    with psycopg.connect(relay_database_url(), autocommit=False) as lock:
        lock.execute("LOCK TABLE artifacts_artifact IN ACCESS EXCLUSIVE MODE")
        answers = await asyncio.gather(*(post(relay, HOST, world.r, incremental(QUERY)) for _ in range(10)))
        lock.rollback()
    reasons = sorted(body["reason"] for _, body in answers)
    assert all(status == 503 for status, _ in answers), answers
    assert {body["error"] for _, body in answers} == {"incremental_unavailable"}
    assert reasons.count("statement_budget") <= 4 and "concurrency" in reasons and "statement_budget" in reasons
    for _, body in answers:
        _no_progress(body)
    status, body = await post(relay, HOST, world.r, incremental(QUERY))
    assert status == 200, body


def _waiting_on(lock: psycopg.Connection[Any], table: str) -> int:
    """Backends other than `lock`'s waiting for a lock on `table`."""
    row = lock.execute(
        "SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted AND pid <> pg_backend_pid()",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_continuation_past_its_statement_budget_is_503_and_cancelled_on_the_server(
    world: World, relay_factory: Any
) -> None:
    # A continuation of a reader the relay knows is read in one round trip
    # (artifacts.incremental._page_in_one_trip) under the same 2 s statement budget: past it, 503
    # statement_budget, its statement is cancelled on the server, and the same cursor reads the page once
    # the table is free.
    relay = relay_factory(**env(BUZZ_INCREMENTAL_PAGE_ROWS="1"))
    ds = await _create(relay, world, 2)
    status, first = await post(relay, HOST, world.r, incremental(QUERY))
    assert status == 200 and first["nextCursor"], first
    more = incremental(QUERY, cursor=first["nextCursor"])
    with psycopg.connect(relay_database_url(), autocommit=False) as lock:
        lock.execute("LOCK TABLE artifacts_artifact IN ACCESS EXCLUSIVE MODE")
        status, failed = await post(relay, HOST, world.r, more)
        waiting = _waiting_on(lock, "artifacts_artifact")
        lock.rollback()
    assert status == 503 and failed["reason"] == "statement_budget", failed
    _no_progress(failed)
    assert waiting == 0, "the timed-out statement still waits on the server"
    status, rest = await post(relay, HOST, world.r, more)
    assert status == 200, rest
    assert [c["artifactId"] for c in first["changes"] + rest["changes"]] == ds


async def test_a_database_failure_is_503_and_advances_nothing(world: World, relay_factory: Any) -> None:
    writer = relay_factory(**env())
    await _create(writer, world, 2)
    with limited_role() as (url, role):
        relay = relay_factory(**env(DATABASE_URL=url))
        status, body = await post(relay, HOST, world.r, incremental(QUERY))
        assert status == 200 and len(body["changes"]) == 2, body
        checkpoint = body["checkpoint"]
        # The relay's role loses SELECT on the revisions (the heads' text): every page read fails.
        set_select(role, "artifacts_revision", allowed=False)
        for request in (incremental(QUERY), incremental(QUERY, checkpoint=checkpoint)):
            status, failed = await post(relay, HOST, world.r, request)
            assert status == 503 and (failed["error"], failed["reason"]) == ("incremental_unavailable", "database")
            _no_progress(failed)
        set_select(role, "artifacts_revision", allowed=True)
        status, body = await post(relay, HOST, world.r, incremental(QUERY, checkpoint=checkpoint))
        assert status == 200 and body["checkpoint"], body  # the old checkpoint still works: nothing advanced


async def test_nip98_authentication_past_its_statement_budget_is_503(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env())
    # NIP-98 authentication reads the relay members before the read's transaction, under a statement
    # budget of its own (artifacts.incremental.statement): held, it ends after 2 s, not at the 8 s operation.
    with psycopg.connect(relay_database_url(), autocommit=False) as lock:
        lock.execute("LOCK TABLE buzz_relaymember IN ACCESS EXCLUSIVE MODE")
        status, body = await post(relay, HOST, world.r, incremental(QUERY))
        waiting = _waiting_on(lock, "buzz_relaymember")
        lock.rollback()
    assert status == 503 and body["error"] == "incremental_unavailable" and body["reason"] == "statement_budget", body
    _no_progress(body)
    assert waiting == 0, "the timed-out admission lookup still waits on the server"
    status, body = await post(relay, HOST, world.r, incremental(QUERY))
    assert status == 200, body


async def test_the_operation_budget_is_503(world: World, relay_factory: Any) -> None:
    # A database that stops answering (a proxy that stops forwarding) never enforces a statement_timeout: the
    # relay's 8 s operation budget ends the read.
    token = await sync_to_async(make_token)(world.community, world.r, ["messages:read"])
    proxy = StallableProxy(relay_database_url())
    relay = relay_factory(**env(DATABASE_URL=await proxy.start()))
    try:
        status, body = await post(relay, HOST, token, incremental(QUERY))
        assert status == 200, body
        proxy.stall()
        status, body = await post(relay, HOST, token, incremental(QUERY))
        proxy.resume()
        assert status == 503 and body["error"] == "incremental_unavailable", body
        assert body["reason"] == "operation_budget", body
        _no_progress(body)
        status, body = await post(relay, HOST, token, incremental(QUERY))
        assert status == 200, body  # and reads again once the database answers
    finally:
        proxy.resume()
        await proxy.aclose()
