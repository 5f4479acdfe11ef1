"""What the checks run in: the relay's NIP-11, keys A, B (and C) connected with NIP-42, and channels.

Key A creates three private channels with NIP-29 kind 9007 and puts key B in two of
them with kind 9000:
    P and Q: A and B (both read and write);
    R:       A only (B is the outsider whose view must disclose nothing).
Key C, when given, is in none of them.

Writes are paced to the write quota the relay advertises (NIP-11 limitation
write_rate_limit) and retried after a rate-limited: answer, so the suite measures the
rules, not the quota.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from .. import httpapi
from ..connection import AuthFailed, ConnectionLost, Ok, Relay
from ..events import Event, Keys
from ..httpapi import RelayUrl
from ..incremental import VERSION as INCREMENTAL_VERSION
from ..revisions import Head, next_revision, revision
from .runner import CheckFailed, short

KIND_CHAT = 9
KIND_PUT_USER = 9000
KIND_REMOVE_USER = 9001
KIND_CREATE_GROUP = 9007
KIND_DELETE_GROUP = 9008


class SetupFailed(Exception):
    pass


class _Pacer:
    """A token bucket per key, matching the relay's advertised write quota."""

    def __init__(self, per_second: float, burst: float) -> None:
        self.rate = per_second
        self.capacity = max(burst, 1.0)
        self.tokens = self.capacity
        self.at = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self) -> None:
        if self.rate <= 0:
            return
        async with self.lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
                self.at = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                await asyncio.sleep((1 - self.tokens) / self.rate)


class Actor:
    """One key with its authenticated connection."""

    def __init__(self, name: str, keys: Keys, relay: Relay, pacer: _Pacer) -> None:
        self.name = name
        self.keys = keys
        self.relay = relay
        self.pacer = pacer

    @property
    def pubkey(self) -> str:
        return self.keys.pubkey

    async def send(self, event: Event) -> Ok:
        for _ in range(8):
            await self.pacer.take()
            ok = await self.relay.publish(event)
            if ok.prefix != "rate-limited":
                return ok
            await asyncio.sleep(1.0)
        return ok

    async def post(self, flt: dict[str, Any]) -> tuple[int, Any]:
        """POST /query with one filter, NIP-98 signed: (status, decoded body)."""
        return await httpapi.post_json(self.relay.url, self.keys, "/query", [flt])

    async def view(self, flt: dict[str, Any]) -> list[Event]:
        """A view that must succeed: its events (CheckFailed on any refusal)."""
        status, body = await self.post(flt)
        if status != 200 or not isinstance(body, list):
            raise CheckFailed(f"{self.name}'s query {short(flt)} answered {status} {short(body)}")
        return [Event.from_dict(raw) for raw in body]

    async def head(self, d: str) -> Event | None:
        found = [e for e in await self.view({"artifact": "head", "#d": [d]}) if e.first("d") == d]
        return found[0] if found else None


@dataclass
class Channels:
    p: str
    q: str
    r: str


