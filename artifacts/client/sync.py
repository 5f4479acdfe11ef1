"""NIP-AR Sync, the client's half: hold the exact set, commit it only at EOSE, keep it with live heads.

`Sync` runs the protocol and restarts it, `SyncSet` is its state (pure, no I/O), and
`fetch_set` is the short-lived form (REQ, wait for EOSE, CLOSE).

The client's rules, from the spec's Sync section:
- rule 7: the set is replaced only at EOSE; what came before EOSE on a sync that then
  failed is discarded. After EOSE each live entry is applied as it arrives.
- live heads: a 45010 is the artifact's current head; the client removes the artifact
  when the head is a deletion or no longer matches the filter (the NIP-AR match rule),
  and inserts or replaces it otherwise. A 45011 removes the artifact it names.
- rule 4 is the relay's ("never older"); the client cannot order heads by created_at,
  but it can refuse a head it already knows to be older: one this sync sent before a
  later entry for that d, or one such an entry names as prev. A repeat of the last entry
  for a d changes nothing.
- on CLOSED "resync:" / "error:", a disconnect or a stalled initial read, start a new
  sync after a random delay that grows with each failure in a row (full jitter); the
  last complete set stays readable meanwhile and is marked stale.
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

from .connection import AuthFailed, ConnectionLost, Relay, RelayError, Subscription
from .digest import is_artifact_id, set_digest
from .events import Event, EventError, Keys
from .filters import SyncFilter
from .httpapi import HttpError, RelayUrl, information
from .revisions import KIND_ARTIFACT, KIND_REMOVAL, Head

# Older ids remembered per d within one sync, to refuse an older head (rule 4, client side): two per
# entry (the one it replaced and its prev), so about the last 16 entries of each d.
SUPERSEDED_PER_D: Final = 32
# CLOSED prefixes after which a new sync is the spec's answer; any other prefix ends the Sync.
RETRY_PREFIXES: Final = frozenset({"resync", "error", "rate-limited"})


class SyncClosed(RelayError):
    """The relay closed the subscription (CLOSED reason, or no EOSE); fetch_set raises it."""


class SyncRefused(RelayError):
    """The relay refused the sync for good (restricted:, invalid:, blocked:, a refused AUTH ...)."""


class ProtocolViolation(RelayError):
    """The relay sent something the spec does not allow; Sync starts over."""


class SyncUnsupported(SyncRefused):
    """The relay's NIP-11 document does not advertise NIP-AR sync: the client sends no sync REQ there."""


async def sync_capability(url: RelayUrl, *, timeout: float = 10.0) -> int:
    """The `max_events` of the relay's advertised sync (NIP-11: `artifacts.sync` version 1 and
    `websocket_query_extensions` true). The spec's "Clients select each protocol through its own
    capability": a relay that does not know the "artifact" key may ignore it and answer a sync REQ with
    an ordinary replay and EOSE, which is no set. Raises SyncUnsupported, or HttpError when the document
    can't be read."""
    doc = await information(url, timeout=timeout)
    section = doc.get("artifacts")
    sync = section.get("sync") if isinstance(section, dict) else None
    if doc.get("websocket_query_extensions") is not True or not isinstance(sync, dict) or sync.get("version") != 1:
        raise SyncUnsupported(
            "unsupported: the relay does not advertise NIP-AR sync"
            " (NIP-11 artifacts.sync version 1 and websocket_query_extensions)"
        )
    max_events = sync.get("max_events")
    if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
        raise SyncUnsupported("unsupported: the relay advertises NIP-AR sync without a max_events")
    return max_events


# --- updates a Sync yields ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Synced:
    """EOSE: the set is complete at one cut and is now the local set."""

    items: Mapping[str, Event]
    digest: str
    resyncs: int


@dataclass(frozen=True, slots=True)
class Change:
    """A live entry that changed the set. `event` is the head, or the 45011 for cause "moved"."""

    d: str
    action: Literal["put", "remove"]
    cause: Literal["new", "updated", "deleted", "unmatched", "moved"]
    event: Event


@dataclass(frozen=True, slots=True)
class Restarting:
    """A new sync starts after `delay` seconds; `cause` is resync, error, rate-limited, disconnect,
    timeout or protocol, and `failures` counts failures since the last EOSE."""

    cause: str
    reason: str
    delay: float
    failures: int


