"""NIP-AR incremental reads, the client's half: a local store kept eventually consistent over signed POST /query.

`Puller` runs passes and current-ID reads for one query; `Store` is the local store (SQLite). The client's
rules, from the spec's "Incremental reads", "Current reads and write confirmation" and "Access recovery
and bounds":
- the relay must advertise `artifacts.incremental` version 1 (NIP-11); its pageRows, currentRows and
  overlapSeconds are the ones the client holds it to;
- a pass follows nextCursor to the final page and saves that page's checkpoint. Each page is applied in
  one local transaction, and the final page's transaction also saves the checkpoint: a failed read keeps
  the prior checkpoint (replays are idempotent). Each page's transaction also saves the pass's progress
  (`PassState`: the next cursor; for a recovery, the rows it has yet to bring are the store's `unseen`), so
  the next pull, in this process or another, goes on from that cursor; a saved cursor the relay refuses
  (400 incremental_invalid) is dropped and the pass starts over;
- upsert saves the complete signed event, with its h as the row's saved home; remove drops that row;
  removeChannel drops the rows whose saved home is that channel. Nothing else removes a row: absence from
  a page proves nothing;
- without a checkpoint (the first pull, or after a reset) the pass is an initial read,
  and the rows held when it began that it did not upsert are then revalidated with current-ID reads
  (at most currentRows per batch, a batch the relay finds too large split in two). That is the
  prescribed recovery: 409 incremental_reset (policy_changed, checkpoint_expired) drops the checkpoint
  and runs it. Progress is saved only after discovery, revalidation and their local commits;
- a current-ID read (`confirm`, what a live revision push asks for) waits for a running pass and its
  commits, and applies exactly one upsert or remove per ID;
- 503 incremental_unavailable and an unreachable relay are retried after a growing random delay from the
  same position; 400 and 413 end the pull;
- what the relay sends is checked before anything is applied: the response shape, one startedAt per
  pass, a checkpoint on the final page only, and each upsert's event (id and signature, kind 45010, d the
  artifactId, not a deletion, matching the query). A violation ends the pull and applies nothing of that
  page;
- preferences (local data about an artifact: a pin, a note) live beside the rows and survive the row's
  removal, so a record that comes back finds them again.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .connection import ConnectionLost, Relay, RelayError, Subscription
from .digest import is_artifact_id
from .events import Event, EventError, Keys
from .filters import CurrentFilter
from .httpapi import DEFAULT_TIMEOUT, HttpError, RelayUrl, information, post_json
from .revisions import KIND_ARTIFACT, KIND_REMOVAL
from .sync import RETRY_PREFIXES, Backoff

VERSION: Final = 1
STORE_FORMAT: Final = "nip-ar-incremental-store-1"
MAX_ID_BYTES: Final = 256


class IncrementalUnsupported(RelayError):
    """The relay's NIP-11 document does not advertise NIP-AR incremental reads."""


class FollowRefused(RelayError):
    """The relay refused the live subscription for good (restricted:, invalid:, blocked:, auth-required:):
    `Puller.follow` ends, as a retry would be refused again."""


def _closed(payload: object) -> RelayError:
    """The error for a CLOSED of the live subscription: a lost connection to start over from when a retry
    can mend it (resync:, error:, rate-limited:), else a refusal."""
    reason = str(payload)
    if reason.partition(":")[0].strip() in RETRY_PREFIXES:
        return ConnectionLost(f"the relay closed the live subscription: {reason}")
    return FollowRefused(reason or "error: CLOSED without a reason")


class IncrementalRefused(RelayError):
    """The relay refused a read for good (400, 413, 401/403, an unexpected status): `status`, `code`
    (incremental_invalid, incremental_limit, restricted ...) and the relay's message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{message} (HTTP {status} {code})" if message else f"HTTP {status} {code}")
        self.status = status
        self.code = code


class IncrementalProtocolError(RelayError):
    """The relay answered something the spec does not allow; nothing of that answer was applied."""


class StoreMismatch(ValueError):
    """The store file holds another relay's, another reader's or another query's rows."""


@dataclass(frozen=True, slots=True)
class Capability:
    """The relay's advertised `artifacts.incremental` (NIP-11)."""

    page_rows: int
    current_rows: int
    response_bytes: int
    overlap_seconds: int
    checkpoint_lifetime_seconds: int
    permanent_channels_only: bool


