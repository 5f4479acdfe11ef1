"""The write entry point shared by WebSocket EVENT and HTTP POST /events.

It runs the checks every event gets (shape, id, signature, limits, what the
database can store, time window, author = authenticated identity), then hands
the event to the service registered for its kind. Apps register their kinds in
AppConfig.ready(), so dependencies keep pointing one way (moderation ->
artifacts -> buzz). The registry also says what NIP-11 advertises (a kind
registered only to be refused is not) and which kinds can't be the NIP-10 root
of a kind-9 reply.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from buzz.events.quotas import take_write_token
from buzz.events.store import check_storable
from buzz.failure_log import FailureLog
from buzz.identity.actor import Actor
from buzz.limits import Limits, limits
from buzz.live.publisher import PublisherFull
from buzz.nostr import Event, ProtocolError, parse_event, verify_event
from buzz.runtime import runtime

log = logging.getLogger(__name__)
# An outage fails every write the same way: one traceback, then a count per interval.
failures = FailureLog(log)


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What OK says: accepted or not, and the NIP-01 reason (HTTP maps its prefix to a status)."""

    ok: bool
    message: str

    @classmethod
    def accepted(cls, message: str = "") -> WriteResult:
        return cls(True, message)

    @classmethod
    def rejected(cls, message: str) -> WriteResult:
        return cls(False, message)


