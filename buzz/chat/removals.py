"""NIP-29 kind 9005, delete-event: who may remove a stored event, and what removing it means per kind.

The rule is the channel's ordinary message-removal rule: the event's author, or a
channel owner/admin. Every refusal gets one text, so a 9005 is never an oracle for
whether an event exists. What the removal does depends on the target's kind:

* relay-signed channel state (39000-39002) is never removable;
* a kind that an app registered with `register_removal_target` is handed to that
  app (artifacts registers NIP-AR revisions and move removals, whose head pointers
  and views must follow);
* anything else (kind-9 messages, group events) is withheld from every read.

The handler runs in the 9005's transaction with the target row locked, after the
permission check, and the 9005 itself is then stored in the channel. A kind registered
with `withhold_request` keeps the 9005 that removed one of its events from readers: it is
stored already withheld (a resubmission still meets it) and not delivered live, because it
names the removed event. For NIP-AR revisions that is the point: "Redacting an artifact's
current revision retires the artifact: ... clients that do not already hold that revision's ID
cannot edit it further", and a 9005 any reader of the channel could replay would hand that ID
to every one of them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from buzz.access.policy import MANAGER_ROLES
from buzz.chat.channels import STATE_KINDS, ChannelError, role_of
from buzz.events.store import store_sync, withhold_sync
from buzz.models import Channel, StoredEvent
from buzz.nostr import Event

DELETE_REFUSED = "restricted: that event can't be deleted by you"
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")


@dataclass(frozen=True, slots=True)
class Removal:
    """One permitted 9005: the locked target, the channel it lives in, who asked, and the request."""

    community_id: int
    channel: Channel
    target: StoredEvent
    actor: str | None  # None: an operator (admin, command), with no channel role to check
    request: Event | None


RemovalHandler = Callable[[Removal], None]
_handlers: dict[int, RemovalHandler] = {}
# Kinds whose removal requests readers never get (see the module's docstring).
_withheld_requests: set[int] = set()


def register_removal_target(kind: int, handler: RemovalHandler, *, withhold_request: bool = False) -> None:
    """Called from AppConfig.ready(): stored events of `kind` are removed by `handler`, not withheld here;
    with `withhold_request`, so is the 9005 that removes one."""
    if kind in STATE_KINDS:
        raise ValueError("relay-signed channel state is never removable")
    if kind in _handlers and _handlers[kind] is not handler:
        raise RuntimeError(f"kind {kind} already has a removal handler")
    _handlers[kind] = handler
    if withhold_request:
        _withheld_requests.add(kind)


def _withhold(removal: Removal) -> None:
    withhold_sync(community_id=removal.community_id, ids=[removal.target.id])


def remove_event(*, community_id: int, actor: str | None, event: Event, channel: uuid.UUID) -> bool:
    """A 9005 request: exactly one `e` tag naming a stored event of the channel. Returns whether readers may
    get the request (stored visible, to be delivered live), False when its target's kind withholds it.
    Raises ChannelError."""
    targets = event.tag_values("e")
    if len(targets) != 1 or not _HEX64.match(targets[0]):
        raise ChannelError("invalid: kind 9005 needs exactly one e tag")
    with transaction.atomic():
        target = (
            StoredEvent.objects.select_for_update()
            .filter(id=targets[0], community_id=community_id, channel_id=channel, deleted_at__isnull=True)
            .first()
        )
        if target is None or target.kind in STATE_KINDS:
            raise ChannelError(DELETE_REFUSED)
        home = Channel.objects.filter(community_id=community_id, uuid=channel, deleted_at__isnull=True).first()
        if home is None:
            raise ChannelError(DELETE_REFUSED)
        if actor is not None and target.pubkey != actor and role_of(home, actor) not in MANAGER_ROLES:
            raise ChannelError(DELETE_REFUSED)
        removal = Removal(community_id=community_id, channel=home, target=target, actor=actor, request=event)
        _handlers.get(target.kind, _withhold)(removal)
        store_sync(community_id=community_id, event=event, channel=channel)
        if target.kind in _withheld_requests:
            withhold_sync(community_id=community_id, ids=[event.id])
            return False
        return True
