"""Relay-level bans and timeouts (services). A ban also ends the pubkey's live subscriptions, on every node."""

from __future__ import annotations

import datetime as dt

from django.db import transaction
from django.utils import timezone

from buzz.access.changes import access_changed
from buzz.identity.communities import check_pubkey
from buzz.live import signals
from buzz.models import Ban, Community, Timeout


def ban_add(*, community: Community, pubkey: str, reason: str = "", duration: dt.timedelta | None = None) -> Ban:
    check_pubkey(pubkey)
    if duration is not None and duration <= dt.timedelta(0):
        # timedelta(0) is falsy: without this check it would silently become a ban until lifted.
        raise ValueError("a ban duration must be positive")
    with transaction.atomic():
        ban = Ban.objects.create(
            community=community,
            pubkey=pubkey,
            reason=reason,
            expires_at=timezone.now() + duration if duration else None,
        )
        # Reads are refused to a banned pubkey: every open subscription of it re-checks and ends, also
        # those on open channels it reads without being a member (the signal goes to the pubkey's topic).
        signals.publish_standing_on_commit(community.pk, pubkey, signals.WHY_BAN)
        access_changed(community.pk)
    return ban


def ban_lift(*, community: Community, pubkey: str) -> int:
    with transaction.atomic():
        lifted = Ban.objects.filter(community=community, pubkey=pubkey, lifted_at__isnull=True).update(
            lifted_at=timezone.now()
        )
        if lifted:
            access_changed(community.pk)  # the pubkey reads again
    return lifted


def timeout_add(*, community: Community, pubkey: str, duration: dt.timedelta, reason: str = "") -> Timeout:
    check_pubkey(pubkey)
    if duration <= dt.timedelta(0):
        raise ValueError("a timeout needs a positive duration")
    return Timeout.objects.create(community=community, pubkey=pubkey, until=timezone.now() + duration, reason=reason)
