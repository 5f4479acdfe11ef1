"""Channel services: NIP-29 group state changes, shared by events, the admin and management commands.

Every function here is synchronous ORM code run in one transaction. Each one
refreshes the relay-signed state events (39000 metadata, 39001 admins, 39002
members) and, after commit, signals live subscribers that access may have
changed (buzz.live).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterable

from django.db import connection, transaction
from django.db.models import F, Sum
from django.utils import timezone

from buzz.access.changes import access_changed
from buzz.access.policy import EPOCHS_SQL, MANAGER_ROLES
from buzz.events.store import discard_sync, store_sync
from buzz.live import signals
from buzz.models import (
    Channel,
    ChannelRole,
    ChannelType,
    ClockTimestamp,
    Community,
    Membership,
    MessageCounter,
    Visibility,
    guarded_writes,
)
from buzz.nostr import Event, Signer

KIND_GROUP_METADATA = 39000
KIND_GROUP_ADMINS = 39001
KIND_GROUP_MEMBERS = 39002
STATE_KINDS = (KIND_GROUP_METADATA, KIND_GROUP_ADMINS, KIND_GROUP_MEMBERS)
DM_MIN, DM_MAX = 2, 9


class ChannelError(Exception):
    """A refused change. `reason` is the client-facing NIP-01 reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _signal_access(channel: Channel, why: str, *, pubkey: str | None = None) -> None:
    """Inside the transaction that changes who reads `channel`: advance its access epoch, and once it commits,
    tell every node's subscriptions of the channel (buzz.live.signals)."""
    Channel.objects.filter(pk=channel.pk).update(access_epoch=F("access_epoch") + 1)
    message = signals.access_message(channel.uuid, why, pubkey=pubkey)
    signals.publish_on_commit(channel.community_id, channel.uuid, message)


def access_epoch(community_id: int, channel: uuid.UUID) -> int:
    """The channel's effective access epoch (ChannelAccess.epoch) as the current transaction sees it (0 when
    there is no such channel): what the live signal of an event stored in the channel carries
    (buzz.live.signals.event_message)."""
    with connection.cursor() as cursor:
        cursor.execute(EPOCHS_SQL, [community_id, [channel]])
        row = cursor.fetchone()
    return int(row[1]) if row is not None else 0


def active_members(channel: Channel) -> list[Membership]:
    return list(channel.memberships.filter(removed_at__isnull=True).order_by("joined_at", "id"))


def active_membership(channel: Channel, pubkey: str) -> Membership | None:
    return channel.memberships.filter(pubkey=pubkey, removed_at__isnull=True).first()


def _message_count(channel: Channel) -> int:
    """A new member starts with nothing unread: the sum of the channel's counter shards."""
    total = MessageCounter.objects.filter(channel=channel).aggregate(n=Sum("message_count"))["n"]
    return int(total or 0)


def _owners(channel: Channel) -> int:
    return channel.memberships.filter(removed_at__isnull=True, role=ChannelRole.OWNER).count()


# --- relay-signed state --------------------------------------------------------


def _state_events(channel: Channel, signer: Signer, created_at: int) -> list[Event]:
    members = active_members(channel)
    h = str(channel.uuid)
    meta: list[list[str]] = [["d", h], ["name", channel.name]]
    if channel.about:
        meta.append(["about", channel.about])
    meta.append(["private" if channel.visibility == Visibility.PRIVATE else "public"])
    meta.append(["closed" if channel.visibility == Visibility.PRIVATE else "open"])
    meta.append(["type", channel.type])
    if channel.topic:
        meta.append(["topic", channel.topic])
    if channel.purpose:
        meta.append(["purpose", channel.purpose])
    if channel.archived_at is not None:
        meta.append(["archived", "true"])
    if channel.ttl_seconds:
        meta.append(["ttl", str(channel.ttl_seconds)])
    if not channel.listed:
        meta.append(["unlisted"])
    admins = [["d", h]] + [["p", m.pubkey, m.role] for m in members if m.role in MANAGER_ROLES]
    roster = [["d", h]] + [["p", m.pubkey, "", m.role] for m in members]
    # Model fields may hold TextChoices members; an event's tags are plain strings.
    meta = [[str(x) for x in tag] for tag in meta]
    admins = [[str(x) for x in tag] for tag in admins]
    roster = [[str(x) for x in tag] for tag in roster]
    return [
        signer.sign_event(kind=KIND_GROUP_METADATA, tags=meta, content="", created_at=created_at),
        signer.sign_event(kind=KIND_GROUP_ADMINS, tags=admins, content="", created_at=created_at),
        signer.sign_event(kind=KIND_GROUP_MEMBERS, tags=roster, content="", created_at=created_at),
    ]


