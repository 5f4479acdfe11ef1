"""reader_scope(wide=True), one statement (buzz.access.policy.wide_scope_statement: REQ and COUNT without #h,
the NIP-AR views, and embedded in incremental reads' head), answers exactly as its two parts do on their own:
check_reader's denial, else readable_channels' channels. For every kind of reader: members, open listed and
unlisted channels, a DM, a deleted channel, a channel-limited token, a ban, a non-member of a members-only
community, a revoked token, a token without the read scope. And it is one round trip.

Then a REQ's re-check after its SUBSCRIBE (reader_scope_and_epochs): the same decision, with the access epochs
of the channels it covered, read in the statements that decide them."""

from __future__ import annotations

import uuid
from typing import Any

from asgiref.sync import sync_to_async

from buzz.access.policy import (
    Denied,
    channel_epochs,
    check_reader,
    readable_channels,
    reader_scope,
    reader_scope_and_epochs,
)
from buzz.chat import bans, channels
from buzz.identity import tokens
from buzz.identity.actor import Actor
from buzz.models import ApiToken
from buzz.nostr import Signer
from buzz.runtime import runtime
from tests.support.factories import make_channel, make_community, make_token
from tests.support.inprocess import Harness, actor_of, community_info

# Reads before the measured one: a pool connection prepares a statement once it has run it a few times
# (prepare_threshold, buzz.runtime), and the reads may use any of the pool's connections.
WARMUP = 6


def _world() -> dict[str, Any]:
    w, r, banned, outsider = (Signer.generate() for _ in range(4))
    community = make_community("wide-scope.test", members=[w, r, banned])
    mine = make_channel(community, w, visibility="private", members=[r, banned])
    theirs = make_channel(community, w, visibility="private")
    listed = make_channel(community, w)
    unlisted = make_channel(community, w, listed=False)
    joined_unlisted = make_channel(community, w, listed=False, members=[r])
    gone = make_channel(community, w, visibility="private", members=[r])
    channels.channel_delete(community=community, channel_uuid=gone, actor=None)
    bans.ban_add(community=community, pubkey=banned.pubkey)
    limited = make_token(community, r, ["messages:read"], channels=[mine, unlisted])
    revoked = make_token(community, r, ["messages:read"])
    tokens.token_revoke(token_id=ApiToken.objects.get(token_hash=tokens.hash_token(revoked)).pk)
    no_read = make_token(community, r, ["messages:write"])
    info = community_info(community)

    def with_token(token: str) -> Actor:
        row = ApiToken.objects.get(token_hash=tokens.hash_token(token))
        return Actor(
            community=info,
            pubkey=r.pubkey,
            scopes=frozenset(row.scopes),
            channels=None if row.channels is None else frozenset(row.channels),
            token_id=row.pk,
        )

    actors = {
        "member": actor_of(community, r),
        "owner": actor_of(community, w),
        "banned": actor_of(community, banned),
        "outsider": actor_of(community, outsider),
        "limited token": with_token(limited),
        "revoked token": with_token(revoked),
        "token without read": with_token(no_read),
    }
    return {
        "actors": actors,
        "expected_nonempty": {listed, joined_unlisted, mine},
        "channels": {"mine": mine, "theirs": theirs, "listed": listed, "joined_unlisted": joined_unlisted},
    }


async def _answer(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", await fn
    except Denied as err:
        return "denied", err.reason


async def _two_statements(actor: Actor, conn: Any) -> tuple[str, Any]:
    """The reference: the standing (check_reader), then the channels (readable_channels), one statement each."""
    standing = await check_reader(actor, conn=conn)
    if not standing.ok:
        return "denied", standing.reason
    return "ok", sorted(await readable_channels(actor, conn=conn))


async def test_wide_scope_answers_as_its_two_parts_do(transactional_db: None) -> None:
    world = await sync_to_async(_world)()
    async with Harness.open():
        pool = await runtime.pool()
        async with pool.connection() as conn:
            seen = set()
            for name, actor in world["actors"].items():
                old = await _two_statements(actor, conn)
                assert await _answer(reader_scope(actor, wide=True, conn=conn)) == old, name
                seen.add(old[0])
                if name == "member":
                    assert world["expected_nonempty"] <= set(old[1])
    assert seen == {"ok", "denied"}


async def test_a_wide_scope_is_one_round_trip(transactional_db: None) -> None:
    """A REQ without #h decides its scope in one round trip on a connection of its own (it was two)."""
    world = await sync_to_async(_world)()
    member = world["actors"]["member"]
    async with Harness.open() as h:
        for _ in range(WARMUP + 1):  # the last time on a warmed-up connection (its statement prepared)
            trips, _, got = await h.measure(reader_scope(member, wide=True))
        assert world["expected_nonempty"] <= set(got)
        assert trips.prepares == 0 and trips.total == 1, str(trips)


async def test_a_named_re_check_reads_its_epochs_with_its_facts(transactional_db: None) -> None:
    """What a REQ does once its SUBSCRIBE is confirmed (buzz.ws.req `_scope_again`): the scope decided again,
    with the access epoch of each channel it covered, read in the statement that decides the channel (named
    channels' facts, or the wide scope's): no statement more than reader_scope sends. They are the epochs
    `channel_epochs` reads, of the channels still in scope, and the decision is reader_scope's, a denial
    included."""
    world = await sync_to_async(_world)()
    member = world["actors"]["member"]
    ch = world["channels"]
    named = [ch["mine"], ch["listed"]]
    # (the scope, the channels whose epochs are asked: a REQ asks for those it covered, and the statements)
    cases: list[tuple[dict[str, Any], list[uuid.UUID], int]] = [
        ({"named": named}, named, 1),
        ({"wide": True}, [*named, ch["joined_unlisted"], ch["theirs"]], 1),
        ({"wide": True, "named": [ch["mine"]]}, [*named, ch["joined_unlisted"]], 2),
        ({"named": [ch["mine"], ch["theirs"]]}, [ch["mine"], ch["theirs"]], 1),
    ]
    seen = set()
    async with Harness.open() as h:
        for scope, epochs_of, statements in cases:
            expected = await _answer(reader_scope(member, **scope))
            seen.add(expected[0])
            for _ in range(WARMUP + 1):  # the last time on warmed-up connections (their statements prepared)
                trips, _, got = await h.measure(_answer(reader_scope_and_epochs(member, **scope, epochs_of=epochs_of)))
            assert trips.prepares == 0 and trips.total == statements, f"{scope}: {trips}"
            if expected[0] == "denied":
                assert got == expected, scope
                continue
            channels, epochs = got[1]
            assert channels == expected[1], scope
            in_scope = [c for c in epochs_of if c in channels]
            assert epochs == await channel_epochs(member.community.id, in_scope), scope
            assert set(epochs) == set(in_scope)
    assert seen == {"ok", "denied"}
