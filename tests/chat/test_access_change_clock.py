"""Access changes are stamped with the database's clock, not Python's (issue 9, item 11).

Incremental reads page on these stamps against a start time taken from the database
(NIP-AR "Incremental reads": membership changes use database clock_timestamp()), so a
node whose clock is off must not stamp them. These tests skew this process's clock
(django.utils.timezone.now) by a day and check that every stamp still lies between two
clock_timestamp() reads taken around the change.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection
from django.utils import timezone

from buzz.chat import channels
from buzz.identity.communities import community_create
from buzz.models import Channel, Community, Membership
from buzz.nostr import Signer

SKEW = dt.timedelta(days=1)


def db_clock() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        row = cursor.fetchone()
    assert row is not None
    value: dt.datetime = row[0]
    return value


@pytest.fixture
def community(db: None) -> Community:
    return community_create(host="clock.test", name="Clock")


@pytest.fixture
def skewed_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's clock runs a day behind the database's from here on."""
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() - SKEW)
    yield


class Bracket:
    """clock_timestamp() before and after: a database-stamped value lies in between."""

    def __enter__(self) -> Bracket:
        self.before = db_clock()
        return self

    def __exit__(self, *exc: object) -> None:
        self.after = db_clock()

    def holds(self, stamp: dt.datetime | None) -> bool:
        return stamp is not None and self.before <= stamp <= self.after


def test_joins_and_removals_take_the_database_clock(community: Community, skewed_clock: None) -> None:
    owner, alice, bob = (Signer.generate().pubkey for _ in range(3))
    cid = uuid.uuid4()
    with Bracket() as created:
        channels.channel_create(community=community, channel_uuid=cid, name="general", creator=owner)
    channel = Channel.objects.get(uuid=cid)
    # The skew is real: a field outside this change (auto_now_add, Python's clock) shows it.
    assert channel.created_at < created.before - SKEW / 2
    assert created.holds(Membership.objects.get(channel=channel, pubkey=owner).joined_at)

    with Bracket() as put:
        channels.member_put(community=community, channel_uuid=cid, actor=None, pubkey=alice)
    with Bracket() as joined:
        channels.channel_join(community=community, channel_uuid=cid, pubkey=bob)
    assert put.holds(Membership.objects.get(channel=channel, pubkey=alice).joined_at)
    assert joined.holds(Membership.objects.get(channel=channel, pubkey=bob).joined_at)

    with Bracket() as removed:
        channels.member_remove(community=community, channel_uuid=cid, actor=None, pubkey=alice)
    row = Membership.objects.get(channel=channel, pubkey=alice)
    assert removed.holds(row.removed_at)
    assert put.holds(row.joined_at), "a removal leaves the join stamp alone"


def test_dm_participants_join_on_the_database_clock(community: Community, skewed_clock: None) -> None:
    people = [Signer.generate().pubkey for _ in range(3)]
    cid = uuid.uuid4()
    with Bracket() as created:
        channels.channel_create(
            community=community,
            channel_uuid=cid,
            name="dm",
            creator=people[0],
            channel_type="dm",
            participants=people[1:],
        )
    stamps = Membership.objects.filter(channel__uuid=cid).values_list("joined_at", flat=True)
    assert len(stamps) == 3 and all(created.holds(s) for s in stamps)


def test_visibility_changes_and_deletion_take_the_database_clock(community: Community, skewed_clock: None) -> None:
    owner = Signer.generate().pubkey
    cid = uuid.uuid4()
    channels.channel_create(community=community, channel_uuid=cid, name="general", creator=owner)
    assert Channel.objects.get(uuid=cid).access_changed_at is None

    # Edits that change no read access leave the stamp alone: a rename, archiving, the same visibility.
    for changes in ({"name": "renamed"}, {"archived": "true"}, {"archived": "false"}, {"visibility": "open"}):
        channels.channel_edit(community=community, channel_uuid=cid, actor=None, changes=changes)
    assert Channel.objects.get(uuid=cid).access_changed_at is None

    with Bracket() as private:
        returned = channels.channel_edit(
            community=community, channel_uuid=cid, actor=None, changes={"visibility": "private"}
        )
    assert private.holds(Channel.objects.get(uuid=cid).access_changed_at)
    assert private.holds(returned.access_changed_at), "the service returns the stored stamp"
    with Bracket() as reopened:
        channels.channel_edit(community=community, channel_uuid=cid, actor=None, changes={"visibility": "open"})
    assert reopened.holds(Channel.objects.get(uuid=cid).access_changed_at)

    with Bracket() as deleted:
        channels.channel_delete(community=community, channel_uuid=cid, actor=None)
    assert deleted.holds(Channel.objects.get(uuid=cid).deleted_at)


def test_the_column_default_is_the_database_clock(community: Community) -> None:
    """A membership row written by any path (here raw SQL, no Django default) is stamped by the database."""
    owner = Signer.generate().pubkey
    cid = uuid.uuid4()
    channels.channel_create(community=community, channel_uuid=cid, name="general", creator=owner)
    pk = Channel.objects.get(uuid=cid).pk
    someone = Signer.generate().pubkey
    with Bracket() as inserted, connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO buzz_membership (channel_id, pubkey, role, read_mark) VALUES (%s, %s, 'member', 0)",
            [pk, someone],
        )
    assert inserted.holds(Membership.objects.get(channel_id=pk, pubkey=someone).joined_at)