def refresh_state(channel: Channel) -> None:
    """Replace the channel's relay-signed 39000/39001/39002 events (addressable: one of each). Called after the
    change's access signal (`_signal_access`, `access_changed`): the events carry the epoch the change made, so
    a live REQ re-checks its reader before it sends them (a member removed with them never gets them)."""
    community = channel.community
    # Each replacement must be newer than the one it replaces: for addressable events a client keeps
    # the newest, and a tie (two changes in one second) goes to the lower id, maybe the stale one.
    previous = discard_sync(community_id=community.pk, channel=channel.uuid, kinds=STATE_KINDS)
    if channel.deleted_at is not None:
        return
    created_at = max(int(time.time()), previous + 1 if previous is not None else 0)
    epoch = access_epoch(community.pk, channel.uuid)
    for event in _state_events(channel, Signer(community.relay_secret), created_at):
        store_sync(community_id=community.pk, event=event, channel=channel.uuid)
        # Live REQs on the state kinds see each replacement (after commit, like every signal).
        signals.publish_on_commit(channel.community_id, channel.uuid, signals.event_message(event, epoch))


# --- services ------------------------------------------------------------------


# The longest TTL a channel takes (ten years).
MAX_TTL_SECONDS = 10 * 365 * 86400


def parse_ttl(value: str) -> int | None:
    """A `ttl` tag's value: seconds, or None for a permanent channel ("" or "0", as the channel's
    metadata shows no ttl then). Raises ChannelError for anything else, or more than MAX_TTL_SECONDS."""
    if value in ("", "0"):
        return None
    if value.isascii() and value.isdigit() and int(value) <= MAX_TTL_SECONDS:
        return int(value)
    raise ChannelError("invalid: ttl must be a number of seconds")


def channel_create(
    *,
    community: Community,
    channel_uuid: uuid.UUID,
    name: str,
    creator: str,
    visibility: str = Visibility.OPEN,
    channel_type: str = ChannelType.STREAM,
    about: str = "",
    listed: bool = True,
    ttl_seconds: int | None = None,
    participants: Iterable[str] = (),
    request: Event | None = None,
) -> Channel:
    if channel_uuid.int == 0:
        raise ChannelError("invalid: channel id must be a non-nil UUID")
    if not name.strip():
        raise ChannelError("invalid: channel needs a name")
    if visibility not in Visibility.values:
        raise ChannelError("invalid: visibility must be open or private")
    if channel_type not in ChannelType.values:
        raise ChannelError(f"invalid: channel type must be one of {', '.join(ChannelType.values)}")
    people = list(dict.fromkeys([creator, *participants]))
    if channel_type == ChannelType.DM:
        if not DM_MIN <= len(people) <= DM_MAX:
            raise ChannelError(f"invalid: a DM has {DM_MIN} to {DM_MAX} participants, the creator included")
        visibility = Visibility.PRIVATE
        listed = False
    elif len(people) > 1:
        raise ChannelError("invalid: only a DM names participants at creation")
    with transaction.atomic():
        if Channel.objects.filter(community=community, uuid=channel_uuid).exists():
            raise ChannelError("invalid: that channel id is taken")
        now = timezone.now()
        channel = Channel.objects.create(
            community=community,
            uuid=channel_uuid,
            name=name.strip()[:200],
            about=about,
            visibility=visibility,
            listed=listed,
            type=channel_type,
            # 0 is no TTL, as everywhere (parse_ttl): stored as NULL, which is what every TTL test reads.
            ttl_seconds=ttl_seconds or None,
            deadline=now + dt.timedelta(seconds=ttl_seconds) if ttl_seconds else None,
            created_by=creator,
        )
        if channel_type == ChannelType.DM:
            # DM participants are peers: nobody owns a DM.
            Membership.objects.bulk_create(
                [Membership(channel=channel, pubkey=p, role=ChannelRole.MEMBER) for p in people]
            )
        else:
            Membership.objects.create(channel=channel, pubkey=creator, role=ChannelRole.OWNER)
        if request is not None:
            store_sync(community_id=community.pk, event=request, channel=channel.uuid)
        _signal_access(channel, signals.WHY_CREATED)
        refresh_state(channel)
    return channel


