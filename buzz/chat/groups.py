"""NIP-29 group events (9000, 9001, 9002, 9005, 9007, 9008, 9021, 9022): the services behind those kinds.

Each one is the policy's manage check, then one channel service (buzz.chat.channels), or
the 9005 removal (buzz.chat.removals). An accepted group event is stored in its channel
and signalled to its live subscribers, like a message.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from buzz.access.policy import channel_epochs, channel_of, check_manage, group_event_scope
from buzz.chat import channels as channel_services
from buzz.chat.channels import ChannelError
from buzz.chat.removals import remove_event
from buzz.events.ingest import WriteResult, register_kind
from buzz.events.store import stored_as
from buzz.identity.actor import Actor
from buzz.live import signals
from buzz.models import Community
from buzz.nostr import Event, ProtocolError
from buzz.orm import orm_call

KIND_PUT_USER = 9000
KIND_REMOVE_USER = 9001
KIND_EDIT_METADATA = 9002
KIND_DELETE_EVENT = 9005
KIND_CREATE_GROUP = 9007
KIND_DELETE_GROUP = 9008
KIND_JOIN = 9021
KIND_LEAVE = 9022

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")


def _single(event: Event, name: str) -> str | None:
    values = event.tag_values(name)
    return values[0] if len(values) == 1 else None


def _pubkey_tag(event: Event) -> tuple[str, str | None]:
    tag = event.first_tag("p")
    if tag is None or len(tag) < 2 or not _HEX64.match(tag[1]):
        raise ProtocolError("invalid: a p tag with a 64-hex pubkey is required")
    role = tag[2] if len(tag) >= 3 and tag[2] else None
    # The role as NIP-29 writes it (the p tag's third element), or as Buzz clients send it: a role tag.
    named = _single(event, "role")
    if named is not None and role is not None and named != role:
        raise ProtocolError("invalid: the p tag's role and the role tag differ")
    return tag[1], role or named or None


async def _run(fn: Callable[..., Any], **kwargs: Any) -> tuple[WriteResult, Any]:
    """The answer to a group event whose change `fn` makes, and what `fn` returned (None when it refused)."""
    try:
        value = await orm_call(fn)(**kwargs)
    except ChannelError as err:
        if err.reason.startswith("duplicate:"):
            # NIP-01 pairs duplicate: with OK true: the state asked for already holds.
            return WriteResult.accepted(err.reason), None
        return WriteResult.rejected(err.reason), None
    return WriteResult.accepted(), value


def _community(actor: Actor) -> Community:
    return Community.objects.get(pk=actor.community.id)


def _create_group(actor: Actor, event: Event, channel: uuid.UUID) -> None:
    # "type", or "channel_type" as Buzz clients send it.
    ctype = _single(event, "type") or _single(event, "channel_type") or "stream"
    visibility = _single(event, "visibility")
    if visibility is None:
        visibility = "private" if event.first_tag("private") is not None else "open"
    ttl = _single(event, "ttl")
    channel_services.channel_create(
        community=_community(actor),
        channel_uuid=channel,
        name=_single(event, "name") or "",
        creator=actor.pubkey,
        visibility=visibility,
        channel_type=ctype,
        about=_single(event, "about") or "",
        listed=event.first_tag("unlisted") is None,
        ttl_seconds=channel_services.parse_ttl(ttl) if ttl is not None else None,
        participants=[p for p in event.tag_values("p") if _HEX64.match(p)],
        request=event,
    )


async def group_event(actor: Actor, event: Event) -> WriteResult:
    """9000/9001/9002/9005/9007/9008/9021/9022: the policy's manage check, then one channel service.

    An accepted group event is stored in its channel (REQ #h returns it), so the channel's live
    subscribers get it too, like a message.
    """
    result, public = await _apply_group_event(actor, event)
    if result.ok and public:
        channel = channel_of(event)
        # Read after the change committed: the epoch it made, or a later one (buzz.live.signals.EVENT).
        epoch = (await channel_epochs(actor.community.id, [channel])).get(channel, 0)
        await signals.publish_committed(actor.community.id, [(channel, signals.event_message(event, epoch))])
    return result


async def _accepted_before(actor: Actor, event: Event) -> bool:
    """Whether this event was accepted before (a group event is stored in its channel with its own id) and may
    be confirmed as such: a 9005 stored withheld (the redaction of an artifact revision) is not, so that
    nothing confirms the revision it names."""
    stored = await stored_as(actor.community.id, event.id)
    return stored is not None and (event.kind != KIND_DELETE_EVENT or stored)


async def _apply_group_event(actor: Actor, event: Event) -> tuple[WriteResult, bool]:
    """The answer, and whether the stored event goes to the channel's live subscribers (a 9005 whose target
    withholds it does not: buzz.chat.removals).

    An event accepted before (a client resending it after a lost OK) is answered duplicate and not applied
    again, before any other check, as a message is: applied again, an old 9001 would remove a member added
    since, an old 9000 undo a later role change. A 9005 that redacted an artifact revision is stored
    withheld: resent, it meets its stored request in buzz.chat.removals, which refuses it as the removal of
    what is gone."""
    if await _accepted_before(actor, event):
        return WriteResult.accepted("duplicate: already have this event"), False
    channel, decision = await check_manage(
        actor, event, scope=group_event_scope(event), creating=event.kind == KIND_CREATE_GROUP
    )
    if not decision.ok:
        return WriteResult.rejected(decision.reason), False
    kind = event.kind
    if kind == KIND_CREATE_GROUP:
        if _single(event, "name") is None:
            return WriteResult.rejected("invalid: kind 9007 needs one name tag"), False
        return (await _run(_create_group, actor=actor, event=event, channel=channel))[0], True
    if kind == KIND_DELETE_EVENT:
        result, public = await _run(
            remove_event, community_id=actor.community.id, actor=actor.pubkey, event=event, channel=channel
        )
        return result, public is True
    service, kwargs = _group_service(actor, event)
    return (await _run(_in_community(actor, service), channel_uuid=channel, request=event, **kwargs))[0], True


def _in_community(actor: Actor, service: Callable[..., Any]) -> Callable[..., Any]:
    """The channel service bound to the actor's community, loaded in the worker thread."""
    return lambda **kwargs: service(community=_community(actor), **kwargs)


