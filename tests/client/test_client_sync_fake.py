"""The Sync state machine against a scripted fake relay (tests/client/fake_relay.py).

* The local set is replaced only at EOSE: entries before EOSE are pending, and a sync that
  fails before EOSE (drop, CLOSED) leaves the last complete set as it was, marked stale.
* CLOSED resync:/error:, a dropped connection, a stalled initial read and a bad event start
  a new sync after exponential backoff with full jitter, observed through the injected
  sleep and random source (nothing sleeps); the streak resets at EOSE; resyncs are counted.
* Live entries after EOSE follow the match rule (tag name and FIRST value, names AND,
  values OR, #h on the h tag): insert, replace, remove on deletion or non-match, remove on
  45011; a repeat changes nothing and a head known to be older is refused.
* CLOSED restricted: and a refused AUTH end the Sync with SyncRefused; a relay that asks
  for AUTH only when needed gets it; fetch_set is REQ, EOSE, CLOSE.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from typing import Any

import pytest

from artifacts.client import (
    KIND_REMOVAL,
    Backoff,
    Change,
    ConnectionLost,
    Event,
    Keys,
    Relay,
    Restarting,
    Sync,
    SyncClosed,
    Synced,
    SyncFilter,
    SyncRefused,
    SyncUnsupported,
    SyncUpdate,
    fetch_set,
    revision,
    set_digest,
)
from tests.client.fake_relay import FakeConnection, FakeRelay

WRITER = Keys.generate()
READER = Keys.generate()
H1 = "11111111-1111-4111-8111-111111111111"
H2 = "22222222-2222-4222-8222-222222222222"
H3 = "33333333-3333-4333-8333-333333333333"
TYPE = "buzz.task"


def art(
    d: str | None = None,
    *,
    h: str = H1,
    op: str = "create",
    prev: Event | None = None,
    tags: list[list[str]] | None = None,
    type: str = TYPE,
) -> Event:
    """A signed kind 45010 (a delete has no title and empty content)."""
    delete = op == "delete"
    return revision(
        WRITER,
        d=d or (prev.first("d") if prev else None) or secrets.token_hex(16)[:8] + "-0000-4000-8000-000000000000",
        h=h,
        type=type,
        op=op,
        title=None if delete else "a task",
        prev=prev.id if prev else None,
        content="" if delete else {"n": secrets.token_hex(4)},
        tags=[] if delete else (tags if tags is not None else [["status", "open"]]),
    )


def removal(d: str, *, h: str = H1, replaced: Event | None = None) -> Event:
    relay_key = Keys.generate()
    return relay_key.sign(
        KIND_REMOVAL,
        [["ar", "1"], ["d", d], ["h", h], ["reason", "moved"], ["prev", replaced.id if replaced else "0" * 64]],
        "",
    )


FILTER = SyncFilter.of([H1], types=[TYPE])


class Sleeps:
    """The injected sleep: records each delay and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


class Driver:
    """Runs a Sync's updates in a task; the test takes them one by one."""

    def __init__(self, sync: Sync) -> None:
        self.sync = sync
        self.queue: asyncio.Queue[SyncUpdate | BaseException] = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for update in self.sync:
                await self.queue.put(update)
        except Exception as err:
            await self.queue.put(err)

    async def next(self, timeout: float = 5.0) -> SyncUpdate:
        update = await asyncio.wait_for(self.queue.get(), timeout)
        if isinstance(update, BaseException):
            raise update
        return update

    async def synced(self) -> Synced:
        update = await self.next()
        assert isinstance(update, Synced), update
        return update

    async def restart(self) -> Restarting:
        update = await self.next()
        assert isinstance(update, Restarting), update
        return update

    async def change(self) -> Change:
        update = await self.next()
        assert isinstance(update, Change), update
        return update

    async def close(self) -> None:
        await self.sync.stop()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.task, 5)


async def until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def ids(items: Any) -> dict[str, str]:
    return {d: e.id for d, e in items.items()}