def _lock(community: Community, channel_uuid: uuid.UUID) -> Channel:
    channel = (
        Channel.objects.select_for_update()
        .filter(community=community, uuid=channel_uuid, deleted_at__isnull=True)
        .first()
    )
    if channel is None:
        raise ChannelError("restricted: not a channel member")
    return channel


def role_of(channel: Channel, pubkey: str) -> str | None:
    m = active_membership(channel, pubkey)
    return m.role if m else None


def member_put(
    *,
    community: Community,
    channel_uuid: uuid.UUID,
    actor: str | None,
    pubkey: str,
    role: str | None = ChannelRole.MEMBER,
    request: Event | None = None,
) -> Membership:
    """NIP-29 9000. actor None means an operator (admin, management command): no channel-role checks.

    role None (a 9000 that names no role): a new member joins as a member; an existing member keeps their
    role. Changing an existing member's role is an owner's or an admin's, in both directions."""
    if role is not None and role not in ChannelRole.values:
        raise ChannelError(f"invalid: role must be one of {', '.join(ChannelRole.values)}")
    with transaction.atomic():
        channel = _lock(community, channel_uuid)
        if channel.type == ChannelType.DM:
            raise ChannelError("invalid: a DM's participants can't change")
        # The actor's role, read once (an operator has none and needs none).
        actor_role = role_of(channel, actor) if actor is not None else None
        if actor is not None:
            if channel.visibility == Visibility.PRIVATE and actor_role not in MANAGER_ROLES:
                raise ChannelError("restricted: only owners and admins add members to a private channel")
            if channel.visibility == Visibility.OPEN and actor_role is None:
                raise ChannelError("restricted: not a channel member")
            if role not in (None, ChannelRole.MEMBER) and actor_role not in MANAGER_ROLES:
                raise ChannelError("restricted: only owners and admins assign roles")
            if role == ChannelRole.OWNER and actor_role != "owner":
                raise ChannelError("restricted: only an owner makes another owner")
            if channel.archived_at is not None:
                raise ChannelError("invalid: channel is archived")
        current = active_membership(channel, pubkey)
        if current is not None:
            new_role = current.role if role is None else role  # no role named: the member keeps theirs
            if new_role != current.role:
                if actor is not None and actor_role not in MANAGER_ROLES:
                    raise ChannelError("restricted: only owners and admins change a member's role")
                if current.role == ChannelRole.OWNER and _owners(channel) <= 1:
                    raise ChannelError("invalid: the last owner can't be demoted")
                if actor is not None and current.role == ChannelRole.OWNER and actor_role != "owner":
                    raise ChannelError("restricted: only an owner changes an owner's role")
                current.role = new_role
                with guarded_writes():  # this service publishes the access change
                    current.save(update_fields=["role"])
            membership = current
        else:
            membership = Membership.objects.create(
                channel=channel, pubkey=pubkey, role=role or ChannelRole.MEMBER, read_mark=_message_count(channel)
            )
        if request is not None:
            store_sync(community_id=community.pk, event=request, channel=channel.uuid)
        _signal_access(channel, signals.WHY_MEMBERSHIP, pubkey=pubkey)
        refresh_state(channel)
    return membership


