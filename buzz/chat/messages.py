"""Kind-9 chat messages and NIP-29 group events: the services behind those kinds.

A kind-9 message is one policy read and one SQL statement (event, tag index,
channel counter, thread counter, author's read mark, mentions, TTL deadline),
then a live signal after commit.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async

from buzz.access.policy import (
    MANAGER_ROLES,
    NOT_A_MEMBER,
    SCOPE_CHANNELS_WRITE,
    SCOPE_WRITE,
    channel_of,
    check_manage,
    check_post,
)
from buzz.chat import channels as channel_services
from buzz.chat.channels import ChannelError
from buzz.events.ingest import Actor, WriteResult, register_kind
from buzz.events.query import event_json, indexed_tags
from buzz.live.hub import topic_for_channel
from buzz.models import Community, StoredEvent
from buzz.nostr import Event, ProtocolError
from buzz.runtime import runtime

KIND_MESSAGE = 9
KIND_PUT_USER = 9000
KIND_REMOVE_USER = 9001
KIND_EDIT_METADATA = 9002
KIND_DELETE_EVENT = 9005
KIND_CREATE_GROUP = 9007
KIND_DELETE_GROUP = 9008
KIND_JOIN = 9021
KIND_LEAVE = 9022

_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")

_POST_SQL = """
WITH ins AS (
  INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw, received_at)
  VALUES (%(id)s, %(community)s, %(pubkey)s, %(kind)s, %(created_at)s, %(channel)s, %(raw)s, now())
  ON CONFLICT (id) DO NOTHING RETURNING id
), tags AS (
  INSERT INTO buzz_eventtag (event_id, name, value)
  SELECT ins.id, t.n, t.v FROM ins, unnest(%(tag_names)s::text[], %(tag_values)s::text[]) AS t(n, v)
), stats AS (
  UPDATE buzz_channelstats SET message_count = message_count + 1, last_message_at = now()
  WHERE channel_id = %(channel_pk)s AND EXISTS (SELECT 1 FROM ins) RETURNING message_count
), mark AS (
  -- Posting marks the channel read for the author.
  UPDATE buzz_membership SET read_mark = (SELECT message_count FROM stats)
  WHERE channel_id = %(channel_pk)s AND pubkey = %(pubkey)s AND removed_at IS NULL AND EXISTS (SELECT 1 FROM stats)
), thread AS (
  INSERT INTO buzz_threadstats (community_id, root_id, channel_id, reply_count, last_reply_at)
  SELECT %(community)s, r.id, r.channel_id, 1, now() FROM ins
  JOIN buzz_storedevent r ON r.id = %(root)s AND r.community_id = %(community)s AND r.channel_id = %(channel)s
  ON CONFLICT (community_id, root_id)
  DO UPDATE SET reply_count = buzz_threadstats.reply_count + 1, last_reply_at = now()
), mentions AS (
  INSERT INTO buzz_mention (community_id, pubkey, event_id, channel_id, kind, created_at)
  SELECT %(community)s, p, ins.id, %(channel)s, %(kind)s, now() FROM ins, unnest(%(mentions)s::text[]) AS p
  ON CONFLICT DO NOTHING
), ttl AS (
  UPDATE buzz_channel SET deadline = now() + make_interval(secs => ttl_seconds)
  WHERE id = %(channel_pk)s AND ttl_seconds IS NOT NULL AND EXISTS (SELECT 1 FROM ins)
)
SELECT count(*) FROM ins
"""


def thread_root(event: Event) -> str | None:
    """NIP-10: the `e` tag marked root names the thread this event replies in."""
    for tag in event.tags:
        if len(tag) >= 4 and tag[0] == "e" and tag[3] == "root" and _HEX64.match(tag[1]):
            return tag[1]
    return None


def mentioned(event: Event, *, exclude: frozenset[str] = frozenset()) -> list[str]:
    """Pubkeys named by `p` tags, each once, never the author, minus `exclude`."""
    out: list[str] = []
    for p in event.tag_values("p"):
        if _HEX64.match(p) and p != event.pubkey and p not in exclude and p not in out:
            out.append(p)
    return out


def live_message(event: Event) -> dict[str, Any]:
    return {"t": "event", "event": event.to_dict()}


PUBLISH_WAIT = 1.0  # seconds OK waits for the live signal; past that it stays queued and is retried


async def publish_event(community_id: int, channel: uuid.UUID, event: Event) -> None:
    """After commit, before OK: tell live subscribers of the channel (retried until it succeeds)."""
    topic = topic_for_channel(community_id, str(channel))
    await runtime.publisher().publish_confirmed(topic, live_message(event), timeout=PUBLISH_WAIT)


async def post_message(actor: Actor, event: Event) -> WriteResult:
    channel, decision = await check_post(actor, event)
    if not decision.ok:
        return WriteResult.rejected(decision.reason)
    if decision.access is None or decision.access.channel_pk is None:
        return WriteResult.rejected(NOT_A_MEMBER)
    names, values = indexed_tags(event)
    params = {
        "id": event.id,
        "community": actor.community.id,
        "pubkey": event.pubkey,
        "kind": event.kind,
        "created_at": event.created_at,
        "channel": channel,
        "channel_pk": decision.access.channel_pk,
        "raw": event_json(event),
        "tag_names": names,
        "tag_values": values,
        "root": thread_root(event),
        "mentions": mentioned(event),
    }
    pool = await runtime.pool()
    async with pool.connection() as conn:
        row = await (await conn.execute(_POST_SQL, params)).fetchone()
    if not row or row[0] == 0:
        return WriteResult.accepted("duplicate: already have this event")
    await publish_event(actor.community.id, channel, event)
    return WriteResult.accepted()


# --- NIP-29 group events ---------------------------------------------------------


def _single(event: Event, name: str) -> str | None:
    values = event.tag_values(name)
    return values[0] if len(values) == 1 else None


def _pubkey_tag(event: Event) -> tuple[str, str | None]:
    tag = event.first_tag("p")
    if tag is None or len(tag) < 2 or not _HEX64.match(tag[1]):
        raise ProtocolError("invalid: a p tag with a 64-hex pubkey is required")
    role = tag[2] if len(tag) >= 3 and tag[2] else None
    return tag[1], role


async def _run(fn: Callable[..., Any], **kwargs: Any) -> WriteResult:
    try:
        await sync_to_async(fn, thread_sensitive=False)(**kwargs)
    except ChannelError as err:
        if err.reason.startswith("duplicate:"):
            # NIP-01 pairs duplicate: with OK true: the state asked for already holds.
            return WriteResult.accepted(err.reason)
        return WriteResult.rejected(err.reason)
    return WriteResult.accepted()


def _community(actor: Actor) -> Community:
    return Community.objects.get(pk=actor.community.id)


def _create_group(actor: Actor, event: Event, channel: uuid.UUID) -> None:
    ctype = _single(event, "type") or "stream"
    visibility = _single(event, "visibility")
    if visibility is None:
        visibility = "private" if event.first_tag("private") is not None else "open"
    ttl = _single(event, "ttl")
    if ttl is not None and not ttl.isdigit():
        raise ChannelError("invalid: ttl must be a number of seconds")
    channel_services.channel_create(
        community=_community(actor),
        channel_uuid=channel,
        name=_single(event, "name") or "",
        creator=actor.pubkey,
        visibility=visibility,
        channel_type=ctype,
        about=_single(event, "about") or "",
        listed=event.first_tag("unlisted") is None,
        ttl_seconds=int(ttl) if ttl else None,
        participants=[p for p in event.tag_values("p") if _HEX64.match(p)],
        request=event,
    )


async def group_event(actor: Actor, event: Event) -> WriteResult:
    """9000/9001/9002/9005/9007/9008/9021/9022: the policy's manage check, then one channel service.

    An accepted group event is stored in its channel (REQ #h returns it), so the channel's live
    subscribers get it too, like a message.
    """
    result = await _apply_group_event(actor, event)
    if result.ok:
        await publish_event(actor.community.id, channel_of(event), event)
    return result


async def _apply_group_event(actor: Actor, event: Event) -> WriteResult:
    # Deleting a message is a message write; membership and metadata changes need channels:write.
    scope = SCOPE_WRITE if event.kind == KIND_DELETE_EVENT else SCOPE_CHANNELS_WRITE
    channel, decision = await check_manage(actor, event, scope=scope, creating=event.kind == KIND_CREATE_GROUP)
    if not decision.ok:
        return WriteResult.rejected(decision.reason)
    kind = event.kind
    if kind == KIND_CREATE_GROUP:
        if _single(event, "name") is None:
            return WriteResult.rejected("invalid: kind 9007 needs one name tag")
        return await _run(_create_group, actor=actor, event=event, channel=channel)
    if kind == KIND_DELETE_EVENT:
        return await _run(_delete_event, actor=actor, event=event, channel=channel)
    service, kwargs = _group_service(actor, event)
    return await _run(_in_community(actor, service), channel_uuid=channel, request=event, **kwargs)


def _in_community(actor: Actor, service: Callable[..., Any]) -> Callable[..., Any]:
    """The channel service bound to the actor's community, loaded in the worker thread."""
    return lambda **kwargs: service(community=_community(actor), **kwargs)


def _group_service(actor: Actor, event: Event) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The channel service for a membership or metadata event and its arguments from the tags."""
    kind = event.kind
    if kind == KIND_PUT_USER:
        pubkey, role = _pubkey_tag(event)
        return channel_services.member_put, {"actor": actor.pubkey, "pubkey": pubkey, "role": role or "member"}
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


DELETE_REFUSED = "restricted: that event can't be deleted by you"


def _delete_event(actor: Actor, event: Event, channel: uuid.UUID) -> None:
    """9005 for a message: the author or a channel owner/admin. One text for every refusal (no oracle)."""
    from django.db import transaction
    from django.utils import timezone

    targets = event.tag_values("e")
    if len(targets) != 1 or not _HEX64.match(targets[0]):
        raise ChannelError("invalid: kind 9005 needs exactly one e tag")
    community = _community(actor)
    with transaction.atomic():
        target = (
            StoredEvent.objects.select_for_update()
            .filter(id=targets[0], community=community, channel_id=channel, deleted_at__isnull=True)
            .first()
        )
        # Relay state is not deletable, and artifact revisions and removals are redacted through
        # moderation (their head pointers and views must follow), never soft-deleted here.
        if target is None or target.kind in channel_services.STATE_KINDS or target.kind in (45010, 45011):
            raise ChannelError(DELETE_REFUSED)
        if target.pubkey != actor.pubkey:
            ch = community.channels.filter(uuid=channel).first()
            role = channel_services.role_of(ch, actor.pubkey) if ch else None
            if role not in MANAGER_ROLES:
                raise ChannelError(DELETE_REFUSED)
        target.deleted_at = timezone.now()
        target.save(update_fields=["deleted_at"])
        channel_services.store_event_sync(community, event, channel)


def register() -> None:
    register_kind(KIND_MESSAGE, post_message)
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
        register_kind(kind, group_event)
