"""Moderation services: redaction, retention expiry, channel lifecycle, policy reset, TTL reaping.

The one place these operations live. The NIP-29 kind-9005 path (buzz.chat.removals, through the
removal target artifacts registers), the admin and the `retention` command all call these, so each
operation has one mechanism: one transaction, an AuditRecord, and the resync signals the spec
requires published after commit (buzz.live.signals).

Every destructive operation has a `preview_*` twin that computes the same plan without writing,
for the admin's confirmation pages: which revision ids are withheld, which artifacts retire, which
channels are affected, and how many open syncs will get a resync (artifacts.census: the syncs open on
every relay node now, as the nodes last published them, which may lag by a second).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from django.db import transaction
from django.utils import timezone

from artifacts.census import count_open_syncs
from artifacts.models import Artifact, MoveRemoval, Revision
from artifacts.redaction import Redaction, count_expirable, expire_batch
from buzz.access.changes import access_changed
from buzz.chat.channels import (
    ARCHIVE,
    DELETE,
    UNARCHIVE,
    ChannelError,
    access_epoch,
    channel_delete,
    channel_edit,
)
from buzz.chat.removals import Removal, remove_event
from buzz.live import signals
from buzz.models import Channel, Community, PolicyStamp
from buzz.nostr import Event, Signer
from moderation.models import AuditAction, AuditRecord, RetentionPolicy

log = logging.getLogger(__name__)

KIND_DELETE_EVENT = 9005
# Why an access signal was sent when a community's access policy was reset (the `why` field).
WHY_POLICY_RESET = "policy-reset"
# The longest retention period (a longer one is "keep everything": remove the policy instead).
MAX_KEEP = dt.timedelta(days=36500)
# The actor of a management command.
COMMAND = "command"


class ModerationError(Exception):
    """A refused moderation action; the message is one line for an operator."""


@dataclass(frozen=True, slots=True)
class RedactPlan:
    """What a redaction does. `withheld`: revision (or 45011 removal) ids withheld now (already redacted ones
    are left out); `retiring`: the d of each artifact whose current revision is among them;
    `channels`: the channels whose readers are affected; `open_syncs`: the open syncs over the retiring
    artifacts' channels (those whose set holds a retiring artifact get the resync)."""

    withheld: tuple[str, ...]
    retiring: tuple[str, ...]
    channels: tuple[str, ...]
    open_syncs: int
    unknown: tuple[str, ...] = ()  # ids named that are no revision or removal of the community


@dataclass(frozen=True, slots=True)
class ExpirePlan:
    """What an expiry run does (or did). `expired`: how many revisions are tombstoned; `kept_current`:
    revisions older than the policy kept because they are current heads or needed by prev checks and
    incremental reads; `communities`: the hosts covered; `batches`: how many batches ran."""

    expired: int
    kept: int
    communities: tuple[str, ...]
    sample: tuple[str, ...] = ()  # the first few revision ids expired (or to expire)
    batches: int = 0
    dry_run: bool = False
    open_syncs: int = 0  # expiry never retires a head: no sync gets a resync


@dataclass(frozen=True, slots=True)
class DeletePlan:
    """What deleting a channel does: its artifacts leave every current-state result and the head view."""

    channel: str
    artifacts: int
    retiring: tuple[str, ...]  # d's of the artifacts homed in the channel that are not deleted
    open_syncs: int
    already_deleted: bool = False


@dataclass(frozen=True, slots=True)
class LifecyclePlan:
    """What archive / unarchive / policy reset / TTL reaping did."""

    channels: tuple[str, ...]
    open_syncs: int = 0
    detail: str = ""


# --- open syncs ------------------------------------------------------------------------------------


def estimate_open_syncs(community_id: int, channels: Iterable[uuid.UUID | str]) -> int:
    """How many NIP-AR syncs are open now, on every relay node, over at least one of these channels.

    Counted by artifacts.census (each relay publishes its open syncs to Redis within about a second; a
    killed node's count vanishes within 15 s); a sync over several of the channels counts once. Ordinary
    REQs are not syncs and are not counted. 0 when Redis can't be asked (no action depends on it).
    """
    return count_open_syncs(community_id, channels)


