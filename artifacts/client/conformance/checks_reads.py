"""Checks of the read side: the current view and its match rule, the advertised query limits,
the head lookup (deletions included, nothing disclosed), and the ensure flow."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from typing import Any

from ..ensure import Outcome, ensure
from ..identity import derive_d
from .runner import CheckFailed, check, expect, short
from .world import Actor, World


async def refused_query(actor: Actor, flt: dict[str, Any], what: str) -> None:
    """An over-limit or malformed query must fail explicitly: never a 200 with a (partial) result."""
    status, body = await actor.post(flt)
    expect(status >= 400, f"{what}: answered {status} {short(body)} instead of failing explicitly")
    reason = body.get("error") if isinstance(body, dict) else None
    expect(isinstance(reason, str) and ":" in reason, f"{what}: failed without a NIP-01 reason ({short(body)})")


# --- the current view ----------------------------------------------------------------------


@check("views: current returns only the current revision of each artifact")
async def _current_only_head(world: World) -> None:
    head = await world.create(tags=[["status", "open"]])
    for _ in range(3):
        head = await world.revise(head, "update", tags=[["status", "open"]])
    d = head.first("d") or ""
    found = await world.b.view({"artifact": "current", "#h": [world.channels.p], "#d": [d]})
    expect([e.id for e in found] == [head.id], f"current for one d returned {len(found)} events, not the head")


@check("views: a match is the tag name and its FIRST value, in the same tag")
async def _match_first_value(world: World) -> None:
    tag = f"m{world.run}"
    head = await world.create(tags=[[tag, "first", "second"], ["other", "x"]])
    d = head.first("d") or ""
    p = [world.channels.p]
    expect(d in await world.current(world.b, h=p, **{tag: ["first"]}), "a tag's first value does not match")
    expect(d not in await world.current(world.b, h=p, **{tag: ["second"]}), "a tag's second value matched")
    expect(d not in await world.current(world.b, h=p, **{tag: ["x"]}), "another tag's value matched")


@check("views: conditions on different names AND, values of one name OR")
async def _match_and_or(world: World) -> None:
    run = world.run
    one = await world.create(tags=[["color", f"red{run}"], ["size", f"big{run}"]])
    two = await world.create(tags=[["color", f"blue{run}"], ["size", f"big{run}"]])
    p = [world.channels.p]
    got = await world.current(world.b, h=p, color=[f"red{run}"], size=[f"big{run}"])
    expect(set(got) == {one.first("d")}, f"red AND big matched {sorted(got)}")
    got = await world.current(world.b, h=p, color=[f"red{run}", f"blue{run}"])
    expect(set(got) == {one.first("d"), two.first("d")}, f"red OR blue matched {sorted(got)}")
    got = await world.current(world.b, h=p, color=[f"red{run}"], size=[f"small{run}"])
    expect(not got, f"red AND small matched {sorted(got)}")


@check("views: multi-character tag names match exactly")
async def _match_long_names(world: World) -> None:
    name = f"project-{world.run}.ref_x"
    head = await world.create(tags=[[name, "alpha"]])
    d = head.first("d") or ""
    expect(d in await world.current(world.b, h=[world.channels.p], **{name: ["alpha"]}), "a long tag name missed")
    prefix = name[:-1]
    expect(
        d not in await world.current(world.b, h=[world.channels.p], **{prefix: ["alpha"]}),
        "a tag name matched by its prefix",
    )


@check("views: older revisions do not contribute matches")
async def _match_not_older(world: World) -> None:
    tag = f"s{world.run}"
    head = await world.create(tags=[[tag, "old"]])
    await world.revise(head, "update", tags=[[tag, "new"]])
    d = head.first("d") or ""
    expect(d not in await world.current(world.b, h=[world.channels.p], **{tag: ["old"]}), "an older tag matched")
    expect(d in await world.current(world.b, h=[world.channels.p], **{tag: ["new"]}), "the current tag missed")


@check("views: without #h, current spans every channel the reader belongs to, and only those")
async def _current_wide(world: World) -> None:
    t = f"{world.type}.wide"
    in_p = await world.create(type=t)
    in_q = await world.create(type=t, h=world.channels.q)
    in_r = await world.create(type=t, h=world.channels.r)
    got = {e.first("d") for e in await world.b.view({"artifact": "current", "#type": [t]})}
    expect({in_p.first("d"), in_q.first("d")} <= got, "B's current view without #h misses P or Q")
    expect(in_r.first("d") not in got, "B's current view without #h returns an artifact in R")


@check("views: a channel the reader cannot read is answered like a missing one")
async def _current_unreadable(world: World) -> None:
    await world.create(h=world.channels.r)
    hidden = await world.b.post({"artifact": "current", "#h": [world.channels.r]})
    missing = await world.b.post({"artifact": "current", "#h": [str(uuid.uuid4())]})
    expect(hidden[0] != 200 or hidden[1] == [], f"B read channel R: {short(hidden)}")
    expect(hidden == missing, f"unreadable R: {short(hidden)}; missing channel: {short(missing)}")


@check("views: history holds every revision of d, each to readers of its channel", needs=("history",))
async def _history(world: World) -> None:
    head = await world.create()
    second = await world.revise(head, "update")
    third = await world.revise(second, "update")
    revs = await world.b.view({"artifact": "history", "#d": [head.first("d") or ""]})
    expect(
        sorted(e.id for e in revs) == sorted([head.id, second.id, third.id]),
        f"history returned {len(revs)} revisions, not 3",
    )


@check("views: pages never exceed limit, and limit past max_limit fails", needs=("limit:max_limit",))
async def _paging(world: World) -> None:
    t = f"{world.type}.pages"
    made = {(await world.create(type=t)).first("d") for _ in range(5)}
    flt: dict[str, Any] = {"artifact": "current", "#h": [world.channels.p], "#type": [t]}
    seen: set[str | None] = set()
    for offset in range(0, 6, 2):
        page = await world.b.view({**flt, "limit": 2, "offset": offset})
        expect(len(page) <= 2, f"a page of limit 2 returned {len(page)} events")
        seen |= {e.first("d") for e in page}
    expect(seen == made, f"pages of a quiescent set returned {len(seen)} of its 5 artifacts")
    await refused_query(world.b, {**flt, "limit": world.limit("max_limit") + 1}, "limit above max_limit")


# --- limits ------------------------------------------------------------------------------


@check("limits: more predicates than max_predicates fail explicitly", needs=("limit:max_predicates",))
async def _max_predicates(world: World) -> None:
    n = world.limit("max_predicates")
    flt: dict[str, Any] = {"artifact": "current", "#h": [world.channels.p]}
    flt.update({f"#p{i}": ["x"] for i in range(n)})
    await refused_query(world.b, flt, f"{n + 1} predicates")


@check("limits: more values than max_values fail explicitly", needs=("limit:max_values",))
async def _max_values(world: World) -> None:
    n = world.limit("max_values")
    await refused_query(
        world.b,
        {"artifact": "current", "#h": [world.channels.p], "#x": [f"v{i}" for i in range(n + 1)]},
        f"{n + 1} values",
    )


@check("limits: a value over max_predicate_value_bytes fails explicitly", needs=("limit:max_predicate_value_bytes",))
async def _max_value_bytes(world: World) -> None:
    n = world.limit("max_predicate_value_bytes")
    await refused_query(
        world.b, {"artifact": "current", "#h": [world.channels.p], "#x": ["v" * (n + 1)]}, f"a {n + 1}-byte value"
    )


@check("limits: a name over max_predicate_name_bytes fails explicitly", needs=("limit:max_predicate_name_bytes",))
async def _max_name_bytes(world: World) -> None:
    n = world.limit("max_predicate_name_bytes")
    await refused_query(
        world.b, {"artifact": "current", "#h": [world.channels.p], "#" + "n" * (n + 1): ["x"]}, f"a {n + 1}-byte name"
    )


@check("limits: an offset over max_offset fails explicitly", needs=("limit:max_offset",))
async def _max_offset(world: World) -> None:
    n = world.limit("max_offset")
    await refused_query(world.b, {"artifact": "current", "#h": [world.channels.p], "offset": n + 1}, f"offset {n + 1}")


@check("limits: an unknown query key fails explicitly (never silently ignored)")
async def _unknown_key(world: World) -> None:
    await refused_query(world.b, {"artifact": "current", "#h": [world.channels.p], "authorz": ["x"]}, "an unknown key")


# --- head lookup ---------------------------------------------------------------------------


@check("head view: returns the current revision of every named artifact, deletions included", needs=("head",))
async def _head_many(world: World) -> None:
    heads = [await world.create() for _ in range(4)]
    heads[1] = await world.revise(heads[1], "update")
    heads[2] = await world.revise(heads[2], "delete")
    heads.append(await world.create(h=world.channels.q))
    ds = [h.first("d") or "" for h in heads]
    found = {e.first("d"): e for e in await world.b.view({"artifact": "head", "#d": ds})}
    expect(len(found) == len(heads), f"the head view returned {len(found)} of {len(heads)} named artifacts")
    for want in heads:
        got = found.get(want.first("d"))
        expect(got == want, f"the head of {want.first('d')} is {short(got)}, not {want.id}")


@check("head view: nothing for an unknown d or an unreadable one, alike", needs=("head",))
async def _head_nondisclosure(world: World) -> None:
    hidden = await world.create(h=world.channels.r)
    unreadable = await world.b.post({"artifact": "head", "#d": [hidden.first("d")]})
    unknown = await world.b.post({"artifact": "head", "#d": [str(uuid.uuid4())]})
    expect(unreadable == (200, []), f"B's head of an artifact in R answered {short(unreadable)}")
    expect(unknown == (200, []), f"the head of an unknown d answered {short(unknown)}")


@check("head view: requires #d", needs=("head",))
async def _head_needs_d(world: World) -> None:
    await refused_query(world.b, {"artifact": "head", "#h": [world.channels.p]}, "a head view without #d")


# --- ensure ------------------------------------------------------------------------------


def _key() -> str:
    return f"setting-{secrets.token_hex(4)}"


@check("ensure: create, then the same call is unchanged; the d is the derived one", needs=("head",))
async def _ensure_basic(world: World) -> None:
    key = _key()
    kwargs: dict[str, Any] = dict(
        channel=world.channels.p,
        type=world.type,
        key=key,
        title="setting",
        content={"version": 1, "value": 1},
        tags=[["status", "open"]],
    )
    first = await ensure(world.a.relay, **kwargs)
    expect(first.outcome is Outcome.CREATED, f"the first ensure reported {first.outcome.value}: {first.message}")
    expect(first.d == derive_d(world.channels.p, world.type, key), "ensure used another d than the derived one")
    await asyncio.sleep(1.1)  # another created_at: a new event, so the relay answers conflict, not duplicate
    again = await ensure(world.a.relay, **kwargs)
    expect(again.outcome is Outcome.UNCHANGED, f"the repeated ensure reported {again.outcome.value}: {again.message}")
    expect(again.head_id == first.head_id, "the repeated ensure names another head")


@check("ensure: changed content updates; --report-conflict reports it instead", needs=("head",))
async def _ensure_update(world: World) -> None:
    key = _key()
    base: dict[str, Any] = dict(channel=world.channels.p, type=world.type, key=key, title="setting")
    await ensure(world.a.relay, **base, content={"version": 1, "value": 1})
    reported = await ensure(world.a.relay, **base, content={"version": 1, "value": 2}, on_differs="report")
    expect(reported.outcome is Outcome.CONFLICT, f"report mode gave {reported.outcome.value}")
    updated = await ensure(world.b.relay, **base, content={"version": 1, "value": 2})
    expect(updated.outcome is Outcome.UPDATED, f"changed content gave {updated.outcome.value}: {updated.message}")
    head = await world.a.head(updated.d)
    expect(head is not None and head.id == updated.head_id, "the update is not the head")


@check("ensure: a deleted record is restored", needs=("head",))
async def _ensure_restore(world: World) -> None:
    key = _key()
    base: dict[str, Any] = dict(
        channel=world.channels.p, type=world.type, key=key, title="setting", content={"version": 1}
    )
    created = await ensure(world.a.relay, **base)
    head = await world.a.head(created.d)
    if head is None:
        raise CheckFailed("no head after ensure created it")
    await world.revise(head, "delete")
    restored = await ensure(world.a.relay, **base)
    expect(restored.outcome is Outcome.RESTORED, f"ensure after deletion gave {restored.outcome.value}")
    expect(created.d in await world.current(world.b, h=[world.channels.p]), "the restored record is not current")


@check("ensure: concurrent callers with one key create it exactly once", needs=("head",))
async def _ensure_concurrent(world: World) -> None:
    key = _key()
    base: dict[str, Any] = dict(
        channel=world.channels.p, type=world.type, key=key, title="setting", content={"version": 1, "shared": True}
    )
    callers = [world.a, world.b] * 4
    results = await asyncio.gather(*(ensure(c.relay, **base) for c in callers))
    outcomes = sorted(r.outcome.value for r in results)
    expect(outcomes.count("created") == 1, f"outcomes {outcomes}: not exactly one created")
    expect(set(outcomes) <= {"created", "duplicate", "unchanged"}, f"outcomes {outcomes}")
