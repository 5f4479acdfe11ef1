"""One ordinary NIP-01 REQ: live interest first, then stored events, EOSE, then live events.

The subscription registers with the hub before it reads stored events (the
order NIP-AR Sync rule 1 names for REQ), holds live events that arrive during
the stored read, and releases them after EOSE. An access signal on one of its
channels pauses live delivery until the reader's access is checked again; a
lost check or a lost hub connection ends the subscription with CLOSED, so a
gap is never silent. It also listens on its reader's pubkey topic: a standing
signal (a ban, a removal from the relay members, a revoked token) and the
expiry of the connection's token make it re-check the reader's standing in the
same way, whatever channels it reads.

Signals of different processes reach it in no set order, so a new event can
arrive before the signal of an access change that committed before it. Each
live event carries its channel's effective access epoch as the write read it
(buzz.live.signals.EVENT; the channel's own epoch plus the community's policy
stamp, so a ban or a relay removal advances it as a membership change does:
buzz.access.policy.ChannelAccess.epoch); the subscription knows, per channel, the epoch its
reader's access was last decided at (read before the scope is decided again
once live interest is confirmed, and with every re-check). An event of a
later epoch, or of none, is held, and live delivery pauses, until a re-check
that began after the event arrived has decided again: so a live event goes
out only if its reader could read its channel at or after the instant it was
stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from buzz.access.policy import Denied, check_read, check_reader
from buzz.chat.channels import STATE_KINDS
from buzz.events.query import ReadOverBudget, ReadsBusy, query_events
from buzz.live import signals
from buzz.live.hub import HubUnavailable, LossReason, topic_for_channel
from buzz.live.hub import Subscription as LiveSubscription
from buzz.nostr.filters import Filter, matches_any
from buzz.runtime import runtime
from buzz.ws.frames import is_unicode
from buzz.ws.host import SubscriptionHost
from buzz.ws.outbound import QueueFull

log = logging.getLogger(__name__)

STORED_SEND_TIMEOUT = 10.0  # seconds the stored read may wait for room in the outbound queue
SENT_IDS_GRACE = 30.0  # seconds after EOSE during which a live copy of a stored event is skipped
LIVE_WAIT = 5.0  # seconds a REQ waits for a healthy hub before CLOSED "error:"
# After a token's expiry instant by this process's clock, the database (whose clock decides) may not
# agree yet: the re-check is repeated this often until it does.
EXPIRY_RECHECK = 0.25


@dataclass(slots=True)
class _Live:
    """A live event held for delivery: its channel's access epoch from its signal (None when it has none) and
    its place in the order live events arrived in."""

    event: dict[str, Any]
    epoch: int | None
    arrival: int


def dumps(value: Any) -> str:
    """A reply frame's text. A value holding a lone surrogate (echoed from a client's frame) comes out
    \\u-escaped: raw, it could not be encoded as the UTF-8 a text frame carries."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if not is_unicode(text):
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return text