def _audit(
    community: Community | None, *, who: str, action: str, target: str, reason: str, detail: dict[str, Any]
) -> AuditRecord:
    return AuditRecord.objects.create(
        community=community, who=who, action=action, target=target, reason=reason, detail=detail
    )


# --- redaction -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Target:
    id: str
    channel: uuid.UUID
    retires: str | None  # the d it retires (its artifact's current head), else None


def _targets(community: Community, revision_ids: Sequence[str]) -> tuple[list[_Target], list[str]]:
    ids = list(dict.fromkeys(revision_ids))
    found: dict[str, _Target] = {}
    # An expired revision is withheld everywhere already (its stored copy too): nothing is left to redact.
    revisions = Revision.objects.filter(
        community=community, id__in=ids, redacted_at__isnull=True, expired_at__isnull=True
    ).values_list("id", "channel", "artifact__head_id", "artifact__d", "artifact__retired")
    for rid, channel, head_id, d, retired in revisions:
        found[rid] = _Target(rid, channel, str(d) if head_id == rid and not retired else None)
    removals = MoveRemoval.objects.filter(community=community, id__in=ids, redacted_at__isnull=True).values_list(
        "id", "source"
    )
    for rid, source in removals:
        found[rid] = _Target(rid, source, None)
    # A target in a deleted channel is gone from every read already; a 9005 can't be stored there.
    live = set(
        Channel.objects.filter(
            community=community, uuid__in={t.channel for t in found.values()}, deleted_at__isnull=True
        ).values_list("uuid", flat=True)
    )
    targets = [found[i] for i in ids if i in found and found[i].channel in live]
    unknown = [i for i in ids if i not in found or found[i].channel not in live]
    return targets, unknown


def _plan(community: Community, targets: list[_Target], unknown: list[str]) -> RedactPlan:
    retiring = [t for t in targets if t.retires is not None]
    channels = sorted({str(t.channel) for t in targets})
    return RedactPlan(
        withheld=tuple(t.id for t in targets),
        retiring=tuple(t.retires for t in retiring if t.retires is not None),
        channels=tuple(channels),
        open_syncs=estimate_open_syncs(community.pk, {t.channel for t in retiring}),
        unknown=tuple(unknown),
    )


def preview_redact(community: Community, revision_ids: Sequence[str]) -> RedactPlan:
    """What `redact` would do now: the ids withheld, the artifacts retiring, the open syncs concerned."""
    targets, unknown = _targets(community, revision_ids)
    return _plan(community, targets, unknown)


def removal_request(community: Community, *, target: str, channel: uuid.UUID, reason: str) -> Event:
    """The relay-signed NIP-29 kind-9005 an operator's removal is published as, in the target's channel."""
    tags = [["h", str(channel)], ["e", target]]
    return Signer(community.relay_secret).sign_event(kind=KIND_DELETE_EVENT, tags=tags, content=reason)


def redact(community: Community, revision_ids: Sequence[str], *, actor: str, reason: str) -> RedactPlan:
    """Redact revisions (and 45011 move removals) as a relay admin: one relay-signed 9005 each, through the
    same removal path as a member's 9005 (buzz.chat.removals), in one transaction, audited.

    Ids that are unknown, already redacted or in a deleted channel are reported in `unknown` and skipped.
    """
    with transaction.atomic():
        targets, unknown = _targets(community, revision_ids)
        plan = _plan(community, targets, unknown)
        for target in targets:
            request = removal_request(community, target=target.id, channel=target.channel, reason=reason)
            try:
                public = remove_event(community_id=community.pk, actor=None, event=request, channel=target.channel)
            except ChannelError as err:
                raise ModerationError(f"{target.id}: {err.reason}") from None
            if public:
                # A 9005 readers may get is a stored event of the channel: live REQs see it, like a member's.
                epoch = access_epoch(community.pk, target.channel)
                signals.publish_on_commit(community.pk, target.channel, signals.event_message(request, epoch))
        # What retired is what the locked write decided (a concurrent edit may have moved a head meanwhile).
        retired = sorted(
            str(d)
            for d in Artifact.objects.filter(
                community=community, head_id__in=[t.id for t in targets], retired=True
            ).values_list("d", flat=True)
        )
        # And the syncs concerned are those over the channels of what retired: none when nothing did.
        retired_in = {t.channel for t in targets if t.retires is not None and t.retires in retired}
        plan = replace(plan, retiring=tuple(retired), open_syncs=estimate_open_syncs(community.pk, retired_in))
        _audit(
            community,
            who=actor,
            action=AuditAction.REDACT,
            target=", ".join(plan.withheld) or "(nothing)",
            reason=reason,
            detail={
                "withheld": list(plan.withheld),
                "retired": retired,
                "channels": list(plan.channels),
                "open_syncs": plan.open_syncs,
                "unknown": list(plan.unknown),
            },
        )
    return plan


