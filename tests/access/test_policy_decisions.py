"""The policy's pure decisions (buzz.access.policy decide_post / decide_read / decide_manage) on hand-built facts.

No database: each test builds the ChannelAccess facts that load_access_many would read and an Actor
(NIP-42 login, or a bearer token with its scopes and channel limit) and calls the decision directly.

The order is REFERENCE.md's "Write checks for kind 9, in order" (steps 1-4, signature, time, size
and pubkey, are buzz.events.ingest's, before the policy):
  5. scope messages:write (NIP-42 holds every scope, a token only its own);
  6. ban ("blocked: ..."; an agent's owner's ban is folded into `banned` by the loader), then timeout
     ("restricted: ... timed out until <unix>");
  7. the h tag (channel_of), and a channel-limited token must cover the channel;
  8. a member, or the channel is open, else "restricted: not a channel member";
  9. not archived ("invalid: channel is archived").
REFERENCE.md does not say where a revoked or expired token falls; the relay refuses it with the
credential, right after the scope check and before the ban. Reads apply the same order without the
timeout and the archive; NIP-29 management applies it with its own scope and, when creating, without
step 8 (the channel does not exist yet). A DM is private whatever its visibility field says, and a
deleted channel answers like a missing one (no existence oracle).

A hypothesis test compares every decision with a small oracle written from that text, not from the code.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from buzz.access.policy import (
    KNOWN_SCOPES,
    ChannelAccess,
    Decision,
    channel_of,
    decide_manage,
    decide_post,
    decide_read,
    group_event_scope,
    parse_channel_id,
)
from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo
from buzz.nostr import ProtocolError, Signer

COMMUNITY = CommunityInfo(
    id=1,
    host="policy.test",
    name="Policy",
    description="",
    public_url="ws://policy.test/",
    relay_pubkey="ab" * 32,
    relay_secret="",
    admission="members",
)
PUBKEY = "cd" * 32
CHANNEL = uuid.UUID("0b7e6d2c-3f5a-4c1e-9d8b-2a4f6e8c0d1b")
ELSEWHERE = uuid.UUID("5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a")
UNTIL = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)

SCOPE_WRITE = "restricted: this token lacks the messages:write scope"
SCOPE_READ = "restricted: this token lacks the messages:read scope"
TOKEN_INVALID = "auth-required: this token is revoked or expired"
BANNED = "blocked: this pubkey is banned from the community"
TIMED_OUT = f"restricted: timed out until {int(UNTIL.timestamp())}"
TOKEN_CHANNEL = "restricted: this token does not cover that channel"
NOT_A_MEMBER = "restricted: not a channel member"
ARCHIVED = "invalid: channel is archived"

ROLES = ("owner", "admin", "member", "guest", "bot")
TYPES = ("stream", "forum", "dm", "workflow")


def nip42() -> Actor:
    """A NIP-42 login: every scope, every channel, no token."""
    return Actor(community=COMMUNITY, pubkey=PUBKEY)


def token(*scopes: str, channels: tuple[uuid.UUID, ...] | None = None) -> Actor:
    limit = None if channels is None else frozenset(str(c) for c in channels)
    return Actor(community=COMMUNITY, pubkey=PUBKEY, scopes=frozenset(scopes), channels=limit, token_id=7)


def facts(
    *,
    visibility: str = "open",
    type_: str = "stream",
    role: str | None = "member",
    archived: bool = False,
    deleted: bool = False,
    banned: bool = False,
    timeout_until: dt.datetime | None = None,
    token_ok: bool = True,
    exists: bool = True,
) -> ChannelAccess:
    """What load_access_many would read; a missing channel has no row (every channel field NULL)."""
    if not exists:
        return ChannelAccess(None, None, None, False, False, None, banned, timeout_until, token_ok)
    return ChannelAccess(42, visibility, type_, archived, deleted, role, banned, timeout_until, token_ok)


def verdict(decision: Decision) -> str | None:
    """None when allowed, else the reason; the decision always carries the facts it was made on."""
    assert decision.ok == (decision.reason == ""), decision
    return None if decision.ok else decision.reason


def post(actor: Actor, access: ChannelAccess, channel: uuid.UUID = CHANNEL) -> str | None:
    decision = decide_post(actor, channel, access)
    assert decision.access is access
    return verdict(decision)


def read(actor: Actor, access: ChannelAccess, channel: uuid.UUID = CHANNEL) -> str | None:
    return verdict(decide_read(actor, channel, access))


def manage(actor: Actor, access: ChannelAccess, *, scope: str = "channels:write", creating: bool = False) -> str | None:
    return verdict(decide_manage(actor, CHANNEL, access, scope=scope, creating=creating))


# --- each fact alone -------------------------------------------------------------------------------


def test_a_member_posts_and_reads_with_nip42_or_a_scoped_token() -> None:
    for actor in (nip42(), token("messages:read", "messages:write"), token("messages:write", channels=(CHANNEL,))):
        for visibility in ("open", "private"):
            assert post(actor, facts(visibility=visibility)) is None, actor
    assert read(token("messages:read"), facts(visibility="private")) is None


def test_scope() -> None:
    assert post(token("messages:read"), facts()) == SCOPE_WRITE
    assert read(token("messages:write", "channels:read"), facts()) == SCOPE_READ
    assert post(token(), facts()) == SCOPE_WRITE
    assert manage(token("messages:write"), facts(), scope="channels:write") == (
        "restricted: this token lacks the channels:write scope"
    )
    assert manage(token("admin:channels"), facts(), scope="admin:channels") is None


def test_revoked_or_expired_token() -> None:
    dead = facts(token_ok=False)
    actor = token("messages:read", "messages:write")
    assert post(actor, dead) == TOKEN_INVALID
    assert read(actor, dead) == TOKEN_INVALID
    assert manage(token("channels:write"), dead) == TOKEN_INVALID


def test_ban_refuses_posts_reads_and_management() -> None:
    banned = facts(banned=True)
    assert post(nip42(), banned) == BANNED
    assert read(nip42(), banned) == BANNED
    assert manage(nip42(), banned, creating=True) == BANNED


def test_timeout_refuses_writes_not_reads() -> None:
    timed_out = facts(timeout_until=UNTIL)
    assert post(nip42(), timed_out) == TIMED_OUT
    assert manage(nip42(), timed_out) == TIMED_OUT
    assert read(nip42(), timed_out) is None


def test_token_channel_limit() -> None:
    limited = token("messages:read", "messages:write", channels=(ELSEWHERE,))
    assert post(limited, facts()) == TOKEN_CHANNEL
    assert read(limited, facts()) == TOKEN_CHANNEL
    assert post(limited, facts(), channel=ELSEWHERE) is None
    assert read(limited, facts(), channel=ELSEWHERE) is None
    # An empty limit covers nothing (not "every channel").
    assert post(token("messages:write", channels=()), facts()) == TOKEN_CHANNEL


@pytest.mark.parametrize("role", ROLES)
def test_every_channel_role_may_post_and_read(role: str) -> None:
    for visibility in ("open", "private"):
        for type_ in TYPES:
            access = facts(visibility=visibility, type_=type_, role=role)
            assert post(nip42(), access) is None, (role, visibility, type_)
            assert read(nip42(), access) is None, (role, visibility, type_)


def test_nonmember_open_private_dm() -> None:
    assert post(nip42(), facts(role=None)) is None
    assert read(nip42(), facts(role=None)) is None
    for type_ in ("stream", "forum", "workflow"):
        assert post(nip42(), facts(role=None, visibility="private", type_=type_)) == NOT_A_MEMBER
        assert read(nip42(), facts(role=None, visibility="private", type_=type_)) == NOT_A_MEMBER
    # A DM is private whatever its visibility says.
    for visibility in ("open", "private"):
        assert post(nip42(), facts(role=None, visibility=visibility, type_="dm")) == NOT_A_MEMBER
        assert read(nip42(), facts(role=None, visibility=visibility, type_="dm")) == NOT_A_MEMBER
    assert post(nip42(), facts(visibility="private", type_="dm", role="member")) is None


def test_archived_refuses_posts_not_reads_or_management() -> None:
    archived = facts(archived=True)
    assert post(nip42(), archived) == ARCHIVED
    assert read(nip42(), archived) is None
    assert manage(nip42(), archived) is None


def test_missing_and_deleted_channels_answer_alike() -> None:
    """No existence oracle: a deleted channel, even one the actor was owner of, answers like a missing one."""
    answers = {
        (post(nip42(), access), read(nip42(), access), manage(nip42(), access))
        for access in (
            facts(exists=False),
            facts(deleted=True, role="owner"),
            facts(deleted=True, role=None),
            facts(deleted=True, visibility="private", role="member", archived=True),
            facts(visibility="private", role=None),
        )
    }
    assert answers == {(NOT_A_MEMBER, NOT_A_MEMBER, NOT_A_MEMBER)}


def test_creating_a_channel_needs_no_visible_channel() -> None:
    assert manage(nip42(), facts(exists=False), creating=True) is None
    assert manage(nip42(), facts(exists=False), creating=False) == NOT_A_MEMBER
    # The credential and moderation checks still apply to a create.
    assert manage(token("channels:write", channels=(ELSEWHERE,)), facts(exists=False), creating=True) == TOKEN_CHANNEL
    assert manage(nip42(), facts(exists=False, timeout_until=UNTIL), creating=True) == TIMED_OUT


# --- the order: the earliest failing step gives the reason ----------------------------------------

EVERYTHING_WRONG = facts(
    visibility="private", role=None, archived=True, banned=True, timeout_until=UNTIL, token_ok=False
)


@pytest.mark.parametrize(
    ("label", "actor", "access", "reason"),
    [
        ("scope before everything", token("messages:read", channels=(ELSEWHERE,)), EVERYTHING_WRONG, SCOPE_WRITE),
        ("token state before ban", token("messages:write", channels=(ELSEWHERE,)), EVERYTHING_WRONG, TOKEN_INVALID),
        ("ban before timeout", token("messages:write", channels=(ELSEWHERE,)), replace(EVERYTHING_WRONG, token_ok=True),
         BANNED),
        ("timeout before token channel", token("messages:write", channels=(ELSEWHERE,)),
         replace(EVERYTHING_WRONG, token_ok=True, banned=False), TIMED_OUT),
        ("token channel before membership", token("messages:write", channels=(ELSEWHERE,)),
         facts(visibility="private", role=None, archived=True), TOKEN_CHANNEL),
        ("membership before archive", nip42(), facts(visibility="private", role=None, archived=True), NOT_A_MEMBER),
        ("deleted before archive", nip42(), facts(deleted=True, archived=True), NOT_A_MEMBER),
        ("archive last", nip42(), facts(visibility="private", role="guest", archived=True), ARCHIVED),
    ],
)  # fmt: skip
def test_post_checks_in_reference_order(label: str, actor: Actor, access: ChannelAccess, reason: str) -> None:
    assert post(actor, access) == reason, label


def test_read_order_skips_timeout_and_archive() -> None:
    actor = token("messages:read", channels=(ELSEWHERE,))
    assert read(token("messages:write"), EVERYTHING_WRONG) == SCOPE_READ
    assert read(actor, EVERYTHING_WRONG) == TOKEN_INVALID
    assert read(actor, replace(EVERYTHING_WRONG, token_ok=True)) == BANNED
    # A timeout doesn't stop reading: the token channel limit is next.
    assert read(actor, replace(EVERYTHING_WRONG, token_ok=True, banned=False)) == TOKEN_CHANNEL
    assert read(nip42(), replace(EVERYTHING_WRONG, token_ok=True, banned=False)) == NOT_A_MEMBER
    assert read(nip42(), facts(visibility="private", role="member", archived=True, timeout_until=UNTIL)) is None


# --- the h tag (step 7) ----------------------------------------------------------------------------

SIGNER = Signer("00" * 31 + "11")


def h_event(*values: str) -> ProtocolError | uuid.UUID:
    event = SIGNER.sign_event(kind=9, tags=[["h", v] for v in values], content="x", created_at=1_700_000_000)
    try:
        return channel_of(event)
    except ProtocolError as err:
        return err


def test_the_h_tag_names_exactly_one_lowercase_channel_uuid() -> None:
    assert h_event(str(CHANNEL)) == CHANNEL
    reasons = {
        "none": h_event(),
        "two": h_event(str(CHANNEL), str(ELSEWHERE)),
        "upper": h_event(str(CHANNEL).upper()),
        "nil": h_event(str(uuid.UUID(int=0))),
        "unhyphenated": h_event(CHANNEL.hex),
        "braced": h_event("{" + str(CHANNEL) + "}"),
        "junk": h_event("general"),
    }
    assert {k: v.reason for k, v in reasons.items() if isinstance(v, ProtocolError)} == {
        "none": "invalid: event needs an h tag naming its channel",
        "two": "invalid: event must have exactly one h tag",
        "upper": "invalid: h tag must be a lowercase channel UUID",
        "nil": "invalid: h tag must be a lowercase channel UUID",
        "unhyphenated": "invalid: h tag must be a lowercase channel UUID",
        "braced": "invalid: h tag must be a lowercase channel UUID",
        "junk": "invalid: h tag must be a lowercase channel UUID",
    }
    assert parse_channel_id(str(CHANNEL)) == CHANNEL and parse_channel_id("") is None


# --- the oracle ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """One actor and one channel, as the oracle sees them (independent of ChannelAccess's field names)."""

    login: bool  # NIP-42: every scope, every channel, no token
    scopes: frozenset[str]
    token_channels: frozenset[uuid.UUID] | None
    token_live: bool
    banned: bool
    timed_out: bool
    channel_exists: bool
    channel_deleted: bool
    visibility: str
    dm: bool
    member: bool
    archived: bool
    target: uuid.UUID


def oracle(w: World, *, action: str, scope: str = "", creating: bool = False) -> str | None:
    """REFERENCE.md's steps 5-9 (see the module docstring) for a post, a read or a NIP-29 management event."""
    needed = {"post": "messages:write", "read": "messages:read"}.get(action, scope)
    if not w.login and needed not in w.scopes:  # 5
        return f"restricted: this token lacks the {needed} scope"
    if not w.login and not w.token_live:  # the credential itself
        return TOKEN_INVALID
    if w.banned:  # 6
        return BANNED
    if w.timed_out and action != "read":
        return TIMED_OUT
    if not w.login and w.token_channels is not None and w.target not in w.token_channels:  # 7
        return TOKEN_CHANNEL
    if action == "manage" and creating:
        return None
    there = w.channel_exists and not w.channel_deleted
    open_channel = w.visibility == "open" and not w.dm  # a DM is private
    if not there or not (w.member or open_channel):  # 8
        return NOT_A_MEMBER
    if action == "post" and w.archived:  # 9
        return ARCHIVED
    return None


def to_policy(w: World) -> tuple[Actor, ChannelAccess]:
    """The same situation as the policy's inputs: an Actor and the loader's facts."""
    if w.login:
        actor = Actor(community=COMMUNITY, pubkey=PUBKEY)
    else:
        channels = None if w.token_channels is None else frozenset(str(c) for c in w.token_channels)
        actor = Actor(community=COMMUNITY, pubkey=PUBKEY, scopes=w.scopes, channels=channels, token_id=99)
    timeout = UNTIL if w.timed_out else None
    token_ok = w.login or w.token_live  # the loader reports no token as a live one
    if not w.channel_exists:
        return actor, ChannelAccess(None, None, None, False, False, None, w.banned, timeout, token_ok)
    role = "member" if w.member else None
    kind = "dm" if w.dm else "stream"
    return actor, ChannelAccess(7, w.visibility, kind, w.archived, w.channel_deleted, role, w.banned, timeout, token_ok)


@st.composite
def worlds(draw: st.DrawFn) -> World:
    exists = draw(st.booleans())
    target = draw(st.sampled_from((CHANNEL, ELSEWHERE)))
    return World(
        login=draw(st.booleans()),
        scopes=draw(st.frozensets(st.sampled_from(sorted(KNOWN_SCOPES)))),
        token_channels=draw(st.none() | st.frozensets(st.sampled_from((CHANNEL, ELSEWHERE)))),
        token_live=draw(st.booleans()),
        banned=draw(st.booleans()),
        timed_out=draw(st.booleans()),
        channel_exists=exists,
        channel_deleted=exists and draw(st.booleans()),
        visibility=draw(st.sampled_from(("open", "private"))) if exists else "",
        dm=exists and draw(st.booleans()),
        member=exists and draw(st.booleans()),
        archived=exists and draw(st.booleans()),
        target=target,
    )


@given(w=worlds(), scope=st.sampled_from(sorted(KNOWN_SCOPES)), creating=st.booleans())
def test_decisions_agree_with_the_reference_oracle(w: World, scope: str, creating: bool) -> None:
    actor, access = to_policy(w)
    assert verdict(decide_post(actor, w.target, access)) == oracle(w, action="post"), (w, actor, access)
    assert verdict(decide_read(actor, w.target, access)) == oracle(w, action="read"), (w, actor, access)
    got = verdict(decide_manage(actor, w.target, access, scope=scope, creating=creating))
    assert got == oracle(w, action="manage", scope=scope, creating=creating), (w, scope, creating, actor, access)


def test_each_group_event_needs_the_scope_buzz_asks_for() -> None:
    signer = Signer.generate()
    h = ["h", str(uuid.uuid4())]

    def scope(kind: int, *tags: list[str]) -> str:
        return group_event_scope(signer.sign_event(kind=kind, tags=[h, *tags], content=""))

    p = ["p", "ab" * 32]
    assert scope(9000, p) == scope(9001, p) == scope(9008) == "admin:channels"
    assert scope(9002, ["name", "x"]) == scope(9007, ["name", "x"]) == "channels:write"
    assert scope(9002, ["archived", "true"]) == scope(9002, ["archived", "false"], ["name", "x"]) == "admin:channels"
    assert scope(9021) == scope(9022) == "channels:read"
    assert scope(9005, ["e", "cd" * 32]) == "messages:write"