class World:
    def __init__(self, url: RelayUrl, nip11: dict[str, Any], actors: list[Actor], out: TextIO) -> None:
        self.url = url
        self.nip11 = nip11
        self.actors = actors
        self.out = out
        self.run = secrets.token_hex(4)
        # One type per run: a relay that kept earlier runs' artifacts does not mix them in.
        self.type = f"conformance.run{self.run}"
        self.channels = Channels("", "", "")
        self.cleanup: list[tuple[Actor, Event]] = []

    # --- capabilities --------------------------------------------------------------

    @property
    def artifacts(self) -> dict[str, Any]:
        section = self.nip11.get("artifacts")
        return section if isinstance(section, dict) else {}

    @property
    def limits(self) -> dict[str, Any]:
        lim = self.artifacts.get("limits")
        return lim if isinstance(lim, dict) else {}

    def limit(self, name: str) -> int:
        value = self.limits.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise CheckFailed(f"NIP-11 artifacts.limits.{name} is not an integer")
        return value

    def has(self, need: str) -> bool:
        if need == "sync":
            sync = self.artifacts.get("sync")
            return isinstance(sync, dict) and sync.get("version") == 1
        if need in ("head", "history", "current"):
            modes = self.artifacts.get("modes")
            return isinstance(modes, list) and need in modes
        if need == "incremental":
            inc = self.artifacts.get("incremental")
            return isinstance(inc, dict) and inc.get("version") == INCREMENTAL_VERSION
        if need.startswith("limit:"):
            value = self.limits.get(need.removeprefix("limit:"))
            return isinstance(value, int) and not isinstance(value, bool)
        if need == "C":
            return len(self.actors) >= 3
        raise RuntimeError(f"unknown capability {need!r}")

    def why_not(self, need: str) -> str:
        if need == "sync":
            return "the relay does not advertise artifacts.sync (NIP-11), so sync is not tested"
        if need in ("head", "history", "current"):
            return f"the relay does not advertise the {need!r} view in NIP-11 artifacts.modes"
        if need == "incremental":
            return "the relay does not advertise artifacts.incremental (NIP-11), so incremental reads are not tested"
        if need.startswith("limit:"):
            return f"the relay does not advertise artifacts.limits.{need.removeprefix('limit:')} in NIP-11"
        if need == "C":
            return "needs a third key (--key-file C), a relay member outside the suite's channels"
        return need

    # --- actors --------------------------------------------------------------------

    @property
    def a(self) -> Actor:
        return self.actors[0]

    @property
    def b(self) -> Actor:
        return self.actors[1]

    @property
    def c(self) -> Actor:
        return self.actors[2]

    @classmethod
    async def open(cls, url: RelayUrl, keys: Sequence[Keys], out: TextIO) -> World:
        try:
            nip11 = await httpapi.information(url)
        except httpapi.HttpError as err:
            raise SetupFailed(f"no NIP-11 document at {url.http}/ ({err})") from None
        if not isinstance(nip11.get("artifacts"), dict):
            raise SetupFailed("NIP-11 has no artifacts object: the relay does not advertise NIP-AR")
        limitation = nip11.get("limitation")
        quota = limitation.get("write_rate_limit") if isinstance(limitation, dict) else None
        try:
            rate = float(quota.get("per_second") or 0) if isinstance(quota, dict) else 0.0
            burst = float(quota.get("burst") or rate) if isinstance(quota, dict) else 0.0
        except (TypeError, ValueError):
            raise SetupFailed(f"NIP-11 limitation.write_rate_limit is malformed: {short(quota)}") from None
        actors: list[Actor] = []
        world = cls(url, nip11, actors, out)
        try:
            for name, k in zip("ABC", keys, strict=False):
                try:
                    relay = await Relay.open(url, k)
                except AuthFailed as err:
                    raise SetupFailed(f"key {name} was refused at AUTH ({err.reason}); is it admitted?") from None
                except ConnectionLost as err:
                    raise SetupFailed(err.reason) from None
                if relay.authenticated is None:
                    await relay.close()
                    raise SetupFailed(f"the relay sent key {name} no NIP-42 challenge")
                actors.append(Actor(name, k, relay, _Pacer(rate, burst)))
            await world._channels()
        except BaseException:
            await world.close()
            raise
        return world

    async def close(self) -> None:
        for actor in self.actors:
            await actor.relay.close()

    async def _group(self, actor: Actor, kind: int, tags: list[list[str]]) -> None:
        ok = await actor.send(actor.keys.sign(kind, tags, ""))
        if not ok.accepted:
            raise SetupFailed(f"kind {kind} {short(tags)} by {actor.name} was refused: {ok.message}")

    async def _channels(self) -> None:
        p, q, r = (str(uuid.uuid4()) for _ in range(3))
        for label, ch in (("P", p), ("Q", q), ("R", r)):
            name = f"nip-ar conformance {self.run} {label}"
            await self._group(self.a, KIND_CREATE_GROUP, [["h", ch], ["name", name], ["private"], ["closed"]])
        for ch in (p, q):
            await self.add_member(ch, self.b)
        self.channels = Channels(p, q, r)
        # The checks rely on R being closed to B: make sure the relay made it private.
        status, body = await self.b.post({"artifact": "current", "#h": [r]})
        if status == 200 and body:
            raise SetupFailed("B reads channel R without being a member: the relay did not make it private")

    async def add_member(self, channel: str, who: Actor) -> None:
        await self._group(self.a, KIND_PUT_USER, [["h", channel], ["p", who.pubkey]])

    async def remove_member(self, channel: str, who: Actor) -> None:
        await self._group(self.a, KIND_REMOVE_USER, [["h", channel], ["p", who.pubkey]])

    async def new_channel(self, label: str, members: Sequence[Actor] = ()) -> str:
        ch = str(uuid.uuid4())
        name = f"nip-ar conformance {self.run} {label}"
        await self._group(self.a, KIND_CREATE_GROUP, [["h", ch], ["name", name], ["private"], ["closed"]])
        for who in members:
            await self.add_member(ch, who)
        return ch

    async def delete_channel(self, channel: str) -> None:
        await self._group(self.a, KIND_DELETE_GROUP, [["h", channel]])

    # --- artifacts -----------------------------------------------------------------

    @staticmethod
    def new_d() -> str:
        return str(uuid.uuid4())

    async def create(
        self,
        actor: Actor | None = None,
        *,
        h: str | None = None,
        title: str = "conformance item",
        content: Any = None,
        tags: Sequence[Sequence[str]] = (),
        d: str | None = None,
        type: str | None = None,
        root: str | None = None,
    ) -> Event:
        """A create that must be accepted."""
        who = actor or self.a
        event = revision(
            who.keys,
            d=d or self.new_d(),
            h=h or self.channels.p,
            type=type or self.type,
            op="create",
            title=title,
            root=root,
            content={"version": 1, "n": secrets.token_hex(4)} if content is None else content,
            tags=tags,
        )
        await self.accepted(who, event, "create")
        return event

    async def revise(self, head: Event, op: str, actor: Actor | None = None, **changes: Any) -> Event:
        """The next revision after `head` (update, move, delete, restore) that must be accepted."""
        who = actor or self.a
        if op in ("update", "move") and "content" not in changes:
            changes["content"] = {"version": 1, "n": secrets.token_hex(4)}
        if op == "restore" and "title" not in changes:
            changes["title"] = "restored conformance item"
        event = next_revision(who.keys, head, op, **changes)
        await self.accepted(who, event, op)
        return event

    async def accepted(self, actor: Actor, event: Event, what: str) -> Ok:
        ok = await actor.send(event)
        if not ok.accepted:
            raise CheckFailed(f"{actor.name}'s {what} of {event.first('d')} was refused: {ok.message!r}")
        return ok

    async def chat(self, actor: Actor, channel: str, text: str = "conformance message") -> Event:
        """A kind-9 message: a conversation anchor for root."""
        event = actor.keys.sign(KIND_CHAT, [["h", channel]], text)
        await self.accepted(actor, event, "kind-9 message")
        return event

    async def current(self, actor: Actor, **predicates: Sequence[str]) -> dict[str, Event]:
        flt: dict[str, Any] = {"artifact": "current"}
        for name, values in predicates.items():
            flt[f"#{name}"] = list(values)
        return {e.first("d") or "": e for e in await actor.view(flt)}

    async def replay(self, actor: Actor, flt: dict[str, Any], timeout: float = 15.0) -> list[Event]:
        """An ordinary NIP-01 REQ, read to EOSE: the stored events it returns."""
        sub = await actor.relay.subscribe([flt])
        out: list[Event] = []
        try:
            while True:
                try:
                    verb, payload = await sub.next(timeout)
                except TimeoutError:
                    raise CheckFailed(f"no EOSE for REQ {short(flt)} within {timeout:g} s") from None
                if verb == "EVENT":
                    out.append(Event.from_dict(payload))
                elif verb == "EOSE":
                    return out
                else:
                    raise CheckFailed(f"REQ {short(flt)} was CLOSED: {payload!r}")
        finally:
            await sub.close()


def head_of(event: Event) -> Head:
    return Head.of(event)