class ReqSubscription:
    def __init__(
        self,
        host: SubscriptionHost,
        sub_id: str,
        filters: Sequence[Filter],
        channels: Sequence[uuid.UUID],
        *,
        rescope: Callable[[Sequence[uuid.UUID]], Awaitable[tuple[Sequence[uuid.UUID], dict[uuid.UUID, int]]]]
        | None = None,
    ) -> None:
        """`channels`: the scope the policy granted when the REQ arrived. `rescope` decides it again (raising
        Denied), with the access epochs of the channels it is given, none read after the decision
        (buzz.access.policy.reader_scope_and_epochs): once live interest is confirmed, the REQ reads and
        delivers only what is readable then."""
        self.host = host
        self._rescope = rescope
        self.sub_id = sub_id
        self.filters = tuple(filters)
        self.channels = tuple(channels)
        self._channel_strs = frozenset(str(c) for c in channels)
        self._prefix = f'["EVENT",{dumps(sub_id)},'
        self._live: LiveSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._held: list[_Live] = []
        self._arrivals = 0  # live events that have arrived so far
        # Per channel: the access epoch its reader's access was last decided at, and the last arrival that a
        # decision which began after it covers (buzz.ws.req's module doc).
        self._epochs: dict[str, int] = {}
        self._decided_through: dict[str, int] = {}
        self._deciding: set[str] = set()  # channels with a re-check under way for a held event
        self._forget_armed = False
        self._held_max = host.limits.outbound_max_messages
        self._sent_ids: set[str] | None = set()  # ids sent from storage; dropped after EOSE
        self._eose = False
        self._rechecks = 0
        self._expiry: asyncio.TimerHandle | None = None
        self.ended = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"req:{self.sub_id}")
        actor = self.host.actor
        if actor is not None and actor.token_expires_at is not None:
            self._arm_expiry(max(0.0, (actor.token_expires_at - dt.datetime.now(dt.UTC)).total_seconds()))

    async def close(self) -> None:
        """CLOSE from the client, a replacing REQ, or disconnect: stop reading and unsubscribe."""
        self.ended = True
        self._disarm_expiry()
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            # The read is being abandoned; how it ends does not matter.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        live, self._live = self._live, None
        if live is not None:
            await live.close()

    def end(self, reason: str) -> None:
        """End the subscription from the relay's side with CLOSED reason."""
        if self.ended:
            return
        # Ended from now on, not only once close() runs: no later callback may send an EVENT or a
        # second CLOSED, and the stored read stops before it queues anything more.
        self.ended = True
        self._disarm_expiry()
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self.host.subscription_ended(self, reason)

    # --- initial phase -------------------------------------------------------------

    async def _run(self) -> None:
        try:
            actor = self.host.actor
            if actor is None:
                raise RuntimeError("subscription without an authenticated actor")
            topics = [topic_for_channel(self.host.community.id, c) for c in self._channel_strs]
            # Standing signals about the reader, on every node (one topic per pubkey, shared by its subscriptions).
            topics += signals.standing_topics(self.host.community.id, actor.pubkey)
            try:
                self._live = await runtime.hub().subscribe(topics, self, wait=LIVE_WAIT)
            except HubUnavailable:
                self.end("error: live delivery is unavailable right now, try again")
                return
            if not await self._scope_again():
                return
            outbound = self.host.outbound
            sent: set[str] = set()
            self._sent_ids = sent
            rows = query_events(
                self.host.community.id, self.filters, readable_channels=self.channels, reads=self.host.reads
            )
            async for event_id, raw in rows:
                sent.add(event_id)
                await outbound.put(self._prefix + raw + "]", timeout=STORED_SEND_TIMEOUT)
            await outbound.put(dumps(["EOSE", self.sub_id]), timeout=STORED_SEND_TIMEOUT)
            # What was held during the read goes out the way stored events do, waiting for room: right
            # after a large stored set the queue is often full, and that is no reason to drop the client.
            while not self.ended:
                try:
                    text = self._next_held()
                except (KeyError, TypeError):
                    self.end("error: live delivery received a malformed entry; send REQ again")
                    return
                if text is None:
                    break
                await outbound.put(text, timeout=STORED_SEND_TIMEOUT)
            self._eose = True
            self._release_held()
        except asyncio.CancelledError:
            raise
        except QueueFull:
            self.host.abort()
        except (ReadsBusy, ReadOverBudget) as refused:
            self.end(str(refused))
        except Exception:
            log.exception("REQ %s failed", self.sub_id)
            self.end("error: the query failed")

    async def _scope_again(self) -> bool:
        """The scope decided again, now that live interest is confirmed. An access change that committed
        between the REQ's first decision and its SUBSCRIBE was signalled to nobody here: decided now, it
        counts, and every later one is signalled to this subscription. A channel the reader lost leaves the
        REQ (as it would leave a new one); a named channel it can't read, or its standing, ends it. False when
        the REQ ended."""
        if self._rescope is None:
            return True
        try:
            # Never read after the scope is decided: an epoch read after the decision could be one it did not
            # see. A named channel's comes with the facts the decision is made on, in the same statement.
            scope, epochs = await self._rescope(self.channels)
            now = frozenset(scope)
        except Denied as err:
            self.end(err.reason)
            return False
        except Exception:
            log.exception("access re-check failed")
            self.end("error: could not check channel access, try again")
            return False
        if not now.issuperset(self.channels):
            self.channels = tuple(c for c in self.channels if c in now)
            self._channel_strs = frozenset(str(c) for c in self.channels)
        self._epochs = {str(c): epoch for c, epoch in epochs.items()}
        return not self.ended

    # --- live phase (hub callbacks: never block) -------------------------------------

    def on_message(self, topic: str, message: dict[str, Any]) -> None:
        if self.ended:
            return
        kind = message.get("t")
        if kind == signals.EVENT:
            event = message.get("event")
            if not isinstance(event, dict):
                self.end("error: live delivery received a malformed entry; send REQ again")
                return
            epoch = message.get("epoch")
            self._arrivals += 1
            if type(epoch) is not int:
                epoch = None
            if self._eose and self._rechecks == 0 and not self._held:
                self._deliver(event, epoch)
            elif len(self._held) >= self._held_max:
                self.end("error: too many live events arrived while they were held; send REQ again")
            else:
                self._held.append(_Live(event, epoch, self._arrivals))
        elif kind == signals.ACCESS:
            channel = message.get("channel")
            if isinstance(channel, str) and channel in self._channel_strs:
                self._rechecks += 1
                asyncio.get_running_loop().create_task(self._recheck(channel))
        elif kind == signals.STANDING:
            actor = self.host.actor
            if actor is not None and signals.standing_concerns(message, pubkey=actor.pubkey, token_id=actor.token_id):
                self._rechecks += 1
                asyncio.get_running_loop().create_task(self._recheck(None))

    def on_loss(self, reason: LossReason, detail: str) -> None:
        self._live = None
        self.end(f"error: live delivery was interrupted ({reason.value}); send REQ again")

    def _wanted(self, event: dict[str, Any]) -> str | None:
        """The channel of a live event this REQ gets, or None if it does not get it. KeyError/TypeError if
        malformed."""
        channel = _channel_tag(event)
        if channel is None or channel not in self._channel_strs or not matches_any(self.filters, event):
            return None
        if self._sent_ids is not None and event.get("id") in self._sent_ids:
            return None
        return channel

    def _frame(self, event: dict[str, Any]) -> str:
        return self._prefix + _event_text(event) + "]"

    def _decided(self, channel: str, epoch: int | None, arrival: int) -> bool:
        """Whether the reader's access to `channel` was decided at or after the instant a live event (its epoch,
        its arrival) was stored: at its epoch or a later one, or by a decision that began after it arrived (and so
        after it was stored)."""
        if arrival <= self._decided_through.get(channel, 0):
            return True
        return epoch is not None and epoch <= self._epochs.get(channel, -1)

    def _deliver(self, event: dict[str, Any], epoch: int | None) -> None:
        """Send the live event that arrived last now, or hold it until its reader's access is decided again
        (delivery pauses)."""
        try:
            channel = self._wanted(event)
            if channel is None:
                return
            if not self._decided(channel, epoch, self._arrivals):
                self._held.append(_Live(event, epoch, self._arrivals))
                self._decide_again(channel)
                return
            self.host.outbound.try_put(self._frame(event))
        except QueueFull:
            # The client stopped reading; dropping silently is not allowed, so the connection ends.
            self.host.abort()
        except (KeyError, TypeError):
            self.end("error: live delivery received a malformed entry; send REQ again")

    def _next_held(self) -> str | None:
        """The frame of the first held event that may go out now, taken off the held list; None when there is
        none (the list is empty, or its first event waits for a decision, which this starts). Skips held events
        this REQ does not get. KeyError/TypeError if malformed."""
        while self._held and not self._rechecks:
            live = self._held[0]
            channel = self._wanted(live.event)
            if channel is None:
                self._held.pop(0)
                continue
            if not self._decided(channel, live.epoch, live.arrival):
                self._decide_again(channel)
                return None
            self._held.pop(0)
            return self._frame(live.event)
        return None

    def _decide_again(self, channel: str) -> None:
        """Re-check the reader's access to `channel` for a held event (one at a time per channel)."""
        if channel in self._deciding:
            return
        self._deciding.add(channel)
        self._rechecks += 1
        asyncio.get_running_loop().create_task(self._recheck(channel, held=True))

    def _release_held(self) -> None:
        if self._rechecks:
            return  # still held; the stored ids stay until then, so a held stored event is not sent twice
        while not self.ended:
            try:
                text = self._next_held()
                if text is None:
                    break
                self.host.outbound.try_put(text)
            except QueueFull:
                self.host.abort()
                return
            except (KeyError, TypeError):
                self.end("error: live delivery received a malformed entry; send REQ again")
                return
        if not self._forget_armed:
            # A change stored before the read can still arrive live after EOSE (a slow or retried publish):
            # the stored ids are kept a while so it is not sent twice, then dropped (they are bounded anyway).
            self._forget_armed = True
            asyncio.get_running_loop().call_later(SENT_IDS_GRACE, self._forget_sent)

    def _forget_sent(self) -> None:
        self._sent_ids = None

    # --- token expiry -----------------------------------------------------------------

    def _arm_expiry(self, delay: float) -> None:
        self._expiry = asyncio.get_running_loop().call_later(delay, self._expiry_due)

    def _disarm_expiry(self) -> None:
        handle, self._expiry = self._expiry, None
        if handle is not None:
            handle.cancel()

    def _expiry_due(self) -> None:
        self._expiry = None
        if self.ended:
            return
        # Live delivery pauses from this instant until the policy has answered.
        self._rechecks += 1
        asyncio.get_running_loop().create_task(self._recheck(None, expiring=True))

    async def _recheck(self, channel: str | None, *, expiring: bool = False, held: bool = False) -> None:
        """Re-check read access to `channel`, or the reader's standing (None); end the REQ if it is gone. `held`:
        started for a held event (`_decide_again`)."""
        # Every live event that has arrived by now was stored before this decision's read begins.
        through = self._arrivals
        try:
            actor = self.host.actor
            if actor is None:
                raise RuntimeError("subscription without an authenticated actor")
            if channel is None:
                decision = await check_reader(actor)
            else:
                decision = await check_read(actor, uuid.UUID(channel))
                if decision.ok and decision.access is not None:
                    # The epoch of the facts this decision was made on.
                    self._epochs[channel] = max(self._epochs.get(channel, -1), decision.access.epoch)
                    self._decided_through[channel] = max(self._decided_through.get(channel, 0), through)
        except Exception:
            log.exception("access re-check failed")
            self.end("error: could not re-check channel access; send REQ again")
            return
        finally:
            self._rechecks -= 1
            if held and channel is not None:
                self._deciding.discard(channel)
        if not decision.ok:
            reason = decision.reason
            if reason.split(":", 1)[0] not in ("restricted", "blocked", "auth-required"):
                reason = "restricted: " + reason
            self.end(reason)
            return
        if expiring and not self.ended:
            self._arm_expiry(EXPIRY_RECHECK)
        if self._eose:
            self._release_held()