def _positive(section: dict[str, Any], name: str) -> int:
    value = section.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise IncrementalUnsupported(f"unsupported: the relay's artifacts.incremental has no positive {name}")
    return value


async def incremental_capability(url: RelayUrl, *, timeout: float = 10.0) -> Capability:
    """The relay's advertised incremental reads. The spec's "Clients select each protocol through its own
    capability": a relay that does not advertise them gets no incremental request. Raises
    IncrementalUnsupported, or HttpError when the document can't be read."""
    doc = await information(url, timeout=timeout)
    section = doc.get("artifacts")
    inc = section.get("incremental") if isinstance(section, dict) else None
    if not isinstance(inc, dict) or inc.get("version") != VERSION:
        raise IncrementalUnsupported(
            "unsupported: the relay does not advertise NIP-AR incremental reads (NIP-11 artifacts.incremental"
            " version 1)"
        )
    return Capability(
        page_rows=_positive(inc, "pageRows"),
        current_rows=_positive(inc, "currentRows"),
        response_bytes=_positive(inc, "responseBytes"),
        overlap_seconds=_positive(inc, "overlapSeconds"),
        checkpoint_lifetime_seconds=_positive(inc, "checkpointLifetimeSeconds"),
        permanent_channels_only=inc.get("permanentChannelsOnly") is True,
    )