def record_redaction(removal: Removal, result: Redaction) -> None:
    """artifacts.redaction observer: a member's 9005 leaves an audit record; an operator's is audited by `redact`."""
    if removal.actor is None:
        return
    _audit(
        Community.objects.get(pk=removal.community_id),
        who=removal.actor,
        action=AuditAction.REDACT,
        target=removal.target.id,
        reason=removal.request.content if removal.request is not None else "",
        detail={
            "withheld": list(result.withheld),
            "retired": [d for d, _ in result.retired],
            "channels": [str(removal.channel.uuid)],
            "via": "nip29-9005",
        },
    )


_LIFECYCLE_ACTIONS: Final = {
    ARCHIVE: AuditAction.ARCHIVE,
    UNARCHIVE: AuditAction.UNARCHIVE,
    DELETE: AuditAction.DELETE_CHANNEL,
}


def record_lifecycle(channel: Channel, action: str, who: str | None, request: Event | None) -> None:
    """buzz.chat.channels observer: an archive, unarchive or delete that a member's NIP-29 request (9002, 9008)
    or `manage.py channel` made leaves an audit record; the services here record their own (`who` None)."""
    if who is None:
        return
    _audit(
        channel.community,
        who=who,
        action=_LIFECYCLE_ACTIONS[action],
        target=str(channel.uuid),
        reason=request.content if request is not None else "",
        detail={
            "channel": str(channel.uuid),
            "name": channel.name,
            "via": f"nip29-{request.kind}" if request is not None else who,
        },
    )


# --- retention -------------------------------------------------------------------------------------


def _policies(community: Community | None) -> list[RetentionPolicy]:
    qs = RetentionPolicy.objects.select_related("community").order_by("community__host")
    if community is not None:
        qs = qs.filter(community=community)
    return list(qs)


def preview_expire(community: Community | None, *, now: dt.datetime | None = None) -> ExpirePlan:
    """What `expire` would tombstone now, for one community or every community with a policy. Writes nothing."""
    now = now or timezone.now()
    expired = kept = 0
    sample: list[str] = []
    hosts: list[str] = []
    for policy in _policies(community):
        counts = count_expirable(policy.community_id, now - policy.keep)
        expired += counts.expirable
        kept += counts.kept
        sample.extend(counts.sample)
        hosts.append(policy.community.host)
    return ExpirePlan(expired=expired, kept=kept, communities=tuple(hosts), sample=tuple(sample[:10]), dry_run=True)


def expire(
    community: Community | None,
    *,
    actor: str,
    reason: str,
    batch_size: int = 1000,
    dry_run: bool = False,
    now: dt.datetime | None = None,
    progress: Callable[[str], None] | None = None,
) -> ExpirePlan:
    """Tombstone the revision history each community's policy no longer keeps, in batches of `batch_size`
    (one transaction each, so writes go on meanwhile). Idempotent: a second run finds nothing.

    Expiry never retires a head (current revisions are never expired), so it resyncs nothing.
    """
    if batch_size < 1:
        raise ModerationError("--batch-size must be at least 1")
    if community is not None and not RetentionPolicy.objects.filter(community=community).exists():
        raise ModerationError(f"{community.host} has no retention policy: set one with retention set")
    if dry_run:
        plan = preview_expire(community, now=now)
        if progress is not None:
            for host in plan.communities:
                progress(f"{host}: dry run")
        return plan
    now = now or timezone.now()
    total = kept = batches = 0
    sample: list[str] = []
    hosts: list[str] = []
    for policy in _policies(community):
        cutoff = now - policy.keep
        host = policy.community.host
        hosts.append(host)
        done = 0
        while True:
            with transaction.atomic():
                ids = expire_batch(policy.community_id, cutoff, batch_size)
            if not ids:
                break
            batches += 1
            done += len(ids)
            sample.extend(ids[: max(0, 10 - len(sample))])
            if progress is not None:
                progress(f"{host}: expired {done} revisions so far")
            if len(ids) < batch_size:
                break
        with transaction.atomic():
            kept_here = count_expirable(policy.community_id, cutoff, sample=0).kept
            kept += kept_here
            _audit(
                policy.community,
                who=actor,
                action=AuditAction.EXPIRE,
                target=host,
                reason=reason,
                detail={"expired": done, "kept": kept_here, "keep_seconds": int(policy.keep.total_seconds())},
            )
        total += done
    return ExpirePlan(
        expired=total, kept=kept, communities=tuple(hosts), sample=tuple(sample), batches=batches, dry_run=False
    )


