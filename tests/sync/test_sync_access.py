"""NIP-AR sync rule 9 for the reader's own access, on every node: a ban, a removal from the relay
members, the revocation of the connection's token and its expiry each end the sync with CLOSED
"resync: ..."; another member's membership change does not (it changes nothing this reader can read)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.chat import bans, channels
from buzz.identity import communities, tokens
from buzz.models import ApiToken
from buzz.nostr import Signer
from tests.support.factories import admit, make_token
from tests.support.wsclient import RelayClient
from tests.sync.support import RELAY_ENV, World, follow, make_world, open_sync, revision, write

HOST = "sync-access.test"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


def _resync(state: Any) -> bool:
    return state.closed is not None and state.closed.startswith("resync:")


async def _two_syncs(world: World, relay_factory: Any) -> tuple[Any, Any, Any]:
    """A sync of the reader on each of two nodes."""
    a, b = relay_factory(**RELAY_ENV), relay_factory(**RELAY_ENV)
    return a, b, {"artifact": "current", "#h": [str(world.a)]}


@pytest.mark.parametrize("change", ["ban", "relay-member"])
async def test_a_ban_or_a_relay_member_removal_resyncs_on_every_node(
    world: World, relay_factory: Any, change: str
) -> None:
    a, b, flt = await _two_syncs(world, relay_factory)
    async with RelayClient.connect(a.ws_url, host=HOST) as ra, RelayClient.connect(b.ws_url, host=HOST) as rb:
        assert (await ra.auth(world.reader))[2] is True
        assert (await rb.auth(world.reader))[2] is True
        sa, sb = await open_sync(ra, "s", flt), await open_sync(rb, "s", flt)
        assert sa.eose and sb.eose
        if change == "ban":
            await sync_to_async(bans.ban_add)(community=world.community, pubkey=world.reader.pubkey)
        else:
            await sync_to_async(communities.member_remove)(community=world.community, pubkey=world.reader.pubkey)
        for client, state in ((ra, sa), (rb, sb)):
            await follow(client, "s", state, lambda s: False)
            assert _resync(state), state.closed
        # A new sync is refused now, as for any channel the reader can't read (rule 2).
        again = await open_sync(ra, "again", flt)
        assert again.closed is not None and again.closed.startswith("restricted: "), again.closed
        assert not again.eose


async def test_token_revocation_resyncs_only_that_tokens_syncs(world: World, relay_factory: Any) -> None:
    a, b, flt = await _two_syncs(world, relay_factory)
    token = await sync_to_async(make_token)(world.community, world.reader)
    bearer = RelayClient.bearer(token)
    async with (
        RelayClient.connect(a.ws_url, host=HOST, authorization=bearer) as ta,
        RelayClient.connect(b.ws_url, host=HOST, authorization=bearer) as tb,
        RelayClient.connect(a.ws_url, host=HOST) as nip42,
        RelayClient.connect(a.ws_url, host=HOST) as w,
    ):
        assert (await nip42.auth(world.reader))[2] is True
        assert (await w.auth(world.owner))[2] is True
        sa, sb, sn = await open_sync(ta, "s", flt), await open_sync(tb, "s", flt), await open_sync(nip42, "s", flt)
        assert sa.eose and sb.eose and sn.eose
        row = await sync_to_async(ApiToken.objects.get)(token_hash=tokens.hash_token(token))
        await sync_to_async(tokens.token_revoke)(token_id=row.pk)
        for client, state in ((ta, sa), (tb, sb)):
            await follow(client, "s", state, lambda s: False)
            assert _resync(state), state.closed
        # A new sync on the revoked token's connection is refused as for a channel it can't read (rule 2).
        again = await open_sync(ta, "again", flt)
        assert again.closed is not None and again.closed.startswith("restricted: "), again.closed
        # The reader's NIP-42 connection is not that token's: its sync goes on.
        marker = revision(world.owner, uuid.uuid4(), world.a, "create")
        await write(w, marker)
        await follow(nip42, "s", sn, lambda s: marker["id"] in {e["id"] for e in s.heads.values()})
        assert sn.closed is None


async def test_token_expiry_resyncs_at_the_expiry_instant(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    token = await sync_to_async(make_token)(world.community, world.reader, expires_in=dt.timedelta(seconds=4))
    async with RelayClient.connect(relay.ws_url, host=HOST, authorization=RelayClient.bearer(token)) as r:
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
        assert state.eose
        await follow(r, "s", state, lambda s: False, timeout=30.0)
        assert _resync(state), state.closed
        # A new sync on that connection gets the policy's refusal, never a resync a client would retry forever.
        for sub in ("again", "and-again"):
            again = await open_sync(r, sub, {"artifact": "current", "#h": [str(world.a)]})
            assert not again.eose and again.closed == "restricted: this token is revoked or expired", again.closed


async def test_another_members_membership_change_does_not_resync(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    other = Signer.generate()
    await sync_to_async(admit)(world.community, other)
    async with RelayClient.connect(relay.ws_url, host=HOST) as r, RelayClient.connect(relay.ws_url, host=HOST) as w:
        assert (await r.auth(world.reader))[2] is True
        assert (await w.auth(world.owner))[2] is True
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
        assert state.eose
        await sync_to_async(channels.member_put)(
            community=world.community, channel_uuid=world.a, actor=None, pubkey=other.pubkey
        )
        await sync_to_async(channels.member_remove)(
            community=world.community, channel_uuid=world.a, actor=None, pubkey=other.pubkey
        )
        marker = revision(world.owner, uuid.uuid4(), world.a, "create")
        await write(w, marker)
        await follow(r, "s", state, lambda s: marker["id"] in {e["id"] for e in s.heads.values()})
        assert state.closed is None
