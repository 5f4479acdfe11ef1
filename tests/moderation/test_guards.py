"""No silent retirement (issue 11, item 4): Django's delete and queryset updates that would retire a head,
remove a revision or change access without a resync are refused on Channel, Artifact, Revision,
MoveRemoval, StoredEvent and CurrentTag; harmless updates still work."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone

from artifacts.models import Artifact, MoveRemoval, Revision
from artifacts.redaction import redact_events
from buzz.models import Channel, GuardedChange, Membership
from tests.moderation.moderation_support import make_world


@pytest.fixture
def channel(db: None) -> Channel:
    world = make_world("guards.test")
    return Channel.objects.get(uuid=world.ch)


def test_channel_and_membership_deletes_and_access_updates_are_refused(channel: Channel) -> None:
    with pytest.raises(GuardedChange):
        channel.delete()
    with pytest.raises(GuardedChange):
        Channel.objects.filter(pk=channel.pk).delete()
    for field in ("deleted_at", "archived_at"):
        with pytest.raises(GuardedChange):
            Channel.objects.filter(pk=channel.pk).update(**{field: timezone.now()})
    with pytest.raises(GuardedChange):
        Channel.objects.filter(pk=channel.pk).update(visibility="open")
    channel.deleted_at = timezone.now()
    with pytest.raises(GuardedChange):
        Channel.objects.bulk_update([channel], ["deleted_at"])
    membership = Membership.objects.filter(channel=channel).first()
    assert membership is not None
    with pytest.raises(GuardedChange):
        membership.delete()
    with pytest.raises(GuardedChange):
        channel.memberships.all().delete()
    for change in ({"removed_at": timezone.now()}, {"role": "owner"}):
        with pytest.raises(GuardedChange):
            Membership.objects.filter(channel=channel).update(**change)
    # A change that retires nothing and changes no access is an ordinary update.
    assert Channel.objects.filter(pk=channel.pk).update(topic="new topic") == 1
    assert Channel.objects.filter(pk=channel.pk, deleted_at__isnull=True, archived_at__isnull=True).exists()


def test_artifact_revision_and_removal_deletes_and_tombstone_updates_are_refused(db: None) -> None:
    for model, fields in (
        (Artifact, {"retired": True, "head_id": "ab" * 32, "deleted": True}),
        (Revision, {"redacted_at": timezone.now(), "expired_at": timezone.now(), "raw": ""}),
        (MoveRemoval, {"redacted_at": timezone.now()}),
    ):
        with pytest.raises(GuardedChange):
            model.objects.all().delete()  # type: ignore[attr-defined]
        for name, value in fields.items():
            with pytest.raises(GuardedChange):
                model.objects.all().update(**{name: value})  # type: ignore[attr-defined]
    with pytest.raises(GuardedChange):
        Revision(seq=1, id="ab" * 32).delete()


def test_redact_events_skips_what_is_no_revision(db: None) -> None:
    make_world("guards2.test")
    result = redact_events(1, ["cd" * 32, str(uuid.uuid4())])
    assert result.withheld == () and result.retired == ()


def test_stored_copies_current_tags_and_an_artifacts_type_are_guarded_too(channel: Channel) -> None:
    """A withheld copy put back by a queryset update would return a redacted revision to every NIP-01 replay;
    current tags and the type are what current-state queries match on."""
    from artifacts.models import CurrentTag
    from buzz.models import StoredEvent

    for qs, field, value in (
        (StoredEvent.objects.all(), "deleted_at", None),
        (StoredEvent.objects.all(), "raw", "{}"),
        (CurrentTag.objects.all(), "value", "x"),
        (Artifact.objects.all(), "type", "buzz.other"),
    ):
        with pytest.raises(GuardedChange):
            qs.update(**{field: value})
    for qs in (StoredEvent.objects.all(), CurrentTag.objects.all()):
        with pytest.raises(GuardedChange):
            qs.delete()
    StoredEvent.objects.filter(channel_id=channel.uuid).update(received_at=timezone.now())  # harmless: allowed
