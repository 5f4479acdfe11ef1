"""NIP-AR incremental reads, four edges of a later pass against a real relay: a moderator's kind-9005
redaction that retires a held head (remove, and an initial read omits it), candidates of different
sources tied on one change timestamp with a page boundary inside every tie (each candidate reported,
none skipped at a boundary), an explicit #h limiting move-source records and membership removals, and a
reader removed from a channel in the middle of a pass and added again before the next one (the channel
is removed, then replayed)."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import uuid
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async

from buzz.chat import channels
from buzz.nostr import Signer
from tests.incremental.support import Client, current_ids, env, post
from tests.support.factories import make_channel, make_community, revision, signed
from tests.support.relay import RelayProcess, relay_database_url
from tests.support.wire import accept, logged_in

HOST = "incremental-edges.test"
QUERY = {"artifact": "current", "#type": ["buzz.task"]}
pytestmark = pytest.mark.timeout(300)


class World:
    """w creates every channel (their owner); r reads. r is a member of p1, p2, p5 and p6; p3 is a channel r
    is granted later; hidden is one r never reads."""

    def __init__(self) -> None:
        self.w, self.r = Signer.generate(), Signer.generate()
        self.community = make_community(HOST, members=[self.w, self.r])
        self.p1 = make_channel(self.community, self.w, visibility="private", members=[self.r])
        self.p2 = make_channel(self.community, self.w, visibility="private", members=[self.r])
        self.p3 = make_channel(self.community, self.w, visibility="private")
        self.p5 = make_channel(self.community, self.w, visibility="private", members=[self.r])
        self.p6 = make_channel(self.community, self.w, visibility="private", members=[self.r])
        self.hidden = make_channel(self.community, self.w, visibility="private")
        self.heads: dict[str, dict[str, Any]] = {}


@pytest.fixture
def world(transactional_db: None) -> World:
    return World()


async def _write(relay: RelayProcess, world: World, d: str, h: uuid.UUID, op: str = "create") -> dict[str, Any]:
    prev = world.heads[d]["id"] if d in world.heads else None
    event = revision(world.w, d=d, h=h, op=op, prev=prev)
    async with logged_in(relay, world.w, host=HOST) as client:
        await accept(client, event)
    world.heads[d] = event
    return event


async def _create(relay: RelayProcess, world: World, h: uuid.UUID) -> str:
    d = str(uuid.uuid4())
    await _write(relay, world, d, h)
    return d


async def _pass(client: Client) -> list[dict[str, Any]]:
    """One later pass (or initial read) of `client`: the changes it applied, in order. Never a recovery."""
    before = len(client.store.applied)
    await client.sync()
    assert client.resets == [], "the pass was answered with a reset, not as a pass"
    return client.store.applied[before:]


def _upsert(world: World, d: str) -> dict[str, Any]:
    return {"type": "upsert", "artifactId": d, "event": world.heads[d]}


def _about(changes: list[dict[str, Any]], d: str) -> list[dict[str, Any]]:
    return [c for c in changes if c.get("artifactId") == d]


# --- 1. a redaction's retirement ----------------------------------------------------------------


async def test_a_redaction_that_retires_a_held_head_is_a_remove_in_the_next_later_pass(
    world: World, relay_factory: Any
) -> None:
    relay = relay_factory(**env())
    held = await _create(relay, world, world.p1)
    kept = await _create(relay, world, world.p1)
    client = Client([relay], HOST, world.r, QUERY)
    await _pass(client)
    assert client.store.heads() == {held: world.heads[held]["id"], kept: world.heads[kept]["id"]}

    # The channel's owner redacts the current head with a NIP-29 kind 9005: the artifact retires.
    redacted = world.heads[held]["id"]
    async with logged_in(relay, world.w, host=HOST) as owner:
        await accept(owner, signed(world.w, 9005, [["h", str(world.p1)], ["e", redacted]], "spam"))

    changes = await _pass(client)
    # The retired head is answered from the current state: a remove, and never the redacted event.
    assert _about(changes, held) == [{"type": "remove", "artifactId": held}], changes
    assert redacted not in str(changes)
    assert all(c == _upsert(world, kept) for c in _about(changes, kept)), changes
    assert client.store.heads() == {kept: world.heads[kept]["id"]}

    # An initial read after the redaction omits it; a current-ID read answers remove.
    fresh = Client([relay], HOST, world.r, QUERY)
    initial = await _pass(fresh)
    assert initial == [_upsert(world, kept)]
    assert fresh.store.heads() == {kept: world.heads[kept]["id"]}
    status, body = await post(relay, HOST, world.r, current_ids(QUERY, [held, kept]))
    assert status == 200, body
    assert body["changes"] == [{"type": "remove", "artifactId": held}, _upsert(world, kept)]

    # The retired head's id stays valid as prev: that edit makes a new visible head, which the next later
    # pass upserts (as a head change, and again as a replay of r's grant of p1 still in the window).
    await _write(relay, world, held, world.p1, "update")
    changes = await _pass(client)
    assert _about(changes, held) and all(c == _upsert(world, held) for c in _about(changes, held)), changes
    assert client.store.heads() == {held: world.heads[held]["id"], kept: world.heads[kept]["id"]}


# --- 2. ties on one timestamp across sources --------------------------------------------------------


def _tie_everything(world: World) -> None:
    """Every change stamp of this community that a pass of r can see set to one database time: the heads'
    changed_at, r's memberships' joined_at and removed_at, and the move-source records' accepted_at."""
    with psycopg.connect(relay_database_url(), autocommit=False) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        tie = row[0]
        community = world.community.pk
        conn.execute("UPDATE artifacts_artifact SET changed_at = %s WHERE community_id = %s", [tie, community])
        conn.execute(
            "UPDATE buzz_membership mb SET joined_at = %s FROM buzz_channel c"
            " WHERE c.id = mb.channel_id AND c.community_id = %s AND mb.pubkey = %s",
            [tie, community, world.r.pubkey],
        )
        conn.execute(
            "UPDATE buzz_membership mb SET removed_at = %s FROM buzz_channel c"
            " WHERE c.id = mb.channel_id AND c.community_id = %s AND mb.pubkey = %s AND mb.removed_at IS NOT NULL",
            [tie, community, world.r.pubkey],
        )
        moved = conn.execute(
            "UPDATE artifacts_moveremoval SET accepted_at = %s WHERE community_id = %s", [tie, community]
        ).rowcount
        assert moved == 1
        conn.commit()