def new_sync(relay: FakeRelay, sleeps: Sleeps | None = None, **kwargs: Any) -> Sync:
    backoff = kwargs.pop("backoff", Backoff(base=1.0, cap=8.0, random=lambda: 0.5))
    return Sync(relay.url, READER, kwargs.pop("flt", FILTER), backoff=backoff, sleep=sleeps or Sleeps(), **kwargs)


# --- commit point -----------------------------------------------------------------------


async def test_the_set_is_replaced_only_at_eose() -> None:
    a, b, c, d = art(), art(), art(), art()
    gates = [asyncio.Event() for _ in range(3)]
    filters: list[dict[str, Any]] = []

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, flt = await conn.req()
        filters.append(flt)
        await conn.send("EVENT", sub, a.to_dict())
        await conn.send("EVENT", sub, b.to_dict())
        await gates[0].wait()
        await conn.send("EOSE", sub)
        await gates[1].wait()
        await conn.send("CLOSED", sub, "resync: membership changed")
        sub2, flt2 = await conn.req()  # the same connection serves the new sync
        filters.append(flt2)
        await conn.send("EVENT", sub2, c.to_dict())
        await conn.send("EVENT", sub2, d.to_dict())
        await gates[2].wait()
        await conn.send("EOSE", sub2)

    async with FakeRelay(script) as relay:
        sync = new_sync(relay)
        driver = Driver(sync)
        try:
            await until(lambda: sync.pending == 2, "two initial entries")
            assert dict(sync.items) == {} and not sync.complete
            gates[0].set()
            first = await driver.synced()
            assert ids(first.items) == {a.first("d"): a.id, b.first("d"): b.id}
            assert first.digest == sync.digest == set_digest(ids(first.items))
            assert (sync.complete, sync.stale, sync.resyncs) == (True, False, 0)

            gates[1].set()
            restart = await driver.restart()
            assert (restart.cause, restart.reason) == ("resync", "resync: membership changed")
            await until(lambda: sync.pending == 2, "two entries of the second sync")
            # Until its EOSE, the second sync's entries are not the set: the first set stays, stale.
            assert ids(sync.items) == ids(first.items) and sync.stale
            gates[2].set()
            second = await driver.synced()
            assert ids(second.items) == {c.first("d"): c.id, d.first("d"): d.id}
            assert (second.resyncs, sync.resyncs, sync.stale) == (1, 1, False)
        finally:
            await driver.close()
    assert filters == [{"artifact": "current", "#h": [H1], "#type": [TYPE]}] * 2
    assert len(relay.connections) == 1 and relay.authenticated == [READER.pubkey]


async def test_a_drop_before_eose_discards_what_came_and_keeps_the_last_set() -> None:
    a, b, c, d = art(), art(), art(), art()
    dropped, gate = asyncio.Event(), asyncio.Event()

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, _ = await conn.req()
        if conn.index == 0:
            await conn.send("EVENT", sub, a.to_dict())
            await conn.send("EOSE", sub)
            await asyncio.sleep(0.05)
            conn.drop()
        elif conn.index == 1:
            await conn.send("EVENT", sub, b.to_dict())
            await conn.send("EVENT", sub, c.to_dict())
            await asyncio.sleep(0.05)
            conn.drop()  # before EOSE: b and c are not a set
            dropped.set()
        else:
            await dropped.wait()
            await conn.send("EVENT", sub, d.to_dict())
            await gate.wait()
            await conn.send("EOSE", sub)

    async with FakeRelay(script) as relay:
        sleeps = Sleeps()
        sync = new_sync(relay, sleeps)
        driver = Driver(sync)
        try:
            assert ids((await driver.synced()).items) == {a.first("d"): a.id}
            assert (await driver.restart()).cause == "disconnect"
            assert (await driver.restart()).cause == "disconnect"
            await until(lambda: sync.pending == 1, "the third sync's entry")
            assert ids(sync.items) == {a.first("d"): a.id} and sync.stale
            gate.set()
            final = await driver.synced()
            assert ids(final.items) == {d.first("d"): d.id}
            assert sync.resyncs == 2 and sync.restarts == {"disconnect": 2}
        finally:
            await driver.close()
    assert len(relay.connections) == 3
    # Two failures in a row: the second delay doubles (random() = 0.5, base 1 s).
    assert sleeps.delays == [0.5, 1.0]


