"""Checks of NIP-AR Sync that can be observed from outside the relay (needs artifacts.sync in NIP-11).

The checks read the raw messages of a sync (EVENT / EOSE / CLOSED) rather than trust the
reference client, and compare what arrives with what key A wrote and saw accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
from collections.abc import Callable
from typing import Any

from ..connection import ConnectionLost, Subscription
from ..digest import set_digest
from ..events import Event
from ..filters import SyncFilter
from ..revisions import KIND_ARTIFACT, KIND_REMOVAL
from ..sync import Change, Sync, Synced, fetch_set
from .runner import CheckFailed, check, expect, short
from .world import Actor, World

WAIT = 10.0
SYNC = ("sync",)


class RawSync:
    """One sync subscription, read message by message."""

    def __init__(self, actor: Actor, flt: dict[str, Any]) -> None:
        self.actor = actor
        self.filter = flt
        self.sub: Subscription | None = None
        self.initial: list[Event] = []
        self.live: list[Event] = []

    async def __aenter__(self) -> RawSync:
        self.sub = await self.actor.relay.subscribe([self.filter])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.sub is not None:
            await self.sub.close()

    async def _next(self, timeout: float, what: str) -> tuple[str, Any]:
        if self.sub is None:
            raise RuntimeError("not subscribed")
        try:
            return await self.sub.next(timeout)
        except TimeoutError:
            raise CheckFailed(f"{what}: nothing within {timeout:g} s") from None
        except ConnectionLost as err:
            raise CheckFailed(f"{what}: the connection dropped ({err.reason})") from None

    async def eose(self, timeout: float = WAIT) -> list[Event]:
        """Read to EOSE; CheckFailed on CLOSED. The initial events, in arrival order."""
        while True:
            verb, payload = await self._next(timeout, f"the sync {short(self.filter)} before EOSE")
            if verb == "EOSE":
                return self.initial
            if verb == "CLOSED":
                raise CheckFailed(f"the sync {short(self.filter)} was CLOSED before EOSE: {payload!r}")
            self.initial.append(Event.from_dict(payload))

    async def closed(self, timeout: float = WAIT) -> str:
        """Read until CLOSED (CheckFailed if an EVENT or EOSE comes first); its reason."""
        verb, payload = await self._next(timeout, f"CLOSED for {short(self.filter)}")
        expect(verb == "CLOSED", f"the sync {short(self.filter)} got {verb}, not CLOSED")
        return str(payload)

    async def until(self, wanted: Callable[[Event], bool], what: str, timeout: float = WAIT) -> Event:
        """Read live entries until one that `wanted` accepts; all are kept in .live."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            verb, payload = await self._next(max(deadline - loop.time(), 0.01), what)
            if verb == "CLOSED":
                raise CheckFailed(f"{what}: the sync was CLOSED: {payload!r}")
            if verb != "EVENT":
                raise CheckFailed(f"{what}: got {verb} after EOSE")
            event = Event.from_dict(payload)
            self.live.append(event)
            if wanted(event):
                return event

    async def quiet(self, seconds: float) -> list[Event]:
        """Whatever arrives within `seconds` (for checks that something does NOT arrive)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        got: list[Event] = []
        while (left := deadline - loop.time()) > 0:
            try:
                verb, payload = await self._next(left, "")
            except CheckFailed:
                break
            if verb == "EVENT":
                got.append(Event.from_dict(payload))
        self.live.extend(got)
        return got


def _d(event: Event) -> str:
    return event.first("d") or ""


def sync_filter(world: World, channels: list[str], **tags: list[str]) -> dict[str, Any]:
    flt: dict[str, Any] = {"artifact": "current", "#h": channels}
    flt.update({f"#{name}": values for name, values in tags.items()})
    return flt


@check("sync: a filter without #h, with an unknown key, or with limit or offset is CLOSED", needs=SYNC)
async def _bad_filters(world: World) -> None:
    p = [world.channels.p]
    for flt in (
        {"artifact": "current"},
        {"artifact": "current", "#h": p, "bogus": 1},
        {"artifact": "current", "#h": p, "limit": 10},
        {"artifact": "current", "#h": p, "offset": 0},
    ):
        async with RawSync(world.b, flt) as raw:
            await raw.closed()


@check("sync: an unreadable or missing channel in #h is CLOSED restricted:, alike", needs=SYNC)
async def _restricted(world: World) -> None:
    reasons = []
    for channels in ([world.channels.r], [str(uuid.uuid4())], [world.channels.p, world.channels.r]):
        async with RawSync(world.b, sync_filter(world, channels)) as raw:
            reasons.append(await raw.closed())
    expect(all(r.startswith("restricted:") for r in reasons), f"CLOSED reasons {reasons}")
    expect(len(set(reasons)) == 1, f"the reasons tell unreadable and missing channels apart: {reasons}")


@check("sync rule 2: EOSE follows exactly the set in scope, with every change accepted before the REQ", needs=SYNC)
async def _initial_set(world: World) -> None:
    t = f"{world.type}.initial"
    heads = [await world.create(type=t) for _ in range(8)]
    heads[0] = await world.revise(heads[0], "update")
    gone = [await world.revise(heads.pop(), "delete"), await world.revise(heads.pop(), "move", h=world.channels.r)]
    elsewhere = await world.create(type=t, h=world.channels.q)
    expected = {_d(e): e.id for e in heads}
    for flt in (
        sync_filter(world, [world.channels.p], type=[t]),
        {**sync_filter(world, [world.channels.p], type=[t]), "kinds": [KIND_ARTIFACT]},
    ):
        async with RawSync(world.b, flt) as raw:
            initial = await raw.eose()
        got = {_d(e): e.id for e in initial}
        expect(len(initial) == len(got), f"the initial set repeats an artifact ({len(initial)} events)")
        expect(all(e.kind == KIND_ARTIFACT for e in initial), "a 45011 arrived before EOSE (live only)")
        expect(
            got == expected,
            f"the initial set has {len(got)} artifacts, {len(expected)} expected"
            f" (missing {sorted(set(expected) - set(got))[:3]}, extra {sorted(set(got) - set(expected))[:3]})",
        )
        expect(set_digest(got) == set_digest(expected), "the digests differ")
    expect(_d(elsewhere) not in got and not {_d(e) for e in gone} & set(got), "out-of-scope artifacts arrived")


@check("sync rule 2: the initial set is one consistent cut while writes go on", needs=SYNC)
async def _one_cut(world: World) -> None:
    t = f"{world.type}.cut"
    heads = sorted([await world.create(type=t, content={"g": 0}) for _ in range(30)], key=_d)
    acked = {_d(h): 0 for h in heads}
    stop = asyncio.Event()

    async def writer() -> None:
        # Passes in ascending d: at any one instant the generations, in d order, are g..g, g-1..g-1.
        g = 0
        while not stop.is_set():
            g += 1
            for i, head in enumerate(heads):
                heads[i] = await world.revise(head, "update", content={"g": g})
                acked[_d(head)] = g

    task = asyncio.create_task(writer())
    try:
        await asyncio.sleep(0.2)
        for _ in range(3):
            floor = dict(acked)
            async with RawSync(world.b, sync_filter(world, [world.channels.p], type=[t])) as raw:
                initial = await raw.eose(timeout=30)
            gens = [json.loads(e.content)["g"] for e in sorted(initial, key=_d)]
            expect(len(gens) == len(heads), f"the initial set holds {len(gens)} of {len(heads)} artifacts")
            expect(
                all(a >= b for a, b in itertools.pairwise(gens)) and max(gens) - min(gens) <= 1,
                f"generations in d order {gens}: not one point in time",
            )
            got = {_d(e): json.loads(e.content)["g"] for e in initial}
            behind = [d for d, g in floor.items() if got.get(d, -1) < g]
            expect(not behind, f"{len(behind)} artifacts miss changes accepted before the REQ")
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await task


@check("sync rule 3: live heads after EOSE: new, updated, no longer matching, deleted", needs=SYNC)
async def _live(world: World) -> None:
    tag = f"st{world.run}"
    async with RawSync(world.b, sync_filter(world, [world.channels.p], **{tag: ["open"]})) as raw:
        await raw.eose()
        x = await world.create(tags=[[tag, "open"]])
        await raw.until(lambda e: e.id == x.id, "the head of a new matching artifact")
        x2 = await world.revise(x, "update", tags=[[tag, "open"]])
        await raw.until(lambda e: e.id == x2.id, "the head of an update")
        x3 = await world.revise(x2, "update", tags=[[tag, "done"]])
        await raw.until(lambda e: e.id == x3.id, "the head that no longer matches")
        y = await world.create(tags=[[tag, "open"]])
        y_del = await world.revise(y, "delete")
        await raw.until(lambda e: e.id == y_del.id, "the deletion head")
        never = await world.create(tags=[[tag, "done"]])
        marker = await world.create(tags=[[tag, "open"]])
        await raw.until(lambda e: e.id == marker.id, "the head of a later matching artifact")
        await raw.quiet(0.5)
        about_never = [e for e in raw.live if _d(e) == _d(never)]
        expect(not about_never, "a head that never matched the filter reached the sync")
        foreign = [e for e in raw.live if e.kind == KIND_ARTIFACT and e.first("h") != world.channels.p]
        expect(not foreign, f"heads of other channels arrived: {short([e.first('h') for e in foreign])}")


@check("sync rule 3: a move out of the reader's channels sends the 45011; a move between them the head", needs=SYNC)
async def _live_moves(world: World) -> None:
    t = f"{world.type}.moves"
    async with RawSync(world.b, sync_filter(world, [world.channels.p, world.channels.q], type=[t])) as raw:
        await raw.eose()
        out = await world.create(type=t)
        await raw.until(lambda e: e.id == out.id, "the head of a new artifact")
        await world.revise(out, "move", h=world.channels.r)
        removal = await raw.until(lambda e: _d(e) == _d(out), "the 45011 of the move to R")
        expect(removal.kind == KIND_REMOVAL, f"the move to R arrived as kind {removal.kind}, not a 45011")
        expect(removal.first("h") == world.channels.p, "the 45011 does not name the source channel")
        across = await world.create(type=t)
        await raw.until(lambda e: e.id == across.id, "the head of another new artifact")
        moved = await world.revise(across, "move", h=world.channels.q)
        got = await raw.until(lambda e: _d(e) == _d(across), "the head of the move to Q")
        expect(got.id == moved.id, f"the move into Q arrived as {short(got.to_dict())}, not its head")
        leaked = [e for e in raw.live if world.channels.r in json.dumps(e.to_dict())]
        expect(not leaked, "an entry names channel R, which the reader cannot read")


@check("sync rule 4: a sync never sends an older head than the last it sent for that d", needs=SYNC)
async def _never_older(world: World) -> None:
    t = f"{world.type}.order"
    head = await world.create(type=t)
    order = [head.id]
    async with RawSync(world.b, sync_filter(world, [world.channels.p], type=[t])) as raw:
        await raw.eose()
        for _ in range(25):
            head = await world.revise(head, "update")
            order.append(head.id)
        final = head.id
        await raw.until(lambda e: e.id == final, "the last head", timeout=20)
    seen = [order.index(e.id) if e.id in order else -1 for e in raw.live if _d(e) == _d(head)]
    expect(-1 not in seen, "a head this check never wrote arrived")
    expect(all(a <= b for a, b in itertools.pairwise(seen)), f"heads arrived in the order {seen}")


@check("sync rule 9: a membership change in a named channel ends the whole sync with resync:", needs=SYNC)
async def _resync_membership(world: World) -> None:
    s = await world.new_channel("membership", [world.b])
    async with RawSync(world.b, sync_filter(world, [world.channels.p, s])) as raw:
        await raw.eose()
        await world.remove_member(s, world.b)
        verb, reason = await raw._next(WAIT, "CLOSED after B left a named channel")
        while verb == "EVENT":
            verb, reason = await raw._next(WAIT, "CLOSED after B left a named channel")
        expect(verb == "CLOSED" and str(reason).startswith("resync:"), f"got {verb} {reason!r}, not CLOSED resync:")


@check("sync rule 9: deleting a named channel ends the sync with resync:", needs=SYNC)
async def _resync_deletion(world: World) -> None:
    s = await world.new_channel("deletion", [world.b])
    async with RawSync(world.b, sync_filter(world, [s])) as raw:
        await raw.eose()
        await world.delete_channel(s)
        verb, reason = await raw._next(WAIT, "CLOSED after the channel was deleted")
        expect(verb == "CLOSED" and str(reason).startswith("resync:"), f"got {verb} {reason!r}, not CLOSED resync:")


@check("sync: after quiescence the live set equals a fresh sync, and equal heads give equal digests", needs=SYNC)
async def _quiescence(world: World) -> None:
    t = f"{world.type}.quiet"
    flt = SyncFilter.of([world.channels.p], types=[t])
    heads = [await world.create(type=t) for _ in range(4)]
    sync = Sync(world.url, world.b.keys, flt)
    synced = asyncio.Event()
    changes: list[Change] = []

    async def follow() -> None:
        async for update in sync:
            if isinstance(update, Synced):
                synced.set()
            elif isinstance(update, Change):
                changes.append(update)

    task = asyncio.create_task(follow())
    try:
        await asyncio.wait_for(synced.wait(), WAIT)
        heads[0] = await world.revise(heads[0], "update")
        await world.revise(heads[1], "delete")
        await world.revise(heads[2], "move", h=world.channels.r)
        await world.revise(heads[3], "move", h=world.channels.q)
        for _ in range(3):
            await world.create(type=t)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while True:
            fresh = await fetch_set(world.a.relay, flt)
            if fresh.digest == sync.digest or loop.time() > deadline:
                break
            await asyncio.sleep(0.2)
        expect(
            fresh.digest == sync.digest,
            f"after {len(changes)} live changes the kept set ({len(sync.items)})"
            f" differs from a fresh sync ({len(fresh.items)})",
        )
        other = await fetch_set(world.b.relay, flt)
        expect(other.digest == fresh.digest, "A and B hold the same heads but compute other digests")
        expect(len(fresh.items) == 4, f"the quiescent set holds {len(fresh.items)} artifacts, 4 expected")
    finally:
        await sync.stop()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
