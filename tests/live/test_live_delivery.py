"""Live kind-9 delivery through the node's hub, against a real relay process.

What is checked here:
* an ordinary REQ gets kind-9 messages live after EOSE, and its filters (kinds,
  authors, #p, since, until, several filters OR-ed) apply to them; messages of
  channels the REQ does not cover never reach it;
* access changes reach live delivery at once: a member removed from a private
  channel, and every nonmember of an open channel that turns private, get
  CLOSED "restricted: ..." on each subscription covering that channel and
  nothing of it afterwards; deleting a channel ends every subscription on it;
  several failing re-checks at once still end a REQ with one CLOSED;
* no silent loss: messages posted while a REQ streams a large stored set are
  held and sent after EOSE, each message exactly once (stored or live), and
  nothing is sent before EOSE that is not part of the stored read; a held
  message that the stored read already sent is not sent again when an access
  re-check delays the release of the held set past EOSE.

Some tests hold a table lock in the test database to stop the relay at a known
point (a stored read, an access re-check) and wait until pg_stat_activity shows
the relay's query waiting on it; some publish hub messages straight to Redis,
the way a late publish of the relay's own would arrive.

Absence is asserted without sleeping: the poster publishes through one FIFO and
a node's pub/sub connection delivers in publish order, so a message that was
wrongly delivered would arrive before a later sentinel message that is delivered.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

import psycopg
import pytest

from buzz.events.store import event_json
from tests.live.live_world import (
    READ_TIMEOUT,
    RELAY_ENV,
    Clients,
    TableLock,
    World,
    build_world,
    chat,
    closed_of,
    events_of,
    next_for,
    publish_raw,
    read_until,
    req,
    req_refused,
    send_ok,
    sign,
    wait_for_lock_waiters,
)
from tests.support.relay import relay_database_url
from tests.support.wsclient import RelayClient


@pytest.fixture
def world(transactional_db: None) -> World:
    return build_world()


# --- filters and channels ------------------------------------------------------------------


async def test_live_events_follow_filters_and_channels(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    k, c = world.keys, world.chans
    A, B = str(c["A"]), str(c["B"])
    now = int(time.time())
    marker = secrets.token_hex(6)
    end = {"#h": [A], "#t": [marker]}  # matches only the sentinel, which every sub must get
    subs: dict[str, list[dict[str, Any]]] = {
        "all-a": [{"#h": [A]}],
        "kinds-9": [{"#h": [A], "kinds": [9]}],
        "kinds-1": [{"#h": [A], "kinds": [1]}, end],
        "authors": [{"#h": [A], "authors": [k["bob"].pubkey]}, end],
        "p-carol": [{"#h": [A], "#p": [k["carol"].pubkey]}, end],
        "since": [{"#h": [A], "since": now - 60}, end],
        "until": [{"#h": [A], "until": now + 60}, end],
        "b-only": [{"#h": [B]}, end],
        "wide": [{"kinds": [9]}],  # no #h: every channel alice reads (A, B, O, D listed; P member); not Q
        "either": [{"#h": [A], "authors": [k["bob"].pubkey]}, {"#h": [B], "#p": [k["carol"].pubkey]}, end],
    }
    clients = Clients(relay)
    try:
        alice = await clients(k["alice"])
        bob = await clients(k["bob"])
        owner = await clients(k["owner"])
        for sub, filters in subs.items():
            assert await req(alice, sub, *filters) == [], sub  # nothing stored yet in these channels
        carol_p = ["p", k["carol"].pubkey]
        posts: list[tuple[str, RelayClient, dict[str, Any]]] = [
            ("bob-a", bob, chat(k["bob"], c["A"])),
            ("owner-a", owner, chat(k["owner"], c["A"])),
            ("alice-a", alice, chat(k["alice"], c["A"])),
            ("owner-a-p", owner, chat(k["owner"], c["A"], carol_p)),
            ("bob-a-old", bob, chat(k["bob"], c["A"], created_at=now - 300)),
            ("owner-a-future", owner, chat(k["owner"], c["A"], created_at=now + 300)),
            ("bob-b-p", bob, chat(k["bob"], c["B"], carol_p)),
            ("owner-b", owner, chat(k["owner"], c["B"])),
            ("owner-q", owner, chat(k["owner"], c["Q"])),
            ("owner-p", owner, chat(k["owner"], c["P"])),
            ("end", owner, chat(k["owner"], c["A"], ["t", marker])),
        ]
        ids = {name: event["id"] for name, _, event in posts}
        # One post at a time: each OK comes after its live signal is published, so signals go out in this order.
        for _, poster, event in posts:
            await send_ok(poster, event)
        in_a = {"bob-a", "owner-a", "alice-a", "owner-a-p", "bob-a-old", "owner-a-future", "end"}
        expected = {
            "all-a": in_a,
            "kinds-9": in_a,
            "kinds-1": {"end"},
            "authors": {"bob-a", "bob-a-old", "end"},
            "p-carol": {"owner-a-p", "end"},
            "since": in_a - {"bob-a-old"},
            "until": in_a - {"owner-a-future"},
            "b-only": {"bob-b-p", "owner-b", "end"},
            "wide": in_a | {"bob-b-p", "owner-b", "owner-p"},
            "either": {"bob-a", "bob-a-old", "bob-b-p", "end"},
        }
        got = await read_until(alice, lambda ms: all(ids["end"] in events_of(ms, s) for s in subs))
        assert closed_of(got) == {}
        names = {v: n for n, v in ids.items()}
        for sub in subs:
            received = events_of(got, sub)
            assert len(received) == len(set(received)), f"{sub}: a live event was sent twice"
            assert {names.get(i, i) for i in received} == expected[sub], sub
        # Each live EVENT is the message exactly as posted.
        posted = {event["id"]: event for _, _, event in posts}
        for m in got:
            if m[0] == "EVENT":
                assert m[2] == posted[m[2]["id"]]
    finally:
        await clients.aclose()


# --- access changes -------------------------------------------------------------------------


async def test_member_removed_from_private_channel_stops_receiving(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    k, c = world.keys, world.chans
    P, A = str(c["P"]), str(c["A"])
    clients = Clients(relay)
    try:
        alice = await clients(k["alice"])
        bob = await clients(k["bob"])
        owner = await clients(k["owner"])
        await req(alice, "p", {"#h": [P], "kinds": [9]})
        await req(alice, "p-and-a", {"#h": [P, A], "kinds": [9]})
        await req(alice, "wide", {"kinds": [9]})
        await req(alice, "a", {"#h": [A], "kinds": [9]})
        await req(bob, "p", {"#h": [P], "kinds": [9]})

        before = chat(k["owner"], c["P"])
        await send_ok(owner, before)
        got = await read_until(
            alice, lambda ms: all(before["id"] in events_of(ms, s) for s in ("p", "p-and-a", "wide"))
        )
        assert events_of(got, "a") == []

        removal = sign(k["owner"], 9001, [["h", P], ["p", k["alice"].pubkey]])
        await send_ok(owner, removal)
        after = chat(k["owner"], c["P"])
        await send_ok(owner, after)
        sentinel = chat(k["owner"], c["A"])
        await send_ok(owner, sentinel)

        affected = {"p", "p-and-a", "wide"}
        got = await read_until(
            alice, lambda ms: affected <= set(closed_of(ms)) and sentinel["id"] in events_of(ms, "a")
        )
        closed = closed_of(got)
        assert set(closed) == affected, closed
        for reason in closed.values():
            assert reason.startswith("restricted:"), closed
        seen = [m[2]["id"] for m in got if m[0] == "EVENT"]
        assert after["id"] not in seen, "a removed member received a later message of the private channel"
        assert events_of(got, "a") == [sentinel["id"]]
        # Her REQs on the channel are refused now; bob, still a member, got the later message.
        assert (await req_refused(alice, "p-again", {"#h": [P]})).startswith("restricted:")
        got_bob = await read_until(bob, lambda ms: after["id"] in events_of(ms, "p"))
        assert closed_of(got_bob) == {}
        assert events_of(got_bob, "p") == [before["id"], after["id"]]
    finally:
        await clients.aclose()


async def test_a_removed_member_gets_none_of_the_state_events_stored_with_the_removal(
    world: World, relay_factory: Any
) -> None:
    """The 9001 that removes alice stores the channel's new 39000/39001/39002 in the same transaction: they carry
    the epoch the removal made, so her REQ on them re-checks first and ends, and she gets none of them (she
    could never read them). bob, still a member, gets all three."""
    relay = relay_factory(**RELAY_ENV)
    k, c = world.keys, world.chans
    P, A = str(c["P"]), str(c["A"])
    state = {"kinds": [39000, 39001, 39002], "#d": [P]}
    clients = Clients(relay)
    try:
        alice = await clients(k["alice"])
        bob = await clients(k["bob"])
        owner = await clients(k["owner"])
        await req(alice, "state", state)
        await req(alice, "a", {"#h": [A], "kinds": [9]})
        await req(bob, "state", state)
        removal = sign(k["owner"], 9001, [["h", P], ["p", k["alice"].pubkey]])
        await send_ok(owner, removal)
        sentinel = chat(k["owner"], c["A"])
        await send_ok(owner, sentinel)
        got = await read_until(alice, lambda ms: "state" in closed_of(ms) and sentinel["id"] in events_of(ms, "a"))
        assert closed_of(got)["state"].startswith("restricted:"), got
        assert events_of(got, "state") == [], "a removed member got the state events stored with her removal"
        got_bob = await read_until(bob, lambda ms: len(events_of(ms, "state")) == 3)
        assert closed_of(got_bob) == {}
    finally:
        await clients.aclose()


async def test_open_channel_turning_private_closes_nonmembers(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    k, c = world.keys, world.chans
    O_, A = str(c["O"]), str(c["A"])
    clients = Clients(relay)
    try:
        carol = await clients(k["carol"])  # a relay member, not a member of O
        alice = await clients(k["alice"])  # a member of O
        owner = await clients(k["owner"])
        await req(carol, "o", {"#h": [O_]})
        await req(carol, "wide", {"kinds": [9]})
        await req(carol, "a", {"#h": [A], "kinds": [9]})
        await req(alice, "o", {"#h": [O_], "kinds": [9]})

        before = chat(k["owner"], c["O"])
        await send_ok(owner, before)
        await read_until(carol, lambda ms: all(before["id"] in events_of(ms, s) for s in ("o", "wide")))

        await send_ok(owner, sign(k["owner"], 9002, [["h", O_], ["visibility", "private"]]))
        after = chat(k["owner"], c["O"])
        await send_ok(owner, after)
        sentinel = chat(k["owner"], c["A"])
        await send_ok(owner, sentinel)

        got = await read_until(
            carol, lambda ms: {"o", "wide"} <= set(closed_of(ms)) and sentinel["id"] in events_of(ms, "a")
        )
        closed = closed_of(got)
        assert set(closed) == {"o", "wide"}, closed
        assert all(reason.startswith("restricted:") for reason in closed.values()), closed
        assert after["id"] not in [m[2]["id"] for m in got if m[0] == "EVENT"]
        assert (await req_refused(carol, "o-again", {"#h": [O_]})).startswith("restricted:")
        # The member keeps her subscription and gets the later message.
        got_alice = await read_until(alice, lambda ms: after["id"] in events_of(ms, "o"))
        assert closed_of(got_alice) == {}
        assert events_of(got_alice, "o") == [before["id"], after["id"]]
    finally:
        await clients.aclose()


async def test_deleted_channel_ends_every_subscription(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    k, c = world.keys, world.chans
    D, A = str(c["D"]), str(c["A"])
    clients = Clients(relay)
    try:
        owner = await clients(k["owner"])
        alice = await clients(k["alice"])
        carol = await clients(k["carol"])
        for client in (owner, alice, carol):
            await req(client, "d", {"#h": [D]})
            await req(client, "wide", {"kinds": [9]})
        await req(carol, "a", {"#h": [A]})

        await send_ok(owner, sign(k["owner"], 9008, [["h", D]]))
        for client in (owner, alice, carol):
            got = await read_until(client, lambda ms: {"d", "wide"} <= set(closed_of(ms)))
            closed = closed_of(got)
            assert set(closed) == {"d", "wide"}, closed
            assert all(reason.startswith("restricted:") for reason in closed.values()), closed
            assert (await req_refused(client, "d-again", {"#h": [D]})).startswith("restricted:")
        # Nothing more can be posted there; the rest of the community goes on.
        await send_ok(owner, chat(k["owner"], c["D"]), accepted=False)
        sentinel = chat(k["owner"], c["A"])
        await send_ok(owner, sentinel)
        got = await read_until(carol, lambda ms: sentinel["id"] in events_of(ms, "a"))
        assert closed_of(got) == {}
    finally:
        await clients.aclose()


SIGNALS = 5


async def test_access_lost_on_several_signals_at_once_closes_the_req_once(
    world: World, relay_factory: Any, redis_client: Any
) -> None:
    """Several access signals for one channel, their re-checks failing together: one CLOSED, so a REQ
    the client opens again under the same id right after it is not ended by a stale second CLOSED."""
    relay = relay_factory(**RELAY_ENV)
    k, c = world.keys, world.chans
    P, A = str(c["P"]), str(c["A"])
    clients = Clients(relay)
    try:
        alice = await clients(k["alice"])
        owner = await clients(k["owner"])
        await req(alice, "s", {"#h": [P]})
        with psycopg.connect(relay_database_url()) as conn:
            conn.execute("LOCK TABLE buzz_membership IN ACCESS EXCLUSIVE MODE")
            for _ in range(SIGNALS):
                publish_raw(redis_client, world.community.pk, c["P"], {"t": "access", "channel": P, "why": "test"})
            await wait_for_lock_waiters("buzz_membership", SIGNALS)  # every re-check waits
            # Remove her in the same transaction: the waiting re-checks see it as soon as it commits.
            conn.execute(
                "UPDATE buzz_membership SET removed_at = now() WHERE pubkey = %s"
                " AND channel_id = (SELECT id FROM buzz_channel WHERE uuid = %s)",
                [k["alice"].pubkey, c["P"]],
            )
        closed = await next_for(alice, "s")
        assert closed[0] == "CLOSED" and closed[2].startswith("restricted:"), closed
        # The client reuses the id at once, for a channel it still reads.
        await alice.send_json(["REQ", "s", {"#h": [A], "kinds": [9]}])
        assert await next_for(alice, "s") == ["EOSE", "s"], "the REQ was ended twice"
        sentinel = chat(k["owner"], c["A"])
        await send_ok(owner, sentinel)
        m = await next_for(alice, "s")
        assert m[0] == "EVENT" and m[2]["id"] == sentinel["id"], m
    finally:
        await clients.aclose()


# --- no silent loss: held events ----------------------------------------------------------------


async def test_a_held_message_already_stored_is_not_sent_again_after_a_slow_access_recheck(
    world: World, relay_factory: Any, redis_client: Any
) -> None:
    """During the stored read, the live signal of a stored message arrives (its publish was late), then
    an access signal whose re-check is still running at EOSE. When the re-check passes, the held
    message must not be sent a second time: it was sent from storage."""
    relay = relay_factory(**RELAY_ENV)
    k, c = world.keys, world.chans
    A = str(c["A"])
    clients = Clients(relay)
    try:
        alice = await clients(k["alice"])
        owner = await clients(k["owner"])
        stored = [chat(k["owner"], c["A"]) for _ in range(3)]
        for event in stored:
            await send_ok(owner, event)
        events_lock = TableLock("buzz_storedevent")
        members_lock: TableLock | None = None
        try:
            await alice.send_json(["REQ", "a", {"#h": [A], "kinds": [9]}])
            await wait_for_lock_waiters("buzz_storedevent", 1)  # live interest is active; the read waits
            members_lock = TableLock("buzz_membership")
            publish_raw(redis_client, world.community.pk, c["A"], {"t": "event", "event": stored[0]})
            publish_raw(redis_client, world.community.pk, c["A"], {"t": "access", "channel": A, "why": "test"})
            await wait_for_lock_waiters("buzz_membership", 1)  # the re-check waits
            events_lock.release()  # the stored read ends, EOSE, while the re-check still waits
            got = await read_until(alice, lambda ms: ["EOSE", "a"] in ms)
            assert sorted(events_of(got, "a")) == sorted(e["id"] for e in stored)
        finally:
            events_lock.release()
            if members_lock is not None:
                members_lock.release()
        # The re-check passes now. The next message for the REQ is a new one, not the stored message again.
        sentinel = chat(k["owner"], c["A"])
        await send_ok(owner, sentinel)
        m = await next_for(alice, "a")
        assert m[0] == "EVENT", m
        assert m[2]["id"] != stored[0]["id"], "a stored message was sent again, live, after EOSE"
        assert m[2]["id"] == sentinel["id"], m
    finally:
        await clients.aclose()


STORED = 3000  # stored messages: far more bytes than the relay's and the kernel's buffers hold
STORED_CONTENT = 6000  # bytes each: about 18 MB in all
POSTED = 300  # messages posted while the stored set streams
POSTED_CONTENT = 4000  # bytes each: together more than a stored page (the most the queue drains meanwhile)
# The reader reads the stored set in bursts with pauses, like a client slower than the relay's
# database reads: the relay's outbound queue is full when it reaches EOSE and releases what it held.
READ_BURST, READ_PAUSE = 20, 0.02
POSTING_WAIT = 5.0  # seconds the reader waits, unread, for the posts' OKs


@pytest.fixture
def stocked(world: World) -> dict[str, dict[str, Any]]:
    """STORED old messages in channel A, written straight to the test database."""
    writer = world.keys["bob"]
    channel = world.chans["A"]
    base = int(time.time()) - 7200  # older than anything posted during the test
    stored: dict[str, dict[str, Any]] = {}
    rows = []
    for i in range(STORED):
        # Distinct random content: nothing on the way can compress it away.
        content = secrets.token_hex(STORED_CONTENT // 2)
        event = writer.sign_event(kind=9, tags=[["h", str(channel)]], content=content, created_at=base - i // 3)
        stored[event.id] = event.to_dict()
        rows.append((event.id, world.community.pk, event.pubkey, 9, event.created_at, channel, event_json(event)))
    with psycopg.connect(relay_database_url()) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw, received_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, now())",
            rows,
        )
        cur.executemany(
            "INSERT INTO buzz_eventtag (event_key, name, value)"
            " SELECT key, 'h', %s FROM buzz_storedevent WHERE community_id = %s AND id = %s",
            [(str(channel), r[1], r[0]) for r in rows],
        )
    with psycopg.connect(relay_database_url(), autocommit=True) as conn:
        # Planner statistics for the bulk load, as after any bulk load (without them a page of the
        # stored read takes a nested loop over the tag index, close to a second per page here).
        conn.execute("ANALYZE buzz_storedevent")
        conn.execute("ANALYZE buzz_eventtag")
    return stored


@pytest.mark.slow
async def test_messages_posted_during_the_stored_read_arrive_exactly_once(
    world: World, stocked: dict[str, dict[str, Any]], relay_factory: Any
) -> None:
    relay = relay_factory(**RELAY_ENV, BUZZ_MAX_LIMIT=str(STORED + 1000))
    k, c = world.keys, world.chans
    A = str(c["A"])
    clients = Clients(relay)
    try:
        reader = await clients(k["alice"])
        poster = await clients(k["owner"])
        posted = [
            sign(k["owner"], 9, [["h", A]], content=secrets.token_hex(POSTED_CONTENT // 2)) for _ in range(POSTED)
        ]
        posted_ids = {e["id"] for e in posted}
        # The reader asks for the whole stored set and does not read while the messages are posted from
        # another connection: the relay's stored read fills every buffer on the way and waits, so the
        # posts land in its held set. The reader starts anyway before the relay would give up on it
        # (STORED_SEND_TIMEOUT, 10 s), and then reads in paced bursts.
        await reader.send_json(["REQ", "big", {"#h": [A], "kinds": [9], "limit": STORED + 1000}])
        for event in posted:
            await poster.send_json(["EVENT", event])
        replies: list[list[Any]] = []

        async def collect_replies() -> None:
            while len(replies) < POSTED:
                replies.append(await poster.recv_json(timeout=READ_TIMEOUT))

        posting = asyncio.get_running_loop().create_task(collect_replies())
        await asyncio.wait({posting}, timeout=POSTING_WAIT)

        before_eose: list[dict[str, Any]] = []
        while True:
            m = await reader.recv_json(timeout=READ_TIMEOUT)
            assert m[1] == "big", m
            if m[0] == "EOSE":
                break
            assert m[0] == "EVENT", m
            before_eose.append(m[2])
            if len(before_eose) % READ_BURST == 0:
                await asyncio.sleep(READ_PAUSE)
        await posting
        assert sorted(m[1] for m in replies) == sorted(posted_ids)
        assert all(m[0] == "OK" and m[2] is True for m in replies), replies
        after_eose: list[dict[str, Any]] = []
        pending = set(posted_ids) - {e["id"] for e in before_eose}
        while pending:
            m = await reader.recv_json(timeout=READ_TIMEOUT)
            assert m[0] == "EVENT" and m[1] == "big", m
            after_eose.append(m[2])
            pending.discard(m[2]["id"])
        # Nothing further: a sentinel posted now is the next thing the reader gets.
        sentinel = chat(k["owner"], c["A"])
        await send_ok(poster, sentinel)
        m = await reader.recv_json(timeout=READ_TIMEOUT)
        assert m[0] == "EVENT" and m[2]["id"] == sentinel["id"], m

        ids_before = [e["id"] for e in before_eose]
        ids_after = [e["id"] for e in after_eose]
        # Before EOSE: exactly the stored read, in its order (newest first, then by id). A live event
        # slipped in before EOSE would break that order, since every posted message is newer than all
        # the stored ones and the read goes on through older pages.
        assert len(ids_before) == len(set(ids_before))
        assert set(stocked) <= set(ids_before), "stored messages missing before EOSE"
        assert set(ids_before) <= set(stocked) | posted_ids
        order = [(-e["created_at"], e["id"]) for e in before_eose]
        assert order == sorted(order), "an event before EOSE is not where the stored read puts it"
        # After EOSE: only posted messages, each once, none that the stored read already sent.
        assert set(ids_after) <= posted_ids
        assert len(ids_after) == len(set(ids_after)), "a held message was sent twice"
        assert not set(ids_after) & set(ids_before), "a message was sent both stored and live"
        assert set(ids_before) | set(ids_after) >= posted_ids
        # Each live EVENT is the message exactly as posted.
        by_id = {e["id"]: e for e in posted}
        assert all(e == by_id[e["id"]] for e in after_eose)
    finally:
        await clients.aclose()
