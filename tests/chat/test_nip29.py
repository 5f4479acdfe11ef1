"""NIP-29 group events: the channel services' rules, and the same rules over a real relay.

Service tests call buzz.chat.channels directly (inside a rolled-back transaction). The
relay tests send 9000/9001/9002/9005/9007/9008/9021/9022 over a WebSocket and read
the relay-signed 39000/39001/39002 state back with REQ. Every refusal they provoke
is also checked to have stored nothing.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.chat import channels
from buzz.chat.channels import ChannelError
from buzz.models import Channel, Community, Membership, MessageCounter, StoredEvent
from buzz.nostr import Signer, parse_event, verify_event
from tests.support.factories import NOT_A_MEMBER, make_channel, make_community, message, signed, signers
from tests.support.faults import next_for
from tests.support.records import stored
from tests.support.wire import publish, query
from tests.support.wsclient import RelayClient

HOST = "nip29.test"
DELETE_REFUSED = "restricted: that event can't be deleted by you"


@dataclass
class Crew:
    community: Community
    owner: Signer
    admin: Signer
    member: Signer
    outsider: Signer
    open: uuid.UUID
    private: uuid.UUID


def make_crew() -> Crew:
    owner, admin, member, outsider = signers(4)
    community = make_community(HOST, "NIP-29", members=[owner, admin, member, outsider])
    open_ch = make_channel(community, owner, name="open", admins=[admin], members=[member])
    private_ch = make_channel(community, owner, visibility="private", name="private", admins=[admin], members=[member])
    return Crew(community, owner, admin, member, outsider, open_ch, private_ch)


@pytest.fixture
def crew_db(db: None) -> Crew:
    return make_crew()


@pytest.fixture
def crew(transactional_db: None) -> Crew:
    return make_crew()


def state(channel: uuid.UUID, kind: int) -> list[dict[str, Any]]:
    rows = StoredEvent.objects.filter(channel_id=channel, kind=kind)
    return [json.loads(r.raw) for r in rows]


def roster(event: dict[str, Any]) -> dict[str, str]:
    """39002 `["p", pubkey, "", role]` tags as pubkey -> role."""
    return {t[1]: t[3] for t in event["tags"] if t[0] == "p"}


def tag(event: dict[str, Any], name: str) -> list[str] | None:
    return next((t for t in event["tags"] if t[0] == name), None)


def refused(call: Any, reason: str) -> None:
    with pytest.raises(ChannelError) as err:
        call()
    assert err.value.reason == reason


# --- services ------------------------------------------------------------------------


def test_creator_becomes_owner_and_relay_signs_the_state_events(crew_db: Crew) -> None:
    c = crew_db
    owner = Membership.objects.get(channel__uuid=c.open, pubkey=c.owner.pubkey)
    assert owner.role == "owner"
    for kind in (39000, 39001, 39002):
        events = state(c.open, kind)
        assert len(events) == 1, kind
        event = events[0]
        verify_event(parse_event(event))
        assert event["pubkey"] == c.community.relay_pubkey
        assert tag(event, "d") == ["d", str(c.open)]
        assert tag(event, "h") is None
    meta = state(c.open, 39000)[0]
    assert tag(meta, "name") == ["name", "open"]
    assert tag(meta, "public") is not None and tag(meta, "open") is not None
    private_meta = state(c.private, 39000)[0]
    assert tag(private_meta, "private") is not None and tag(private_meta, "closed") is not None
    assert roster(state(c.open, 39002)[0]) == {
        c.owner.pubkey: "owner",
        c.admin.pubkey: "admin",
        c.member.pubkey: "member",
    }
    admins = {t[1]: t[2] for t in state(c.open, 39001)[0]["tags"] if t[0] == "p"}
    assert admins == {c.owner.pubkey: "owner", c.admin.pubkey: "admin"}


def test_state_events_follow_membership_and_metadata_changes(crew_db: Crew) -> None:
    c = crew_db
    kw: dict[str, Any] = {"community": c.community, "channel_uuid": c.open}
    channels.member_put(**kw, actor=c.owner.pubkey, pubkey=c.outsider.pubkey)
    assert roster(state(c.open, 39002)[0])[c.outsider.pubkey] == "member"
    channels.member_remove(**kw, actor=c.owner.pubkey, pubkey=c.outsider.pubkey)
    assert c.outsider.pubkey not in roster(state(c.open, 39002)[0])
    channels.channel_edit(**kw, actor=c.owner.pubkey, changes={"name": "renamed", "archived": "true"})
    meta = state(c.open, 39000)[0]
    assert tag(meta, "name") == ["name", "renamed"]
    assert tag(meta, "archived") == ["archived", "true"]
    channels.channel_edit(**kw, actor=c.owner.pubkey, changes={"archived": "false"})
    assert tag(state(c.open, 39000)[0], "archived") is None
    channels.channel_edit(**kw, actor=c.owner.pubkey, changes={"visibility": "private"})
    assert tag(state(c.open, 39000)[0], "private") is not None
    # Addressable: still exactly one of each after all those changes.
    for kind in (39000, 39001, 39002):
        assert StoredEvent.objects.filter(channel_id=c.open, kind=kind).count() == 1


def test_each_state_change_gets_a_newer_created_at(crew_db: Crew) -> None:
    """Addressable events: a client keeps the newest. Two changes in one second must not tie
    (a tie goes to the lower id, which may be the stale one)."""
    c = crew_db
    kw: dict[str, Any] = {"community": c.community, "channel_uuid": c.open}
    seen = [state(c.open, 39002)[0]["created_at"]]
    for _ in range(3):
        channels.member_put(**kw, actor=None, pubkey=c.outsider.pubkey)
        seen.append(state(c.open, 39002)[0]["created_at"])
        channels.member_remove(**kw, actor=None, pubkey=c.outsider.pubkey)
        seen.append(state(c.open, 39002)[0]["created_at"])
    assert seen == sorted(set(seen)), seen
    metas = [state(c.open, k)[0]["created_at"] for k in (39000, 39001, 39002)]
    assert metas == [seen[-1]] * 3


def test_last_owner_cannot_be_demoted_removed_or_leave(crew_db: Crew) -> None:
    c = crew_db
    kw: dict[str, Any] = {"community": c.community, "channel_uuid": c.open}
    refused(
        lambda: channels.member_put(**kw, actor=None, pubkey=c.owner.pubkey, role="admin"),
        "invalid: the last owner can't be demoted",
    )
    refused(
        lambda: channels.member_put(**kw, actor=c.owner.pubkey, pubkey=c.owner.pubkey, role="member"),
        "invalid: the last owner can't be demoted",
    )
    refused(
        lambda: channels.member_remove(**kw, actor=None, pubkey=c.owner.pubkey),
        "invalid: the last owner can't leave or be removed",
    )
    refused(
        lambda: channels.member_remove(**kw, actor=c.owner.pubkey, pubkey=c.owner.pubkey),
        "invalid: the last owner can't leave or be removed",
    )
    # With a second owner the first may leave; then the second is the last one.
    channels.member_put(**kw, actor=c.owner.pubkey, pubkey=c.admin.pubkey, role="owner")
    channels.member_remove(**kw, actor=c.owner.pubkey, pubkey=c.owner.pubkey)
    refused(
        lambda: channels.member_remove(**kw, actor=c.admin.pubkey, pubkey=c.admin.pubkey),
        "invalid: the last owner can't leave or be removed",
    )


def test_only_owners_and_admins_change_an_existing_members_role(crew_db: Crew) -> None:
    """A 9000 naming someone already in the channel changes their role only when an owner or an admin sends
    it, down as well as up; one that names no role changes nothing (the member keeps theirs)."""
    c = crew_db
    opn: dict[str, Any] = {"community": c.community, "channel_uuid": c.open}
    channel = Channel.objects.get(community=c.community, uuid=c.open)

    def role(pubkey: str) -> str | None:
        return channels.role_of(channel, pubkey)

    assert (role(c.admin.pubkey), role(c.member.pubkey)) == ("admin", "member")
    # A member's bare 9000 naming the admin: the admin stays an admin.
    channels.member_put(**opn, actor=c.member.pubkey, pubkey=c.admin.pubkey, role=None)
    assert role(c.admin.pubkey) == "admin"
    # Naming a role: a demotion is a manager's.
    refused(
        lambda: channels.member_put(**opn, actor=c.member.pubkey, pubkey=c.admin.pubkey, role="member"),
        "restricted: only owners and admins change a member's role",
    )
    assert role(c.admin.pubkey) == "admin"
    # A guest's bare 9000 naming itself: still a guest.
    channels.member_put(**opn, actor=None, pubkey=c.outsider.pubkey, role="guest")
    channels.member_put(**opn, actor=c.outsider.pubkey, pubkey=c.outsider.pubkey, role=None)
    assert role(c.outsider.pubkey) == "guest"
    refused(
        lambda: channels.member_put(**opn, actor=c.outsider.pubkey, pubkey=c.outsider.pubkey, role="member"),
        "restricted: only owners and admins change a member's role",
    )
    # The owner's bare 9000 naming the admin keeps the admin; naming a role changes it.
    channels.member_put(**opn, actor=c.owner.pubkey, pubkey=c.admin.pubkey, role=None)
    assert role(c.admin.pubkey) == "admin"
    channels.member_put(**opn, actor=c.owner.pubkey, pubkey=c.admin.pubkey, role="member")
    assert role(c.admin.pubkey) == "member"
    # A new member named without a role joins as a member.
    channels.member_put(**opn, actor=c.member.pubkey, pubkey=Signer.generate().pubkey, role=None)


def test_channel_roles_decide_who_adds_and_removes(crew_db: Crew) -> None:
    c = crew_db
    priv: dict[str, Any] = {"community": c.community, "channel_uuid": c.private}
    opn: dict[str, Any] = {"community": c.community, "channel_uuid": c.open}
    refused(
        lambda: channels.member_put(**priv, actor=c.member.pubkey, pubkey=c.outsider.pubkey),
        "restricted: only owners and admins add members to a private channel",
    )
    channels.member_put(**priv, actor=c.admin.pubkey, pubkey=c.outsider.pubkey)
    channels.member_put(**opn, actor=c.member.pubkey, pubkey=c.outsider.pubkey)  # open: any member adds
    refused(
        lambda: channels.member_put(**opn, actor=c.member.pubkey, pubkey=c.outsider.pubkey, role="admin"),
        "restricted: only owners and admins assign roles",
    )
    refused(
        lambda: channels.member_put(**opn, actor=c.admin.pubkey, pubkey=c.member.pubkey, role="owner"),
        "restricted: only an owner makes another owner",
    )
    refused(
        lambda: channels.member_remove(**opn, actor=c.admin.pubkey, pubkey=c.owner.pubkey),
        "restricted: only an owner removes an owner",
    )
    refused(
        lambda: channels.member_remove(**opn, actor=c.member.pubkey, pubkey=c.outsider.pubkey),
        "restricted: only owners and admins remove other members",
    )
    refused(
        lambda: channels.member_put(**opn, actor=None, pubkey=c.member.pubkey, role="king"),
        "invalid: role must be one of owner, admin, member, guest, bot",
    )
    channels.member_remove(**opn, actor=c.admin.pubkey, pubkey=c.outsider.pubkey)
    row = Membership.objects.get(channel__uuid=c.open, pubkey=c.outsider.pubkey)
    assert row.removed_at is not None  # soft removal: the row stays


def test_dm_participants_are_fixed(crew_db: Crew) -> None:
    c = crew_db
    dm = uuid.uuid4()
    channels.channel_create(
        community=c.community,
        channel_uuid=dm,
        name="dm",
        creator=c.owner.pubkey,
        channel_type="dm",
        participants=[c.member.pubkey],
    )
    row = Channel.objects.get(uuid=dm)
    assert (row.visibility, row.listed) == ("private", False)
    assert {m.pubkey for m in channels.active_members(row)} == {c.owner.pubkey, c.member.pubkey}
    kw: dict[str, Any] = {"community": c.community, "channel_uuid": dm}
    refused(
        lambda: channels.member_put(**kw, actor=None, pubkey=c.outsider.pubkey),
        "invalid: a DM's participants can't change",
    )
    refused(
        lambda: channels.member_remove(**kw, actor=c.member.pubkey, pubkey=c.member.pubkey),
        "invalid: a DM's participants can't change",
    )
    refused(
        lambda: channels.channel_create(
            community=c.community, channel_uuid=uuid.uuid4(), name="solo", creator=c.owner.pubkey, channel_type="dm"
        ),
        "invalid: a DM has 2 to 9 participants, the creator included",
    )


def test_edit_metadata_rules(crew_db: Crew) -> None:
    c = crew_db
    kw: dict[str, Any] = {"community": c.community, "channel_uuid": c.open}
    channels.channel_edit(**kw, actor=c.member.pubkey, changes={"topic": "lunch", "purpose": "food"})
    assert Channel.objects.get(uuid=c.open).topic == "lunch"
    refused(
        lambda: channels.channel_edit(**kw, actor=c.member.pubkey, changes={"name": "mine"}),
        "restricted: only owners and admins edit this metadata",
    )
    refused(lambda: channels.channel_edit(**kw, actor=c.outsider.pubkey, changes={"topic": "x"}), NOT_A_MEMBER)
    refused(
        lambda: channels.channel_edit(**kw, actor=c.owner.pubkey, changes={"colour": "red"}),
        "invalid: unknown metadata field 'colour'",
    )
    refused(
        lambda: channels.channel_edit(**kw, actor=c.owner.pubkey, changes={"archived": "yes"}),
        "invalid: archived must be true or false",
    )
    channels.channel_edit(**kw, actor=c.admin.pubkey, changes={"archived": "true"})
    assert Channel.objects.get(uuid=c.open).archived_at is not None
    refused(
        lambda: channels.channel_edit(**kw, actor=c.owner.pubkey, changes={"name": "late"}),
        "invalid: channel is archived",
    )
    channels.channel_edit(**kw, actor=c.owner.pubkey, changes={"archived": "false"})
    assert Channel.objects.get(uuid=c.open).archived_at is None


def test_join_is_for_open_channels_only(crew_db: Crew) -> None:
    c = crew_db
    open_channel = Channel.objects.get(uuid=c.open)
    MessageCounter.objects.bulk_create(
        [
            MessageCounter(channel=open_channel, shard=0, message_count=4),
            MessageCounter(channel=open_channel, shard=5, message_count=3),
        ]
    )
    channels.channel_join(community=c.community, channel_uuid=c.open, pubkey=c.outsider.pubkey)
    joined = Membership.objects.get(channel__uuid=c.open, pubkey=c.outsider.pubkey, removed_at__isnull=True)
    assert (joined.role, joined.read_mark) == ("member", 7)  # a new member starts with nothing unread
    refused(
        lambda: channels.channel_join(community=c.community, channel_uuid=c.open, pubkey=c.outsider.pubkey),
        "duplicate: already a member",
    )
    refused(
        lambda: channels.channel_join(community=c.community, channel_uuid=c.private, pubkey=c.outsider.pubkey),
        NOT_A_MEMBER,
    )
    refused(
        lambda: channels.channel_join(community=c.community, channel_uuid=uuid.uuid4(), pubkey=c.outsider.pubkey),
        NOT_A_MEMBER,
    )
    channels.channel_edit(community=c.community, channel_uuid=c.open, actor=None, changes={"archived": "true"})
    refused(
        lambda: channels.channel_join(community=c.community, channel_uuid=c.open, pubkey=Signer.generate().pubkey),
        "invalid: channel is archived",
    )


def test_delete_group_is_owner_only_and_drops_state(crew_db: Crew) -> None:
    c = crew_db
    kw: dict[str, Any] = {"community": c.community, "channel_uuid": c.open}
    refused(lambda: channels.channel_delete(**kw, actor=c.admin.pubkey), "restricted: only an owner deletes a channel")
    channels.channel_delete(**kw, actor=c.owner.pubkey)
    assert Channel.objects.get(uuid=c.open).deleted_at is not None
    assert not StoredEvent.objects.filter(channel_id=c.open, kind__in=channels.STATE_KINDS).exists()
    refused(lambda: channels.member_put(**kw, actor=None, pubkey=c.outsider.pubkey), NOT_A_MEMBER)
    refused(lambda: channels.channel_join(**kw, pubkey=c.outsider.pubkey), NOT_A_MEMBER)


# --- over a relay ------------------------------------------------------------------------


async def rejected(client: RelayClient, event: dict[str, Any], reason: str) -> None:
    """The event is refused with exactly `reason`, and nothing was stored."""
    reply = await publish(client, event)
    assert reply[2:] == [False, reason], reply
    assert not await stored(event["id"])


async def accepted(client: RelayClient, event: dict[str, Any]) -> None:
    reply = await publish(client, event)
    assert reply[2] is True, reply
    assert await stored(event["id"])


def connect(relay: Any) -> Any:
    return RelayClient.connect(relay.ws_url, host=HOST)


async def state_over_req(client: RelayClient, channel: uuid.UUID, kinds: list[int]) -> dict[int, dict[str, Any]]:
    end, events = await query(client, f"st-{uuid.uuid4().hex[:8]}", {"kinds": kinds, "#d": [str(channel)]})
    assert end[0] == "EOSE", end
    return {e["kind"]: e for e in events}


@sync_to_async
def membership(channel: uuid.UUID, pubkey: str) -> Membership | None:
    return Membership.objects.filter(channel__uuid=channel, pubkey=pubkey).order_by("-id").first()


@sync_to_async
def channel_row(channel: uuid.UUID) -> Channel | None:
    return Channel.objects.filter(uuid=channel).first()


async def test_ws_9007_creates_a_channel_and_its_state(crew: Crew, relay_factory: Any) -> None:
    c = crew
    relay = relay_factory()
    new = uuid.uuid4()
    async with connect(relay) as owner:
        assert (await owner.auth(c.owner))[2] is True
        await rejected(owner, signed(c.owner, 9007, [["h", str(new)]]), "invalid: kind 9007 needs one name tag")
        await rejected(
            owner,
            signed(c.owner, 9007, [["h", str(new).upper()], ["name", "x"]]),
            "invalid: h tag must be a lowercase channel UUID",
        )
        await accepted(
            owner,
            signed(
                c.owner, 9007, [["h", str(new)], ["name", "Launch"], ["visibility", "private"], ["about", "rockets"]]
            ),
        )
        row = await channel_row(new)
        assert row is not None and (row.name, row.visibility, row.about) == ("Launch", "private", "rockets")
        assert (await membership(new, c.owner.pubkey)).role == "owner"  # type: ignore[union-attr]
        await rejected(
            owner, signed(c.owner, 9007, [["h", str(new)], ["name", "again"]]), "invalid: that channel id is taken"
        )
        got = await state_over_req(owner, new, [39000, 39001, 39002])
        assert sorted(got) == [39000, 39001, 39002]
        assert {e["pubkey"] for e in got.values()} == {c.community.relay_pubkey}
        assert tag(got[39000], "name") == ["name", "Launch"]
        assert tag(got[39000], "private") is not None
        assert roster(got[39002]) == {c.owner.pubkey: "owner"}
        # The channel type as Buzz clients send it (channel_type) counts as the type tag.
        forum = uuid.uuid4()
        await accepted(owner, signed(c.owner, 9007, [["h", str(forum)], ["name", "Q&A"], ["channel_type", "forum"]]))
        assert (await channel_row(forum)).type == "forum"  # type: ignore[union-attr]


@pytest.mark.parametrize("named", [True, False], ids=["d-named", "wide"])
async def test_a_live_req_on_the_state_kinds_gets_each_replacement(crew: Crew, relay_factory: Any, named: bool) -> None:
    """The relay-signed state names its channel in d, not h: a live REQ places it by d (it got none live)."""
    c = crew
    relay = relay_factory()
    ch = str(c.private)
    flt: dict[str, Any] = {"kinds": [39000, 39002], **({"#d": [ch]} if named else {})}
    async with connect(relay) as owner, connect(relay) as member:
        for client, who in ((owner, c.owner), (member, c.member)):
            assert (await client.auth(who))[2] is True
        await member.send_json(["REQ", "live", flt])
        while (m := await next_for(member, "live"))[0] == "EVENT":
            pass
        assert m[0] == "EOSE", m
        await accepted(owner, signed(c.owner, 9002, [["h", ch], ["name", "renamed"]]))
        m = await next_for(member, "live")
        assert m[0] == "EVENT" and m[2]["kind"] == 39000 and tag(m[2], "name") == ["name", "renamed"], m
        assert tag(m[2], "d") == ["d", ch]
        # Each change replaces the whole state: the rename's roster, then the roster that names the new member.
        await accepted(owner, signed(c.owner, 9000, [["h", ch], ["p", c.outsider.pubkey]]))
        rosters: list[dict[str, str]] = []
        while not rosters or c.outsider.pubkey not in rosters[-1]:
            m = await next_for(member, "live")
            assert m[0] == "EVENT" and tag(m[2], "d") == ["d", ch], m
            if m[2]["kind"] == 39002:
                rosters.append(roster(m[2]))
        assert rosters[-1][c.outsider.pubkey] == "member" and len(rosters) <= 2, rosters


async def test_ws_9000_and_9001_change_membership_by_role(crew: Crew, relay_factory: Any) -> None:
    c = crew
    relay = relay_factory()
    ch = str(c.private)
    async with connect(relay) as owner, connect(relay) as member, connect(relay) as outsider:
        for client, who in ((owner, c.owner), (member, c.member), (outsider, c.outsider)):
            assert (await client.auth(who))[2] is True
        end, _ = await query(outsider, "o1", {"#h": [ch]})
        assert end == ["CLOSED", "o1", NOT_A_MEMBER]
        await rejected(
            member,
            signed(c.member, 9000, [["h", ch], ["p", c.outsider.pubkey]]),
            "restricted: only owners and admins add members to a private channel",
        )
        await rejected(
            owner,
            signed(c.owner, 9000, [["h", ch], ["p", "nothex"]]),
            "invalid: a p tag with a 64-hex pubkey is required",
        )
        await accepted(owner, signed(c.owner, 9000, [["h", ch], ["p", c.outsider.pubkey]]))
        end, _ = await query(outsider, "o2", {"#h": [ch]})
        assert end[0] == "EOSE"
        # The new member reads the private channel's roster, which now names it.
        got = await state_over_req(outsider, c.private, [39002])
        assert roster(got[39002])[c.outsider.pubkey] == "member"
        await rejected(
            owner,
            signed(c.owner, 9000, [["h", ch], ["p", c.owner.pubkey, "admin"]]),
            "invalid: the last owner can't be demoted",
        )
        await rejected(
            member,
            signed(c.member, 9001, [["h", ch], ["p", c.admin.pubkey]]),
            "restricted: only owners and admins remove other members",
        )
        await accepted(owner, signed(c.owner, 9001, [["h", ch], ["p", c.outsider.pubkey]]))
        assert (await membership(c.private, c.outsider.pubkey)).removed_at is not None  # type: ignore[union-attr]
        end, _ = await query(outsider, "o3", {"#h": [ch]})
        assert end == ["CLOSED", "o3", NOT_A_MEMBER]
        await rejected(outsider, message(c.outsider, ch), NOT_A_MEMBER)
        got = await state_over_req(owner, c.private, [39002])
        assert c.outsider.pubkey not in roster(got[39002])
        # The role as Buzz clients send it, in a role tag, counts as the p tag's; the two may not disagree.
        await accepted(owner, signed(c.owner, 9000, [["h", ch], ["p", c.outsider.pubkey], ["role", "admin"]]))
        assert roster((await state_over_req(owner, c.private, [39002]))[39002])[c.outsider.pubkey] == "admin"
        await rejected(
            owner,
            signed(c.owner, 9000, [["h", ch], ["p", c.outsider.pubkey, "member"], ["role", "admin"]]),
            "invalid: the p tag's role and the role tag differ",
        )


async def test_ws_a_members_9000_naming_an_admin_changes_nothing(crew: Crew, relay_factory: Any) -> None:
    """In an open channel any member adds members; a member's 9000 naming the admin without a role keeps the
    admin an admin, and one naming the member role is refused."""
    c = crew
    relay = relay_factory()
    ch = str(c.open)
    async with connect(relay) as member:
        assert (await member.auth(c.member))[2] is True
        await accepted(member, signed(c.member, 9000, [["h", ch], ["p", c.admin.pubkey]]))
        await rejected(
            member,
            signed(c.member, 9000, [["h", ch], ["p", c.admin.pubkey, "member"]]),
            "restricted: only owners and admins change a member's role",
        )
        roles = await sync_to_async(
            lambda: dict(Membership.objects.filter(channel__uuid=c.open, removed_at=None).values_list("pubkey", "role"))
        )()
        assert roles[c.admin.pubkey] == "admin"


async def test_ws_a_group_event_sent_again_is_a_duplicate_and_not_applied_again(crew: Crew, relay_factory: Any) -> None:
    """A client that lost an OK sends the same event again: answered duplicate, as a message is, and not
    applied again (an old 9001 would remove the member added back since)."""
    c = crew
    relay = relay_factory()
    ch, new = str(c.open), uuid.uuid4()
    async with connect(relay) as owner:
        assert (await owner.auth(c.owner))[2] is True
        create = signed(c.owner, 9007, [["h", str(new)], ["name", "Twice"]])
        await accepted(owner, create)
        assert (await publish(owner, create))[2:] == [True, "duplicate: already have this event"]
        remove = signed(c.owner, 9001, [["h", ch], ["p", c.member.pubkey]])
        await accepted(owner, remove)
        await accepted(owner, signed(c.owner, 9000, [["h", ch], ["p", c.member.pubkey]]))
        assert (await publish(owner, remove))[2:] == [True, "duplicate: already have this event"]
        latest = await membership(c.open, c.member.pubkey)
        assert latest is not None and latest.removed_at is None  # still a member


async def test_ws_9021_join_and_9022_leave(crew: Crew, relay_factory: Any) -> None:
    c = crew
    relay = relay_factory()
    async with connect(relay) as owner, connect(relay) as outsider:
        assert (await owner.auth(c.owner))[2] is True
        assert (await outsider.auth(c.outsider))[2] is True
        await rejected(outsider, signed(c.outsider, 9021, [["h", str(c.private)]]), NOT_A_MEMBER)
        # A member's join is duplicate:, in a private channel too (NIP-29), never "not a channel member".
        for channel in (c.private, c.open):
            join = signed(c.owner, 9021, [["h", str(channel)]])
            assert (await publish(owner, join))[2:] == [True, "duplicate: already a member"], channel
        await accepted(outsider, signed(c.outsider, 9021, [["h", str(c.open)]]))
        joined = await membership(c.open, c.outsider.pubkey)
        assert joined is not None and joined.removed_at is None and joined.role == "member"
        assert roster((await state_over_req(outsider, c.open, [39002]))[39002])[c.outsider.pubkey] == "member"
        await accepted(outsider, signed(c.outsider, 9022, [["h", str(c.open)]]))
        assert (await membership(c.open, c.outsider.pubkey)).removed_at is not None  # type: ignore[union-attr]
        await rejected(outsider, signed(c.outsider, 9022, [["h", str(c.open)]]), NOT_A_MEMBER)
        await rejected(
            owner, signed(c.owner, 9022, [["h", str(c.open)]]), "invalid: the last owner can't leave or be removed"
        )


async def test_ws_9002_edits_archives_unarchives_and_changes_visibility(crew: Crew, relay_factory: Any) -> None:
    c = crew
    relay = relay_factory()
    ch = str(c.open)
    async with connect(relay) as owner, connect(relay) as member, connect(relay) as outsider:
        for client, who in ((owner, c.owner), (member, c.member), (outsider, c.outsider)):
            assert (await client.auth(who))[2] is True
        await accepted(owner, signed(c.owner, 9002, [["h", ch], ["name", "Renamed"], ["about", "new"]]))
        assert tag((await state_over_req(member, c.open, [39000]))[39000], "name") == ["name", "Renamed"]
        await rejected(
            member,
            signed(c.member, 9002, [["h", ch], ["name", "Mine"]]),
            "restricted: only owners and admins edit this metadata",
        )
        await accepted(member, signed(c.member, 9002, [["h", ch], ["topic", "standup"]]))
        await rejected(
            owner, signed(c.owner, 9002, [["h", ch], ["archived", "maybe"]]), "invalid: archived must be true or false"
        )

        await accepted(owner, signed(c.owner, 9002, [["h", ch], ["archived", "true"]]))
        await rejected(member, message(c.member, ch), "invalid: channel is archived")
        assert tag((await state_over_req(member, c.open, [39000]))[39000], "archived") == ["archived", "true"]
        end, _ = await query(member, "m1", {"#h": [ch]})
        assert end[0] == "EOSE"  # an archived channel is still readable
        # Archived, it takes no other edit, not even beside archived=true; unarchiving may come with one.
        for edit in ([["name", "Sneaky"]], [["archived", "true"], ["name", "Sneaky"]]):
            await rejected(owner, signed(c.owner, 9002, [["h", ch], *edit]), "invalid: channel is archived")
        assert tag((await state_over_req(member, c.open, [39000]))[39000], "name") == ["name", "Renamed"]
        await accepted(owner, signed(c.owner, 9002, [["h", ch], ["archived", "true"]]))  # changes nothing
        await accepted(owner, signed(c.owner, 9002, [["h", ch], ["archived", "false"]]))
        await accepted(member, message(c.member, ch))
        assert tag((await state_over_req(member, c.open, [39000]))[39000], "archived") is None

        end, _ = await query(outsider, "o1", {"#h": [ch]})
        assert end[0] == "EOSE"
        await accepted(owner, signed(c.owner, 9002, [["h", ch], ["visibility", "private"]]))
        assert (await channel_row(c.open)).visibility == "private"  # type: ignore[union-attr]
        end, _ = await query(outsider, "o2", {"#h": [ch]})
        assert end == ["CLOSED", "o2", NOT_A_MEMBER]
        await rejected(outsider, message(c.outsider, ch), NOT_A_MEMBER)
        await accepted(owner, signed(c.owner, 9002, [["h", ch], ["visibility", "open"]]))
        await accepted(outsider, message(c.outsider, ch))


async def test_ws_9005_deletes_messages_for_author_or_manager(crew: Crew, relay_factory: Any) -> None:
    c = crew
    relay = relay_factory()
    ch = str(c.open)
    async with connect(relay) as admin, connect(relay) as member, connect(relay) as outsider:
        for client, who in ((admin, c.admin), (member, c.member), (outsider, c.outsider)):
            assert (await client.auth(who))[2] is True
        own = message(c.member, ch, "typo")
        foreign = message(c.outsider, ch, "spam")  # an open channel takes a non-member's message
        await accepted(member, own)
        await accepted(outsider, foreign)
        meta = (await state_over_req(member, c.open, [39000]))[39000]

        deletion = signed(c.member, 9005, [["e", own["id"]], ["h", ch]])
        await accepted(member, deletion)
        # Sent again after a lost OK: the stored request is confirmed, as any group event's is.
        assert (await publish(member, deletion))[2:] == [True, "duplicate: already have this event"]
        await rejected(member, signed(c.member, 9005, [["e", foreign["id"]], ["h", ch]]), DELETE_REFUSED)
        await rejected(member, signed(c.member, 9005, [["e", "ab" * 32], ["h", ch]]), DELETE_REFUSED)
        await rejected(admin, signed(c.admin, 9005, [["e", meta["id"]], ["h", ch]]), DELETE_REFUSED)
        await rejected(admin, signed(c.admin, 9005, [["e", foreign["id"]], ["h", str(c.private)]]), DELETE_REFUSED)
        await rejected(admin, signed(c.admin, 9005, [["h", ch]]), "invalid: kind 9005 needs exactly one e tag")
        end, events = await query(member, "m1", {"#h": [ch], "kinds": [9]})
        assert end[0] == "EOSE" and [e["id"] for e in events] == [foreign["id"]]
        await accepted(admin, signed(c.admin, 9005, [["e", foreign["id"]], ["h", ch]]))
        end, events = await query(member, "m2", {"#h": [ch], "kinds": [9]})
        assert end[0] == "EOSE" and events == []


async def test_ws_9008_deletes_the_group_for_its_owner_only(crew: Crew, relay_factory: Any) -> None:
    c = crew
    relay = relay_factory()
    ch = str(c.private)
    async with connect(relay) as owner, connect(relay) as admin, connect(relay) as member:
        for client, who in ((owner, c.owner), (admin, c.admin), (member, c.member)):
            assert (await client.auth(who))[2] is True
        await rejected(admin, signed(c.admin, 9008, [["h", ch]]), "restricted: only an owner deletes a channel")
        await accepted(owner, signed(c.owner, 9008, [["h", ch]]))
        assert (await channel_row(c.private)).deleted_at is not None  # type: ignore[union-attr]
        end, _ = await query(member, "m1", {"#h": [ch]})
        assert end == ["CLOSED", "m1", NOT_A_MEMBER]
        await rejected(member, message(c.member, ch), NOT_A_MEMBER)
        assert await state_over_req(member, c.private, [39000, 39001, 39002]) == {}


async def test_ws_state_events_reach_readers_of_the_channel_by_d_tag(crew: Crew, relay_factory: Any) -> None:
    """39000-39002 carry d=channel: REQ #d finds them, for readers of the channel only."""
    c = crew
    relay = relay_factory()
    async with connect(relay) as member, connect(relay) as outsider:
        assert (await member.auth(c.member))[2] is True
        assert (await outsider.auth(c.outsider))[2] is True
        got = await state_over_req(member, c.private, [39000, 39001, 39002])
        assert sorted(got) == [39000, 39001, 39002]
        assert await state_over_req(outsider, c.private, [39000, 39001, 39002]) == {}
        # A listed open channel's state is public to relay members.
        assert sorted(await state_over_req(outsider, c.open, [39000, 39002])) == [39000, 39002]