def member_remove(
    *, community: Community, channel_uuid: uuid.UUID, actor: str | None, pubkey: str, request: Event | None = None
) -> None:
    """NIP-29 9001 (and 9022 leave, where actor == pubkey). The row stays with removed_at set."""
    with transaction.atomic():
        channel = _lock(community, channel_uuid)
        if channel.type == ChannelType.DM:
            raise ChannelError("invalid: a DM's participants can't change")
        target = active_membership(channel, pubkey)
        if actor is not None and actor != pubkey:
            actor_role = role_of(channel, actor)
            if actor_role not in MANAGER_ROLES:
                raise ChannelError("restricted: only owners and admins remove other members")
            if target is not None and target.role == ChannelRole.OWNER and actor_role != "owner":
                raise ChannelError("restricted: only an owner removes an owner")
        if target is None:
            if actor is not None and actor == pubkey:
                raise ChannelError("restricted: not a channel member")
            raise ChannelError("invalid: that pubkey is not a member")
        if target.role == ChannelRole.OWNER and _owners(channel) <= 1:
            raise ChannelError("invalid: the last owner can't leave or be removed")
        # The database's clock, not this process's: incremental reads page on it (NIP-AR).
        target.removed_at = ClockTimestamp()
        with guarded_writes():  # this service publishes the access change
            target.save(update_fields=["removed_at"])
        if request is not None:
            store_sync(community_id=community.pk, event=request, channel=channel.uuid)
        _signal_access(channel, signals.WHY_MEMBERSHIP, pubkey=pubkey)
        refresh_state(channel)


# Archive, unarchive and delete, seen by observers an app registers (moderation keeps its audit log with
# them): `observer(channel, action, who, request)` in the change's transaction, where `who` is the member's
# pubkey, the operator's label (`operator=`, e.g. "command"), or None for a caller that records the change
# itself (the moderation services).
LifecycleObserver = Callable[[Channel, str, str | None, Event | None], None]
_lifecycle_observers: list[LifecycleObserver] = []
ARCHIVE, UNARCHIVE, DELETE = "archive", "unarchive", "delete"


def observe_lifecycle(observer: LifecycleObserver) -> None:
    """Called from AppConfig.ready()."""
    if observer not in _lifecycle_observers:
        _lifecycle_observers.append(observer)


def _lifecycle(channel: Channel, action: str, who: str | None, request: Event | None) -> None:
    for observer in _lifecycle_observers:
        observer(channel, action, who, request)


EDITABLE = ("name", "about", "topic", "purpose", "visibility", "archived", "ttl", "listed")
MEMBER_EDITABLE = frozenset({"topic", "purpose"})


