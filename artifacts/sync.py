"""NIP-AR sync: `["REQ", sub, {"artifact": "current", "#h": [...], ...}]` (spec section "Sync").

The artifacts app registers this as the REQ mode "artifact" (buzz.ws.modes), so the
core never imports it. One `SyncSubscription` per sync holds all of its state:

1. Scope. The filter is the current view's (artifacts.query.parse_sync_filter) and
   the channels come from the one `reader_scope()`: the sync's set is what the
   `current` view returns to this reader for the same filter.
2. Rule 1, live before stored. The hub subscription on every #h channel is
   confirmed by Redis, on a connection that is up, before the snapshot opens.
   Change signals that arrive during the read are held by d, bounded by max_events.
3. Rule 2, one cut. One REPEATABLE READ READ ONLY transaction on a connection of
   the snapshot pool, keyset pages ordered by d, under a time budget the relay
   enforces itself. Pages go into a bounded buffer, so the snapshot can close
   before a slow reader has received them. Then EOSE; never EOSE after a failure.
4. Rules 3 and 4, live heads. After EOSE each sync takes its changed d one at a
   time, reads its current head from the writer (artifacts.heads, one batched
   reader shared by the process's syncs), decides with the before/after rule,
   queues the result, and only then starts the next read. The common case is plain
   calls on the hub's reader and the head reader's task (no task, future or wake-up
   per sync and change); only a head that left for a channel the sync doesn't name
   goes through the sync's own task. The published event itself is never sent.
5. Rules 5, 6 and 9. Any loss the node can see (hub drop, fan-out overflow, a
   signal it can't decode or interpret, a failed head or access read, a full send queue), a
   retirement, and any access change on a named channel end the sync with
   CLOSED "resync: ...". If even that can't be queued, the connection is closed.
6. The census (artifacts.census). A sync whose scope check passed is counted until it ends, however it
   ends (`_run`'s finally, `end` and `close` all release it), for the admin's "open syncs" figure.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import json
import logging
import uuid
from typing import Any, Final

import psycopg.errors
from django.conf import settings
from psycopg import AsyncConnection

from artifacts.census import Registration, census
from artifacts.envelope import KIND_ARTIFACT, KIND_REMOVAL
from artifacts.heads import Head, HeadReader, head_reader
from artifacts.query import ArtifactQuery, QueryError, matches, parse_sync_filter
from artifacts.selectors import HEAD_JOIN, current_where
from buzz.access.policy import NOT_A_MEMBER, Denied, check_read, policy_stamp_sql, reader_scope
from buzz.identity.actor import Actor
from buzz.live import signals
from buzz.live.hub import HubUnavailable, LossReason, topic_for_channel
from buzz.live.hub import Subscription as LiveSubscription
from buzz.nostr import utf8_size
from buzz.runtime import fetch_all, runtime
from buzz.ws.host import Subscription, SubscriptionHost
from buzz.ws.outbound import QueueFull

log = logging.getLogger(__name__)

MODE_KEY = "artifact"
LIVE_WAIT = 5.0  # seconds a new sync waits for a healthy hub (rule 1) before CLOSED "error: ..."
SNAPSHOT_CONNECTION_WAIT = 5.0  # seconds a sync waits for a snapshot connection
SEND_TIMEOUT = 10.0  # seconds the initial set may wait for room in the connection's send queue


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sync_settings() -> dict[str, Any]:
    value: dict[str, Any] = settings.BUZZ_SYNC
    return value


class _Overflow(Exception):
    pass


class _ByteBuffer:
    """The bounded buffer between the snapshot and the send queue (rule 2), bounded in bytes (UTF-8, as the
    frames are sent: a stored event keeps its non-ASCII text as it is) and count."""

    def __init__(self, max_bytes: int, max_items: int) -> None:
        # Each frame with its size, measured once when it is put (None ends the snapshot).
        self._items: collections.deque[tuple[str, int] | None] = collections.deque()
        self._bytes = 0
        self._max_bytes = max_bytes
        self._max_items = max_items
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        # The drain has taken a frame and is waiting for room in the send queue.
        self.draining = False

    async def put(self, text: str) -> None:
        size = utf8_size(text)
        while self._items and (self._bytes + size > self._max_bytes or len(self._items) >= self._max_items):
            self._room.clear()
            await self._room.wait()
        self._items.append((text, size))
        self._bytes += size
        self._ready.set()

    def finish(self) -> None:
        self._items.append(None)
        self._ready.set()

    @property
    def idle(self) -> bool:
        """Nothing waits in the buffer and the drain holds nothing: a frame may skip the buffer in order."""
        return not self._items and not self.draining

    async def get(self) -> str | None:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        self._room.set()
        if item is None:
            return None
        text, size = item
        self._bytes -= size
        return text


# How many times a head that left the sync's channels is read again when it keeps moving (`_left`).
_LEFT_READS: Final = 3


class SyncSubscription:
    """One sync: its filter, scope, held and sent d, and the tasks that serve it."""

    def __init__(self, host: SubscriptionHost, sub_id: str, query: ArtifactQuery, named: list[uuid.UUID]) -> None:
        conf = sync_settings()
        self.host = host
        self.sub_id = sub_id
        self.query = query
        self._named = named
        self._channels: frozenset[uuid.UUID] = frozenset()  # the scope, once the policy has granted it (`_grant`)
        self._community_id: int = host.community.id
        # The channels as text, for the checks of each signal and head: those #h names until the policy grants the
        # scope, then the scope (`_grant`; the same channels, as every channel a sync names must be readable).
        self._channel_strs = frozenset(str(c) for c in named)
        self._expiry: asyncio.TimerHandle | None = None
        self._max_events: int = conf["max_events"]
        self._budget = conf["snapshot_budget_ms"] / 1000.0
        self._buffer_bytes: int = conf["buffer_bytes"]
        self._page_rows: int = conf["page_rows"]
        self._prefix = f'["EVENT",{_dumps(sub_id)},'
        self._live: LiveSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        # The initial set's drain (buffer -> send queue): ended with the sync, so no frame of the set follows
        # the CLOSED (the snapshot's own task may still be rolling back when the sync ends).
        self._drain_task: asyncio.Task[None] | None = None
        # d of the client's copy as this sync sent it: "before" of rule 3.
        self._holds: set[str] = set()
        # d -> seq of the last head sent for it, kept after it leaves the set (until `_forget_left`): never older
        # (rule 4).
        self._last: dict[str, int] = {}
        # Changed d not read yet, in arrival order (held before EOSE, live after).
        self._pending: dict[str, None] = {}
        self._wake = asyncio.Event()  # a head for the slow path (`_left`, `_recheck`) is waiting
        self._slow: tuple[str, Head, bool] | None = None  # (d, head, left: True for `_left`, else `_recheck`)
        # Channel (as text) -> (its access epoch, the community's policy stamp) when the reader's access to it
        # was last decided. A head read with other values goes out only after the reader's access is checked again:
        # the change's own signal may not have come yet (Redis orders no two publishers' messages).
        self._access: dict[str, tuple[int, int]] = {}
        # The d whose head read (or its slow path) is in progress: the next read waits for it.
        self._reading: str | None = None
        self._reader: HeadReader | None = None  # the process's head reader, once live
        self._live_phase = False  # EOSE has been queued
        self._counted: Registration | None = None  # this sync's place in the census, once its scope passed
        self.ended = False

    # --- lifecycle (buzz.ws.host.Subscription) --------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"sync:{self.sub_id}")

    def _arm_expiry(self) -> None:
        """The credential's expiry changes the reader's access (rule 9): the sync ends at that instant. Armed
        once the policy granted the scope, which refuses a token expired already (the database's clock): a
        new sync on such a connection gets the policy's refusal, not a resync to retry forever."""
        actor = self._actor()
        if actor.token_expires_at is not None:
            delay = max(0.0, (actor.token_expires_at - dt.datetime.now(dt.UTC)).total_seconds())
            self._expiry = asyncio.get_running_loop().call_later(delay, self.resync, "the connection's token expired")

    async def close(self) -> None:
        """CLOSE, a replacing REQ or a disconnect: the snapshot and every read end now (rule 8)."""
        self.ended = True
        self._disarm_expiry()
        self._uncount()
        drain = self._drain_task
        if drain is not None and drain is not asyncio.current_task():
            drain.cancel()  # at once: a replacing REQ's frames must not follow any of this sync's
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        live, self._live = self._live, None
        if live is not None:
            await live.close()

    def end(self, reason: str) -> None:
        """The relay ends the sync with CLOSED `reason`; nothing is sent for it afterwards."""
        if self.ended:
            return
        self.ended = True
        self._disarm_expiry()
        self._uncount()
        for task in (self._task, self._drain_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self.host.subscription_ended(self, reason)

    def _disarm_expiry(self) -> None:
        handle, self._expiry = self._expiry, None
        if handle is not None:
            handle.cancel()

    def _uncount(self) -> None:
        counted, self._counted = self._counted, None
        if counted is not None:
            counted.release()

    def resync(self, why: str) -> None:
        self.end(f"resync: {why}; start a new sync")

    def _actor(self) -> Actor:
        actor = self.host.actor
        if actor is None:
            raise RuntimeError("a sync without an authenticated actor")
        return actor

    # --- the sync ---------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            # Live interest first (rule 1), then the access check: an access change that commits between the
            # two is signalled to a subscription that is already listening, never missed.
            if not await self._subscribe():
                return
            # Read before the access check: what changes after this read is checked again before it counts.
            self._access = await self._read_access()
            if not await self._scope():
                return
            self._arm_expiry()
            self._counted = census().register(self._community_id, self._channels)
            if not await self._initial_set():
                return
            await self._serve_changes()
        except asyncio.CancelledError:
            raise
        except QueueFull:
            # EOSE waited for room past the send timeout: the client is not reading (rule 2). The CLOSED may
            # still fit (the queue is bounded in bytes too); if it doesn't, the connection closes (rule 5).
            self.end(_TOO_SLOW)
        except Exception:
            log.exception("sync %s failed", self.sub_id)
            self.end("error: the sync failed; start a new sync")
        finally:
            self._uncount()  # however the sync ends, the census forgets it

    async def _scope(self) -> bool:
        actor = self._actor()
        try:
            channels = await reader_scope(actor, named=self._named)
        except Denied as err:
            self.end(restricted(err.reason))
            return False
        except Exception:
            log.exception("sync access check failed")
            self.end("error: could not check channel access; try again")
            return False
        self._grant(frozenset(channels))
        return not self.ended

    def _grant(self, channels: frozenset[uuid.UUID]) -> None:
        """The scope the policy granted: the channels the snapshot reads and each change is checked against."""
        self._channels = channels
        self._channel_strs = frozenset(str(c) for c in channels)

    async def _subscribe(self) -> bool:
        """Rule 1: live interest is confirmed by Redis, on a connection that is up, before the snapshot:
        each channel #h names, and the reader's own standing (bans, relay membership, tokens)."""
        community = self._community_id
        actor = self._actor()
        topics = [topic_for_channel(community, c) for c in sorted(self._channel_strs)]
        topics += signals.standing_topics(community, actor.pubkey)
        try:
            # Inline: on_message only records the changed d (bounded by max_events) or ends the sync.
            self._live = await runtime.hub().subscribe(topics, self, wait=LIVE_WAIT, inline=True)
        except HubUnavailable:
            self.end("error: live delivery is unavailable right now; try again")
            return False
        return not self.ended

    async def _initial_set(self) -> bool:
        """Rule 2: the whole set from one snapshot, streamed through a bounded buffer, then EOSE."""
        buffer = _ByteBuffer(self._buffer_bytes, self._max_events + 1)
        drain = self._start_drain(buffer)
        try:
            try:
                async with asyncio.timeout(self._budget):
                    at_snapshot = await self._snapshot(buffer)
            except TimeoutError:
                self.end("error: the initial set did not finish within the relay's time budget; start a new sync")
                return False
            except _Overflow:
                self.end(self._too_many())
                return False
            except psycopg.errors.QueryCanceled:
                self.end("error: the initial set did not finish within the relay's time budget; start a new sync")
                return False
            except (psycopg.Error, OSError):
                log.exception("sync snapshot failed")
                self.end("error: the initial read failed; start a new sync")
                return False
            buffer.finish()
            await drain
        finally:
            if not drain.done():
                drain.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await drain
            self._drain_task = None
        if self.ended or not await self._access_held(at_snapshot):
            return False
        await self.host.outbound.put(_dumps(["EOSE", self.sub_id]), timeout=SEND_TIMEOUT)
        self._live_phase = True
        return not self.ended

    async def _snapshot(self, buffer: _ByteBuffer) -> dict[str, tuple[int, int]]:
        """Rule 2's pages into `buffer`; returns who reads the channels at the snapshot's instant (`_read_access`
        in it): the set is exact only if the reader still does."""
        actor = self._actor()
        where, args = current_where(actor, self.query, sorted(self._channels))
        sql = (
            f"SELECT a.d, r.seq, r.raw FROM {HEAD_JOIN}"  # noqa: S608
            f" WHERE {where} AND a.d > %s ORDER BY a.d LIMIT %s"
        )
        pool = await runtime.snapshot_pool()
        count = 0
        budget_ms = max(1, int(self._budget * 1000))
        async with pool.connection(timeout=SNAPSHOT_CONNECTION_WAIT) as conn, conn.transaction():
            # One snapshot for every page (REPEATABLE READ), opened after the REQ and after rule 1.
            await conn.execute(
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;"
                f" SET LOCAL statement_timeout = {budget_ms};"
                " SET LOCAL plan_cache_mode = force_custom_plan"
            )
            after = uuid.UUID(int=0)
            while True:
                rows = await (await conn.execute(sql, [*args, after, self._page_rows])).fetchall()
                for d, seq, raw in rows:
                    count += 1
                    if count > self._max_events:
                        raise _Overflow
                    self._holds.add(str(d))
                    self._last[str(d)] = int(seq)
                    text = self._prefix + raw + "]"
                    if buffer.idle and self._send_now(text):
                        continue
                    await buffer.put(text)
                if len(rows) < self._page_rows:
                    return await self._read_access(conn)  # who reads the channels at this instant
                after = rows[-1][0]

    async def _read_access(self, conn: AsyncConnection[Any] | None = None) -> dict[str, tuple[int, int]]:
        """(access epoch, policy stamp) of each channel #h names, by the channel as text, now (on `conn`: in its
        snapshot)."""
        community = self._community_id
        sql = (
            f"SELECT c.uuid, c.access_epoch, {policy_stamp_sql('%s')}"  # noqa: S608 - composed from code
            " FROM buzz_channel c WHERE c.community_id = %s AND c.uuid = ANY(%s)"
        )
        rows = await fetch_all(sql, (community, community, sorted(self._named)), conn=conn)
        return {str(row[0]): (int(row[1]), int(row[2] or 0)) for row in rows}

    async def _access_held(self, now: dict[str, tuple[int, int]]) -> bool:
        """After the snapshot: where who reads a channel changed since the access check, check the reader again
        (the change's signal may still be on its way). False, with CLOSED "resync: ...", if it lost access."""
        for channel in sorted(self._channels):
            key = str(channel)
            seen = now.get(key)
            if seen is None or seen == self._access.get(key):
                continue
            if not await self._can_read(channel):
                self.resync("access to a channel of this sync changed")
                return False
            self._access[key] = seen
        return not self.ended

    def _send_now(self, text: str) -> bool:
        """The frame goes straight into the send queue when it has room (the common case, no buffer hop)."""
        try:
            self.host.outbound.try_put(text)
        except QueueFull:
            return False
        return True

    def _start_drain(self, buffer: _ByteBuffer) -> asyncio.Task[None]:
        """The task that moves the initial set from `buffer` to the send queue (`end` cancels it)."""
        drain = asyncio.get_running_loop().create_task(self._drain(buffer), name=f"sync-drain:{self.sub_id}")
        self._drain_task = drain
        return drain

    async def _drain(self, buffer: _ByteBuffer) -> None:
        try:
            while (text := await buffer.get()) is not None:
                if self.ended:
                    return
                buffer.draining = True
                await self.host.outbound.put(text, timeout=SEND_TIMEOUT)
                buffer.draining = False
        except QueueFull:
            # The client stopped reading (rule 2). The CLOSED may still fit where a large EVENT did not (the
            # queue is bounded in bytes too); if it doesn't, the connection closes (rule 5).
            self.end(_TOO_SLOW)

    async def _serve_changes(self) -> None:
        """Rules 3 and 4: one head read at a time, each started after the previous result is queued.

        The common case runs without this task: `_next` submits the read to the process's head reader,
        whose batch calls `_on_head` back, which decides, queues the result and submits the next read.
        Only a head that left for a channel this sync doesn't name needs awaits (the reader's access to
        it, or the stored removal); `_on_head` hands that one to this task, and the next read waits.
        """
        self._next()
        while not self.ended:
            job, self._slow = self._slow, None
            if job is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            d, head, left = job
            try:
                text = await (self._left(d, head) if left else self._recheck(d, head))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("sync %s: deciding the head of %s failed: %s", self.sub_id, d, exc)
                self.resync("a change could not be read")
                return
            self._reading = None
            if text is not None and not self._queue(text):
                return
            self._next()

    def _next(self) -> None:
        """Start the next read, if the sync is live, has a changed d and no read in progress."""
        if self._reading is not None or self.ended or not self._live_phase or not self._pending:
            return
        d = next(iter(self._pending))
        del self._pending[d]
        self._read(d)

    def _read(self, d: str) -> None:
        """Submit the head read of d; `_on_head` gets the answer."""
        self._reading = d
        reader = self._reader
        if reader is None:
            reader = self._reader = head_reader()
        reader.submit(self._community_id, d, self._on_head)

    def _on_head(self, d: str, head: Head | None, exc: BaseException | None) -> None:
        """The head reader's answer for d (on its task; never blocks)."""
        if self.ended:
            return
        if exc is not None:
            log.warning("sync %s: head read for %s failed: %s", self.sub_id, d, exc)
            self.resync("a change could not be read")
            return
        try:
            text = self._render(d, head)
        except Exception:
            log.exception("sync %s: deciding the head of %s failed", self.sub_id, d)
            self.resync("a change could not be read")
            return
        if text is _LEFT and head is not None:  # _render answers _LEFT for a head only
            # The read stays in progress until the slow path has queued its result.
            self._slow = (d, head, True)
            self._wake.set()
            return
        if text is _RECHECK and head is not None:
            self._slow = (d, head, False)
            self._wake.set()
            return
        self._reading = None
        if text is not None and not self._queue(text):
            return
        if self._pending:
            self._next()

    def _queue(self, text: str) -> bool:
        if self.ended:
            return False
        try:
            self.host.outbound.try_put(text)
        except QueueFull:
            # One drop is enough (rule 5); the CLOSED itself may not fit, then the connection closes.
            self.resync("the connection's send queue is full")
            return False
        return True

    def _render(self, d: str, head: Head | None) -> str | None:
        """What this sync sends for a changed d: its head, nothing, or `_LEFT` (rules 3 and 4).

        `_LEFT`: d left this sync for a channel it doesn't name, and `_left` decides what goes out.
        """
        if head is None:
            return None
        inside = head.channel in self._channel_strs
        if inside and head.access != self._access.get(head.channel):
            return _RECHECK  # who reads its channel changed since the reader's access was decided
        if head.retired:
            # Rule 6: a redacted head is withheld, so only a new sync can tell the client it left the set.
            if d in self._holds:
                self.resync("an artifact of this sync was retired by moderation")
            return None
        last = self._last.get(d)
        if last is not None and head.seq <= last:
            return None  # the head this sync sent already, or (never) an older one: rule 4
        if inside and not head.deleted and self._matches(head):
            if d not in self._holds and len(self._holds) >= self._max_events:
                # The set outgrew what a sync serves (max_events bounds it, not only its initial read): a new
                # sync of this filter would be refused the same way, so none is offered (rule 8).
                self.end(self._too_many())
                return None
            self._holds.add(d)
            self._last[d] = head.seq
            return f"{self._prefix}{head.raw}]"
        if d not in self._holds:
            return None  # in scope neither before nor after: nothing, ever
        self._holds.discard(d)
        self._last[d] = head.seq
        if len(self._last) > 2 * self._max_events:
            self._forget_left()
        if inside:
            # A deletion, or a head that no longer matches.
            return f"{self._prefix}{head.raw}]"
        return _LEFT

    def _forget_left(self) -> None:
        """Bound `_last` (rule 8) by dropping the d that left the set. What it kept for them only guards
        against an older head, which can't come: this sync reads one head at a time, each from the writer
        and started after the previous one's answer, so a later read never returns an older head; a head
        sent again would be the same one, which rule 4 allows."""
        self._last = {d: seq for d, seq in self._last.items() if d in self._holds}

    def _too_many(self) -> str:
        return f"error: more than {self._max_events} artifacts match this sync (max_events); narrow the filter"

    def _matches(self, head: Head) -> bool:
        """artifacts.query.matches, once per head and distinct predicates among the syncs that read it."""
        key = self.query.predicates
        hit = head.matched.get(key)
        if hit is None:
            hit = head.matched[key] = matches(self.query, head.tags)
        return hit

    async def _left(self, d: str, head: Head) -> str | None:
        """d left for a channel this sync doesn't name: its head if the reader can read it there, else the
        45011 removal stored in the channel it left.

        The head was read before the access check, and what happens to it in its new channel is signalled on
        that channel's topic, which this sync doesn't hear: a redaction that retired it meanwhile would not
        end the sync, nor would a change of who reads that channel. So a readable head is read again after
        the check, and the fresh one decides, sent only when who reads its channel is still what the check
        saw (its access epoch); else the reader's access is checked again."""
        for _ in range(_LEFT_READS):
            epoch = await self._readable_at(head.home)
            if epoch is None:
                removal = await self._removal(head)
                if removal is None:
                    # The removal was redacted: nothing can tell the client the artifact left, but a new sync.
                    self.resync("an artifact of this sync left it and its removal was redacted")
                    return None
                return self._prefix + removal + "]"
            fresh = await self._read_again(d)
            if fresh is None or fresh.retired:
                # Withheld now: only a new sync can tell the client that the artifact left (rule 6).
                self.resync("an artifact of this sync was retired by moderation")
                return None
            if fresh.channel in self._channel_strs:
                # It came back. The client still holds it, and its own signal, on a channel this sync hears,
                # decides what goes out.
                self._holds.add(d)
                return None
            if fresh.home == head.home and sum(fresh.access) == epoch:
                self._last[d] = max(self._last.get(d, 0), fresh.seq)
                return self._prefix + fresh.raw + "]"
            head = fresh  # it moved on again, or who reads its channel changed: decide again
        self.resync("an artifact of this sync kept moving while it was read")
        return None

    async def _read_again(self, d: str) -> Head | None:
        """d's head as the writer has it now, from a read that starts after this call (raises if it fails)."""
        answer: asyncio.Future[Head | None] = asyncio.get_running_loop().create_future()

        def done(_d: str, head: Head | None, exc: BaseException | None) -> None:
            if not answer.done():
                if exc is not None:
                    answer.set_exception(exc)
                else:
                    answer.set_result(head)

        reader = self._reader if self._reader is not None else head_reader()
        reader.submit(self._community_id, d, done)
        return await answer

    async def _recheck(self, d: str, head: Head) -> str | None:
        """A head of a channel this sync names, read after a change to who reads that channel that this sync
        has not been told of: the reader's access is checked now. Lost: CLOSED "resync: ..." (the change's
        own signal would say the same); kept: the head is decided as any other."""
        if not await self._can_read(head.home):
            self.resync("access to a channel of this sync changed")
            return None
        self._access[head.channel] = head.access
        text = self._render(d, head)
        return text if isinstance(text, str) else None

    async def _can_read(self, channel: uuid.UUID) -> bool:
        return await self._readable_at(channel) is not None

    async def _readable_at(self, channel: uuid.UUID) -> int | None:
        """The channel's effective access epoch (ChannelAccess.epoch, the sum of a Head's `access`) when the
        reader can read it now, else None."""
        decision = await check_read(self._actor(), channel)
        if not decision.ok:
            return None
        # A decision always carries its facts; without them, an epoch no head has: the check is made again.
        return decision.access.epoch if decision.access is not None else -1

    async def _removal(self, head: Head) -> str | None:
        """The 45011 stored in a channel of this sync when the artifact moved where the reader can't read: the
        latest removal from this sync's channels (the move that took it out). None when there is none, or when
        that one was redacted: an earlier removal names an earlier revision, and is no answer for this move."""
        pool = await runtime.pool()
        async with pool.connection() as conn:
            row = await (
                await conn.execute(
                    "SELECT m.raw, m.redacted_at IS NULL FROM artifacts_moveremoval m"
                    " JOIN artifacts_artifact a ON a.id = m.artifact_id"
                    " WHERE a.community_id = %s AND a.d = %s AND m.source = ANY(%s) ORDER BY m.seq DESC LIMIT 1",
                    (self._community_id, uuid.UUID(head.d), sorted(self._channels)),
                )
            ).fetchone()
        return str(row[0]) if row and row[1] else None

    # --- hub callbacks (buzz.live.hub.Listener; never block) ----------------------------

    def on_message(self, topic: str, message: dict[str, Any]) -> None:
        if self.ended:
            return
        # Rule 5: a message this sync can't interpret (an unknown kind, a missing or mistyped field) may have
        # been a change it needed; it is a loss like one that could not be decoded, never silently skipped.
        kind = message.get("t")
        if kind == signals.EVENT:
            event = message.get("event")
            if not isinstance(event, dict) or type(event.get("kind")) is not int:
                self.resync(_UNINTERPRETABLE)
                return
            if event["kind"] not in (KIND_ARTIFACT, KIND_REMOVAL):
                return
            d = _d_of(event)
            if d is None:
                self.resync(_UNINTERPRETABLE)
                return
            self._changed(d)
        elif kind == signals.ACCESS:
            channel = message.get("channel")
            if not isinstance(channel, str):
                self.resync(_UNINTERPRETABLE)
            elif channel in self._channel_strs and self._concerns_reader(message):
                # Rule 9: the reader's membership, the visibility or the deletion of a named channel. Archive
                # sends no access signal; another member's membership changes nothing this reader can read.
                self.resync("access to a channel of this sync changed")
        elif kind == signals.STANDING:
            actor = self.host.actor
            token = message.get("token")
            pubkey = message.get("pubkey")
            if not (pubkey is None or isinstance(pubkey, str)) or not (token is None or type(token) is int):
                self.resync(_UNINTERPRETABLE)
            elif actor is None or signals.standing_concerns(message, pubkey=actor.pubkey, token_id=actor.token_id):
                # A ban, a removal from the relay members, or a revoked token of this connection.
                self.resync("the reader's access changed")
        elif kind == signals.RETIRED:
            channel = message.get("channel")
            if not isinstance(channel, str) or not isinstance(message.get("d"), str):
                self.resync(_UNINTERPRETABLE)
            elif channel in self._channel_strs and self._may_hold(message):
                self.resync("an artifact of this sync was retired by moderation")
        else:
            self.resync(_UNINTERPRETABLE)

    def _may_hold(self, message: dict[str, Any]) -> bool:
        """Rule 6: only a sync whose set holds the retired artifact, whose set is still being read, or whose head
        read of it is in flight can hold it. That read may have read the head before the retirement committed,
        and would send it after this signal."""
        d = message.get("d")
        return not self._live_phase or d in self._holds or (d is not None and d == self._reading)

    def _concerns_reader(self, message: dict[str, Any]) -> bool:
        if message.get("why") != signals.WHY_MEMBERSHIP:
            return True
        pubkey = message.get("pubkey")
        actor = self.host.actor
        return pubkey is None or actor is None or pubkey == actor.pubkey

    def on_loss(self, reason: LossReason, detail: str) -> None:
        self._live = None
        self.resync(f"live delivery was interrupted ({reason.value})")

    def _changed(self, d: str) -> None:
        if d in self._pending:
            return
        if len(self._pending) >= self._max_events:
            # Rule 1's bound on the held list (before EOSE), and lagging fan-out after it (rule 5).
            self.resync(f"more than {self._max_events} artifacts changed before they could be sent")
            return
        if self._reading is None and self._live_phase and not self._pending and not self.ended:
            self._read(d)  # the common case: nothing else waits, the read starts now
            return
        self._pending[d] = None
        self._next()


def restricted(reason: str) -> str:
    """The policy's refusal as rule 2 answers a sync the reader can't read: CLOSED "restricted: ...", whatever
    prefix the policy gave it (a ban is "blocked:", a revoked token "auth-required:" elsewhere). The text
    after it is kept: it is about the reader's own standing, or the same for every channel it can't read."""
    if reason.startswith("restricted:"):
        return reason
    _, sep, detail = reason.partition(":")
    return f"restricted: {detail.strip() if sep else reason}"


# Rule 5's resync for a live message the sync could not interpret.
_UNINTERPRETABLE: Final = "live delivery received a signal this relay could not interpret"

# Rule 2's CLOSED for a reader too slow to take the initial set.
_TOO_SLOW: Final = "error: the client did not read the initial set in time; start a new sync"

# `_render`'s answer when the slow path must decide.
_LEFT: Any = object()
# `_render`'s answer for a head of a named channel whose access epoch or policy stamp changed (`_recheck`).
_RECHECK: Any = object()


# The last event `_d_of` looked at, and its d. The hub hands one decoded message to every sync of its
# topic (read-only), so a change seen by a thousand syncs is looked through once. Holding the event
# keeps its id from being reused by another object.
_last_d: tuple[Any, str | None] = (None, None)


def _d_of(event: dict[str, Any]) -> str | None:
    global _last_d
    seen, d = _last_d
    if seen is event:
        return d
    d = _tag(event, "d")
    _last_d = (event, d)
    return d


def _tag(event: dict[str, Any], name: str) -> str | None:
    tags = event.get("tags")
    if not isinstance(tags, list):
        return None
    for tag in tags:
        if isinstance(tag, list) and len(tag) >= 2 and tag[0] == name and isinstance(tag[1], str):
            return tag[1]
    return None


async def open_sync(host: SubscriptionHost, sub_id: str, filters: tuple[dict[str, Any], ...]) -> Subscription | None:
    """The REQ-mode factory: validate the filter, or answer CLOSED and return None."""
    if len(filters) != 1:
        host.reply(["CLOSED", sub_id, "invalid: a sync takes exactly one filter"])
        return None
    try:
        query = parse_sync_filter(filters[0])
    except QueryError as err:
        host.reply(["CLOSED", sub_id, err.reason])
        return None
    named = query.channels() or []
    if len(named) != len(query.values("h") or ()):
        # A value that is no channel id names no channel: the answer for a missing one.
        host.reply(["CLOSED", sub_id, NOT_A_MEMBER])
        return None
    return SyncSubscription(host, sub_id, query, named)