def _group_service(actor: Actor, event: Event) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The channel service for a membership or metadata event and its arguments from the tags."""
    kind = event.kind
    if kind == KIND_PUT_USER:
        pubkey, role = _pubkey_tag(event)
        return channel_services.member_put, {"actor": actor.pubkey, "pubkey": pubkey, "role": role or None}
    if kind == KIND_REMOVE_USER:
        return channel_services.member_remove, {"actor": actor.pubkey, "pubkey": _pubkey_tag(event)[0]}
    if kind == KIND_LEAVE:
        return channel_services.member_remove, {"actor": actor.pubkey, "pubkey": actor.pubkey}
    if kind == KIND_JOIN:
        return channel_services.channel_join, {"pubkey": actor.pubkey}
    if kind == KIND_DELETE_GROUP:
        return channel_services.channel_delete, {"actor": actor.pubkey}
    if kind == KIND_EDIT_METADATA:
        changes: dict[str, str] = {}
        for tag in event.tags:
            if tag[0] in channel_services.EDITABLE and len(tag) >= 2:
                if tag[0] in changes:
                    raise ProtocolError(f"invalid: metadata field {tag[0]!r} appears twice")
                changes[tag[0]] = tag[1]
        return channel_services.channel_edit, {"actor": actor.pubkey, "changes": changes}
    raise ProtocolError(f"blocked: kind {kind} is not accepted by this relay")


def register() -> None:
    for kind in (
        KIND_PUT_USER,
        KIND_REMOVE_USER,
        KIND_EDIT_METADATA,
        KIND_DELETE_EVENT,
        KIND_CREATE_GROUP,
        KIND_DELETE_GROUP,
        KIND_JOIN,
        KIND_LEAVE,
    ):
        # A late, backed-up or throttled retry of an accepted one is still answered duplicate (buzz.events.ingest).
        register_kind(kind, group_event, already_accepted=_accepted_before)