async def test_ws_h_filter_matches_only_events_carrying_that_h_tag(crew: Crew, relay_factory: Any) -> None:
    """NIP-01: #h matches events with an h tag of that value. The state events have none."""
    c = crew
    relay = relay_factory()
    async with connect(relay) as member:
        assert (await member.auth(c.member))[2] is True
        end, events = await query(member, "h1", {"#h": [str(c.private)]})
        assert end[0] == "EOSE"
        assert [e["kind"] for e in events if not any(t[0] == "h" for t in e["tags"])] == []


async def test_ws_accepted_group_events_reach_live_subscribers_of_the_channel(crew: Crew, relay_factory: Any) -> None:
    """A stored 9000/9002/9005 is returned by REQ #h later; a subscriber that is already live gets it too."""
    c = crew
    relay = relay_factory()
    ch = str(c.private)
    async with connect(relay) as owner, connect(relay) as member:
        assert (await owner.auth(c.owner))[2] is True
        assert (await member.auth(c.member))[2] is True
        await member.send_json(["REQ", "live", {"#h": [ch]}])
        await member.expect("EOSE", where=lambda m: m[1] == "live")
        post = message(c.owner, ch)
        sent = [
            post,
            signed(c.owner, 9000, [["h", ch], ["p", c.outsider.pubkey]]),
            signed(c.owner, 9002, [["h", ch], ["topic", "launch day"]]),
            signed(c.owner, 9005, [["e", post["id"]], ["h", ch]]),
        ]
        for event in sent:
            await accepted(owner, event)
        for event in sent:
            got = await member.expect("EVENT", where=lambda m, i=event["id"]: m[1] == "live" and m[2]["id"] == i)
            assert got[2] == event
