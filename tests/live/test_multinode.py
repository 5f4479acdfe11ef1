"""Two relay processes on one PostgreSQL and one Redis: live delivery and access changes cross nodes.

Node A and node B are separate uvicorn processes, each with its own hub (its own
pub/sub connection). A message posted on one reaches open REQs on the other; an
access change made on one (NIP-29 events sent to that node) ends the affected
subscriptions on the other with CLOSED "restricted: ...", and later messages of
the channel are not delivered there.

Helpers and the world (channels A, B, P, Q, O, D) come from test_live_delivery.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.live.live_world import (
    RELAY_ENV,
    Clients,
    World,
    build_world,
    chat,
    closed_of,
    events_of,
    read_until,
    req,
    req_refused,
    send_ok,
    sign,
)


@pytest.fixture
def world(transactional_db: None) -> World:
    return build_world()


def two_nodes(relay_factory: Any) -> tuple[Any, Any]:
    node_a = relay_factory(**RELAY_ENV)
    node_b = relay_factory(**RELAY_ENV)
    assert node_a.pid != node_b.pid
    return node_a, node_b


async def test_messages_cross_nodes(world: World, relay_factory: Any) -> None:
    node_a, node_b = two_nodes(relay_factory)
    k, c = world.keys, world.chans
    A, P = str(c["A"]), str(c["P"])
    on_a, on_b = Clients(node_a), Clients(node_b)
    try:
        alice_b = await on_b(k["alice"])
        carol_a = await on_a(k["carol"])
        bob_a = await on_a(k["bob"])
        owner_b = await on_b(k["owner"])
        await req(alice_b, "a", {"#h": [A], "kinds": [9]})
        await req(alice_b, "p", {"#h": [P]})
        await req(alice_b, "wide", {"kinds": [9]})
        await req(alice_b, "by-owner", {"#h": [A], "authors": [k["owner"].pubkey]})
        await req(carol_a, "a", {"#h": [A]})

        from_a_in_a = chat(k["bob"], c["A"])
        from_a_in_p = chat(k["bob"], c["P"])
        from_b_in_a = chat(k["owner"], c["A"])
        await send_ok(bob_a, from_a_in_a)
        await send_ok(bob_a, from_a_in_p)
        await send_ok(owner_b, from_b_in_a)

        got = await read_until(
            alice_b,
            lambda ms: (
                from_b_in_a["id"] in events_of(ms, "a")
                and from_a_in_p["id"] in events_of(ms, "p")
                and from_b_in_a["id"] in events_of(ms, "by-owner")
                and from_b_in_a["id"] in events_of(ms, "wide")
            ),
        )
        assert closed_of(got) == {}
        assert events_of(got, "a") == [from_a_in_a["id"], from_b_in_a["id"]]
        assert events_of(got, "p") == [from_a_in_p["id"]]
        assert events_of(got, "wide") == [from_a_in_a["id"], from_a_in_p["id"], from_b_in_a["id"]]
        assert events_of(got, "by-owner") == [from_b_in_a["id"]]
        # Carol, on node A and not a member of P, gets A's messages from both nodes and nothing of P.
        got_carol = await read_until(carol_a, lambda ms: from_b_in_a["id"] in events_of(ms, "a"))
        assert events_of(got_carol, "a") == [from_a_in_a["id"], from_b_in_a["id"]]
        posted = {e["id"]: e for e in (from_a_in_a, from_a_in_p, from_b_in_a)}
        for m in [*got, *got_carol]:
            if m[0] == "EVENT":
                assert m[2] == posted[m[2]["id"]]
    finally:
        await on_a.aclose()
        await on_b.aclose()


async def test_member_removed_on_one_node_stops_receiving_on_the_other(world: World, relay_factory: Any) -> None:
    node_a, node_b = two_nodes(relay_factory)
    k, c = world.keys, world.chans
    A, P = str(c["A"]), str(c["P"])
    on_a, on_b = Clients(node_a), Clients(node_b)
    try:
        owner_a = await on_a(k["owner"])
        alice_b = await on_b(k["alice"])
        bob_b = await on_b(k["bob"])
        await req(alice_b, "p", {"#h": [P], "kinds": [9]})
        await req(alice_b, "wide", {"kinds": [9]})
        await req(alice_b, "a", {"#h": [A], "kinds": [9]})
        await req(bob_b, "p", {"#h": [P], "kinds": [9]})

        before = chat(k["owner"], c["P"])
        await send_ok(owner_a, before)
        await read_until(alice_b, lambda ms: all(before["id"] in events_of(ms, s) for s in ("p", "wide")))

        # The channel owner removes alice with a NIP-29 kind 9001 sent to node A.
        await send_ok(owner_a, sign(k["owner"], 9001, [["h", P], ["p", k["alice"].pubkey]]))
        after = chat(k["owner"], c["P"])
        await send_ok(owner_a, after)
        sentinel = chat(k["owner"], c["A"])
        await send_ok(owner_a, sentinel)

        got = await read_until(
            alice_b, lambda ms: {"p", "wide"} <= set(closed_of(ms)) and sentinel["id"] in events_of(ms, "a")
        )
        closed = closed_of(got)
        assert set(closed) == {"p", "wide"}, closed
        assert all(reason.startswith("restricted:") for reason in closed.values()), closed
        assert after["id"] not in [m[2]["id"] for m in got if m[0] == "EVENT"], "removed member got a later message"
        assert events_of(got, "a") == [sentinel["id"]]
        assert (await req_refused(alice_b, "p-again", {"#h": [P]})).startswith("restricted:")
        # Bob, still a member, on the same node, keeps receiving.
        got_bob = await read_until(bob_b, lambda ms: after["id"] in events_of(ms, "p"))
        assert closed_of(got_bob) == {}
        assert events_of(got_bob, "p") == [before["id"], after["id"]]
    finally:
        await on_a.aclose()
        await on_b.aclose()


async def test_channel_made_private_then_deleted_on_one_node_ends_subscriptions_on_the_other(
    world: World, relay_factory: Any
) -> None:
    node_a, node_b = two_nodes(relay_factory)
    k, c = world.keys, world.chans
    O_, A = str(c["O"]), str(c["A"])
    on_a, on_b = Clients(node_a), Clients(node_b)
    try:
        owner_a = await on_a(k["owner"])
        carol_b = await on_b(k["carol"])  # not a member of O
        alice_b = await on_b(k["alice"])  # a member of O
        await req(carol_b, "o", {"#h": [O_]})
        await req(carol_b, "a", {"#h": [A], "kinds": [9]})
        await req(alice_b, "o", {"#h": [O_], "kinds": [9]})

        await send_ok(owner_a, sign(k["owner"], 9002, [["h", O_], ["visibility", "private"]]))
        member_only = chat(k["owner"], c["O"])
        await send_ok(owner_a, member_only)
        sentinel = chat(k["owner"], c["A"])
        await send_ok(owner_a, sentinel)
        got = await read_until(carol_b, lambda ms: "o" in closed_of(ms) and sentinel["id"] in events_of(ms, "a"))
        assert closed_of(got)["o"].startswith("restricted:"), got
        assert member_only["id"] not in [m[2]["id"] for m in got if m[0] == "EVENT"]
        got_alice = await read_until(alice_b, lambda ms: member_only["id"] in events_of(ms, "o"))
        assert closed_of(got_alice) == {}

        # Deleting the channel on node A ends the member's subscription on node B too.
        await send_ok(owner_a, sign(k["owner"], 9008, [["h", O_]]))
        got_alice = await read_until(alice_b, lambda ms: "o" in closed_of(ms))
        assert closed_of(got_alice)["o"].startswith("restricted:"), got_alice
        assert (await req_refused(alice_b, "o-again", {"#h": [O_]})).startswith("restricted:")
    finally:
        await on_a.aclose()
        await on_b.aclose()