async def test_closed_error_keeps_the_set_stale_and_restricted_ends_the_sync() -> None:
    a = art()

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, _ = await conn.req()
        await conn.send("EVENT", sub, a.to_dict())
        await conn.send("EOSE", sub)
        await conn.send("CLOSED", sub, "error: the snapshot budget ran out")
        sub2, _ = await conn.req()
        await conn.send("CLOSED", sub2, "restricted: not a channel member")

    async with FakeRelay(script) as relay:
        sync = new_sync(relay)
        driver = Driver(sync)
        try:
            await driver.synced()
            restart = await driver.restart()
            assert (restart.cause, restart.reason) == ("error", "error: the snapshot budget ran out")
            with pytest.raises(SyncRefused) as refused:
                await driver.next()
            assert refused.value.reason == "restricted: not a channel member"
            # The last complete set is still there, and known to be possibly stale.
            assert ids(sync.items) == {a.first("d"): a.id} and sync.stale
        finally:
            await driver.close()


# --- backoff ------------------------------------------------------------------------------


async def test_backoff_grows_with_each_failure_in_a_row_with_full_jitter_and_resets_at_eose() -> None:
    # Per REQ, in order: six failures of every kind, a complete sync ended by a resync, a complete sync.
    plan = ["error", "resync", "drop", "rate-limited", "drop", "error", "resync-after-eose", "ok"]
    a = art()
    step = 0

    async def script(conn: FakeConnection) -> None:
        nonlocal step
        await conn.auth()
        while step < len(plan):
            sub, _ = await conn.req()
            what = plan[step]
            step += 1
            if what == "drop":
                conn.drop()
                return
            if what in ("error", "resync", "rate-limited"):
                await conn.send("CLOSED", sub, f"{what}: try again")
                continue
            await conn.send("EVENT", sub, a.to_dict())
            await conn.send("EOSE", sub)
            if what == "resync-after-eose":
                await conn.send("CLOSED", sub, "resync: channel visibility changed")
            else:
                return

    fractions = iter([0.5, 0.0, 0.999, 0.25, 0.5, 1.0, 0.75, 0.6])
    async with FakeRelay(script) as relay:
        sleeps = Sleeps()
        sync = new_sync(relay, sleeps, backoff=Backoff(base=1.0, cap=8.0, random=lambda: next(fractions)))
        driver = Driver(sync)
        seen: list[SyncUpdate] = []
        try:
            while sum(isinstance(u, Synced) for u in seen) < 2:
                seen.append(await driver.next())
        finally:
            await driver.close()
    causes = [u.cause for u in seen if isinstance(u, Restarting)]
    assert causes == ["error", "resync", "disconnect", "rate-limited", "disconnect", "error", "resync"]
    # Ceilings 1, 2, 4, 8, 8 (cap), 8, then 1 again: the first failure after an EOSE starts a new streak.
    assert sleeps.delays == [0.5, 0.0, 0.999 * 4, 0.25 * 8, 0.5 * 8, 1.0 * 8, 0.75 * 1]
    assert [u.failures for u in seen if isinstance(u, Restarting)] == [1, 2, 3, 4, 5, 6, 1]
    assert sync.resyncs == 7
    assert sync.restarts == {"error": 2, "resync": 2, "disconnect": 2, "rate-limited": 1}


