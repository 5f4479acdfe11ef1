"""No silent retirement (issue 11, item 4; NIP-AR sync rule 6): Django's deletes, queryset updates and instance
saves that would retire a head, remove a revision or change access without a resync are refused on Channel,
Membership, Artifact, Revision, MoveRemoval, StoredEvent and CurrentTag; harmless updates and saves still work,
and so do the services that resync."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from artifacts.models import Artifact, CurrentTag, MoveRemoval, Revision
from artifacts.redaction import redact_events
from buzz.chat.channels import channel_edit
from buzz.events.ingest import ingest
from buzz.models import Channel, ClockTimestamp, GuardedChange, Membership, StoredEvent
from buzz.runtime import runtime
from tests.moderation.moderation_support import make_world
from tests.support.factories import revision
from tests.support.inprocess import actor_of


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
    for qs, field, value in (
        (StoredEvent.objects.all(), "deleted_at", None),
        (StoredEvent.objects.all(), "raw", "{}"),
        (CurrentTag.objects.all(), "value", "x"),
        (Artifact.objects.all(), "type", "buzz.other"),
        (Channel.objects.all(), "type", "dm"),
        (Channel.objects.all(), "listed", False),
        (Channel.objects.all(), "ttl_seconds", 60),
    ):
        with pytest.raises(GuardedChange):
            qs.update(**{field: value})
    for qs in (StoredEvent.objects.all(), CurrentTag.objects.all()):
        with pytest.raises(GuardedChange):
            qs.delete()
    StoredEvent.objects.filter(channel_id=channel.uuid).update(received_at=timezone.now())  # harmless: allowed


# --- Model.save(): Django saves an instance through the base manager, which the guarded querysets never see --


def _unchanged(model: Any, pk: Any, **stored: Any) -> bool:
    return bool(model._base_manager.filter(pk=pk, **stored).exists())


@pytest.fixture
def written(transactional_db: None) -> tuple[Channel, str]:
    """A channel with one artifact written through the write path: (the channel, the artifact's d)."""
    world = make_world("guards-save.test")
    writer = actor_of(world.community, world.author)
    d = str(uuid.uuid4())
    _, result = async_to_sync(_ingest_and_close)(writer, revision(world.author, d=d, h=world.ch))
    assert result.ok, result
    return Channel.objects.get(uuid=world.ch), d


async def _ingest_and_close(writer: Any, event: dict[str, Any]) -> Any:
    try:
        return await ingest(writer, event)
    finally:
        await runtime.aclose()


def test_saving_an_instance_that_retires_a_head_or_changes_access_is_refused(written: tuple[Channel, str]) -> None:
    channel, d = written
    artifact = Artifact.objects.get(d=d)
    head = Revision.objects.get(id=artifact.head_id)
    stored = StoredEvent.objects.get(id=artifact.head_id)
    tag = CurrentTag.objects.filter(artifact=artifact).first()
    membership = Membership.objects.filter(channel=channel, removed_at__isnull=True, role="member").first()
    assert tag is not None and membership is not None
    for instance, field, value in (
        (artifact, "retired", True),
        (artifact, "deleted", True),
        (artifact, "head_id", "ab" * 32),
        (head, "redacted_at", timezone.now()),
        (head, "raw", "{}"),
        (stored, "deleted_at", timezone.now()),
        (tag, "value", "changed"),
        (channel, "deleted_at", timezone.now()),
        (channel, "archived_at", timezone.now()),
        (channel, "visibility", "open"),
        (channel, "type", "dm"),
        (channel, "listed", False),
        (channel, "ttl_seconds", 60),
        (membership, "removed_at", timezone.now()),
        (membership, "role", "owner"),
    ):
        model = type(instance)
        before = model._base_manager.filter(pk=instance.pk).values(field).get()[field]
        was = getattr(instance, field)
        setattr(instance, field, value)
        for kwargs in ({}, {"update_fields": [field]}):
            with pytest.raises(GuardedChange):
                instance.save(**kwargs)
        assert _unchanged(model, instance.pk, **{field: before}), (model.__name__, field)
        setattr(instance, field, was)
    # An SQL expression, as the services write the database's clock: a change too.
    membership.removed_at = ClockTimestamp()
    with pytest.raises(GuardedChange):
        membership.save(update_fields=["removed_at"])
    assert _unchanged(Membership, membership.pk, removed_at__isnull=True)
    with pytest.raises(GuardedChange):
        stored.delete()
    assert StoredEvent.objects.filter(pk=stored.pk).exists()
    # One current tag deleted would take the artifact out of every query on it, with no sync told.
    with pytest.raises(GuardedChange):
        tag.delete()
    assert CurrentTag.objects.filter(pk=tag.pk).exists()


def test_saving_an_instance_without_a_guarded_change_still_works(written: tuple[Channel, str]) -> None:
    channel, _ = written
    channel.topic = "saved"
    channel.save()  # every field, the guarded ones unchanged
    membership = Membership.objects.filter(channel=channel, removed_at__isnull=True).first()
    assert membership is not None
    membership.read_mark = 7
    membership.removed_at = timezone.now()  # changed in memory, but not among the fields saved
    membership.save(update_fields=["read_mark"])
    assert Channel.objects.get(pk=channel.pk).topic == "saved"
    assert _unchanged(Membership, membership.pk, read_mark=7, removed_at__isnull=True)
    # The services that resync still save guarded fields (buzz.chat.channels, inside guarded_writes).
    channel_edit(community=channel.community, channel_uuid=channel.uuid, actor=None, changes={"archived": "true"})
    assert Channel.objects.get(pk=channel.pk).archived_at is not None
