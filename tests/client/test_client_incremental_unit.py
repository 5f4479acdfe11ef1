"""The incremental client's own logic, with the relay's answers scripted (no network): what it checks in an
answer, what it applies and when it saves progress, its retries and its resets. The protocol against a real
relay is tests/client/test_client_incremental_relay.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from artifacts.client import (
    Capability,
    Confirmed,
    CurrentFilter,
    Event,
    FollowRefused,
    HttpError,
    IncrementalProtocolError,
    IncrementalRefused,
    Keys,
    PassState,
    Pulled,
    Puller,
    PullReport,
    Reconnecting,
    RelayUrl,
    Store,
    StoreMismatch,
    revision,
)
from tests.client.fake_relay import FakeConnection, FakeRelay

URL = RelayUrl.parse("ws://relay.test:7777/")
CAP = Capability(
    page_rows=3,
    current_rows=2,
    response_bytes=8 << 20,
    overlap_seconds=120,
    checkpoint_lifetime_seconds=2592000,
    permanent_channels_only=True,
)
KEYS = Keys.generate()
H1, H2 = str(uuid.UUID(int=1, version=4)), str(uuid.UUID(int=2, version=4))
QUERY = CurrentFilter.of(types=["buzz.task"])
STARTED = "2026-12-07T00:00:00.000000Z"


def art(n: int, h: str = H1, **kw: Any) -> Event:
    return revision(
        KEYS,
        d=str(uuid.UUID(int=1000 + n, version=4)),
        h=h,
        type=kw.pop("type", "buzz.task"),
        op=kw.pop("op", "create"),
        title=f"t{n}",
        content={"n": n},
        **kw,
    )


def upsert(event: Event) -> dict[str, Any]:
    return {"type": "upsert", "artifactId": event.first("d"), "event": event.to_dict()}


def page(changes: list[dict[str, Any]], *, cursor: str | None = None, checkpoint: str = "cp") -> dict[str, Any]:
    body: dict[str, Any] = {"version": 1, "startedAt": STARTED, "overlapSeconds": 120, "changes": changes}
    body["nextCursor"] = cursor
    if cursor is None:
        body["checkpoint"] = checkpoint
    return body


class Script:
    """The relay's answers, in order; records each request."""

    def __init__(self, answers: Sequence[tuple[int, Any] | Exception]) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, payload: dict[str, Any]) -> tuple[int, Any]:
        self.requests.append(payload)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def puller(store: Store, script: Script, sleeps: Sleeps | None = None, **kw: Any) -> Puller:
    return Puller(URL, KEYS, QUERY, store, post=script, capability=CAP, sleep=sleeps or Sleeps(), rng=lambda: 0.5, **kw)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "s.db", relay=URL, pubkey=KEYS.pubkey, query=QUERY)


async def test_a_pass_follows_cursors_and_saves_the_checkpoint_with_the_final_page(store: Store) -> None:
    a, b, c = art(1), art(2), art(3)
    script = Script([(200, page([upsert(a), upsert(b)], cursor="c1")), (200, page([upsert(c)], checkpoint="cp1"))])
    report = await puller(store, script).pull()
    assert (report.kind, report.pages, report.upserts, report.held) == ("initial", 2, 3, 3)
    assert store.checkpoint == "cp1"
    assert [r.get("cursor") for r in script.requests] == [None, "c1"]
    assert "checkpoint" not in script.requests[0] and script.requests[0]["query"] == QUERY.to_json()
    # The next pull starts from the checkpoint, and applies removals only where told.
    script = Script([(200, page([{"type": "remove", "artifactId": a.first("d")}], checkpoint="cp2"))])
    report = await puller(store, script).pull()
    assert report.kind == "later" and script.requests[0]["checkpoint"] == "cp1"
    assert store.heads() == {b.first("d"): b.id, c.first("d"): c.id} and store.checkpoint == "cp2"