KindHandler = Callable[[Actor, Event], Awaitable[WriteResult]]
DuplicateCheck = Callable[[Actor, Event], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class KindService:
    accept: KindHandler
    # True when this exact event was accepted before: the resubmission succeeds without being applied
    # again. Asked only when the time window or the quota refuses the event, so a late or throttled retry
    # never fails; the service answers other resubmissions itself, from its own statements.
    already_accepted: DuplicateCheck | None = None
    # False: registered only so that its events get an explicit reason; every one is refused, and NIP-11
    # does not list the kind in accepted_kinds.
    accepts: bool = True
    # The `invalid:` reason a kind-9 reply gets when its NIP-10 root is a stored event of this kind;
    # None: events of this kind may root a thread.
    root_refusal: str | None = None


_services: dict[int, KindService] = {}


def register_kind(
    kind: int,
    handler: KindHandler,
    *,
    already_accepted: DuplicateCheck | None = None,
    accepts: bool = True,
    root_refusal: str | None = None,
) -> None:
    """Called from AppConfig.ready(); a kind has exactly one service."""
    if root_refusal is not None and not root_refusal.startswith("invalid: "):
        raise ValueError("a root refusal is an invalid: reason")
    service = KindService(handler, already_accepted, accepts, root_refusal)
    if kind in _services and _services[kind] != service:
        raise RuntimeError(f"kind {kind} already has a handler")
    _services[kind] = service


def accepted_kinds() -> list[int]:
    """The kinds an event can be accepted in (NIP-11 `accepted_kinds`)."""
    return sorted(kind for kind, service in _services.items() if service.accepts)


def root_refusals() -> dict[int, str]:
    """Kinds whose events can't be the NIP-10 root of a kind-9 reply, with the reason such a reply gets."""
    return {kind: service.root_refusal for kind, service in _services.items() if service.root_refusal is not None}


def event_id_of(raw: object) -> str:
    """The id to echo in OK, taken from the raw value when it looks like one."""
    if isinstance(raw, dict):
        value = raw.get("id")
        if isinstance(value, str) and len(value) <= 64:
            return value
    return ""


def check_event(raw: object, lim: Limits | None = None) -> Event:
    """Shape, limits, id and signature. Raises ProtocolError."""
    lim = lim or limits()
    event = parse_event(raw, max_tags=lim.max_event_tags, max_content_bytes=lim.max_content_length)
    verify_event(event)
    return event


def check_window(event: Event, lim: Limits | None = None, now: int | None = None) -> None:
    """The created_at window. Raises ProtocolError."""
    lim = lim or limits()
    now = int(time.time()) if now is None else now
    if event.created_at < now - lim.created_at_lower_limit:
        raise ProtocolError(f"invalid: created_at is more than {lim.created_at_lower_limit} seconds in the past")
    if event.created_at > now + lim.created_at_upper_limit:
        raise ProtocolError(f"invalid: created_at is more than {lim.created_at_upper_limit} seconds in the future")


async def _unless_duplicate(service: KindService, actor: Actor, event: Event, refused: WriteResult) -> WriteResult:
    """`refused`, unless this exact event was accepted before: then the resubmission succeeds."""
    if service.already_accepted is None:
        return refused
    try:
        seen = await service.already_accepted(actor, event)
    except Exception as exc:
        failures.failed(f"duplicate check for kind {event.kind}", exc)
        return WriteResult.rejected("error: could not store the event, try again")
    failures.succeeded(f"duplicate check for kind {event.kind}")
    return WriteResult.accepted("duplicate: already accepted") if seen else refused


# Detached ingests still running (asyncio keeps only weak references to tasks).
_detached: set[asyncio.Task[tuple[str, WriteResult]]] = set()


def _detached_done(task: asyncio.Task[tuple[str, WriteResult]]) -> None:
    _detached.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("a write whose client went away failed", exc_info=task.exception())


async def ingest_detached(actor: Actor | None, raw: object) -> tuple[str, WriteResult]:
    """`ingest`, run to its end even when the caller is cancelled. An HTTP view is cancelled when its client
    goes away (Django's handler and buzz.web.front both do it); a cancelled `ingest` could stop between a
    commit and the publish of its signals (while its statement runs, psycopg lets it commit and then
    raises), and every sync of the channel would miss that change with no resync (NIP-AR sync rule 5).
    Detached, the write and its publish finish, and only the answer is lost, as with a dropped OK. The
    WebSocket consumer calls `ingest` itself: nothing cancels a frame's handling when its client leaves."""
    task = asyncio.ensure_future(ingest(actor, raw))
    _detached.add(task)
    task.add_done_callback(_detached_done)
    return await asyncio.shield(task)


async def ingest(actor: Actor | None, raw: object) -> tuple[str, WriteResult]:
    """Validate and store one event. Returns (event id for OK, result)."""
    event_id = event_id_of(raw)
    if actor is None:
        return event_id, WriteResult.rejected("auth-required: authenticate with NIP-42 AUTH first")
    try:
        event = check_event(raw)
        # Permanent: answered before anything is tried, never as a failed INSERT that says "try again".
        check_storable(event)
    except ProtocolError as err:
        return event_id, WriteResult.rejected(err.reason)
    if event.pubkey != actor.pubkey:
        return event.id, WriteResult.rejected("invalid: event pubkey is not the authenticated pubkey")
    service = _services.get(event.kind)
    if service is None:
        return event.id, WriteResult.rejected(f"blocked: kind {event.kind} is not accepted by this relay")
    # The duplicate check runs only on the failure paths (the window, a full publish queue, the quota, Redis): a late,
    # backed-up or throttled retry of an accepted event is still answered "duplicate:", and an accepted write
    # never pays for the look-up (the services answer resubmissions from their own statements).
    try:
        check_window(event)
    except ProtocolError as err:
        return event.id, await _unless_duplicate(service, actor, event, WriteResult.rejected(err.reason))
    try:
        # Before anything commits: a committed change's signal is never dropped (buzz.live.publisher).
        runtime.publisher().ensure_room()
    except PublisherFull as full:
        return event.id, await _unless_duplicate(service, actor, event, WriteResult.rejected(full.reason))
    try:
        allowed = await take_write_token(actor.community.id, actor.pubkey)
    except Exception as exc:
        failures.failed("write quota check", exc)
        refused = WriteResult.rejected("error: could not check the write quota, try again")
        return event.id, await _unless_duplicate(service, actor, event, refused)
    failures.succeeded("write quota check")
    if not allowed:
        refused = WriteResult.rejected("rate-limited: slow down, too many writes from this pubkey")
        return event.id, await _unless_duplicate(service, actor, event, refused)
    try:
        result = await service.accept(actor, event)
    except ProtocolError as err:
        return event.id, WriteResult.rejected(err.reason)
    except Exception as exc:
        # Nothing was stored (each service writes in one transaction); the connection carries on.
        failures.failed(f"storing a kind {event.kind} event", exc)
        return event.id, WriteResult.rejected("error: could not store the event, try again")
    failures.succeeded(f"storing a kind {event.kind} event")
    return event.id, result