def set_retention(community: Community, keep: dt.timedelta, *, actor: str) -> None:
    """Set how long a community keeps non-current revision history (0 keeps only what must stay)."""
    if keep < dt.timedelta(0):
        raise ModerationError("the retention period can't be negative")
    if keep > MAX_KEEP:
        raise ModerationError(f"the retention period is at most {MAX_KEEP.days}d")
    with transaction.atomic():
        RetentionPolicy.objects.update_or_create(community=community, defaults={"keep": keep})
        _audit(
            community,
            who=actor,
            action=AuditAction.RETENTION_SET,
            target=community.host,
            reason="",
            detail={"keep_seconds": int(keep.total_seconds())},
        )


def show_retention(community: Community) -> dt.timedelta | None:
    """The community's retention period, or None when it keeps everything (no policy)."""
    return RetentionPolicy.objects.filter(community=community).values_list("keep", flat=True).first()


# --- channel lifecycle -----------------------------------------------------------------------------


def _current(channel: Channel) -> Channel:
    fresh = Channel.objects.filter(pk=channel.pk).select_related("community").first()
    if fresh is None:
        raise ModerationError("no such channel")
    return fresh


def archive_channel(channel: Channel, *, actor: str, reason: str) -> LifecyclePlan:
    """Archive: writes are refused with the kind-9 archive reason; reads and syncs are unchanged (no resync)."""
    return _set_archived(channel, True, actor=actor, reason=reason)


def unarchive_channel(channel: Channel, *, actor: str, reason: str) -> LifecyclePlan:
    """Unarchive: writes are allowed again; reads and syncs are unchanged."""
    return _set_archived(channel, False, actor=actor, reason=reason)


def _set_archived(channel: Channel, archived: bool, *, actor: str, reason: str) -> LifecyclePlan:
    channel = _current(channel)
    if channel.deleted_at is not None:
        raise ModerationError(f"channel {channel.uuid} is deleted")
    with transaction.atomic():
        try:
            # The NIP-29 9002 service: one mechanism, with its relay-signed 39000 carrying `archived`.
            channel_edit(
                community=channel.community,
                channel_uuid=channel.uuid,
                actor=None,
                changes={"archived": "true" if archived else "false"},
            )
        except ChannelError as err:
            raise ModerationError(err.reason) from None
        _audit(
            channel.community,
            who=actor,
            action=AuditAction.ARCHIVE if archived else AuditAction.UNARCHIVE,
            target=str(channel.uuid),
            reason=reason,
            detail={"channel": str(channel.uuid), "name": channel.name},
        )
    return LifecyclePlan(channels=(str(channel.uuid),), open_syncs=0)


def preview_delete_channel(channel: Channel) -> DeletePlan:
    """What deleting the channel does: its artifacts leave every current-state result and the head view, and
    every sync covering it (and every REQ on it) ends."""
    channel = _current(channel)
    homed = Artifact.objects.filter(community_id=channel.community_id, home=channel.uuid)
    retiring = tuple(
        str(d) for d in homed.filter(deleted=False, retired=False).order_by("d").values_list("d", flat=True)
    )
    return DeletePlan(
        channel=str(channel.uuid),
        artifacts=homed.count(),
        retiring=retiring,
        open_syncs=0 if channel.deleted_at is not None else estimate_open_syncs(channel.community_id, [channel.uuid]),
        already_deleted=channel.deleted_at is not None,
    )