async def test_a_failed_pass_keeps_the_prior_checkpoint(store: Store) -> None:
    a, b = art(1), art(2)
    await puller(store, Script([(200, page([upsert(a)], checkpoint="cp1"))])).pull()
    script = Script(
        [
            (200, page([upsert(b)], cursor="c1")),
            (400, {"error": "incremental_invalid", "reason": None, "message": "bad cursor"}),
        ]
    )
    with pytest.raises(IncrementalRefused) as refused:
        await puller(store, script).pull()
    assert (refused.value.status, refused.value.code) == (400, "incremental_invalid")
    assert refused.value.reason == "bad cursor (HTTP 400 incremental_invalid)"
    assert store.checkpoint == "cp1"
    # The first page was applied (a replay of it is idempotent); progress did not advance.
    assert set(store.heads()) == {a.first("d"), b.first("d")}


def _bad_pages() -> list[tuple[str, list[tuple[int, Any]]]]:
    good = art(1)
    other = Keys.generate()
    forged = dict(upsert(good), event={**good.to_dict(), "sig": other.sign(1, [], "").sig})
    wrong_d = dict(upsert(good), artifactId=str(uuid.uuid4()))
    note = art(2, type="buzz.note")
    deletion = art(3, op="delete")
    kind1 = other.sign(1, [["d", str(uuid.uuid4())], ["h", H1], ["type", "buzz.task"]], "")
    shifted = page([], cursor="c1")
    late = dict(page([]), startedAt="2026-12-07T00:00:01.000000Z")
    return [
        ("a forged signature", [(200, page([forged]))]),
        ("an artifactId that is not the event's d", [(200, page([wrong_d]))]),
        ("an event outside the query", [(200, page([upsert(note)]))]),
        ("a deletion as an upsert", [(200, page([upsert(deletion)]))]),
        (
            "an event of another kind",
            [(200, page([{"type": "upsert", "artifactId": kind1.first("d"), "event": kind1.to_dict()}]))],
        ),
        ("an unknown change type", [(200, page([{"type": "gone", "artifactId": good.first("d")}]))]),
        ("another version", [(200, dict(page([upsert(good)]), version=2))]),
        ("another overlap", [(200, dict(page([upsert(good)]), overlapSeconds=60))]),
        ("no checkpoint on the final page", [(200, {k: v for k, v in page([]).items() if k != "checkpoint"})]),
        ("a checkpoint before the final page", [(200, dict(page([], cursor="c1"), checkpoint="early"))]),
        ("more changes than pageRows", [(200, page([upsert(art(n)) for n in range(4)]))]),
        ("startedAt changing within a pass", [(200, shifted), (200, late)]),
        ("not an object", [(200, ["not", "a", "page"])]),
    ]


BAD_PAGES = _bad_pages()


@pytest.mark.parametrize(("case", "answers"), BAD_PAGES, ids=[c for c, _ in BAD_PAGES])
async def test_an_answer_the_spec_does_not_allow_applies_nothing(
    store: Store, case: str, answers: list[tuple[int, Any]]
) -> None:
    kept = art(9)
    await puller(store, Script([(200, page([upsert(kept)], checkpoint="cp0"))])).pull()
    with pytest.raises(IncrementalProtocolError):
        await puller(store, Script(answers)).pull()
    assert store.heads() == {kept.first("d"): kept.id}
    assert store.checkpoint == "cp0"


async def test_a_current_id_answer_is_one_change_per_id_in_order(store: Store) -> None:
    a, b = art(1), art(2)
    ids = [a.first("d") or "", b.first("d") or ""]
    current = {"version": 1, "startedAt": STARTED}
    swapped = Script([(200, {**current, "changes": [upsert(b), upsert(a)]})])
    with pytest.raises(IncrementalProtocolError):
        await puller(store, swapped).confirm(ids)
    short = Script([(200, {**current, "changes": [upsert(a)]})])
    with pytest.raises(IncrementalProtocolError):
        await puller(store, short).confirm(ids)
    assert store.heads() == {}
    # currentRows is 2 here: three ids are two batches.
    c = art(3)
    script = Script(
        [
            (200, {**current, "changes": [upsert(a), {"type": "remove", "artifactId": ids[1]}]}),
            (200, {**current, "changes": [upsert(c)]}),
        ]
    )
    answer = await puller(store, script).confirm([*ids, c.first("d") or "", ids[0]])
    assert [len(r["artifactIds"]) for r in script.requests] == [2, 1]
    assert [(e.type, e.id) for e in answer] == [("upsert", ids[0]), ("remove", ids[1]), ("upsert", c.first("d"))]
    assert store.heads() == {ids[0]: a.id, c.first("d"): c.id}