# The JSON text of the live events framed lately, by the identity of the decoded event: the hub hands one decoded
# message to every subscription of the process (each drains its own queue, in its own order), so an event is
# serialized once per process, not once per REQ that gets it. Each entry keeps its event, so an id can't be reused
# while it is cached. Bounded by count and by the texts' size (an event may be up to the message limit, 512 KiB by
# default); the oldest entries go first, and a text larger than the whole bound is not kept.
_TEXTS_MAX = 1024
_TEXTS_MAX_CHARS = 4 * 1024 * 1024
_texts: dict[int, tuple[dict[str, Any], str]] = {}
_texts_chars = 0


def _event_text(event: dict[str, Any]) -> str:
    global _texts_chars
    cached = _texts.get(id(event))
    if cached is not None and cached[0] is event:
        return cached[1]
    text = dumps(event)
    if len(text) > _TEXTS_MAX_CHARS:
        return text
    while _texts and (len(_texts) >= _TEXTS_MAX or _texts_chars + len(text) > _TEXTS_MAX_CHARS):
        _, oldest = _texts.pop(next(iter(_texts)))
        _texts_chars -= len(oldest)
    _texts[id(event)] = (event, text)
    _texts_chars += len(text)
    return text


def _channel_tag(event: dict[str, Any]) -> str | None:
    """The channel a live event belongs to: its h tag, or the d tag of the relay-signed group state (39000-39002),
    which names its channel there (buzz.chat.channels.refresh_state stores it in that channel)."""
    name = "d" if event["kind"] in STATE_KINDS else "h"
    for tag in event["tags"]:
        if len(tag) >= 2 and tag[0] == name:
            return str(tag[1])
    return None
