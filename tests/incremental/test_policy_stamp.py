"""The community policy stamp (buzz.PolicyStamp): every access change that no incremental window
can replay advances it, in the transaction that makes the change, also on an empty channel; membership
grants and removals (which the window replays) and artifact writes do not."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from buzz.access.changes import access_changed
from buzz.chat import bans, channels
from buzz.identity import communities, tokens
from buzz.models import ApiToken, Community, PolicyStamp
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, make_token

pytestmark = pytest.mark.django_db


def _stamp(community: Community) -> int:
    row = PolicyStamp.objects.filter(community=community).first()
    return row.stamp if row is not None else 0


@pytest.fixture
def world() -> dict[str, Any]:
    w, r = Signer.generate(), Signer.generate()
    community = make_community("stamp.test", members=[w, r])
    empty = make_channel(community, w, visibility="private")
    return {"w": w, "r": r, "community": community, "empty": empty}


def _edit(changes: dict[str, str]) -> Callable[[dict[str, Any]], None]:
    def run(x: dict[str, Any]) -> None:
        channels.channel_edit(community=x["community"], channel_uuid=x["empty"], actor=None, changes=changes)

    return run


ADVANCES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "visibility": _edit({"visibility": "open"}),
    "listing": _edit({"listed": "false"}),
    "ttl": _edit({"ttl": "3600"}),
    "channel deletion": lambda x: channels.channel_delete(
        community=x["community"], channel_uuid=x["empty"], actor=None
    ),
    "ban": lambda x: bans.ban_add(community=x["community"], pubkey=x["r"].pubkey),
    "relay-member removal": lambda x: communities.member_remove(community=x["community"], pubkey=x["r"].pubkey),
    "relay-member admission": lambda x: communities.member_add(
        community=x["community"], pubkey=Signer.generate().pubkey
    ),
    "token revocation": lambda x: tokens.token_revoke(
        token_id=ApiToken.objects.get(token_hash=tokens.hash_token(make_token(x["community"], x["r"]))).pk
    ),
    "policy reset": lambda x: access_changed(x["community"].pk),
}

UNCHANGED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "membership grant": lambda x: channels.member_put(
        community=x["community"], channel_uuid=x["empty"], actor=None, pubkey=x["r"].pubkey
    ),
    "name edit": _edit({"name": "renamed"}),
    "archive": _edit({"archived": "true"}),
    "timeout": lambda x: bans.timeout_add(community=x["community"], pubkey=x["r"].pubkey, duration=dt.timedelta(1)),
    "same visibility": _edit({"visibility": "private"}),
}


@pytest.mark.parametrize("change", sorted(ADVANCES))
def test_access_changes_advance_the_stamp(world: dict[str, Any], change: str) -> None:
    before = _stamp(world["community"])
    ADVANCES[change](world)
    assert _stamp(world["community"]) == before + 1


@pytest.mark.parametrize("change", sorted(UNCHANGED))
def test_other_changes_leave_the_stamp(world: dict[str, Any], change: str) -> None:
    before = _stamp(world["community"])
    UNCHANGED[change](world)
    assert _stamp(world["community"]) == before


def test_the_advance_is_part_of_the_change_transaction(world: dict[str, Any]) -> None:
    before = _stamp(world["community"])
    with pytest.raises(RuntimeError), transaction.atomic():
        bans.ban_add(community=world["community"], pubkey=world["r"].pubkey)
        raise RuntimeError("rolled back")
    assert _stamp(world["community"]) == before


def test_ban_lift_advances_and_a_lift_of_nothing_does_not(world: dict[str, Any]) -> None:
    bans.ban_add(community=world["community"], pubkey=world["r"].pubkey)
    before = _stamp(world["community"])
    assert bans.ban_lift(community=world["community"], pubkey=world["r"].pubkey) == 1
    assert _stamp(world["community"]) == before + 1
    assert bans.ban_lift(community=world["community"], pubkey=world["r"].pubkey) == 0
    assert _stamp(world["community"]) == before + 1