@pytest.mark.parametrize("rows", ["1", "2"])
@pytest.mark.parametrize("scoped", [False, True], ids=["wide", "named-h"])
async def test_candidates_tied_on_one_timestamp_are_each_reported_across_page_boundaries(
    world: World, relay_factory: Any, rows: str, scoped: bool
) -> None:
    relay = relay_factory(**env(BUZZ_INCREMENTAL_PAGE_ROWS=rows))
    n = int(rows)
    # p2 plays the channel r is removed from; p3 the channel r is granted.
    query = {**QUERY, "#h": sorted(str(c) for c in (world.p1, world.p2, world.p3))} if scoped else QUERY
    a0 = await _create(relay, world, world.p1)
    moved = await _create(relay, world, world.p1)
    in_removed = await _create(relay, world, world.p2)
    g1 = await _create(relay, world, world.p3)
    g2 = await _create(relay, world, world.p3)
    client = Client([relay], HOST, world.r, query)
    await _pass(client)
    assert set(client.store.rows) == {a0, moved, in_removed}

    # After the checkpoint: two new heads, a move out of p1 to a channel r can't read (a move-source record
    # of p1), a grant of p3 (it replays g1 and g2) and r's removal from p2. Then every stamp is one time.
    h1 = await _create(relay, world, world.p1)
    h2 = await _create(relay, world, world.p1)
    await _write(relay, world, moved, world.hidden, "move")
    await sync_to_async(channels.member_put)(
        community=world.community, channel_uuid=world.p3, actor=None, pubkey=world.r.pubkey
    )
    await sync_to_async(channels.member_remove)(
        community=world.community, channel_uuid=world.p2, actor=None, pubkey=world.r.pubkey
    )
    await sync_to_async(_tie_everything)(world)

    # The candidates of the pass, all at that one time, in (source, identity) order: r's removal from p2
    # (source 0); the readable heads by d (source 1: five heads in one tie); the grants of r's readable
    # memberships p1 and p3 by (channel, d) (source 2); the move-source record of p1 (source 3).
    readable = {a0: world.p1, h1: world.p1, h2: world.p1, g1: world.p3, g2: world.p3}
    expected: list[dict[str, Any]] = [{"type": "removeChannel", "channelId": str(world.p2)}]
    expected += [_upsert(world, d) for d in sorted(readable)]
    expected += [_upsert(world, d) for _, d in sorted((f"{h} {d}", d) for d, h in readable.items())]
    expected += [{"type": "remove", "artifactId": moved}]

    pages = client.pages
    changes = await _pass(client)
    assert changes == expected
    assert client.pages - pages == math.ceil(len(expected) / n), "one page per n candidates, no more"
    assert client.store.heads() == {d: world.heads[d]["id"] for d in readable}

    # An initial read pages through the five tied heads by d, each once.
    fresh = Client([relay], HOST, world.r, query)
    initial = await _pass(fresh)
    assert initial == [_upsert(world, d) for d in sorted(readable)]
    assert fresh.pages == math.ceil(len(readable) / n)


