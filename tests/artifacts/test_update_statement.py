"""An update is decided and written in one statement (artifacts.services._UPDATE): the edit's read and the
compare-and-set, guarded in SQL by every check `_judge_edit` makes of an update.

The guard must never be looser than the decision (the statement would write what the answer refuses; the
service raises then) and should never be stricter (an accepted update would fall back to the read and the
advance: right, but two more round trips). So: every accepted shape below is written by the one statement
(one round trip), and every refused one writes nothing and gets the decision's own answer. Run in-process
through buzz.runtime's pools, round trips counted by libpq's trace (tests/support/pgtrace.py).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from artifacts.models import Revision
from artifacts.services import ANCHOR_INVALID, DUPLICATE, HEAD_CHANGED, HEAD_UNAVAILABLE
from buzz.events.ingest import ingest
from buzz.models import Community, Mention
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community, message, revision
from tests.support.inprocess import Harness, actor_of

HOST = "update-statement.test"
WARMUP = 4  # psycopg prepares a statement the third time a connection runs it; then the counts are steady


@pytest.fixture
def desk(transactional_db: None, settings: Any) -> tuple[Community, Signer, Signer, uuid.UUID, uuid.UUID]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    alice, bob = Signer.generate(), Signer.generate()
    community = make_community(HOST, members=[alice, bob])
    home = make_channel(community, alice, visibility="private")
    other = make_channel(community, alice, visibility="private", members=[bob])
    return community, alice, bob, home, other


@sync_to_async
def _revisions(event_id: str) -> int:
    return Revision.objects.filter(id=event_id).count()


@sync_to_async
def _mentioned(event_id: str) -> set[str]:
    return set(Mention.objects.filter(event_id=event_id).values_list("pubkey", flat=True))


async def test_accepted_updates_take_one_statement_and_refused_ones_write_nothing(
    desk: tuple[Community, Signer, Signer, uuid.UUID, uuid.UUID],
) -> None:
    community, alice, bob, home, other = desk
    actor = actor_of(community, alice)
    carol, dave = Signer.generate().pubkey, Signer.generate().pubkey
    async with Harness.open() as h:

        async def send(event: dict[str, Any], signer_actor: Any = actor) -> tuple[int, str, bool]:
            trips, _, (_, result) = await h.measure(ingest(signer_actor, event))
            return trips.total, result.message, result.ok

        async def artifact() -> tuple[uuid.UUID, str]:
            d = uuid.uuid4()
            create = revision(alice, d=d, h=home, p=[carol])
            _, text, ok = await send(create)
            assert ok, text
            return d, str(create["id"])

        anchor = message(alice, home, "the thread")
        assert (await send(anchor))[2]
        for _ in range(WARMUP):  # the update statement, prepared on the pool's connections
            d, head = await artifact()
            assert (await send(revision(alice, d=d, h=home, op="update", prev=head)))[2]

        # Accepted, each in ONE round trip: a plain update; a new root that is a message in the channel;
        # the root kept; p tags added (only the new one is a mention: carol was the head's already).
        d, head = await artifact()
        accepted = [revision(alice, d=d, h=home, op="update", prev=head, p=[carol])]
        for root in (anchor["id"], anchor["id"]):
            accepted.append(revision(alice, d=d, h=home, op="update", prev=accepted[-1]["id"], root=root, p=[carol]))
        accepted.append(
            revision(alice, d=d, h=home, op="update", prev=accepted[-1]["id"], root=anchor["id"], p=[carol, dave])
        )
        for event in accepted:
            total, text, ok = await send(event)
            assert (ok, text, total) == (True, "", 1), event["tags"]
            assert await _revisions(event["id"]) == 1
        assert await _mentioned(accepted[0]["id"]) == set()
        assert await _mentioned(accepted[-1]["id"]) == {dave}
        head = accepted[-1]["id"]

        # Refused: the decision's answer, and nothing written.
        d2, head2 = await artifact()
        stranger = Signer.generate()
        refused = [
            (revision(alice, d=d, h=home, op="update", prev=head2), HEAD_CHANGED),
            (revision(alice, d=d, h=home, op="update", prev=head, type_="buzz.note"), "invalid: type is immutable"),
            (
                revision(alice, d=d, h=other, op="update", prev=head),
                "invalid: update keeps h; changing the channel is a move",
            ),
            (revision(alice, d=d, h=home, op="update", prev=head, root="ab" * 32), ANCHOR_INVALID),
            (revision(alice, d=uuid.uuid4(), h=home, op="update", prev=head), HEAD_UNAVAILABLE),
            (revision(bob, d=d, h=home, op="update", prev=head), HEAD_UNAVAILABLE),  # not a member of home
            (revision(stranger, d=d, h=home, op="update", prev=head), "restricted: "),  # not admitted at all
        ]
        for event, answer in refused:
            author = next(s for s in (alice, bob, stranger) if s.pubkey == event["pubkey"])
            total, text, ok = await send(event, actor_of(community, author))
            assert not ok and text.startswith(answer), (answer, text)
            assert await _revisions(event["id"]) == 0

        # Deleted: only a restore is accepted.
        deletion = revision(alice, d=d2, h=home, op="delete", prev=head2)
        assert (await send(deletion))[2]
        late = revision(alice, d=d2, h=home, op="update", prev=deletion["id"])
        total, text, ok = await send(late)
        assert (ok, text) == (False, "invalid: the artifact is deleted; only restore is accepted")
        assert await _revisions(late["id"]) == 0

        # A resubmitted update: "duplicate:", in the same one statement, nothing written twice.
        total, text, ok = await send(accepted[0])
        assert (ok, text, total) == (True, DUPLICATE, 1)
        assert await _revisions(accepted[0]["id"]) == 1
