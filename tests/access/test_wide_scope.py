"""buzz.access.policy.wide_scope, the one statement behind reader_scope(wide=True) (REQ and COUNT without #h,
the NIP-AR views, and embedded in incremental reads' head), answers exactly as its two parts do on their own:
check_reader's denial, else readable_channels' channels. For every kind of reader: members, open listed and
unlisted channels, a DM, a deleted channel, a channel-limited token, a ban, a non-member of a members-only
community, a revoked token, a token without the read scope. And it is one round trip."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from buzz.access.policy import Denied, check_reader, readable_channels, reader_scope, wide_scope
from buzz.chat import bans, channels
from buzz.identity import tokens
from buzz.identity.actor import Actor
from buzz.models import ApiToken
from buzz.nostr import Signer
from buzz.runtime import runtime
from tests.support.factories import make_channel, make_community, make_token
from tests.support.inprocess import Harness, actor_of, community_info


def _world() -> dict[str, Any]:
    w, r, banned, outsider = (Signer.generate() for _ in range(4))
    community = make_community("wide-scope.test", members=[w, r, banned])
    mine = make_channel(community, w, visibility="private", members=[r, banned])
    make_channel(community, w, visibility="private")
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
    return {"actors": actors, "expected_nonempty": {listed, joined_unlisted, mine}}


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
                assert await _answer(wide_scope(actor, conn=conn)) == old, name
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
        for _ in range(2):  # the second time on a warmed-up connection
            trips, _, got = await h.measure(reader_scope(member, wide=True))
        assert world["expected_nonempty"] <= set(got)
        assert trips.total == 1, str(trips)