def test_backoff_ceiling_is_exponential_and_capped() -> None:
    backoff = Backoff(base=0.5, cap=30.0, random=lambda: 1.0)
    assert [backoff.ceiling(n) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff.ceiling(10_000) == 30.0
    assert Backoff(random=lambda: 0.0).delay(5) == 0.0


async def test_a_stalled_initial_read_and_a_bad_event_start_over() -> None:
    a = art()
    forged = Event(a.id, a.pubkey, a.created_at, a.kind, a.tags, a.content + " ", a.sig)  # id no longer matches

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, _ = await conn.req()
        if conn.index == 0:
            await conn.send("EVENT", sub, a.to_dict())  # ... and no EOSE
            close = await conn.expect("CLOSE")
            assert close[1] == sub
            sub, _ = await conn.req()
            await conn.send("EVENT", sub, forged.to_dict())
            await conn.hold()
        else:
            await conn.send("EVENT", sub, a.to_dict())
            await conn.send("EOSE", sub)

    async with FakeRelay(script) as relay:
        sync = new_sync(relay, eose_timeout=0.3)
        driver = Driver(sync)
        try:
            timeout = await driver.restart()
            assert (timeout.cause, timeout.reason) == ("timeout", "error: no EOSE within 0.3 s")
            bad = await driver.restart()
            assert bad.cause == "protocol" and "event id does not match its content" in bad.reason
            assert ids((await driver.synced()).items) == {a.first("d"): a.id}
        finally:
            await driver.close()
    # A protocol violation is answered on a new connection.
    assert len(relay.connections) == 2


# --- live entries ---------------------------------------------------------------------------


async def test_live_heads_follow_the_match_rule_deletions_removals_repeats_and_older_heads() -> None:
    flt = SyncFilter.of([H1, H2], types=[TYPE], tags=[("status", "open"), ("status", "active"), ("prio", "1")])
    a = art(tags=[["status", "open"], ["prio", "1"]])
    a2 = art(op="update", prev=a, tags=[["status", "open"], ["prio", "1"]])
    b = art(h=H2, tags=[["prio", "1"], ["status", "active"]])
    c = art(h=H3, tags=[["status", "open"], ["prio", "1"]])  # #h does not name H3
    e = art(tags=[["status", "x", "open"], ["prio", "1"]])  # "open" is not the FIRST value
    f = art(tags=[["status", "open"], ["prio", "2"]])  # status matches, prio does not: AND
    g = art(tags=[["prio", "1"], ["status", "active"]])  # the other status value: OR
    other_type = art(type="buzz.note", tags=[["status", "open"], ["prio", "1"]])
    a3 = art(op="update", prev=a2, tags=[["status", "done"], ["prio", "1"]])
    b_del = art(op="delete", prev=b, h=H2)
    b_back = art(op="restore", prev=b_del, h=H2, tags=[["status", "open"], ["prio", "1"]])
    live = [
        a2,
        b,
        c,
        e,
        f,
        g,
        other_type,
        a2,
        a3,
        a2,
        a,
        b_del,
        b,
        removal(g.first("d") or "", replaced=g),
        removal("44444444-4444-4444-8444-444444444444"),
        b_back,
    ]
    done = asyncio.Event()

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, sent_filter = await conn.req()
        assert sent_filter == {
            "artifact": "current",
            "#h": [H1, H2],
            "#type": [TYPE],
            "#status": ["open", "active"],
            "#prio": ["1"],
        }
        await conn.send("EVENT", sub, a.to_dict())
        await conn.send("EOSE", sub)
        for event in live:
            await conn.send("EVENT", sub, event.to_dict())
        done.set()

    async with FakeRelay(script) as relay:
        sync = new_sync(relay, flt=flt)
        driver = Driver(sync)
        try:
            await driver.synced()
            got = [await driver.change() for _ in range(7)]
            await done.wait()
        finally:
            await driver.close()
    summary = [(ch.action, ch.cause, ch.event.id) for ch in got]
    g_removal = live[13]
    assert summary == [
        ("put", "updated", a2.id),
        ("put", "new", b.id),
        ("put", "new", g.id),
        ("remove", "unmatched", a3.id),
        ("remove", "deleted", b_del.id),
        ("remove", "moved", g_removal.id),
        ("put", "new", b_back.id),
    ]
    assert ids(sync.items) == {b.first("d"): b_back.id}
    # a2 came back twice: once as a repeat of the held head, once after a3 replaced it (older);
    # a (a2's prev) and b (replaced by its deletion) came back as older heads.
    assert (sync.state.stats.repeats_ignored, sync.state.stats.older_ignored) == (1, 3)


async def test_a_relay_that_asks_for_auth_late_gets_it_and_a_refused_auth_ends_the_sync() -> None:
    a = art()

    async def lazy(conn: FakeConnection) -> None:
        sub, _ = await conn.req()  # no challenge up front
        challenge = secrets.token_hex(8)
        await conn.send("AUTH", challenge)
        await conn.send("CLOSED", sub, "auth-required: this relay needs NIP-42")
        message = await conn.expect("AUTH")
        event = Event.from_dict(message[1])
        event.verify()
        assert event.first("challenge") == challenge and event.pubkey == READER.pubkey
        await conn.send("OK", event.id, True, "")
        sub, _ = await conn.req()
        await conn.send("EVENT", sub, a.to_dict())
        await conn.send("EOSE", sub)

    async with FakeRelay(lazy) as relay:
        sleeps = Sleeps()
        driver = Driver(new_sync(relay, sleeps, auth_timeout=0.2))
        try:
            assert ids((await driver.synced()).items) == {a.first("d"): a.id}
        finally:
            await driver.close()
    assert sleeps.delays == [] and driver.sync.resyncs == 0

    async def refusing(conn: FakeConnection) -> None:
        await conn.auth(accept=False, reason="restricted: not a relay member")

    async with FakeRelay(refusing) as relay:
        driver = Driver(new_sync(relay))
        try:
            with pytest.raises(SyncRefused) as refused:
                await driver.next()
            assert refused.value.reason == "restricted: not a relay member"
        finally:
            await driver.close()


async def test_stop_ends_a_sync_waiting_in_backoff() -> None:
    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, _ = await conn.req()
        await conn.send("CLOSED", sub, "error: try later")

    never = asyncio.Event()

    async def forever(delay: float) -> None:
        await never.wait()

    async with FakeRelay(script) as relay:
        sync = Sync(relay.url, READER, FILTER, sleep=forever)
        driver = Driver(sync)
        assert (await driver.restart()).cause == "error"
        await sync.stop()
        await asyncio.wait_for(driver.task, 5)


# --- the short-lived form ------------------------------------------------------------------


async def test_fetch_set_is_req_eose_close_and_never_takes_a_failure_for_an_empty_set() -> None:
    a, b = art(), art()

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, _ = await conn.req()
        await conn.send("EVENT", sub, a.to_dict())
        await conn.send("EVENT", sub, b.to_dict())
        await conn.send("EOSE", sub)
        close = await conn.expect("CLOSE")
        assert close == ["CLOSE", sub]
        sub, _ = await conn.req()
        await conn.send("CLOSED", sub, "resync: too many changes during the read")
        sub, _ = await conn.req()
        await conn.send("EVENT", sub, a.to_dict())
        conn.drop()

    async with FakeRelay(script) as relay, Relay.connect(relay.url, READER) as client:
        fetched = await fetch_set(client, FILTER)
        assert ids(fetched.items) == {a.first("d"): a.id, b.first("d"): b.id}
        assert fetched.digest == set_digest(ids(fetched.items))
        with pytest.raises(SyncClosed) as closed:
            await fetch_set(client, FILTER)
        assert closed.value.reason == "resync: too many changes during the read"
        with pytest.raises(ConnectionLost):
            await fetch_set(client, FILTER)


# --- capability: a sync REQ goes only where NIP-11 advertises sync ---------------------------------------------
# "Clients select each protocol through its own capability": a NIP-01 relay that ignores the "artifact" key
# answers a sync REQ with an ordinary replay (newest first) and EOSE, which the client would commit as a set.


NOT_ADVERTISED = [
    {"name": "a NIP-01 relay"},
    {"artifacts": {"sync": {"version": 1, "max_events": 4096}}},  # no websocket_query_extensions
    {"artifacts": {"sync": {"version": 2, "max_events": 4096}}, "websocket_query_extensions": True},
    {"artifacts": {"modes": ["current", "history"]}, "websocket_query_extensions": True},
    {"artifacts": {"sync": {"version": 1}}, "websocket_query_extensions": True},  # no max_events
]


@pytest.mark.parametrize("nip11", NOT_ADVERTISED)
async def test_no_sync_req_goes_to_a_relay_that_does_not_advertise_sync(nip11: dict[str, Any]) -> None:
    older = art()
    newer = art(prev=older)

    async def replay(conn: FakeConnection) -> None:  # what such a relay would answer, were it asked
        await conn.auth()
        sub, _ = await conn.req(timeout=3600)
        await conn.send("EVENT", sub, newer.to_dict())
        await conn.send("EVENT", sub, older.to_dict())
        await conn.send("EOSE", sub)

    async with FakeRelay(replay, nip11=nip11) as relay:
        sync = new_sync(relay)
        with pytest.raises(SyncUnsupported):
            async for update in sync:
                raise AssertionError(f"a sync ran against a relay without sync: {update}")
        assert sync.items == {} and not sync.complete
        async with Relay.connect(relay.url, READER) as client:
            with pytest.raises(SyncUnsupported):
                await fetch_set(client, FILTER)
        assert relay.sent("REQ") == [] and relay.nip11_reads == 2


async def test_a_sync_reads_the_relays_sync_bound_once() -> None:
    a = art()

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, _ = await conn.req()
        await conn.send("EVENT", sub, a.to_dict())
        await conn.send("EOSE", sub)
        await conn.send("CLOSED", sub, "resync: membership changed")
        sub, _ = await conn.req()
        await conn.send("EOSE", sub)

    nip11 = {"artifacts": {"sync": {"version": 1, "max_events": 12}}, "websocket_query_extensions": True}
    async with FakeRelay(script, nip11=nip11) as relay:
        sync = new_sync(relay)
        driver = Driver(sync)
        try:
            assert ids((await driver.synced()).items) == {a.first("d"): a.id}
            await driver.restart()
            assert (await driver.synced()).items == {}
            assert sync.max_events == 12 and relay.nip11_reads == 1
        finally:
            await driver.close()


async def test_an_entry_whose_d_is_no_uuid_is_never_held() -> None:
    good = art()
    bad = Keys.generate().sign(
        45010,
        [["ar", "1"], ["d", "not-a-uuid"], ["h", H1], ["type", TYPE], ["title", "t"], ["op", "create"]],
        '{"n":1}',
    )

    async def script(conn: FakeConnection) -> None:
        # A protocol violation ends the connection: each sync below is a connection of its own.
        await conn.auth()
        sub, _ = await conn.req()
        if conn.index == 0:
            await conn.send("EVENT", sub, good.to_dict())
            await conn.send("EVENT", sub, bad.to_dict())
            await conn.send("EOSE", sub)
        elif conn.index == 1:
            await conn.send("EVENT", sub, good.to_dict())
            await conn.send("EOSE", sub)
            await conn.send("EVENT", sub, bad.to_dict())

    async with FakeRelay(script) as relay:
        sync = new_sync(relay)
        driver = Driver(sync)
        try:
            restart = await driver.restart()  # before EOSE: the sync starts over, nothing is committed
            assert restart.cause == "protocol" and "not a lowercase UUID" in restart.reason
            assert sync.items == {} and not sync.complete
            assert ids((await driver.synced()).items) == {good.first("d"): good.id}
            restart = await driver.restart()  # a live entry: the held set stays as it was
            assert restart.cause == "protocol"
            assert ids(sync.items) == {good.first("d"): good.id} and sync.digest == set_digest(ids(sync.items))
        finally:
            await driver.close()