def delete_channel(channel: Channel, *, actor: str, reason: str) -> DeletePlan:
    """Delete the channel as its owner's NIP-29 9008 does (buzz.chat.channels.channel_delete): writes are
    refused, its artifacts leave every current-state result, and every sync covering it gets resync."""
    plan = preview_delete_channel(channel)
    if plan.already_deleted:
        raise ModerationError(f"channel {plan.channel} is already deleted")
    channel = _current(channel)
    with transaction.atomic():
        try:
            channel_delete(community=channel.community, channel_uuid=channel.uuid, actor=None)
        except ChannelError as err:
            raise ModerationError(err.reason) from None
        _audit(
            channel.community,
            who=actor,
            action=AuditAction.DELETE_CHANNEL,
            target=str(channel.uuid),
            reason=reason,
            detail={
                "channel": str(channel.uuid),
                "name": channel.name,
                "artifacts": plan.artifacts,
                "retired": list(plan.retiring),
                "open_syncs": plan.open_syncs,
            },
        )
    return plan


def preview_reset_policy(community: Community) -> LifecyclePlan:
    """What `reset_policy` would do now: the community's live channels, and the open syncs over them (every one
    gets a resync)."""
    channels = list(Channel.objects.filter(community=community, deleted_at__isnull=True).values_list("uuid", flat=True))
    return LifecyclePlan(channels=tuple(map(str, channels)), open_syncs=estimate_open_syncs(community.pk, channels))


def reset_policy(community: Community, *, actor: str, reason: str) -> LifecyclePlan:
    """Reset the community's access policy: advance its PolicyStamp (incremental-read tokens minted before are
    refused) and have every subscription of every channel re-check access, so every sync resyncs."""
    with transaction.atomic():
        # The one place that advances the stamp (buzz.access.changes).
        access_changed(community.pk)
        stamp = PolicyStamp.objects.get(community=community)
        plan = preview_reset_policy(community)
        for channel in map(uuid.UUID, plan.channels):
            signals.publish_on_commit(community.pk, channel, signals.access_message(channel, WHY_POLICY_RESET))
        _audit(
            community,
            who=actor,
            action=AuditAction.POLICY_RESET,
            target=community.host,
            reason=reason,
            detail={"stamp": stamp.stamp, "channels": len(plan.channels), "open_syncs": plan.open_syncs},
        )
    return replace(plan, detail=f"policy stamp {stamp.stamp}")


def reap_ttl(*, now: dt.datetime | None = None, actor: str, reason: str) -> LifecyclePlan:
    """TTL channels past their deadline: archived; one that the reaper archived (after its deadline) and is a
    further ttl_seconds past it is deleted (as `delete_channel`, with the resync of its syncs). A channel an
    operator archived before its deadline is the operator's: never deleted here. Each channel is decided
    again with its row locked, so a write that moved the deadline meanwhile keeps it."""
    now = now or timezone.now()
    due = Channel.objects.filter(
        deleted_at__isnull=True, ttl_seconds__isnull=False, deadline__isnull=False, deadline__lt=now
    ).select_related("community")
    archived: list[str] = []
    deleted: list[str] = []
    resyncs = 0
    for candidate in due.order_by("deadline", "pk"):
        with transaction.atomic():
            channel = Channel.objects.select_for_update().select_related("community").get(pk=candidate.pk)
            ttl, deadline = channel.ttl_seconds, channel.deadline
            if channel.deleted_at is not None or ttl is None or deadline is None or deadline >= now:
                continue
            if channel.archived_at is None:
                archive_channel(channel, actor=actor, reason=reason or "TTL passed")
                archived.append(str(channel.uuid))
            elif channel.archived_at >= deadline and deadline + dt.timedelta(seconds=ttl) < now:
                resyncs += delete_channel(channel, actor=actor, reason=reason or "TTL passed").open_syncs
                deleted.append(str(channel.uuid))
    if archived or deleted:
        _audit(
            None,
            who=actor,
            action=AuditAction.REAP_TTL,
            target=f"{len(archived)} archived, {len(deleted)} deleted",
            reason=reason,
            detail={"archived": archived, "deleted": deleted},
        )
    return LifecyclePlan(
        channels=tuple(archived + deleted),
        open_syncs=resyncs,
        detail=f"{len(archived)} archived, {len(deleted)} deleted",
    )