# --- 3. an explicit #h limits move sources and membership removals ------------------------------------


async def test_an_explicit_h_limits_move_sources_and_membership_removals(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env())
    # a = p1 (the move's source), b = p2 (its destination), c = p5 (another channel), gone = p6 (r is removed).
    a, b, c, gone = world.p1, world.p2, world.p5, world.p6
    x = await _create(relay, world, a)
    stays = await _create(relay, world, a)
    in_c = await _create(relay, world, c)
    in_gone = await _create(relay, world, gone)

    def scoped(*named: uuid.UUID) -> Client:
        return Client([relay], HOST, world.r, {**QUERY, "#h": [str(h) for h in named]})

    clients = {"a": scoped(a), "b": scoped(b), "c": scoped(c), "ab": scoped(a, b), "gone": scoped(gone)}
    for client in clients.values():
        await _pass(client)
    assert set(clients["a"].store.rows) == {x, stays} and clients["b"].store.rows == {}
    assert set(clients["c"].store.rows) == {in_c} and set(clients["gone"].store.rows) == {in_gone}

    await _write(relay, world, x, b, "move")  # a move-source record for a
    await sync_to_async(channels.member_remove)(
        community=world.community, channel_uuid=gone, actor=None, pubkey=world.r.pubkey
    )
    later = {name: await _pass(client) for name, client in clients.items()}

    # #h [a]: the retained move source reports x removed; the removal of r from `gone` (not named) is no
    # candidate: no removeChannel.
    assert _about(later["a"], x) == [{"type": "remove", "artifactId": x}], later["a"]
    assert not [ch for ch in later["a"] if ch["type"] == "removeChannel"], later["a"]
    assert set(clients["a"].store.rows) == {stays}

    # #h [b]: x is a head there now (upsert); the move source a is not named, so nothing removes it.
    assert _about(later["b"], x) and all(ch == _upsert(world, x) for ch in _about(later["b"], x)), later["b"]
    assert not [ch for ch in later["b"] if ch["type"] != "upsert"], later["b"]
    assert clients["b"].store.heads() == {x: world.heads[x]["id"]}

    # #h [c]: neither the move's source nor its destination: nothing about x, and no removeChannel.
    assert _about(later["c"], x) == [], later["c"]
    assert not [ch for ch in later["c"] if ch["type"] != "upsert"], later["c"]
    assert set(clients["c"].store.rows) == {in_c}

    # #h [a, b]: both candidates of x answer from its current state, readable in b: upserts only.
    assert _about(later["ab"], x) and all(ch == _upsert(world, x) for ch in _about(later["ab"], x)), later["ab"]
    assert clients["ab"].store.heads() == {x: world.heads[x]["id"], stays: world.heads[stays]["id"]}

    # #h [gone]: the named channel r was removed from is the one removal reported.
    assert later["gone"] == [{"type": "removeChannel", "channelId": str(gone)}]
    assert clients["gone"].store.rows == {}


