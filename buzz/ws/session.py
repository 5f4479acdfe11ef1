"""One WebSocket connection's protocol state and the router for its frames.

The consumer (transport) hands every text frame to `Session.handle`. Replies go
through the bounded outbound queue; when even a short reply can't be queued the
connection is closed, because a client that does not read must not make the
relay hold more (rule 5 / rule 8 of NIP-AR Sync depend on this bound).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from buzz.access.policy import Denied, parse_channel_id, reader_scope_and_epochs
from buzz.chat.channels import STATE_KINDS
from buzz.events.ingest import event_id_of, ingest
from buzz.events.query import ReadOverBudget, ReadsBusy, connection_reads, count_events
from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo, admitted
from buzz.limits import Limits, limits
from buzz.nostr import ProtocolError, parse_event, verify_auth_event
from buzz.ws.frames import (
    AuthFrame,
    CloseFrame,
    CountFrame,
    EventFrame,
    Filter,
    FrameError,
    FrameLimits,
    ModeReqFrame,
    ReqFrame,
    parse_frame,
)
from buzz.ws.host import Subscription
from buzz.ws.modes import req_mode, req_mode_keys
from buzz.ws.outbound import Outbound, QueueFull
from buzz.ws.req import ReqSubscription, dumps

log = logging.getLogger(__name__)

# Close codes (RFC 6455 section 7.4.1).
CLOSE_TRY_AGAIN = 1013  # the client stopped reading and the outbound bound was reached
# AUTH on a connection opened with `Authorization: Bearer`: the token decides what it may do, to the end.
BEARER_CONNECTION = (
    "restricted: this connection is authenticated by an API token; open a new connection to log in with NIP-42"
)


def frame_limits(lim: Limits) -> FrameLimits:
    return FrameLimits(
        max_message_length=lim.max_message_length,
        max_subid_length=lim.max_subid_length,
        max_filters=lim.max_filters,
        max_limit=lim.max_limit,
        default_limit=lim.default_limit,
        modes=req_mode_keys(),
    )


class Session:
    def __init__(
        self,
        *,
        community: CommunityInfo,
        send_text: Callable[[str], Awaitable[None]],
        close: Callable[[int], Coroutine[Any, Any, None]],
        actor: Actor | None = None,
        send_many: Callable[[list[str]], Awaitable[None]] | None = None,
    ) -> None:
        self.community = community
        self.limits = limits()
        self._frame_limits = frame_limits(self.limits)
        self.challenge = secrets.token_hex(16)
        self.actor = actor
        self.outbound = Outbound(
            send_text,
            max_messages=self.limits.outbound_max_messages,
            max_bytes=self.limits.outbound_max_bytes,
            send_many=send_many,
        )
        self.reads = connection_reads()
        self._close = close
        self._closing = False
        self.subscriptions: dict[str, Subscription] = {}

    # --- lifecycle ---------------------------------------------------------

    async def open(self) -> None:
        self.outbound.start()
        self.reply(["AUTH", self.challenge])

    async def shutdown(self) -> None:
        self._closing = True
        subs = list(self.subscriptions.values())
        self.subscriptions.clear()
        for sub in subs:
            try:
                await sub.close()
            except Exception:
                # The others are released all the same.
                log.exception("closing subscription %r failed", sub.sub_id)
        await self.outbound.close()

    def reply(self, message: list[Any], *, notice: bool = False) -> bool:
        """Queue a reply; on a full queue close the connection. False when closing. A `notice` (the CLOSED of
        a subscription the relay ends) may use the queue's slack for notices (buzz.ws.outbound)."""
        if self._closing:
            return False
        try:
            self.outbound.try_put(dumps(message), notice=notice)
            return True
        except QueueFull:
            self.abort()
            return False

    def abort(self) -> None:
        if not self._closing:
            self._closing = True
            asyncio.get_running_loop().create_task(self._close(CLOSE_TRY_AGAIN))

    # --- frames --------------------------------------------------------------

    async def handle(self, text: str | bytes) -> None:
        try:
            frame = parse_frame(text, self._frame_limits)
        except FrameError as err:
            if err.replacing is not None:
                # A REQ refused while parsing still replaces an open subscription of its id (NIP-01): its
                # CLOSED says that id has ended, so nothing more may come for it.
                previous = self.subscriptions.pop(err.replacing, None)
                if previous is not None:
                    await previous.close()
            self.reply(err.reply)
            return
        if isinstance(frame, EventFrame):
            await self._event(frame)
        elif isinstance(frame, ReqFrame | ModeReqFrame):
            await self._req(frame)
        elif isinstance(frame, CloseFrame):
            await self._close_sub(frame.sub_id)
        elif isinstance(frame, AuthFrame):
            await self._auth(frame)
        elif isinstance(frame, CountFrame):
            await self._count(frame)

    async def _auth(self, frame: AuthFrame) -> None:
        event_id = event_id_of(frame.event)
        try:
            event = parse_event(frame.event, max_tags=self.limits.max_event_tags)
            pubkey = verify_auth_event(
                event,
                challenge=self.challenge,
                relay_url=self.community.public_url,
                now=int(time.time()),
                window=self.limits.auth_window,
            )
        except ProtocolError as err:
            self.reply(["OK", event_id, False, err.reason])
            return
        if self.actor is not None and self.actor.pubkey != pubkey:
            self.reply(["OK", event_id, False, "restricted: this connection is authenticated as another pubkey"])
            return
        if self.actor is not None and self.actor.token_id is not None:
            # The connection keeps the token's scopes, channels and expiry: an OK here would change nothing.
            self.reply(["OK", event_id, False, BEARER_CONNECTION])
            return
        try:
            ok = await admitted(self.community, pubkey)
        except Exception:
            log.exception("relay membership lookup failed")
            self.reply(["OK", event_id, False, "error: could not check relay membership, try again"])
            return
        if not ok:
            self.reply(["OK", event_id, False, "restricted: not a relay member"])
            return
        if self.actor is None:
            self.actor = Actor(community=self.community, pubkey=pubkey)
        # The challenge stays good for the connection (NIP-42: until the relay sends another), so AUTH again
        # with the same pubkey is answered OK; another pubkey is refused above.
        self.reply(["OK", event_id, True, ""])

    async def _event(self, frame: EventFrame) -> None:
        event_id, result = await ingest(self.actor, frame.event)
        self.reply(["OK", event_id, result.ok, result.message])

    async def _channels_for(self, sub_id: str, filters: tuple[Filter, ...]) -> list[uuid.UUID] | None:
        """The channels a REQ/COUNT covers (`_scope_of`), or None after replying CLOSED."""
        try:
            channels, _ = await self._scope_of(filters)
            return channels
        except Denied as err:
            self.reply(["CLOSED", sub_id, err.reason])
            return None
        except Exception:
            log.exception("access check failed")
            self.reply(["CLOSED", sub_id, "error: could not check channel access, try again"])
            return None

    async def _scope_of(
        self, filters: tuple[Filter, ...], epochs_of: Sequence[uuid.UUID] = ()
    ) -> tuple[list[uuid.UUID], dict[uuid.UUID, int]]:
        """The channels a REQ/COUNT covers, decided now by the policy, and the access epochs of those of
        `epochs_of` in it (reader_scope_and_epochs: a REQ's re-check). Raises Denied.

        A filter with #h names its channels, and each must be readable (one
        answer for missing and unreadable); a filter without #h covers every
        channel the reader can read that is listed or joined.
        """
        actor = self.actor
        if actor is None:
            raise Denied("auth-required: authenticate with NIP-42 AUTH first")
        named: set[uuid.UUID] = set()
        wide = False
        state_named: set[uuid.UUID] = set()
        for f in filters:
            values = f.tag_values("h")
            if values is None:
                wide = True
                # Relay-signed group state (39000-39002) names its channel in d, not h.
                d_values = f.tag_values("d")
                if d_values is not None and f.kinds is not None and set(f.kinds) <= set(STATE_KINDS):
                    state_named.update(c for c in map(parse_channel_id, d_values) if c is not None)
                continue
            for value in values:
                channel = parse_channel_id(value)
                if channel is None:
                    raise Denied("invalid: #h values must be lowercase channel UUIDs")
                named.add(channel)
        return await reader_scope_and_epochs(
            actor, named=sorted(named), wide=wide, optional=sorted(state_named), epochs_of=epochs_of
        )

    async def _req(self, frame: ReqFrame | ModeReqFrame) -> None:
        if self.actor is None:
            self.reply(["CLOSED", frame.sub_id, "auth-required: authenticate with NIP-42 AUTH first"])
            return
        previous = self.subscriptions.pop(frame.sub_id, None)
        if previous is not None:
            # NIP-01: a REQ with an open subscription id replaces that subscription.
            await previous.close()
        elif len(self.subscriptions) >= self.limits.max_subscriptions:
            self.reply(["CLOSED", frame.sub_id, f"blocked: at most {self.limits.max_subscriptions} open subscriptions"])
            return
        sub: Subscription | None
        if isinstance(frame, ModeReqFrame):
            sub = await req_mode(frame.mode)(self, frame.sub_id, frame.filters)
        else:
            channels = await self._channels_for(frame.sub_id, frame.filters)
            filters = frame.filters
            sub = (
                ReqSubscription(
                    self, frame.sub_id, filters, channels, rescope=lambda epochs_of: self._scope_of(filters, epochs_of)
                )
                if channels is not None
                else None
            )
        if sub is None or self._closing:
            return
        self.subscriptions[frame.sub_id] = sub
        sub.start()

    def subscription_ended(self, sub: Subscription, reason: str) -> None:
        """The relay ends a subscription: CLOSED with reason, then it is forgotten."""
        if self.subscriptions.get(sub.sub_id) is sub:
            del self.subscriptions[sub.sub_id]
        asyncio.get_running_loop().create_task(sub.close())
        self.reply(["CLOSED", sub.sub_id, reason], notice=True)

    async def _close_sub(self, sub_id: str) -> None:
        sub = self.subscriptions.pop(sub_id, None)
        if sub is not None:
            await sub.close()

    async def _count(self, frame: CountFrame) -> None:
        if self.actor is None:
            self.reply(["CLOSED", frame.sub_id, "auth-required: authenticate with NIP-42 AUTH first"])
            return
        channels = await self._channels_for(frame.sub_id, frame.filters)
        if channels is None:
            return
        try:
            n = await count_events(self.community.id, frame.filters, readable_channels=channels, reads=self.reads)
        except (ReadsBusy, ReadOverBudget) as refused:
            self.reply(["CLOSED", frame.sub_id, str(refused)])
            return
        except Exception:
            log.exception("COUNT failed")
            self.reply(["CLOSED", frame.sub_id, "error: the count failed"])
            return
        self.reply(["COUNT", frame.sub_id, {"count": n}])
