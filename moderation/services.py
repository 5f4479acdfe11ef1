"""Moderation services: redaction, retention expiry, channel lifecycle, policy reset, TTL reaping.

The one place these operations live. The NIP-29 kind-9005 path (buzz.chat.removals, through the
removal target artifacts registers), the admin and the `retention` command all call these, so each
operation has one mechanism: one transaction, an AuditRecord, and the resync signals the spec
requires published after commit (buzz.live.signals).

Every destructive operation has a `preview_*` twin that computes the same plan without writing,
for the admin's confirmation pages: which revision ids are withheld, which artifacts retire, which
channels are affected, and an estimate of how many open syncs will get a resync.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from buzz.models import Channel, Community


@dataclass(frozen=True, slots=True)
class RedactPlan:
    """What a redaction does. `withheld`: revision (or 45011 removal) ids withheld now (already redacted ones
    are left out); `retiring`: the d of each artifact whose current revision is among them;
    `channels`: the channels whose readers are affected; `open_syncs`: an estimate of the syncs resynced."""

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


def preview_redact(community: Community, revision_ids: Sequence[str]) -> RedactPlan:
    raise NotImplementedError


def redact(community: Community, revision_ids: Sequence[str], *, actor: str, reason: str) -> RedactPlan:
    raise NotImplementedError


def preview_expire(community: Community | None, *, now: dt.datetime | None = None) -> ExpirePlan:
    raise NotImplementedError


def expire(
    community: Community | None,
    *,
    actor: str,
    reason: str,
    batch_size: int = 1000,
    dry_run: bool = False,
    now: dt.datetime | None = None,
) -> ExpirePlan:
    raise NotImplementedError


def archive_channel(channel: Channel, *, actor: str, reason: str) -> LifecyclePlan:
    raise NotImplementedError


def unarchive_channel(channel: Channel, *, actor: str, reason: str) -> LifecyclePlan:
    raise NotImplementedError


def preview_delete_channel(channel: Channel) -> DeletePlan:
    raise NotImplementedError


def delete_channel(channel: Channel, *, actor: str, reason: str) -> DeletePlan:
    raise NotImplementedError


def reset_policy(community: Community, *, actor: str, reason: str) -> LifecyclePlan:
    raise NotImplementedError


def set_retention(community: Community, keep: dt.timedelta, *, actor: str) -> None:
    raise NotImplementedError


def show_retention(community: Community) -> dt.timedelta | None:
    raise NotImplementedError


def reap_ttl(*, now: dt.datetime | None = None, actor: str, reason: str) -> LifecyclePlan:
    raise NotImplementedError