async def test_unavailable_is_retried_with_backoff_then_given_up(store: Store) -> None:
    busy = (503, {"error": "incremental_unavailable", "reason": "busy", "message": "busy"})
    sleeps = Sleeps()
    script = Script([busy, busy, (200, page([upsert(art(1))], checkpoint="cp1"))])
    report = await puller(store, script, sleeps).pull()
    assert (report.retries, store.checkpoint) == (2, "cp1")
    assert sleeps.delays == [0.25, 0.5]  # full jitter at 0.5 of a ceiling that doubles from 0.5 s
    with pytest.raises(IncrementalRefused) as refused:
        await puller(store, Script([busy] * 3), attempts=3).pull()
    assert refused.value.status == 503 and store.checkpoint == "cp1"


async def test_an_unreachable_relay_is_retried_then_reported(store: Store) -> None:
    down = HttpError(0, "error: could not reach http://relay.test:7777/query: refused")
    sleeps = Sleeps()
    report = await puller(store, Script([down, (200, page([upsert(art(1))], checkpoint="cp1"))]), sleeps).pull()
    assert (report.retries, len(sleeps.delays), store.checkpoint) == (1, 1, "cp1")
    with pytest.raises(HttpError) as unreachable:
        await puller(store, Script([down, down]), attempts=2).pull()
    assert unreachable.value.reason.startswith("error: could not reach") and store.checkpoint == "cp1"


async def test_a_reset_drops_the_checkpoint_and_recovers_by_revalidation(store: Store) -> None:
    a, b, c = art(1), art(2, h=H2), art(3)
    await puller(store, Script([(200, page([upsert(a), upsert(b)], checkpoint="cp1"))])).pull()
    current = {"version": 1, "startedAt": STARTED}
    script = Script(
        [
            (409, {"error": "incremental_reset", "reason": "policy_changed", "message": "policy changed"}),
            (200, page([upsert(a), upsert(c)], checkpoint="cp2")),  # the new initial read
            (200, {**current, "changes": [{"type": "remove", "artifactId": b.first("d")}]}),  # b only: a was read
        ]
    )
    report = await puller(store, script).pull()
    assert (report.kind, report.resets, report.revalidated) == ("initial", ["policy_changed"], 1)
    assert "checkpoint" not in script.requests[1] and script.requests[2]["artifactIds"] == [b.first("d")]
    assert store.heads() == {a.first("d"): a.id, c.first("d"): c.id} and store.checkpoint == "cp2"


async def test_resets_without_end_stop_the_pull(store: Store) -> None:
    reset = (409, {"error": "incremental_reset", "reason": "checkpoint_expired", "message": "old"})
    await puller(store, Script([(200, page([upsert(art(1))], checkpoint="cp1"))])).pull()
    with pytest.raises(IncrementalRefused) as refused:
        await puller(store, Script([reset] * 3), max_resets=2).pull()
    assert refused.value.code == "incremental_reset"
    assert store.checkpoint is None  # spent: the next pull is the recovery


DOWN = HttpError(0, "error: could not reach http://relay.test:7777/query: refused")


async def test_a_recovery_stopped_between_pages_goes_on_from_its_saved_cursor(store: Store) -> None:
    a, b, c = art(1), art(2), art(3)
    await puller(store, Script([(200, page([upsert(a), upsert(b)], checkpoint="cp1"))])).pull()
    store.drop_checkpoint()  # the next pull is a recovery: a and b are to be revalidated unless read again
    with pytest.raises(HttpError):
        await puller(store, Script([(200, page([upsert(a)], cursor="c1")), DOWN]), attempts=1).pull()
    assert store.pass_state == PassState("initial", "c1", STARTED) and store.checkpoint is None
    assert store.unseen() == [b.first("d")]
    current = {"version": 1, "startedAt": STARTED, "changes": [{"type": "remove", "artifactId": b.first("d")}]}
    script = Script([(200, page([upsert(c)], checkpoint="cp2")), (200, current)])
    report = await puller(store, script).pull()
    # Only the page after the saved cursor is read again; b, held when the recovery began and not read by it,
    # is revalidated; the checkpoint comes with the revalidation, and the pass is over.
    assert [r.get("cursor") for r in script.requests] == ["c1", None]
    assert "checkpoint" not in script.requests[0] and script.requests[1]["artifactIds"] == [b.first("d")]
    assert (report.kind, report.resumed, report.restarted, report.pages, report.revalidated) == (
        "initial", True, False, 1, 1
    )  # fmt: skip
    assert store.heads() == {a.first("d"): a.id, c.first("d"): c.id} and store.checkpoint == "cp2"
    assert store.pass_state is None and store.unseen() == []


