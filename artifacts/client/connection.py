"""One WebSocket connection to a relay: NIP-01 messages, NIP-42 AUTH, EVENT/OK, subscriptions.

A reader task owns the socket's receive side and routes each message: OK to the
publish() waiting for that id, AUTH challenges to authenticate(), EVENT/EOSE/CLOSED to
the subscription they name. A subscription's queue is bounded; when it is full the
reader waits, so a slow consumer slows the socket instead of growing memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from . import httpapi
from .events import Event, Keys
from .httpapi import RelayUrl

log = logging.getLogger(__name__)

AUTH_KIND: Final = 22242
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
SUBSCRIPTION_QUEUE: Final = 1024


class RelayError(Exception):
    """Base of the client's relay errors; `reason` is the text to show (a NIP-01 prefix when the relay gave one)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ConnectionLost(RelayError):
    """The connection closed or could not be opened."""


class AuthFailed(RelayError):
    """NIP-42 AUTH was refused (the reason is the relay's OK message) or got no answer."""


@dataclass(frozen=True, slots=True)
class Ok:
    event_id: str
    accepted: bool
    message: str

    @property
    def prefix(self) -> str:
        return self.message.partition(":")[0] if ":" in self.message else ""


# What a subscription yields: ("EVENT", event dict), ("EOSE", None) or ("CLOSED", reason).
SubMessage = tuple[str, Any]
_LOST: Final = ("LOST", None)


class Subscription:
    def __init__(self, relay: Relay, sub_id: str) -> None:
        self.relay = relay
        self.id = sub_id
        self.queue: asyncio.Queue[SubMessage] = asyncio.Queue(SUBSCRIPTION_QUEUE)

    async def next(self, timeout: float | None = None) -> SubMessage:
        """The next message for this subscription. ConnectionLost when the connection is gone."""
        if self.queue.empty() and self.relay.lost is not None:
            raise ConnectionLost(self.relay.lost)
        message = await asyncio.wait_for(self.queue.get(), timeout)
        if message is _LOST:
            raise ConnectionLost(self.relay.lost or "connection closed")
        return message

    @property
    def active(self) -> bool:
        """Neither side has closed it yet."""
        return self.relay._subs.get(self.id) is self

    async def close(self) -> None:
        """Send CLOSE (if the relay has not closed it and the connection is up) and stop routing messages here."""
        active = self.active
        self.relay._subs.pop(self.id, None)
        while not self.queue.empty():  # a reader blocked on this full queue goes on
            self.queue.get_nowait()
        if active and self.relay.lost is None:
            with contextlib.suppress(ConnectionLost):
                await self.relay.send(["CLOSE", self.id])