# --- the local store -------------------------------------------------------------------

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rows (d TEXT PRIMARY KEY, home TEXT NOT NULL, event TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS rows_by_home ON rows (home);
CREATE TABLE IF NOT EXISTS preferences (d TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
                                        PRIMARY KEY (d, name));
CREATE TABLE IF NOT EXISTS unseen (d TEXT PRIMARY KEY);
"""


@dataclass(frozen=True, slots=True)
class PassState:
    """A pass in progress, as the store keeps it with the commit of each page, so that a pull interrupted
    between pages resumes where it stopped instead of reading every page again. `kind` is initial (a
    recovery: the rows held when it began and not yet upserted by it are the store's `unseen`) or later;
    `cursor` is the next page's (None once the last page is in); `started` the pass's startedAt; an
    initial pass's `checkpoint` is its final page's, kept until its revalidation is done."""

    kind: str
    cursor: str | None
    started: str
    checkpoint: str | None = None

    def to_json(self) -> str:
        return json.dumps([self.kind, self.cursor, self.started, self.checkpoint], separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> PassState | None:
        """None for a value this client did not write (the pass then starts over)."""
        try:
            kind, cursor, started, checkpoint = json.loads(text)
        except (ValueError, TypeError):
            return None
        texts = (cursor, checkpoint)
        if (
            kind not in ("initial", "later")
            or not isinstance(started, str)
            or not all(t is None or isinstance(t, str) for t in texts)
        ):
            return None
        if (cursor is None) == (checkpoint is None) or (checkpoint is not None and kind != "initial"):
            return None
        return cls(kind, cursor, started, checkpoint)


# `Store.save`'s pass argument when the commit leaves the pass as it is.
_KEEP: Final = object()


def _query_text(query: dict[str, Any]) -> str:
    """A query's JSON as a store binds it: keys sorted and, the order of a name's values meaning nothing,
    its lists sorted (the canonical spelling, `CurrentFilter.canonical`)."""
    spelled = {name: sorted(value) if isinstance(value, list) else value for name, value in query.items()}
    return json.dumps(spelled, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _respelled(held: str | None, bound: str) -> bool:
    """Is the held binding `bound`'s query in another spelling (a store bound before queries were canonical)?"""
    try:
        query = json.loads(held) if held is not None else None
        return isinstance(query, dict) and _query_text(query) == bound
    except (ValueError, TypeError):  # not JSON, or lists of values that don't sort: not a query of ours
        return False


class Store:
    """The local store of one (relay, reader, query): the saved rows, the checkpoint and preferences, in one
    SQLite file (":memory:" for none). A checkpoint binds the reader and the exact query, so a store opened
    for another relay, key or query is a StoreMismatch. The same query with its values in another order is
    the same query (`CurrentFilter.canonical`)."""

    def __init__(self, path: str | Path, *, relay: RelayUrl, pubkey: str, query: CurrentFilter) -> None:
        self.path = str(path)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.executescript(_SCHEMA)
        binding = {
            "format": STORE_FORMAT,
            "relay": relay.http,
            "pubkey": pubkey,
            "query": _query_text(query.canonical().to_json()),
        }
        with self.transaction() as db:
            held = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('format', 'relay', 'pubkey', 'query')"))
            if not held:
                db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", binding.items())
            elif held.get("query") != binding["query"] and _respelled(held.get("query"), binding["query"]):
                # Bound by an earlier client to the query as it was given (values in their order): the same
                # query. Its checkpoint was minted for that spelling, which this client no longer sends, so
                # it goes (with the cursor of a pass in progress): the next pull is an initial pass with the
                # revalidation of the rows held.
                db.execute("UPDATE meta SET value = ? WHERE key = 'query'", (binding["query"],))
                db.execute("DELETE FROM meta WHERE key IN ('checkpoint', 'pass')")
                held["query"] = binding["query"]
        if held and held != binding:
            wrong = next(k for k in binding if held.get(k) != binding[k])
            self._db.close()
            raise StoreMismatch(
                f"{self.path} holds the rows of another {wrong} ({held.get(wrong)}); use another store file"
            )

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One local commit: everything inside is saved together, or nothing is."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    @property
    def checkpoint(self) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'checkpoint'").fetchone()
        return str(row[0]) if row else None

    def ids(self) -> list[str]:
        return [str(r[0]) for r in self._db.execute("SELECT d FROM rows ORDER BY d")]

    def rows(self) -> dict[str, Event]:
        """d -> the saved event."""
        found = self._db.execute("SELECT d, event FROM rows ORDER BY d")
        return {str(d): Event.from_dict(json.loads(raw)) for d, raw in found}

    def heads(self) -> dict[str, str]:
        """d -> the saved event's id."""
        return {str(d): str(json.loads(raw)["id"]) for d, raw in self._db.execute("SELECT d, event FROM rows")}

    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM rows").fetchone()[0])

    def drop_checkpoint(self) -> None:
        """The next pull is an initial read that revalidates every saved row (the prescribed recovery); a pass
        in progress is dropped with the checkpoint."""
        with self.transaction() as db:
            db.execute("DELETE FROM meta WHERE key IN ('checkpoint', 'pass')")
            db.execute("DELETE FROM unseen")

    @property
    def pass_state(self) -> PassState | None:
        """The pass in progress, if a pull stopped between its pages."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'pass'").fetchone()
        return PassState.from_json(str(row[0])) if row else None

    def drop_pass(self) -> None:
        """The next pull starts its pass over (from the checkpoint, or with a recovery)."""
        with self.transaction() as db:
            db.execute("DELETE FROM meta WHERE key = 'pass'")

    def begin_recovery(self) -> None:
        """A recovery begins: every row held now is to be revalidated unless its initial read upserts it."""
        with self.transaction() as db:
            db.execute("DELETE FROM meta WHERE key = 'pass'")
            db.execute("DELETE FROM unseen")
            db.execute("INSERT INTO unseen (d) SELECT d FROM rows")

    def unseen(self) -> list[str]:
        """The rows held when the recovery began that its initial read did not upsert."""
        return [str(r[0]) for r in self._db.execute("SELECT d FROM unseen ORDER BY d")]

    def save(self, entries: Sequence[Entry], *, checkpoint: str | None = None, progress: Any = _KEEP) -> None:
        """One local commit: apply `entries` in order and, when given, save `checkpoint` with them, and the
        pass's `progress` (a PassState; None: the pass is over, its rows to revalidate too)."""
        with self.transaction() as db:
            for entry in entries:
                if entry.event is not None:  # an upsert: the event, with its h as the saved home
                    event = json.dumps(entry.event.to_dict(), separators=(",", ":"), ensure_ascii=False)
                    home = entry.event.first("h") or ""
                    db.execute("INSERT OR REPLACE INTO rows (d, home, event) VALUES (?, ?, ?)", (entry.id, home, event))
                    db.execute("DELETE FROM unseen WHERE d = ?", (entry.id,))
                elif entry.type == "remove":
                    db.execute("DELETE FROM rows WHERE d = ?", (entry.id,))
                else:
                    db.execute("DELETE FROM rows WHERE home = ?", (entry.id,))
            if checkpoint is not None:
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('checkpoint', ?)", (checkpoint,))
            if progress is None:
                db.execute("DELETE FROM meta WHERE key = 'pass'")
                db.execute("DELETE FROM unseen")
            elif isinstance(progress, PassState):
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('pass', ?)", (progress.to_json(),))

    def set_preference(self, d: str, name: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO preferences (d, name, value) VALUES (?, ?, ?)", (d, name, value))

    def preferences(self, d: str) -> dict[str, str]:
        return {str(n): str(v) for n, v in self._db.execute("SELECT name, value FROM preferences WHERE d = ?", (d,))}


# --- what the relay sends ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a page or a current-ID answer. `id` is the artifactId (upsert, remove) or the channelId
    (removeChannel)."""

    type: str  # upsert, remove, removeChannel
    id: str
    event: Event | None = None


def _violation(what: str) -> IncrementalProtocolError:
    return IncrementalProtocolError(f"error: the relay's incremental answer is invalid: {what}")


def _entry(raw: object, query: CurrentFilter) -> Entry:
    if not isinstance(raw, dict):
        raise _violation("a change is not an object")
    kind = raw.get("type")
    if kind == "removeChannel":
        channel = raw.get("channelId")
        if not isinstance(channel, str) or not channel:
            raise _violation("removeChannel without a channelId")
        return Entry("removeChannel", channel)
    d = raw.get("artifactId")
    if not isinstance(d, str) or not d:
        raise _violation(f"{kind} without an artifactId")
    if kind == "remove":
        return Entry("remove", d)
    if kind != "upsert":
        raise _violation(f"unknown change type {kind!r:.40}")
    if not is_artifact_id(d):
        raise _violation(f"upsert of {d!r:.80}, which is not an artifact id")
    try:
        event = Event.from_dict(raw.get("event"))
        event.verify()
    except EventError as err:
        raise _violation(f"the event of {d} ({err})") from None
    if event.kind != KIND_ARTIFACT or event.first("d") != d or event.first("h") is None:
        raise _violation(f"the event of {d} is not a kind-{KIND_ARTIFACT} revision of that artifact")
    if event.first("op") == "delete":
        raise _violation(f"upsert of {d} carries a deletion (a deleted artifact is a remove)")
    if not query.matches(event):
        raise _violation(f"upsert of {d} does not match the query")
    return Entry("upsert", d, event)


@dataclass(frozen=True, slots=True)
class _Page:
    started: str
    changes: list[Entry]
    next_cursor: str | None
    checkpoint: str | None


def _page(body: object, query: CurrentFilter, cap: Capability) -> _Page:
    if not isinstance(body, dict) or body.get("version") != VERSION:
        raise _violation("not a version-1 page")
    started, changes = body.get("startedAt"), body.get("changes")
    if not isinstance(started, str) or not isinstance(changes, list):
        raise _violation("a page needs startedAt and changes")
    if body.get("overlapSeconds") != cap.overlap_seconds:
        raise _violation(f"overlapSeconds is not the advertised {cap.overlap_seconds}")
    cursor, checkpoint = body.get("nextCursor", ...), body.get("checkpoint")
    if cursor is not None and (not isinstance(cursor, str) or not cursor):
        raise _violation("nextCursor must be null or a string")
    if cursor is None and (not isinstance(checkpoint, str) or not checkpoint):
        raise _violation("the final page has no checkpoint")
    if cursor is not None and "checkpoint" in body:
        raise _violation("a checkpoint on a page that is not the final one")
    if len(changes) > cap.page_rows:
        raise _violation(f"{len(changes)} changes on a page of at most {cap.page_rows}")
    return _Page(started, [_entry(c, query) for c in changes], cursor, checkpoint if cursor is None else None)


def _current_answer(body: object, ids: Sequence[str], query: CurrentFilter) -> list[Entry]:
    if not isinstance(body, dict) or body.get("version") != VERSION or not isinstance(body.get("startedAt"), str):
        raise _violation("not a version-1 current-ID answer")
    raw = body.get("changes")
    if not isinstance(raw, list) or len(raw) != len(ids):
        raise _violation("a current-ID answer has exactly one change per requested id")
    out = [_entry(c, query) for c in raw]
    for change, wanted in zip(out, ids, strict=True):
        if change.type == "removeChannel" or change.id != wanted:
            raise _violation("a current-ID answer has one upsert or remove per id, in request order")
    return out


def _pushed_d(raw: object) -> str | None:
    tags = raw.get("tags") if isinstance(raw, dict) else None
    for tag in tags if isinstance(tags, list) else ():
        if isinstance(tag, list) and len(tag) >= 2 and tag[0] == "d" and is_artifact_id(tag[1]):
            return str(tag[1])
    return None


# --- the puller --------------------------------------------------------------------------


@dataclass
class PullReport:
    """What one pull did. `kind` is initial (no checkpoint: the first pull, or a recovery) or later;
    `resets` holds the reason of each 409 incremental_reset met (policy_changed, checkpoint_expired)."""

    kind: str = "later"
    pages: int = 0
    upserts: int = 0
    removes: int = 0
    channel_removals: int = 0
    revalidated: int = 0
    resets: list[str] = field(default_factory=list)
    retries: int = 0
    held: int = 0
    # The pull went on with a pass an earlier pull left between its pages (at its saved cursor); `restarted`:
    # the relay refused that cursor (400 incremental_invalid), so the pass started over.
    resumed: bool = False
    restarted: bool = False

    def count(self, changes: Sequence[Entry]) -> None:
        for change in changes:
            if change.type == "upsert":
                self.upserts += 1
            elif change.type == "remove":
                self.removes += 1
            else:
                self.channel_removals += 1


@dataclass(frozen=True, slots=True)
class Pulled:
    """`follow`: a pull finished (the first one, or the one after a reconnect)."""

    report: PullReport


@dataclass(frozen=True, slots=True)
class Confirmed:
    """`follow`: live revision pushes were confirmed by a current-ID read; `entries` were applied."""

    entries: list[Entry]


@dataclass(frozen=True, slots=True)
class Reconnecting:
    """`follow`: the connection or a read failed; a new connection and pull follow after `delay` seconds."""

    reason: str
    delay: float
    failures: int


FollowUpdate = Pulled | Confirmed | Reconnecting


class _Reset(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Poster = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]


class Puller:
    """Keeps `store` for `query` on one relay as one reader (`keys`): `pull()` runs a pass (with the
    recovery where it is due), `confirm(ids)` a current-ID read. One at a time: a confirm waits for a
    running pass and its commits."""

    def __init__(
        self,
        url: RelayUrl,
        keys: Keys,
        query: CurrentFilter,
        store: Store,
        *,
        attempts: int = 5,
        timeout: float = DEFAULT_TIMEOUT,
        max_resets: int = 3,
        rng: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        post: Poster | None = None,
        capability: Capability | None = None,
    ) -> None:
        # The query as it is sent, spelled one way: its tokens bind its exact text (`Store` binds the same).
        self.url, self.keys, self.query, self.store = url, keys, query.canonical(), store
        self.attempts, self.timeout, self.max_resets = attempts, timeout, max_resets
        self._rng, self._sleep = rng, sleep
        # One signed POST /query of one filter: (status, decoded body); HttpError when no answer came.
        self._send: Poster = post or self._post_signed
        self._lock = asyncio.Lock()
        self._cap = capability
        self.between_pages: Callable[[], Awaitable[None]] | None = None  # tests write here

    async def capability(self) -> Capability:
        """The relay's advertised incremental reads, read once (NIP-11)."""
        if self._cap is None:
            self._cap = await incremental_capability(self.url, timeout=self.timeout)
        return self._cap

    async def pull(self) -> PullReport:
        """One pass from the saved checkpoint, or an initial read with revalidation when there is none."""
        async with self._lock:
            cap = await self.capability()
            report = PullReport()
            while True:
                try:
                    state = self.store.pass_state
                    if state is not None and await self._resume(cap, state, report):
                        break
                    if self.store.checkpoint is None:
                        report.kind = "initial"
                        await self._recover(cap, report)
                    else:
                        await self._pass(cap, self.store.checkpoint, report)
                    break
                except _Reset as reset:
                    report.resets.append(reset.reason)
                    if len(report.resets) > self.max_resets:
                        raise IncrementalRefused(
                            409, "incremental_reset", f"{reset.reason}, {len(report.resets)} times in one pull"
                        ) from None
                    # The checkpoint is spent: the next attempt is the prescribed recovery.
                    self.store.drop_checkpoint()
            report.held = len(self.store)
            return report

    async def confirm(self, ids: Sequence[str]) -> list[Entry]:
        """Current-ID reads of `ids` (what a live revision push asks for), applied: one upsert or remove per
        id, in order. Waits for a running pass."""
        wanted = list(dict.fromkeys(ids))
        for value in wanted:
            if not value or len(value.encode("utf-8")) > MAX_ID_BYTES:
                raise ValueError(f"an artifact id is 1 to {MAX_ID_BYTES} UTF-8 bytes, not {value!r:.80}")
        async with self._lock:
            cap = await self.capability()
            report = PullReport()
            changes = await self._current(cap, wanted, report)
            self.store.save(changes)
            return changes

    async def follow(
        self, *, backoff: Backoff | None = None, eose_timeout: float = 30.0
    ) -> AsyncGenerator[FollowUpdate, None]:
        """Keep the store current until the caller stops iterating. On a NIP-42 authenticated connection it
        subscribes to live revisions and removals (NIP-01 REQ, kinds 45010 and 45011, limit 0, the query's
        #h), and once the relay has answered EOSE (within `eose_timeout` seconds) it pulls. Each push then
        asks for a current-ID read of its artifact (pushes that queued meanwhile are read in one batch): the
        spec's "live revision pushes request a current-ID read; they do not replace confirmed rows
        directly". After a lost connection or a failed read it waits (the sync's backoff) and starts over
        with a pull, which brings what the pushes missed. A refusal that a retry can't mend
        (IncrementalRefused other than 503, a protocol violation, a refused AUTH, FollowRefused: a CLOSED of
        the live subscription that is not resync:, error: or rate-limited:) ends it."""
        delays = backoff or Backoff(random=self._rng)
        failures = 0
        while True:
            try:
                async with Relay.connect(self.url, self.keys) as relay:
                    flt: dict[str, Any] = {"kinds": [KIND_ARTIFACT, KIND_REMOVAL], "limit": 0}
                    if self.query.channels:
                        flt["#h"] = list(self.query.channels)
                    sub = await relay.subscribe([flt])
                    await self._await_eose(sub, eose_timeout)
                    yield Pulled(await self.pull())
                    failures = 0
                    while True:
                        ds = await self._pushed(sub)
                        yield Confirmed(await self.confirm(ds))
            except (ConnectionLost, HttpError) as err:
                reason = err.reason
            except IncrementalRefused as err:
                if err.status != 503:
                    raise
                reason = err.reason
            failures += 1
            delay = delays.delay(failures)
            yield Reconnecting(reason, delay, failures)
            await self._sleep(delay)

    @staticmethod
    async def _await_eose(sub: Subscription, timeout: float) -> None:
        while True:
            try:
                verb, payload = await sub.next(timeout)
            except TimeoutError:
                raise ConnectionLost(f"no EOSE for the live subscription within {timeout:g} s") from None
            if verb == "EOSE":
                return
            if verb == "CLOSED":
                raise _closed(payload)

    @staticmethod
    async def _pushed(sub: Subscription) -> list[str]:
        """The artifacts of the next live pushes: waits for one, then takes what else has queued. A push is
        not trusted for anything but its d: the current-ID read it asks for is what gets checked and applied."""
        ds: list[str] = []
        while not ds or not sub.queue.empty():
            verb, payload = await sub.next()
            if verb == "CLOSED":
                raise _closed(payload)
            d = _pushed_d(payload) if verb == "EVENT" else None
            if d is not None and d not in ds:
                ds.append(d)
        return ds

    async def _resume(self, cap: Capability, state: PassState, report: PullReport) -> bool:
        """Go on with the pass an earlier pull left between its pages: True once it is done. False when the
        relay refused its saved cursor (400 incremental_invalid: e.g. the relay's signing key changed
        since), which is dropped: the pull then starts its pass over."""
        report.kind, report.resumed = state.kind, True
        try:
            if state.cursor is not None:
                checkpoint = await self._pass(
                    cap, None, report, kind=state.kind, cursor=state.cursor, started=state.started
                )
            else:  # an initial pass whose pages are all in: its revalidation is left
                checkpoint = state.checkpoint or ""
        except IncrementalRefused as refused:
            if (refused.status, refused.code) != (400, "incremental_invalid"):
                raise
            self.store.drop_pass()
            report.restarted = True
            return False
        if state.kind == "initial":
            await self._revalidate(cap, report, checkpoint)
        return True

    async def _recover(self, cap: Capability, report: PullReport) -> None:
        """An initial read, then current-ID reads for the rows held when it began that it did not upsert;
        the checkpoint is saved only after both and their commits."""
        self.store.begin_recovery()
        checkpoint = await self._pass(cap, None, report, kind="initial")
        await self._revalidate(cap, report, checkpoint)

    async def _revalidate(self, cap: Capability, report: PullReport, checkpoint: str) -> None:
        """A recovery's end: current-ID reads of the rows held when it began that its initial read did not
        upsert (the store's `unseen`), applied in the commit that saves the checkpoint and ends the pass."""
        stale = self.store.unseen()
        changes = await self._current(cap, stale, report) if stale else []
        report.revalidated += len(stale)
        report.count(changes)
        self.store.save(changes, checkpoint=checkpoint, progress=None)

    async def _pass(
        self,
        cap: Capability,
        checkpoint: str | None,
        report: PullReport,
        *,
        kind: str = "later",
        cursor: str | None = None,
        started: str | None = None,
    ) -> str:
        """Every page of one pass (from `cursor`, a pass `started` at that startedAt, when it goes on with a
        saved one), each applied in its own commit with the pass's progress (`PassState`). A later pass saves
        its checkpoint with its final page; an initial one returns it for `_revalidate` to save."""
        if cursor is not None:
            extra: dict[str, Any] = {"cursor": cursor}
        else:
            extra = {} if checkpoint is None else {"checkpoint": checkpoint}
        while True:
            body = await self._post({"artifact": "incremental", "query": self.query.to_json(), **extra}, report)
            try:
                page = _page(body, self.query, cap)
                if started is not None and page.started != started:
                    raise _violation("startedAt changed within one pass")
            except IncrementalProtocolError:
                self.store.drop_pass()  # the pass can't go on: the next pull starts it over
                raise
            started = page.started
            report.pages += 1
            report.count(page.changes)
            if page.checkpoint is None:
                progress: PassState | None = PassState(kind, page.next_cursor, started)
            else:  # the final page: a later pass ends with it, an initial one with its revalidation
                progress = PassState(kind, None, started, page.checkpoint) if kind == "initial" else None
            self.store.save(page.changes, checkpoint=page.checkpoint if kind == "later" else None, progress=progress)
            if page.checkpoint is not None:
                return page.checkpoint
            extra = {"cursor": page.next_cursor}
            if self.between_pages is not None:
                await self.between_pages()

    async def _post_signed(self, payload: dict[str, Any]) -> tuple[int, Any]:
        return await post_json(self.url, self.keys, "/query", [payload], timeout=self.timeout)

    async def _current(self, cap: Capability, ids: Sequence[str], report: PullReport) -> list[Entry]:
        out: list[Entry] = []
        for start in range(0, len(ids), cap.current_rows):
            out.extend(await self._current_batch(list(ids[start : start + cap.current_rows]), report))
        return out

    async def _current_batch(self, ids: list[str], report: PullReport) -> list[Entry]:
        request = {"artifact": "incremental", "action": "current", "query": self.query.to_json(), "artifactIds": ids}
        try:
            body = await self._post(request, report)
        except IncrementalRefused as refused:
            # The answer would pass the response bound: the spec lets the client split the batch.
            if refused.code != "incremental_limit" or len(ids) == 1:
                raise
            half = len(ids) // 2
            return [*await self._current_batch(ids[:half], report), *await self._current_batch(ids[half:], report)]
        return _current_answer(body, ids, self.query)

    async def _post(self, payload: dict[str, Any], report: PullReport) -> Any:
        """One request: its 200 body. Retries 503 and an unreachable relay after a growing random delay
        (full jitter), `attempts` times in all. Raises _Reset on 409 incremental_reset, IncrementalRefused on
        any other answer, HttpError when the last try got none."""
        failures = 0
        backoff = Backoff(random=self._rng)
        while True:
            try:
                status, body = await self._send(payload)
            except HttpError:
                if failures + 1 >= self.attempts:
                    raise
                status, body = 0, None
            if status == 200:
                return body
            code = str(body.get("error")) if isinstance(body, dict) and isinstance(body.get("error"), str) else ""
            if status == 409 and code == "incremental_reset":
                reason = body.get("reason") if isinstance(body, dict) else None
                raise _Reset(reason if isinstance(reason, str) else "reset")
            if status in (0, 503) and failures + 1 < self.attempts:
                failures += 1
                report.retries += 1
                await self._sleep(backoff.delay(failures))
                continue
            message = body.get("message") if isinstance(body, dict) else None
            text = message if isinstance(message, str) else str(body)[:200]
            raise IncrementalRefused(status, code or "refused", text)