async def test_a_recovery_stopped_before_its_revalidation_goes_on_with_it(store: Store) -> None:
    a, b = art(1), art(2)
    await puller(store, Script([(200, page([upsert(a), upsert(b)], checkpoint="cp1"))])).pull()
    store.drop_checkpoint()
    with pytest.raises(HttpError):
        await puller(store, Script([(200, page([upsert(a)], checkpoint="cp2")), DOWN]), attempts=1).pull()
    assert store.pass_state == PassState("initial", None, STARTED, "cp2") and store.checkpoint is None
    current = {"version": 1, "startedAt": STARTED, "changes": [upsert(b)]}
    script = Script([(200, current)])
    report = await puller(store, script).pull()
    assert [r.get("artifactIds") for r in script.requests] == [[b.first("d")]]
    assert (report.resumed, report.pages, report.revalidated) == (True, 0, 1)
    assert store.checkpoint == "cp2" and store.pass_state is None and len(store) == 2


async def stopped_after_a_page(store: Store) -> Event:
    """`store` with checkpoint cp1 (its initial pass brought art(1)), and a later pass stopped after its first
    page (next cursor c1), which brought the returned artifact."""
    b = art(2)
    await puller(store, Script([(200, page([upsert(art(1))], checkpoint="cp1"))])).pull()
    with pytest.raises(HttpError):
        await puller(store, Script([(200, page([upsert(b)], cursor="c1")), DOWN]), attempts=1).pull()
    return b


async def test_a_saved_cursor_the_relay_refuses_starts_the_pass_over(store: Store) -> None:
    b = await stopped_after_a_page(store)
    assert store.pass_state == PassState("later", "c1", STARTED) and store.checkpoint == "cp1"
    invalid = (400, {"error": "incremental_invalid", "reason": "token", "message": "bad cursor"})
    script = Script([invalid, (200, page([upsert(b)], checkpoint="cp2"))])
    report = await puller(store, script).pull()
    # The refused cursor is dropped and the later pass starts over from the checkpoint it kept.
    assert [(r.get("cursor"), r.get("checkpoint")) for r in script.requests] == [("c1", None), (None, "cp1")]
    assert (report.kind, report.resumed, report.restarted, report.pages) == ("later", True, True, 1)
    assert store.checkpoint == "cp2" and store.pass_state is None and len(store) == 2


async def test_a_resumed_pass_whose_start_changed_is_a_violation_and_starts_over_next_time(store: Store) -> None:
    b = await stopped_after_a_page(store)
    other = {**page([upsert(b)], checkpoint="cp2"), "startedAt": "2026-12-08T00:00:00.000000Z"}
    with pytest.raises(IncrementalProtocolError):
        await puller(store, Script([(200, other)])).pull()
    assert store.pass_state is None and store.checkpoint == "cp1"
    script = Script([(200, page([upsert(b)], checkpoint="cp2"))])
    report = await puller(store, script).pull()
    assert script.requests[0].get("checkpoint") == "cp1" and not report.resumed and store.checkpoint == "cp2"


@given(st.text(max_size=200))
def test_a_saved_pass_this_client_did_not_write_is_no_pass(text: str) -> None:
    state = PassState.from_json(text)
    assert state is None or PassState.from_json(state.to_json()) == state


@pytest.mark.parametrize(
    "state",
    [PassState("initial", "c", STARTED), PassState("initial", None, STARTED, "cp"), PassState("later", "c", STARTED)],
)
def test_a_saved_pass_reads_back_as_written(state: PassState) -> None:
    assert PassState.from_json(state.to_json()) == state
    # Neither a cursor nor a checkpoint, both, or a later pass holding a checkpoint: not a state of ours.
    for bad in (["later", None, STARTED, None], ["initial", "c", STARTED, "cp"], ["later", None, STARTED, "cp"]):
        assert PassState.from_json(json.dumps(bad)) is None