SyncUpdate = Synced | Change | Restarting


# --- the state -------------------------------------------------------------------------


@dataclass
class SyncStats:
    repeats_ignored: int = 0
    older_ignored: int = 0
    initial_dropped: int = 0  # initial entries that were a deletion, did not match, or were a 45011


class SyncSet:
    """The local set and the rules that change it. No I/O: Sync feeds it messages."""

    def __init__(self, flt: SyncFilter) -> None:
        self.filter = flt
        self.items: dict[str, Event] = {}
        self.pending: dict[str, Event] | None = None
        self.stats = SyncStats()
        # Per d, within one sync: the last entry applied, and ids known to be older than it (entries
        # it replaced and the prev they named). Every revision is older than the one naming it in prev.
        self._last: dict[str, str] = {}
        self._older: dict[str, deque[str]] = {}

    @property
    def digest(self) -> str:
        return set_digest({d: e.id for d, e in self.items.items()})

    def begin(self) -> None:
        """A new sync: collect its initial set apart from the held one."""
        self.pending = {}
        self._last, self._older = {}, {}

    def initial(self, event: Event) -> None:
        """An entry before EOSE. A relay sends only heads in scope then; anything else is left out."""
        if self.pending is None:
            raise ProtocolViolation("error: an initial entry outside a sync")
        d = _d_of(event)
        if event.kind != KIND_ARTIFACT or Head.of(event).deleted or not self.filter.matches(event):
            self.stats.initial_dropped += 1
            self.pending.pop(d, None)
            return
        self.pending[d] = event

    def commit(self) -> None:
        """EOSE: the collected set replaces the local one (rule 7's commit point)."""
        if self.pending is None:
            raise ProtocolViolation("error: EOSE outside a sync")
        self.items = self.pending
        self.pending = None
        for d, event in self.items.items():
            self._advance(d, event)

    def discard(self) -> None:
        """The sync failed before EOSE: what it sent is not a set and is dropped."""
        self.pending = None

    def _advance(self, d: str, event: Event) -> None:
        older = self._older.setdefault(d, deque(maxlen=SUPERSEDED_PER_D))
        if d in self._last:
            older.append(self._last[d])
        prev = event.first("prev")
        if prev is not None:
            older.append(prev)
        self._last[d] = event.id

    def live(self, event: Event) -> Change | None:
        """Apply one live entry after EOSE; the Change it made, or None when the set is unchanged."""
        if event.kind not in (KIND_ARTIFACT, KIND_REMOVAL):
            raise ProtocolViolation(f"error: a sync sent kind {event.kind}")
        d = _d_of(event)
        if self._last.get(d) == event.id:
            self.stats.repeats_ignored += 1
            return None
        if event.id in self._older.get(d, ()):
            self.stats.older_ignored += 1
            return None
        self._advance(d, event)
        held = self.items.get(d)
        if event.kind == KIND_REMOVAL:
            # A move took the artifact where this reader cannot follow: it leaves the set.
            if held is None:
                return None
            del self.items[d]
            return Change(d, "remove", "moved", event)
        head = Head.of(event)
        if head.deleted or not self.filter.matches(event):
            if held is None:
                return None
            del self.items[d]
            return Change(d, "remove", "deleted" if head.deleted else "unmatched", event)
        self.items[d] = event
        return Change(d, "put", "updated" if held is not None else "new", event)


def _d_of(event: Event) -> str:
    d = event.first("d")
    if d is None:
        raise ProtocolViolation(f"error: event {event.id} has no d tag")
    if not is_artifact_id(d):
        # Never held: a set of such entries would have no digest (nip-ar-set-v1 names heads by UUID).
        raise ProtocolViolation(f"error: event {event.id} has a d that is not a lowercase UUID")
    return d


def _parse(payload: Any, verify: bool) -> Event:
    try:
        event = Event.from_dict(payload)
        if verify:
            event.verify()
    except EventError as err:
        raise ProtocolViolation(f"error: the relay sent a bad event ({err})") from None
    return event