class Relay:
    """A connected relay. Use `async with Relay.connect(url, keys) as relay:`."""

    def __init__(self, ws: ClientConnection, url: RelayUrl, keys: Keys | None) -> None:
        self.ws = ws
        self.url = url
        self.keys = keys
        self.lost: str | None = None
        self.authenticated: str | None = None  # the pubkey the relay accepted
        self.challenge: str | None = None
        self.notices: list[str] = []
        self._challenge_seen = asyncio.Event()
        self._oks: dict[str, list[asyncio.Future[Ok]]] = {}
        self._subs: dict[str, Subscription] = {}
        self._head_advertised = False  # NIP-11 lists the head view (read before this connection's first head)
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        url: str | RelayUrl,
        keys: Keys | None = None,
        *,
        authenticate: bool = True,
        open_timeout: float = 10.0,
        auth_timeout: float = 5.0,
    ) -> AsyncIterator[Relay]:
        """Open a connection and, with keys, answer the relay's NIP-42 challenge (AuthFailed if refused).

        A relay that sends no challenge within `auth_timeout` is used unauthenticated.
        """
        relay = await cls.open(
            url, keys, authenticate=authenticate, open_timeout=open_timeout, auth_timeout=auth_timeout
        )
        try:
            yield relay
        finally:
            await relay.close()

    @classmethod
    async def open(
        cls,
        url: str | RelayUrl,
        keys: Keys | None = None,
        *,
        authenticate: bool = True,
        open_timeout: float = 10.0,
        auth_timeout: float = 5.0,
    ) -> Relay:
        target = url if isinstance(url, RelayUrl) else RelayUrl.parse(url)
        try:
            ws = await connect(
                target.ws, open_timeout=open_timeout, max_size=MAX_MESSAGE_BYTES, compression=None, proxy=None
            )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as err:
            raise ConnectionLost(f"error: could not connect to {target.ws}: {err or err.__class__.__name__}") from None
        relay = cls(ws, target, keys)
        if keys is not None and authenticate:
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(relay._challenge_seen.wait(), auth_timeout)
                if relay.challenge is not None:
                    await relay.authenticate(timeout=auth_timeout)
            except BaseException:
                await relay.close()
                raise
        return relay

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        self._mark_lost("closed by the client")

    # --- receiving -------------------------------------------------------------------

    async def _read(self) -> None:
        reason = "connection closed"
        try:
            async for raw in self.ws:
                try:
                    message = json.loads(raw)
                except ValueError:
                    log.warning("relay %s sent a message that is not JSON", self.url.ws)
                    continue
                if isinstance(message, list) and message and isinstance(message[0], str):
                    await self._route(message)
        except ConnectionClosed as err:
            reason = f"connection closed ({err.rcvd.code if err.rcvd else 'no close frame'})"
        except asyncio.CancelledError:
            reason = "closed by the client"
            raise
        finally:
            self._mark_lost(reason)

    async def _route(self, message: list[Any]) -> None:
        verb = message[0]
        if verb == "OK" and len(message) >= 3 and isinstance(message[1], str):
            ok = Ok(message[1], message[2] is True, str(message[3]) if len(message) > 3 else "")
            # One OK answers one EVENT: the same event sent twice gets two answers, oldest send first.
            waiting = self._oks.get(ok.event_id, [])
            while waiting:
                fut = waiting.pop(0)
                if not fut.done():
                    fut.set_result(ok)
                    break
            if not waiting:
                self._oks.pop(ok.event_id, None)
        elif verb == "AUTH" and len(message) >= 2 and isinstance(message[1], str):
            self.challenge = message[1]
            self._challenge_seen.set()
        elif verb in ("EVENT", "EOSE", "CLOSED") and len(message) >= 2 and isinstance(message[1], str):
            sub = self._subs.get(message[1])
            if sub is None:
                return
            if verb == "EVENT":
                await sub.queue.put(("EVENT", message[2] if len(message) > 2 else None))
            elif verb == "EOSE":
                await sub.queue.put(("EOSE", None))
            else:
                # CLOSED ends the subscription on the relay's side; route nothing more to it.
                self._subs.pop(sub.id, None)
                await sub.queue.put(("CLOSED", str(message[2]) if len(message) > 2 else ""))
        elif verb == "NOTICE" and len(message) >= 2:
            self.notices.append(str(message[1])[:500])

    def _mark_lost(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = reason
        for futures in self._oks.values():
            for fut in futures:
                if not fut.done():
                    fut.set_exception(ConnectionLost(reason))
        self._oks.clear()
        for sub in self._subs.values():
            # An empty queue has room; a full one is drained by its consumer, who then sees `lost`.
            with contextlib.suppress(asyncio.QueueFull):
                sub.queue.put_nowait(_LOST)
        self._subs.clear()

    # --- sending ---------------------------------------------------------------------

    async def send(self, message: Sequence[Any]) -> None:
        if self.lost is not None:
            raise ConnectionLost(self.lost)
        try:
            await self.ws.send(json.dumps(list(message), separators=(",", ":"), ensure_ascii=False))
        except ConnectionClosed:
            raise ConnectionLost("connection closed") from None

    async def _send_for_ok(self, frame: Sequence[Any], event_id: str, timeout: float) -> Ok:
        fut: asyncio.Future[Ok] = asyncio.get_running_loop().create_future()
        self._oks.setdefault(event_id, []).append(fut)
        try:
            await self.send(frame)
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise ConnectionLost(f"error: no OK for {event_id} within {timeout:g} s") from None
        finally:
            waiting = self._oks.get(event_id)
            if waiting and fut in waiting:
                waiting.remove(fut)
                if not waiting:
                    del self._oks[event_id]

    async def authenticate(self, *, timeout: float = 5.0) -> None:
        """Answer the latest NIP-42 challenge with a kind 22242 naming this relay URL."""
        if self.keys is None:
            raise AuthFailed("auth-required: no key to authenticate with")
        if self.challenge is None:
            try:
                await asyncio.wait_for(self._challenge_seen.wait(), timeout)
            except TimeoutError:
                raise AuthFailed("auth-required: the relay sent no AUTH challenge") from None
        challenge = self.challenge or ""
        event = self.keys.sign(AUTH_KIND, [["relay", self.url.ws], ["challenge", challenge]], "")
        ok = await self._send_for_ok(["AUTH", event.to_dict()], event.id, timeout)
        if not ok.accepted:
            raise AuthFailed(ok.message or "auth-required: AUTH refused")
        self.authenticated = self.keys.pubkey

    async def publish(self, event: Event, *, timeout: float = 15.0) -> Ok:
        """Send EVENT and return the relay's OK. On "auth-required:" it authenticates and sends once more."""
        ok = await self._send_for_ok(["EVENT", event.to_dict()], event.id, timeout)
        if not ok.accepted and ok.prefix == "auth-required" and self.keys is not None and self.authenticated is None:
            await self.authenticate(timeout=timeout)
            ok = await self._send_for_ok(["EVENT", event.to_dict()], event.id, timeout)
        return ok

    async def subscribe(self, filters: Sequence[dict[str, Any]], *, sub_id: str | None = None) -> Subscription:
        sub = Subscription(self, sub_id or secrets.token_hex(8))
        self._subs[sub.id] = sub
        try:
            await self.send(["REQ", sub.id, *filters])
        except ConnectionLost:
            self._subs.pop(sub.id, None)
            raise
        return sub

    # --- HTTP views, signed with the same key ----------------------------------------

    def _keys(self) -> Keys:
        if self.keys is None:
            raise AuthFailed("auth-required: the HTTP views need a key (NIP-98)")
        return self.keys

    async def query(self, flt: dict[str, Any], *, timeout: float = httpapi.DEFAULT_TIMEOUT) -> httpapi.Page:
        return await httpapi.query(self.url, self._keys(), flt, timeout=timeout)

    async def head(
        self, ds: Sequence[str], *, channels: Sequence[str] | None = None, timeout: float = httpapi.DEFAULT_TIMEOUT
    ) -> dict[str, Event]:
        """The head view (httpapi.head), once the relay's NIP-11 document has shown that it serves one:
        httpapi.HeadUnsupported otherwise."""
        if not self._head_advertised:
            await httpapi.head_capability(self.url, timeout=timeout)
            self._head_advertised = True
        chosen = list(channels) if channels is not None else None
        return await httpapi.head(self.url, self._keys(), list(ds), channels=chosen, timeout=timeout)

    async def information(self, *, timeout: float = httpapi.DEFAULT_TIMEOUT) -> dict[str, Any]:
        return await httpapi.information(self.url, timeout=timeout)
