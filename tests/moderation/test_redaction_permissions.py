"""Who may redact a revision with NIP-29 kind 9005: the channel's ordinary message-removal rules (the
revision's author, or a channel owner/admin); a member who is not the author, a nonmember and a banned
member are refused with the one removal refusal, and nothing is withheld. Each 9005 is audited."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from moderation.models import AuditAction, AuditRecord
from tests.moderation.moderation_support import RELAY_ENV, World, aban, make_world, ok, removal, view
from tests.support.factories import revision
from tests.support.wire import accept, logged_in

HOST = "redact-rules.test"
REFUSED = "restricted: that event can't be deleted by you"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


def _audited() -> list[tuple[str, str]]:
    return list(AuditRecord.objects.filter(action=AuditAction.REDACT).values_list("who", "target"))


async def test_9005_permission_rules(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    ch = str(world.ch)
    async with logged_in(relay, world.author, host=HOST) as a:
        heads: dict[str, str] = {}
        for label in ("member", "nonmember", "banned", "author", "owner", "admin"):
            event = revision(world.author, d=str(uuid.uuid4()), h=ch)
            heads[label] = await accept(a, event)
    await aban(world, world.banned)
    for label in ("member", "nonmember", "banned"):
        signer = getattr(world, label)
        async with logged_in(relay, signer, host=HOST) as client:
            answer = await ok(client, removal(signer, world.ch, heads[label]))
        assert answer[0] is False, (label, answer)
        # A nonmember and a banned sender are refused before the rule (not a member / banned); none is accepted.
        assert answer[1].startswith(("restricted:", "blocked:")), (label, answer)
        if label == "member":
            assert answer[1] == REFUSED
    current = await view(relay, world, world.owner, {"artifact": "current", "#h": [ch]})
    assert {heads["member"], heads["nonmember"], heads["banned"]} <= set(current)
    for label in ("author", "owner", "admin"):
        signer = getattr(world, label)
        async with logged_in(relay, signer, host=HOST) as client:
            assert await ok(client, removal(signer, world.ch, heads[label])) == (True, ""), label
    current = await view(relay, world, world.owner, {"artifact": "current", "#h": [ch]})
    assert not {heads["author"], heads["owner"], heads["admin"]} & set(current)
    audited = await sync_to_async(_audited, thread_sensitive=False)()
    assert sorted(audited) == sorted(
        (getattr(world, label).pubkey, heads[label]) for label in ("author", "owner", "admin")
    )
