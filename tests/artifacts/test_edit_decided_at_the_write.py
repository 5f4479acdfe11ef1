"""A move, delete or restore is decided where it writes, as kind 9 is: access that changes between the edit's
read and its compare-and-set is obeyed (NIP-AR: "The relay checks authorization and advances the current
revision atomically"; "at the same point, as for a kind-9 message").

In-process (tests/support/inprocess.py): `_judge_edit` is wrapped so that, right after it accepts an edit from
the read's facts, another connection commits an access change (the home archived, the sender removed from a
private home, the destination deleted). The write must not happen, and the answer is what the edit gets on
the state as it now is; the head is unchanged.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async

from artifacts import services
from artifacts.models import Artifact
from buzz.access.policy import ARCHIVED
from buzz.events.ingest import ingest
from buzz.models import Community
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, revision
from tests.support.inprocess import Harness, actor_of
from tests.support.relay import relay_database_url

HOST = "decided-at-write.test"


@pytest.fixture
def world(transactional_db: None, settings: Any) -> tuple[Community, Signer, Signer, uuid.UUID, uuid.UUID]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    owner, bob = Signer.generate(), Signer.generate()
    community = make_community(HOST, members=[owner, bob])
    home = make_channel(community, owner, visibility="private", members=[bob])
    there = make_channel(community, owner, members=[bob])
    _URL[:] = [relay_database_url()]
    return community, owner, bob, home, there


_URL: list[str] = []


def _commit(sql: str, *args: Any) -> None:
    with psycopg.connect(_URL[0], autocommit=True) as conn:
        conn.execute(sql, args)


CHANGES: dict[str, tuple[Callable[[uuid.UUID, uuid.UUID, str], None], str]] = {
    "home archived": (
        lambda home, there, bob: _commit("UPDATE buzz_channel SET archived_at = now() WHERE uuid = %s", home),
        ARCHIVED,
    ),
    "sender removed from the private home": (
        lambda home, there, bob: _commit(
            "UPDATE buzz_membership SET removed_at = now() FROM buzz_channel c"
            " WHERE c.id = channel_id AND c.uuid = %s AND pubkey = %s",
            home,
            bob,
        ),
        services.HEAD_UNAVAILABLE,
    ),
}


@pytest.mark.parametrize("op", ["delete", "move"])
@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_access_that_changes_after_the_read_is_obeyed(
    world: tuple[Community, Signer, Signer, uuid.UUID, uuid.UUID], monkeypatch: pytest.MonkeyPatch, op: str, change: str
) -> None:
    community, _, bob, home, there = world
    actor = actor_of(community, bob)
    apply, answer = CHANGES[change]
    d = uuid.uuid4()
    create = revision(bob, d=d, h=home)
    async with Harness.open():
        _, result = await ingest(actor, create)
        assert result.ok, result
        judge = services._judge_edit
        changed: list[bool] = []

        def judged_then_changed(*args: Any) -> Any:
            verdict = judge(*args)
            if not isinstance(verdict, services.WriteResult) and not changed:
                apply(home, there, bob.pubkey)  # commits between the read and the write
                changed.append(True)
            return verdict

        monkeypatch.setattr(services, "_judge_edit", judged_then_changed)
        edit = revision(bob, d=d, h=there if op == "move" else home, op=op, prev=create["id"])
        _, result = await ingest(actor, edit)
    assert changed == [True]
    assert (result.ok, result.message) == (False, answer)
    head = await sync_to_async(lambda: Artifact.objects.get(community=community, d=d).head_id)()
    assert head == create["id"]


async def test_an_access_change_after_every_pass_is_answered_with_its_reason(
    world: tuple[Community, Signer, Signer, uuid.UUID, uuid.UUID], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pass of a delete loses its compare-and-set to an access change that committed after its read: the
    home is archived after the first read and unarchived before the second, then the sender is removed from the
    private home after the second read. The answer is the removal's (what a missing d gets), not "head changed",
    and nothing is written."""
    community, _, bob, home, there = world
    actor = actor_of(community, bob)
    d = uuid.uuid4()
    create = revision(bob, d=d, h=home)
    async with Harness.open():
        _, result = await ingest(actor, create)
        assert result.ok, result
        judge, read_params = services._judge_edit, services.read_params
        steps: list[str] = []

        def read_after_unarchive(*args: Any, **kwargs: Any) -> Any:
            if steps == ["archived"]:
                _commit("UPDATE buzz_channel SET archived_at = NULL WHERE uuid = %s", home)
                steps.append("unarchived")
            return read_params(*args, **kwargs)

        def judged_then_changed(*args: Any) -> Any:
            verdict = judge(*args)
            if not isinstance(verdict, services.WriteResult):
                if not steps:
                    CHANGES["home archived"][0](home, there, bob.pubkey)
                    steps.append("archived")
                elif steps == ["archived", "unarchived"]:
                    CHANGES["sender removed from the private home"][0](home, there, bob.pubkey)
                    steps.append("removed")
            return verdict

        monkeypatch.setattr(services, "_judge_edit", judged_then_changed)
        monkeypatch.setattr(services, "read_params", read_after_unarchive)
        _, result = await ingest(actor, revision(bob, d=d, h=home, op="delete", prev=create["id"]))
    assert steps == ["archived", "unarchived", "removed"]
    assert (result.ok, result.message) == (False, services.HEAD_UNAVAILABLE)
    head = await sync_to_async(lambda: Artifact.objects.get(community=community, d=d).head_id)()
    assert head == create["id"]
