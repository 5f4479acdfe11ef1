"""Checks of NIP-AR incremental reads (needs artifacts.incremental in NIP-11): signed POST /query with
{"artifact": "incremental", ...}.

The format checks read the raw pages. The convergence checks keep an in-memory store with the reference
client's Puller, which applies only what the relay says (a row goes only on remove or removeChannel) and
refuses an answer the spec does not allow; so a store that ends equal to what key A wrote proves that the
relay sent every change, and nothing else.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from ..filters import CurrentFilter
from ..incremental import IncrementalProtocolError, IncrementalRefused, Puller, PullReport, Store
from .runner import CheckFailed, check, expect, short
from .world import Actor, World

INCREMENTAL = ("incremental",)
_STARTED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def _query(world: World, tag: str, *channels: str) -> CurrentFilter:
    return CurrentFilter.of(channels, types=[world.type], tags=[(f"i{world.run}", tag)])


def _create_tags(world: World, tag: str) -> list[list[str]]:
    return [[f"i{world.run}", tag]]


async def _pull(world: World, actor: Actor, store: Store, query: CurrentFilter) -> PullReport:
    puller = Puller(world.url, actor.keys, query, store, attempts=3)
    try:
        return await puller.pull()
    except IncrementalProtocolError as err:
        raise CheckFailed(f"{actor.name}'s pull: {err}") from None
    except IncrementalRefused as err:
        raise CheckFailed(f"{actor.name}'s pull was refused: HTTP {err.status} {err}") from None


def _store(world: World, actor: Actor, query: CurrentFilter) -> Store:
    return Store(":memory:", relay=world.url, pubkey=actor.pubkey, query=query)


async def _refused(actor: Actor, flt: dict[str, Any], code: str, status: int, what: str) -> None:
    got, body = await actor.post(flt)
    error = body.get("error") if isinstance(body, dict) else None
    expect((got, error) == (status, code), f"{what}: answered {got} {short(body)}, not {status} {code}")


def _current_ids(query: CurrentFilter, ids: list[str]) -> dict[str, Any]:
    return {"artifact": "incremental", "action": "current", "query": query.to_json(), "artifactIds": ids}


@check("incremental: NIP-11 advertises the spec's artifacts.incremental object", needs=INCREMENTAL)
async def _advertised(world: World) -> None:
    inc = world.artifacts.get("incremental")
    if not isinstance(inc, dict):
        raise CheckFailed("artifacts.incremental is not an object")
    # The spec's values; pageRows and responseBytes are the relay's bounds (its example: 100 and 8 MiB).
    fixed: dict[str, object] = {
        "version": 1,
        "overlapSeconds": 120,
        "currentRows": 100,
        "permanentChannelsOnly": True,
        "checkpointLifetimeSeconds": 2592000,
    }
    for key, want in fixed.items():
        expect(inc.get(key) == want, f"artifacts.incremental.{key} is {short(inc.get(key))}, not {want!r}")
    for key in ("pageRows", "responseBytes"):
        bound = inc.get(key)
        expect(isinstance(bound, int) and not isinstance(bound, bool) and bound > 0, f"{key} is {short(bound)}")
    extra = set(inc) - {*fixed, "pageRows", "responseBytes"}
    expect(not extra, f"artifacts.incremental has keys the spec does not give: {sorted(extra)}")


@check(
    "incremental: an initial read pages through the readable current heads, deleted ones left out", needs=INCREMENTAL
)
async def _initial(world: World) -> None:
    tag = "initial"
    heads = [await world.create(tags=_create_tags(world, tag)) for _ in range(3)]
    deleted = await world.revise(await world.create(tags=_create_tags(world, tag)), "delete")
    hidden = await world.create(h=world.channels.r, tags=_create_tags(world, tag))
    heads[0] = await world.revise(heads[0], "update", tags=_create_tags(world, tag))
    query = _query(world, tag)
    flt = {"artifact": "incremental", "query": query.to_json()}
    status, body = await world.b.post(flt)
    expect(status == 200 and isinstance(body, dict), f"the initial read answered {status} {short(body)}")
    started = body.get("startedAt")
    expect(isinstance(started, str) and _STARTED.fullmatch(started), f"startedAt {short(started)} is not RFC 3339")
    expect(body.get("version") == 1 and body.get("overlapSeconds") == 120, f"version/overlap in {short(body)}")
    store = _store(world, world.b, query)
    try:
        report = await _pull(world, world.b, store, query)
        expect(report.kind == "initial", "a store without a checkpoint did not make an initial read")
        want = {e.first("d"): e.id for e in heads}
        got = store.heads()
        expect(got == want, f"B's initial read holds {short(got)}, not the three current heads {short(want)}")
        expect(deleted.first("d") not in got, "the initial read returned a deleted artifact")
        expect(hidden.first("d") not in got, "the initial read returned an artifact of a channel B can't read")
    finally:
        store.close()


@check("incremental: a later read reports updates, deletions and moves out of the reader's channels", needs=INCREMENTAL)
async def _later(world: World) -> None:
    tag = "later"
    heads = [await world.create(tags=_create_tags(world, tag)) for _ in range(4)]
    query = _query(world, tag)
    store = _store(world, world.b, query)
    try:
        await _pull(world, world.b, store, query)
        expect(len(store) == 4, f"the initial read holds {len(store)} of 4 artifacts")
        updated = await world.revise(heads[0], "update", tags=_create_tags(world, tag))
        await world.revise(heads[1], "delete")
        await world.revise(heads[2], "move", h=world.channels.r, tags=_create_tags(world, tag))
        new = await world.create(tags=_create_tags(world, tag))
        report = await _pull(world, world.b, store, query)
        expect(report.kind == "later" and not report.resets, f"the later read was {report.kind} {report.resets}")
        want = {e.first("d"): e.id for e in (updated, heads[3], new)}
        got = store.heads()
        expect(got == want, f"after the later read B holds {short(got)}, not {short(want)}")
    finally:
        store.close()


@check("incremental: a membership removal is reported as removeChannel", needs=INCREMENTAL)
async def _remove_channel(world: World) -> None:
    tag = "removal"
    s = await world.new_channel("S", [world.b])
    made = await world.create(h=s, tags=_create_tags(world, tag))
    query = _query(world, tag)
    store = _store(world, world.b, query)
    try:
        await _pull(world, world.b, store, query)
        expect(store.heads() == {made.first("d"): made.id}, "B's initial read missed the artifact in S")
        await world.remove_member(s, world.b)
        report = await _pull(world, world.b, store, query)
        expect(report.channel_removals >= 1, "the later read after B's removal from S had no removeChannel")
        expect(len(store) == 0, "B still holds the artifact of the channel B was removed from")
    finally:
        store.close()


@check("incremental: after a channel is deleted, a pass and its recovery drop its artifacts", needs=INCREMENTAL)
async def _deleted_channel(world: World) -> None:
    """A deletion is an access change: the spec's answer is 409 incremental_reset (policy_changed, naming no
    channel) and the prescribed recovery, whose current-ID reads remove what is gone. The check holds the
    relay to the end state and, when a reset comes, to its reason and to naming nothing."""
    tag = "deleted"
    s = await world.new_channel("T", [world.b])
    gone = await world.create(h=s, tags=_create_tags(world, tag))
    kept = await world.create(tags=_create_tags(world, tag))
    query = _query(world, tag)
    store = _store(world, world.b, query)
    try:
        await _pull(world, world.b, store, query)
        expect(store.heads() == {gone.first("d"): gone.id, kept.first("d"): kept.id}, "the initial read missed one")
        await world.delete_channel(s)
        later = {"artifact": "incremental", "query": query.to_json(), "checkpoint": store.checkpoint}
        status, body = await world.b.post(later)
        if status == 409:
            reason = body.get("reason") if isinstance(body, dict) else None
            expect(reason == "policy_changed", f"the reset's reason is {short(reason)}, not policy_changed")
            expect(s not in str(body), "the reset names the deleted channel")
        else:
            expect(status == 200, f"the later read after the deletion answered {status} {short(body)}")
        await _pull(world, world.b, store, query)
        expect(store.heads() == {kept.first("d"): kept.id}, f"after the deletion B holds {short(store.heads())}")
    finally:
        store.close()


@check("incremental: current-ID reads answer one upsert or remove per id, in request order", needs=INCREMENTAL)
async def _current(world: World) -> None:
    tag = "current"
    made = await world.create(tags=_create_tags(world, tag))
    hidden = await world.create(h=world.channels.r, tags=_create_tags(world, tag))
    query = _query(world, tag)
    ids = [str(uuid.uuid4()), made.first("d") or "", hidden.first("d") or "", "not-an-artifact-id"]
    status, body = await world.b.post(_current_ids(query, ids))
    expect(status == 200 and isinstance(body, dict), f"a current-ID read answered {status} {short(body)}")
    changes = body.get("changes")
    expect(isinstance(changes, list) and len(changes) == len(ids), f"{short(changes)} is not one change per id")
    got = [(c.get("type"), c.get("artifactId")) for c in changes if isinstance(c, dict)]
    want = [("remove", ids[0]), ("upsert", ids[1]), ("remove", ids[2]), ("remove", ids[3])]
    expect(got == want, f"the current-ID read answered {short(got)}, not {short(want)}")
    event = changes[1].get("event")
    expect(isinstance(event, dict) and event.get("id") == made.id, "the upsert is not the complete current head")
    expect(changes[2] == {"type": "remove", "artifactId": ids[2]}, f"the remove says more: {short(changes[2])}")
    expect(hidden.id not in str(body), "the current-ID read disclosed the head of an artifact B can't read")


@check("incremental: malformed current-ID reads are 400 incremental_invalid", needs=INCREMENTAL)
async def _current_invalid(world: World) -> None:
    query = _query(world, "invalid")
    one = str(uuid.uuid4())
    cases = [
        ([one, one], "a duplicate id"),
        ([], "no id"),
        ([str(uuid.uuid4()) for _ in range(101)], "101 ids"),
        ([""], "an empty id"),
        (["x" * 257], "an id of 257 bytes"),
    ]
    for ids, what in cases:
        await _refused(world.b, _current_ids(query, ids), "incremental_invalid", 400, what)


@check("incremental: a tampered, foreign or other-query checkpoint is 400 incremental_invalid", needs=INCREMENTAL)
async def _tokens(world: World) -> None:
    tag = "tokens"
    await world.create(tags=_create_tags(world, tag))
    query = _query(world, tag)
    status, body = await world.b.post({"artifact": "incremental", "query": query.to_json()})
    checkpoint = body.get("checkpoint") if isinstance(body, dict) else None
    if status != 200 or not isinstance(checkpoint, str) or not checkpoint:
        raise CheckFailed(f"no checkpoint on a one-page pass: {status} {short(body)}")
    flipped = checkpoint[:-1] + ("A" if checkpoint[-1] != "A" else "B")
    later = {"artifact": "incremental", "query": query.to_json()}
    await _refused(world.b, {**later, "checkpoint": flipped}, "incremental_invalid", 400, "a tampered checkpoint")
    await _refused(world.a, {**later, "checkpoint": checkpoint}, "incremental_invalid", 400, "another reader's")
    other = _query(world, "another query").to_json()
    await _refused(
        world.b,
        {"artifact": "incremental", "query": other, "checkpoint": checkpoint},
        "incremental_invalid",
        400,
        "a checkpoint of another query",
    )


@check("incremental: a reader outside the channel gets none of its artifacts", needs=(*INCREMENTAL, "C"))
async def _outsider(world: World) -> None:
    tag = "outsider"
    made = await world.create(tags=_create_tags(world, tag))
    wide = _query(world, tag)
    status, body = await world.c.post({"artifact": "incremental", "query": wide.to_json()})
    expect(status == 200, f"C's initial read without #h answered {status} {short(body)}")
    expect(made.id not in str(body), "C's initial read returned an artifact of channel P")
    status, body = await world.c.post(_current_ids(wide, [made.first("d") or ""]))
    expect(status == 200, f"C's current-ID read answered {status} {short(body)}")
    changes = body.get("changes") if isinstance(body, dict) else None
    expect(changes == [{"type": "remove", "artifactId": made.first("d")}], f"C read P's artifact: {short(body)}")
    # Naming P may be refused (restricted:) or answered with nothing of P: a relay that leaves an unreadable
    # #h channel out rather than refusing it can still report a membership removal there (removeChannel).
    named = _query(world, tag, world.channels.p)
    status, body = await world.c.post({"artifact": "incremental", "query": named.to_json()})
    expect(status in (200, 403) and made.id not in str(body), f"C's read of #h P answered {status} {short(body)}")
