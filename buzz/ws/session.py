"""One WebSocket connection's protocol state and the router for its frames.

The consumer (transport) hands every text frame to `Session.handle`. Replies go
through the bounded outbound queue; when even a short reply can't be queued the
connection is closed, because a client that does not read must not make the
relay hold more (rule 5 / rule 8 of NIP-AR Sync depend on this bound).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from buzz.communities import CommunityInfo, admitted
from buzz.events import count_events, query_events
from buzz.ingest import Actor, event_id_of, ingest
from buzz.limits import Limits, limits
from buzz.nostr import ProtocolError, parse_event, verify_auth_event
from buzz.ws.frames import (
    AuthFrame,
    CloseFrame,
    CountFrame,
    EventFrame,
    FrameError,
    FrameLimits,
    ReqFrame,
    parse_frame,
)
from buzz.ws.outbound import Outbound, QueueFull

log = logging.getLogger(__name__)

# Close codes (RFC 6455 section 7.4.1).
CLOSE_TRY_AGAIN = 1013  # the client stopped reading and the outbound bound was reached
STORED_SEND_TIMEOUT = 10.0  # seconds a REQ may wait for room while streaming stored events


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def frame_limits(lim: Limits) -> FrameLimits:
    return FrameLimits(
        max_message_length=lim.max_message_length,
        max_subid_length=lim.max_subid_length,
        max_filters=lim.max_filters,
        max_limit=lim.max_limit,
        default_limit=lim.default_limit,
    )


class Session:
    def __init__(
        self,
        *,
        community: CommunityInfo,
        send_text: Callable[[str], Awaitable[None]],
        close: Callable[[int], Awaitable[None]],
        actor: Actor | None = None,
    ) -> None:
        self.community = community
        self.limits = limits()
        self._frame_limits = frame_limits(self.limits)
        self.challenge = secrets.token_hex(16)
        self.actor = actor
        self.outbound = Outbound(
            send_text, max_messages=self.limits.outbound_max_messages, max_bytes=self.limits.outbound_max_bytes
        )
        self._close = close
        self._closing = False
        self.subscriptions: dict[str, asyncio.Task[None]] = {}

    # --- lifecycle ---------------------------------------------------------

    async def open(self) -> None:
        self.outbound.start()
        self.reply(["AUTH", self.challenge])

    async def shutdown(self) -> None:
        self._closing = True
        tasks = list(self.subscriptions.values())
        self.subscriptions.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: S110 - ending subscriptions on disconnect
                pass
        await self.outbound.close()

    def reply(self, message: list[Any]) -> bool:
        """Queue a reply; on a full queue close the connection. False when closing."""
        if self._closing:
            return False
        try:
            self.outbound.try_put(dumps(message))
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
            self.reply(err.reply)
            return
        if isinstance(frame, EventFrame):
            await self._event(frame)
        elif isinstance(frame, ReqFrame):
            self._req(frame)
        elif isinstance(frame, CloseFrame):
            self._close_sub(frame.sub_id)
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
        # A challenge is good for one login.
        self.challenge = secrets.token_hex(16)
        self.reply(["OK", event_id, True, ""])

    async def _event(self, frame: EventFrame) -> None:
        event_id, result = await ingest(self.actor, frame.event)
        self.reply(["OK", event_id, result.ok, result.message])

    def _req(self, frame: ReqFrame) -> None:
        if self.actor is None:
            self.reply(["CLOSED", frame.sub_id, "auth-required: authenticate with NIP-42 AUTH first"])
            return
        previous = self.subscriptions.pop(frame.sub_id, None)
        if previous is not None:
            # NIP-01: a REQ with an open subscription id replaces that subscription.
            previous.cancel()
        elif len(self.subscriptions) >= self.limits.max_subscriptions:
            self.reply(
                ["CLOSED", frame.sub_id, f"blocked: at most {self.limits.max_subscriptions} open subscriptions"]
            )
            return
        task = asyncio.get_running_loop().create_task(self._run_req(frame), name=f"req:{frame.sub_id}")
        self.subscriptions[frame.sub_id] = task

    async def _run_req(self, frame: ReqFrame) -> None:
        assert self.actor is not None
        try:
            rows = await query_events(self.community.id, frame.filters, readable_channels=())
            for raw in rows:
                await self.outbound.put(f'["EVENT",{dumps(frame.sub_id)},{raw}]', timeout=STORED_SEND_TIMEOUT)
            await self.outbound.put(dumps(["EOSE", frame.sub_id]), timeout=STORED_SEND_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except QueueFull:
            self._drop_sub(frame.sub_id)
            self.abort()
        except Exception:
            log.exception("REQ failed")
            self._drop_sub(frame.sub_id)
            self.reply(["CLOSED", frame.sub_id, "error: the query failed"])

    def _drop_sub(self, sub_id: str) -> None:
        task = self.subscriptions.get(sub_id)
        if task is asyncio.current_task():
            del self.subscriptions[sub_id]

    def _close_sub(self, sub_id: str) -> None:
        task = self.subscriptions.pop(sub_id, None)
        if task is not None:
            task.cancel()

    async def _count(self, frame: CountFrame) -> None:
        if self.actor is None:
            self.reply(["CLOSED", frame.sub_id, "auth-required: authenticate with NIP-42 AUTH first"])
            return
        try:
            n = await count_events(self.community.id, frame.filters, readable_channels=())
        except Exception:
            log.exception("COUNT failed")
            self.reply(["CLOSED", frame.sub_id, "error: the count failed"])
            return
        self.reply(["COUNT", frame.sub_id, {"count": n}])