def test_a_store_is_bound_to_its_relay_reader_and_query(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store(path, relay=URL, pubkey=KEYS.pubkey, query=QUERY).close()
    others: list[tuple[dict[str, Any], str]] = [
        ({"query": CurrentFilter.of(types=["buzz.note"])}, "query"),
        ({"pubkey": Keys.generate().pubkey}, "pubkey"),
        ({"relay": RelayUrl.parse("ws://elsewhere.test/")}, "relay"),
    ]
    for kw, what in others:
        args: dict[str, Any] = {"relay": URL, "pubkey": KEYS.pubkey, "query": QUERY, **kw}
        with pytest.raises(StoreMismatch, match=f"another {what}"):
            Store(path, **args)
    Store(path, relay=URL, pubkey=KEYS.pubkey, query=CurrentFilter.of(types=["buzz.task"])).close()


def test_the_order_of_a_querys_values_changes_neither_its_store_nor_what_is_sent(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    given = CurrentFilter.of([H2, H1], types=["buzz.task", "buzz.note"], tags={"status": ["open", "done"]})
    again = CurrentFilter.of([H1, H2], tags={"status": ["done", "open"]}, types=["buzz.note", "buzz.task"])
    Store(path, relay=URL, pubkey=KEYS.pubkey, query=given).close()
    store = Store(path, relay=URL, pubkey=KEYS.pubkey, query=again)  # the same query: no StoreMismatch
    sent = [Puller(URL, KEYS, q, store).query.to_json() for q in (given, again)]
    spelled = {"artifact": "current", "#h": [H1, H2], "#status": ["done", "open"], "#type": ["buzz.note", "buzz.task"]}
    assert sent[0] == sent[1] == spelled
    with pytest.raises(StoreMismatch, match="another query"):
        Store(path, relay=URL, pubkey=KEYS.pubkey, query=CurrentFilter.of([H1], types=["buzz.note", "buzz.task"]))


async def test_a_store_bound_to_another_spelling_of_its_query_keeps_its_rows_and_recovers(tmp_path: Path) -> None:
    """A store an earlier client bound to the query as given (values in their order) opens for the same query:
    its rows stay, and its checkpoint, minted for a spelling no longer sent, is dropped, so the next pull is
    the initial pass that revalidates them."""
    path = tmp_path / "s.db"
    query = CurrentFilter.of(types=["buzz.task", "buzz.note"])
    store = Store(path, relay=URL, pubkey=KEYS.pubkey, query=query)
    a = art(1)
    first = Script([(200, page([upsert(a)], checkpoint="cp1"))])
    await Puller(URL, KEYS, query, store, post=first, capability=CAP).pull()
    assert store.checkpoint == "cp1"
    # As the earlier client bound it: the values in the order given.
    earlier = json.dumps(query.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert '["buzz.task","buzz.note"]' in earlier
    with store.transaction() as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'query'", (earlier,))
    store.close()
    store = Store(path, relay=URL, pubkey=KEYS.pubkey, query=query)
    assert store.checkpoint is None and store.heads() == {a.first("d"): a.id}
    script = Script([(200, page([upsert(a)], checkpoint="cp2"))])
    report = await Puller(URL, KEYS, query, store, post=script, capability=CAP).pull()
    assert report.kind == "initial" and "checkpoint" not in script.requests[0]
    assert script.requests[0]["query"]["#type"] == ["buzz.note", "buzz.task"] and store.checkpoint == "cp2"


# A property over the store: whatever the relay says, in whatever order, the store ends as a model that
# applies the three change types literally; nothing else ever removes a row.
EVENTS = [art(n, h=H1 if n % 2 else H2) for n in range(6)]
_change = st.one_of(
    st.sampled_from(EVENTS).map(upsert),
    st.sampled_from(EVENTS).map(lambda e: {"type": "remove", "artifactId": e.first("d")}),
    st.sampled_from([H1, H2]).map(lambda h: {"type": "removeChannel", "channelId": h}),
)


@settings(max_examples=40, deadline=None)
@given(passes=st.lists(st.lists(_change, max_size=7), min_size=1, max_size=4))
async def test_the_store_applies_exactly_what_it_is_told(passes: list[list[dict[str, Any]]]) -> None:
    store = Store(":memory:", relay=URL, pubkey=KEYS.pubkey, query=QUERY)
    model: dict[str, tuple[str, str]] = {}  # d -> (head id, home)
    for n, changes in enumerate(passes):
        pages = [changes[i : i + 3] for i in range(0, len(changes), 3)] or [[]]
        answers = [(200, page(p, cursor=f"c{n}.{i}" if i < len(pages) - 1 else None)) for i, p in enumerate(pages)]
        await puller(store, Script(answers)).pull()
        for change in changes:
            if change["type"] == "upsert":
                event = change["event"]
                model[change["artifactId"]] = (event["id"], next(t[1] for t in event["tags"] if t[0] == "h"))
            elif change["type"] == "remove":
                model.pop(change["artifactId"], None)
            else:
                model = {d: v for d, v in model.items() if v[1] != change["channelId"]}
        assert store.heads() == {d: v[0] for d, v in model.items()}
    store.close()


async def test_a_current_id_read_waits_for_the_running_pass_and_its_commits(store: Store) -> None:
    a = art(1)
    gate = asyncio.Event()
    order: list[str] = []

    async def relay(payload: dict[str, Any]) -> tuple[int, Any]:
        if payload.get("action") == "current":
            order.append(f"current, checkpoint {store.checkpoint}")
            return 200, {"version": 1, "startedAt": STARTED, "changes": [upsert(a)]}
        if "cursor" not in payload:
            order.append("page 1")
            await gate.wait()  # the pass is held open here
            return 200, page([], cursor="c1")
        order.append("page 2")
        return 200, page([upsert(a)], checkpoint="cp1")

    client = Puller(URL, KEYS, QUERY, store, post=relay, capability=CAP)
    pulling = asyncio.create_task(client.pull())
    await asyncio.sleep(0.01)
    confirming = asyncio.create_task(client.confirm([a.first("d") or ""]))
    await asyncio.sleep(0.01)
    assert order == ["page 1"] and not confirming.done()
    gate.set()
    await asyncio.gather(pulling, confirming)
    assert order == ["page 1", "page 2", "current, checkpoint cp1"]


async def test_follow_subscribes_before_it_pulls_and_pulls_again_after_a_lost_connection(store: Store) -> None:
    """The WebSocket side is the scripted fake relay; the HTTP answers are scripted as above."""
    a, b = art(1), art(2)
    b2 = revision(KEYS, d=b.first("d") or "", h=H1, type="buzz.task", op="update", prev=b.id, title="t2", content={})
    current = {"version": 1, "startedAt": STARTED}

    async def relay_script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, flt = await conn.req()
        assert flt == {"kinds": [45010, 45011], "limit": 0}, flt
        await conn.send("EOSE", sub)
        if conn.index == 0:
            await pulled.wait()
            await conn.send("EVENT", sub, a.to_dict())
            await conn.send("EVENT", sub, a.to_dict())  # a repeat: one read of a
            await confirmed.wait()
            conn.drop()
        else:
            await conn.hold()

    pulled, confirmed = asyncio.Event(), asyncio.Event()
    script = Script(
        [
            (200, page([upsert(b)], checkpoint="cp1")),  # the first pull
            (200, {**current, "changes": [upsert(a)]}),  # the push's current-ID read
            (200, page([upsert(b2)], checkpoint="cp2")),  # the pull after the reconnect
        ]
    )
    sleeps = Sleeps()
    async with FakeRelay(relay_script, nip11={"artifacts": {}}) as relay:
        client = Puller(
            RelayUrl.parse(relay.url), KEYS, QUERY, store, post=script, capability=CAP, sleep=sleeps, rng=lambda: 0.5
        )
        updates = client.follow()
        try:
            first = await anext(updates)
            assert isinstance(first, Pulled) and first.report.kind == "initial"
            pulled.set()
            push = await anext(updates)
            assert isinstance(push, Confirmed) and [(e.type, e.id) for e in push.entries] == [("upsert", a.first("d"))]
            confirmed.set()
            lost = await anext(updates)
            assert isinstance(lost, Reconnecting) and (lost.failures, lost.delay) == (1, 0.25)
            again = await anext(updates)
            assert isinstance(again, Pulled) and again.report.kind == "later" and sleeps.delays == [0.25]
        finally:
            await updates.aclose()
    assert [r.get("checkpoint") for r in script.requests] == [None, None, "cp1"]
    assert script.requests[1]["artifactIds"] == [a.first("d")]
    assert store.heads() == {a.first("d"): a.id, b.first("d"): b2.id} and store.checkpoint == "cp2"


async def test_follow_starts_over_when_the_live_subscription_gets_no_eose(store: Store) -> None:
    async def relay_script(conn: FakeConnection) -> None:
        await conn.auth()
        await conn.req()
        await conn.hold()  # never EOSE

    async with FakeRelay(relay_script, nip11={"artifacts": {}}) as relay:
        client = Puller(RelayUrl.parse(relay.url), KEYS, QUERY, store, post=Script([]), capability=CAP, sleep=Sleeps())
        updates = client.follow(eose_timeout=0.2)
        try:
            lost = await asyncio.wait_for(anext(updates), 10)
            assert isinstance(lost, Reconnecting) and lost.reason == "no EOSE for the live subscription within 0.2 s"
        finally:
            await updates.aclose()
    assert store.checkpoint is None  # nothing was pulled


@pytest.mark.parametrize(
    ("reason", "refused"),
    [("restricted: not a member of that channel", True), ("invalid: bad filter", True), ("error: busy", False)],
)
async def test_follow_ends_on_a_refusal_of_its_live_subscription_and_retries_the_rest(
    store: Store, reason: str, refused: bool
) -> None:
    """A CLOSED that a retry would meet again ends follow with FollowRefused, not reconnects forever; a
    transient one (error:, resync:, rate-limited:) is a reconnect."""

    async def relay_script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, _ = await conn.req()
        await conn.send("CLOSED", sub, reason)
        await conn.hold()

    async with FakeRelay(relay_script, nip11={"artifacts": {}}) as relay:
        client = Puller(RelayUrl.parse(relay.url), KEYS, QUERY, store, post=Script([]), capability=CAP, sleep=Sleeps())
        updates = client.follow()
        try:
            if refused:
                with pytest.raises(FollowRefused) as info:
                    await asyncio.wait_for(anext(updates), 10)
                assert info.value.reason == reason
            else:
                lost = await asyncio.wait_for(anext(updates), 10)
                assert isinstance(lost, Reconnecting) and lost.reason.endswith(reason)
        finally:
            await updates.aclose()


def test_the_pull_command_says_when_it_went_on_with_a_saved_pass() -> None:
    from artifacts.client import cli

    went_on = PullReport(kind="initial", pages=1, resumed=True, held=3)
    assert "went on from the saved cursor" in cli._report_line(went_on)
    started_over = PullReport(kind="later", pages=2, resumed=True, restarted=True)
    assert "refused the saved cursor" in cli._report_line(started_over)
    assert "saved cursor" not in cli._report_line(PullReport(kind="later"))
    assert cli._report_json(started_over)["resumed"] is True and cli._report_json(started_over)["restarted"] is True


def _serving_cut_answers(answers: list[bytes]) -> tuple[str, Any]:
    """A one-thread HTTP server on a free port that answers each request with the next raw bytes of `answers`
    and then closes the connection: (its URL, the thread)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with listener:
            for raw in answers:
                conn, _ = listener.accept()
                with conn:
                    request = b""
                    while not request.endswith(b"\r\n\r\n{}"):  # the whole request (its body is {})
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        request += chunk
                    conn.sendall(raw)
                    conn.shutdown(socket.SHUT_WR)  # a close with nothing unread: no reset

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{port}/", thread


@pytest.mark.parametrize(
    "raw",
    [
        # A Content-Length the connection closes before.
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"changes": [',
        # A chunked body that stops before its last chunk.
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"cha',
    ],
)
def test_an_answer_cut_short_is_no_answer_not_a_short_body(raw: bytes) -> None:
    """The relay's process dies in the middle of a page: that is an unreachable relay (HttpError 0, which
    pulls retry with backoff), not an answer to parse, which would end a follow for good as a protocol error."""
    import urllib.request

    from artifacts.client.httpapi import _request

    url, thread = _serving_cut_answers([raw])
    with pytest.raises(HttpError) as err:
        _request(urllib.request.Request(url, data=b"{}", method="POST"), 5.0)  # noqa: S310 - a local test server
    assert err.value.status == 0 and "closed before the whole answer came" in err.value.reason
    thread.join(5)