def channel_edit(
    *,
    community: Community,
    channel_uuid: uuid.UUID,
    actor: str | None,
    changes: dict[str, str],
    request: Event | None = None,
    operator: str | None = None,
) -> Channel:
    """NIP-29 9002. Owners/admins edit everything; members only topic and purpose. `operator` names who asked
    when `actor` is None (see `observe_lifecycle`)."""
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise ChannelError(f"invalid: unknown metadata field {sorted(unknown)[0]!r}")
    if not changes:
        raise ChannelError("invalid: edit-metadata changes nothing")
    with transaction.atomic():
        channel = _lock(community, channel_uuid)
        if actor is not None:
            role = role_of(channel, actor)
            if role is None:
                raise ChannelError("restricted: not a channel member")
            if role not in MANAGER_ROLES and not set(changes) <= MEMBER_EDITABLE:
                raise ChannelError("restricted: only owners and admins edit this metadata")
        was_active = channel.archived_at is None
        # An archived channel takes one edit: its archive flag, alone or with the unarchiving it allows.
        if channel.archived_at is not None and set(changes) != {"archived"} and changes.get("archived") != "false":
            raise ChannelError("invalid: channel is archived")
        access_changed_now = False
        # Listing and TTL change what an incremental read covers (unlisted channels need #h; TTL
        # channels contribute nothing): the policy stamp advances for them too.
        scope_changed = False
        for key, value in changes.items():
            if key in ("name", "about", "topic", "purpose"):
                if key == "name" and not value.strip():
                    raise ChannelError("invalid: channel needs a name")
                setattr(channel, key, value.strip()[:200] if key == "name" else value[:500])
            elif key == "visibility":
                if value not in Visibility.values:
                    raise ChannelError("invalid: visibility must be open or private")
                if channel.type == ChannelType.DM and value != Visibility.PRIVATE:
                    raise ChannelError("invalid: a DM is always private")
                access_changed_now = access_changed_now or value != channel.visibility
                channel.visibility = value
            elif key == "archived":
                if value not in ("true", "false"):
                    raise ChannelError("invalid: archived must be true or false")
                if value == "false" and channel.archived_at is not None and channel.ttl_seconds:
                    # Unarchiving a TTL channel starts its time again, as a new event would: left past its
                    # deadline, the next reap would archive it at once (moderation.services.reap_ttl).
                    channel.deadline = timezone.now() + dt.timedelta(seconds=channel.ttl_seconds)
                channel.archived_at = (channel.archived_at or timezone.now()) if value == "true" else None
            elif key == "listed":
                if value not in ("true", "false"):
                    raise ChannelError("invalid: listed must be true or false")
                scope_changed = scope_changed or channel.listed != (value == "true")
                channel.listed = value == "true"
            elif key == "ttl":
                was_ttl = bool(channel.ttl_seconds)
                channel.ttl_seconds = parse_ttl(value)
                channel.deadline = (
                    timezone.now() + dt.timedelta(seconds=channel.ttl_seconds) if channel.ttl_seconds else None
                )
                scope_changed = scope_changed or was_ttl != bool(channel.ttl_seconds)
        if access_changed_now:
            channel.access_changed_at = ClockTimestamp()  # the database's clock, as every access change
        with guarded_writes():  # this service publishes the access change
            channel.save()
        if access_changed_now:
            channel.refresh_from_db(fields=["access_changed_at"])
        if access_changed_now or scope_changed:
            access_changed(community.pk)
        if request is not None:
            store_sync(community_id=community.pk, event=request, channel=channel.uuid)
        if access_changed_now:
            _signal_access(channel, signals.WHY_VISIBILITY)
        refresh_state(channel)
        if (channel.archived_at is None) != was_active:
            _lifecycle(channel, UNARCHIVE if channel.archived_at is None else ARCHIVE, actor or operator, request)
    return channel


def channel_delete(
    *,
    community: Community,
    channel_uuid: uuid.UUID,
    actor: str | None,
    request: Event | None = None,
    operator: str | None = None,
) -> None:
    """NIP-29 9008: owner only. Soft delete; every subscription on the channel ends. `operator` names who asked
    when `actor` is None (see `observe_lifecycle`)."""
    with transaction.atomic():
        channel = _lock(community, channel_uuid)
        if actor is not None and role_of(channel, actor) != ChannelRole.OWNER:
            raise ChannelError("restricted: only an owner deletes a channel")
        channel.deleted_at = ClockTimestamp()  # the database's clock, as every access change
        with guarded_writes():  # this service publishes the access change
            channel.save(update_fields=["deleted_at"])
        access_changed(community.pk)
        if request is not None:
            store_sync(community_id=community.pk, event=request, channel=channel.uuid)
        _signal_access(channel, signals.WHY_DELETED)
        refresh_state(channel)
        _lifecycle(channel, DELETE, actor or operator, request)


def channel_join(*, community: Community, channel_uuid: uuid.UUID, pubkey: str, request: Event | None = None) -> None:
    """NIP-29 9021: open channels only; a private channel answers like a missing one."""
    with transaction.atomic():
        channel = _lock(community, channel_uuid)
        if active_membership(channel, pubkey) is not None:
            # NIP-29: a member's join is answered duplicate:, in a private channel or DM too (a member reads it,
            # so saying so discloses nothing).
            raise ChannelError("duplicate: already a member")
        if channel.visibility != Visibility.OPEN or channel.type == ChannelType.DM:
            raise ChannelError("restricted: not a channel member")
        if channel.archived_at is not None:
            raise ChannelError("invalid: channel is archived")
        Membership.objects.create(
            channel=channel, pubkey=pubkey, role=ChannelRole.MEMBER, read_mark=_message_count(channel)
        )
        if request is not None:
            store_sync(community_id=community.pk, event=request, channel=channel.uuid)
        _signal_access(channel, signals.WHY_MEMBERSHIP, pubkey=pubkey)
        refresh_state(channel)