# --- backoff ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: after the n-th failure in a row, wait
    random() * min(cap, base * 2**(n-1)) seconds. `random` returns a float in [0, 1)."""

    base: float = 0.5
    cap: float = 30.0
    random: Callable[[], float] = field(default=random.random)

    def ceiling(self, failures: int) -> float:
        return min(self.cap, self.base * 2.0 ** min(max(failures - 1, 0), 64))

    def delay(self, failures: int) -> float:
        return self.random() * self.ceiling(failures)


class _Restart(Exception):
    def __init__(self, cause: str, reason: str) -> None:
        super().__init__(reason)
        self.cause = cause
        self.reason = reason


def _prefix(reason: str) -> str:
    return reason.partition(":")[0].strip() if ":" in reason else ""


# --- the sync --------------------------------------------------------------------------


class Sync:
    """Holds the exact set for `flt` and keeps it current, restarting as the spec says.

        sync = Sync("wss://relay.example/", keys, SyncFilter.of([channel], types=["buzz.task"]))
        async for update in sync:          # Synced, Change or Restarting
            ...                            # sync.items, sync.digest, sync.resyncs at any time

    Or `await sync.run(callback)`. `await sync.stop()` ends either. A refusal that a new
    sync cannot fix (CLOSED restricted:/invalid:, AUTH refused) raises SyncRefused.
    `sleep` and `backoff.random` are injectable so that tests observe the delays.
    """

    def __init__(
        self,
        relay: str | RelayUrl,
        keys: Keys | None,
        flt: SyncFilter,
        *,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        eose_timeout: float | None = 120.0,
        open_timeout: float = 10.0,
        auth_timeout: float = 5.0,
        verify: bool = True,
    ) -> None:
        self.url = relay if isinstance(relay, RelayUrl) else RelayUrl.parse(relay)
        self.keys = keys
        self.filter = flt
        self.backoff = backoff or Backoff()
        self.eose_timeout = eose_timeout
        self.open_timeout = open_timeout
        self.auth_timeout = auth_timeout
        self.verify = verify
        self.state = SyncSet(flt)
        self.resyncs = 0
        self.restarts: Counter[str] = Counter()
        self.complete = False  # an EOSE has been received at least once
        self.stale = False  # the held set may be out of date (a sync failed since its EOSE)
        self._sleep = sleep
        self.max_events: int | None = None  # the relay's advertised sync bound, once its NIP-11 is read
        self._relay: Relay | None = None
        self._stopping = asyncio.Event()

    @property
    def items(self) -> Mapping[str, Event]:
        return MappingProxyType(self.state.items)

    @property
    def digest(self) -> str:
        return self.state.digest

    @property
    def pending(self) -> int:
        """Entries received by the sync in progress before its EOSE."""
        return len(self.state.pending or ())

    def __aiter__(self) -> AsyncIterator[SyncUpdate]:
        return self.updates()

    async def run(self, callback: Callable[[SyncUpdate], Any]) -> None:
        """Call `callback` (plain or async) with each update until stop()."""
        async for update in self.updates():
            result = callback(update)
            if inspect.isawaitable(result):
                await result

    async def stop(self) -> None:
        self._stopping.set()
        if self._relay is not None:
            await self._relay.close()

    async def updates(self) -> AsyncGenerator[SyncUpdate, None]:
        failures = 0
        relay: Relay | None = None
        try:
            while not self._stopping.is_set():
                try:
                    if relay is None or relay.lost is not None:
                        if relay is not None:
                            await relay.close()
                        if self.max_events is None:
                            self.max_events = await self._capability()
                        relay = await self._connect()
                    sub = await relay.subscribe([self.filter.to_json()])
                    self.state.begin()
                    try:
                        while True:
                            update = await self._next(relay, sub)
                            if update is None:
                                continue
                            if isinstance(update, Synced):
                                failures = 0
                            yield update
                    finally:
                        await sub.close()
                except _Restart as restart:
                    cause, reason = restart.cause, restart.reason
                except ConnectionLost as lost:
                    cause, reason = "disconnect", lost.reason
                if self._stopping.is_set():
                    return
                if cause == "auth":
                    continue  # authenticated on the relay's request: subscribe again at once
                if cause in ("disconnect", "protocol") and relay is not None:
                    await relay.close()
                    relay = None
                self.state.discard()
                self.stale = self.complete
                failures += 1
                self.resyncs += 1
                self.restarts[cause] += 1
                delay = self.backoff.delay(failures)
                yield Restarting(cause, reason, delay, failures)
                await self._pause(delay)
        finally:
            self._relay = None
            if relay is not None:
                await relay.close()

    async def _capability(self) -> int:
        """The relay's sync bound (`sync_capability`); a document that can't be read now is a restart."""
        try:
            return await sync_capability(self.url, timeout=self.open_timeout)
        except (HttpError, OSError) as err:
            raise _Restart("error", f"error: the relay's NIP-11 document could not be read ({err})") from None

    async def _connect(self) -> Relay:
        try:
            relay = await Relay.open(
                self.url, self.keys, open_timeout=self.open_timeout, auth_timeout=self.auth_timeout
            )
        except AuthFailed as err:
            if _prefix(err.reason) in RETRY_PREFIXES:
                raise _Restart("error", err.reason) from None
            raise SyncRefused(err.reason) from None
        self._relay = relay
        if self._stopping.is_set():
            await relay.close()
        return relay

    async def _pause(self, delay: float) -> None:
        # The injected sleep, cut short by stop().
        sleeper = asyncio.ensure_future(self._sleep(delay))
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, stopper):
                task.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)

    async def _next(self, relay: Relay, sub: Subscription) -> SyncUpdate | None:
        collecting = self.state.pending is not None
        try:
            verb, payload = await sub.next(self.eose_timeout if collecting else None)
        except TimeoutError:
            raise _Restart("timeout", f"error: no EOSE within {self.eose_timeout:g} s") from None
        try:
            if verb == "EVENT":
                event = _parse(payload, self.verify)
                if collecting:
                    self.state.initial(event)
                    return None
                return self.state.live(event)
            if verb == "EOSE":
                if not collecting:
                    return None  # EOSE is sent once; a repeat changes nothing
                self.state.commit()
                self.complete, self.stale = True, False
                return Synced(MappingProxyType(dict(self.state.items)), self.state.digest, self.resyncs)
        except ProtocolViolation as err:
            raise _Restart("protocol", err.reason) from None
        except ValueError as err:  # an envelope without d or h
            raise _Restart("protocol", f"error: the relay sent a bad entry ({err})") from None
        # CLOSED: the subscription is over.
        reason = str(payload)
        prefix = _prefix(reason)
        if prefix in RETRY_PREFIXES:
            raise _Restart(prefix, reason)
        if prefix == "auth-required" and relay.authenticated is None and self.keys is not None:
            try:
                await relay.authenticate(timeout=self.auth_timeout)
            except AuthFailed as err:
                raise SyncRefused(err.reason) from None
            raise _Restart("auth", reason)
        raise SyncRefused(reason or "error: CLOSED without a reason")


# --- the short-lived form ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchedSet:
    items: Mapping[str, Event]
    digest: str


async def fetch_set(relay: Relay, flt: SyncFilter, *, timeout: float = 120.0, verify: bool = True) -> FetchedSet:
    """REQ, wait for EOSE, CLOSE: the complete set at the relay's cut (spec: "Short-lived clients").

    CLOSED before EOSE raises SyncClosed with the relay's reason, a dropped connection
    ConnectionLost: neither is ever taken for an empty set. A relay whose NIP-11 document does not advertise
    sync gets no REQ: SyncUnsupported (`sync_capability`).
    """
    await sync_capability(relay.url, timeout=timeout)
    state = SyncSet(flt)
    state.begin()
    sub = await relay.subscribe([flt.to_json()])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            try:
                verb, payload = await sub.next(max(deadline - loop.time(), 0.0))
            except TimeoutError:
                raise SyncClosed(f"error: no EOSE within {timeout:g} s") from None
            if verb == "EVENT":
                state.initial(_parse(payload, verify))
            elif verb == "EOSE":
                state.commit()
                return FetchedSet(MappingProxyType(dict(state.items)), state.digest)
            else:
                raise SyncClosed(str(payload) or "error: CLOSED without a reason")
    finally:
        await sub.close()