# --- 4. removed in the middle of a pass, added again before the next ---------------------------------


def _set_stamps(world: World, changed: dict[str, dt.datetime], joined: dt.datetime) -> None:
    """Heads' changed_at as `changed` says, and every membership of r joined at `joined`."""
    with psycopg.connect(relay_database_url(), autocommit=False) as conn:
        community = world.community.pk
        for d, at in changed.items():
            updated = conn.execute(
                "UPDATE artifacts_artifact SET changed_at = %s WHERE community_id = %s AND d = %s",
                [at, community, uuid.UUID(d)],
            ).rowcount
            assert updated == 1
        conn.execute(
            "UPDATE buzz_membership mb SET joined_at = %s FROM buzz_channel c"
            " WHERE c.id = mb.channel_id AND c.community_id = %s AND mb.pubkey = %s",
            [joined, community, world.r.pubkey],
        )
        conn.commit()


async def test_a_channel_left_out_mid_pass_and_joined_again_is_removed_then_replayed(
    world: World, relay_factory: Any
) -> None:
    """r is removed from p2 between two pages of a later pass, whose remaining pages then leave p2 out: the
    deletion of x there, in the window but older than the next pass's overlap, is read by no page. r is
    added to p2 again before the next pass. That pass reports r's removal from p2 (removeChannel, so x goes)
    and then its new grant replays p2's live heads (y comes back): the store ends equal to what r reads."""
    relay = relay_factory(**env(BUZZ_INCREMENTAL_PAGE_ROWS="1"))
    a = await _create(relay, world, world.p1)
    x = await _create(relay, world, world.p2)
    y = await _create(relay, world, world.p2)
    now = dt.datetime.now(dt.UTC)
    old = now - dt.timedelta(days=2)
    # Nothing in any window but what this test puts there: the heads and r's memberships two days old.
    await sync_to_async(_set_stamps)(world, {a: old, x: old, y: old}, old)
    client = Client([relay], HOST, world.r, QUERY)
    await _pass(client)
    assert set(client.store.rows) == {a, x, y}
    assert client.started is not None
    start = dt.datetime.strptime(client.started, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)

    # x is deleted. Then a (first in the order) and x changed just inside the next pass's window, which
    # begins 120 s before `start`, and more than 120 s before that pass's own start: outside the window of
    # the pass after it.
    await _write(relay, world, x, world.p2, "delete")
    await sync_to_async(_set_stamps)(
        world, {a: start - dt.timedelta(seconds=119.8), x: start - dt.timedelta(seconds=119.6), y: old}, old
    )
    await asyncio.sleep(1.0)

    removed = False

    async def remove_once() -> None:
        nonlocal removed
        if not removed:
            removed = True
            await sync_to_async(channels.member_remove)(
                community=world.community, channel_uuid=world.p2, actor=None, pubkey=world.r.pubkey
            )

    client.between_pages = remove_once
    changes = await _pass(client)
    client.between_pages = None
    assert removed
    # Page 1 read a; p2 was out of scope for the rest of the pass: nothing about x (this is the gap).
    assert changes == [_upsert(world, a)], changes
    assert x in client.store.rows

    await sync_to_async(channels.member_put)(
        community=world.community, channel_uuid=world.p2, actor=None, pubkey=world.r.pubkey
    )
    changes = await _pass(client)
    assert changes == [{"type": "removeChannel", "channelId": str(world.p2)}, _upsert(world, y)], changes
    assert client.store.heads() == {a: world.heads[a]["id"], y: world.heads[y]["id"]}
