"""The current-tag index always holds the head's (name, first value) pairs (artifacts.envelope.match_tags).

An edit writes only the pairs that differ from prev's (artifacts.services._ADVANCE): kept pairs stay as
rows, dropped ones are deleted, new ones inserted. Hypothesis drives random chains of edits (update,
delete, restore, move) whose extra tags are drawn from a small alphabet, so a chain keeps, drops, repeats
and re-adds pairs, several values under one name included; after every accepted edit the rows in
PostgreSQL are compared with the head's pairs, and a kept pair keeps its row.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from artifacts.envelope import match_tags
from artifacts.models import Artifact, CurrentTag
from buzz.events.ingest import ingest
from buzz.nostr import Signer, parse_event
from buzz.runtime import runtime
from tests.support.factories import make_channel, make_community, revision
from tests.support.inprocess import actor_of

NAMES = ("status", "label", "t")
VALUES = ("a", "b", "c")
extra_tags = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES)).map(list), max_size=5)
steps = st.lists(st.tuples(st.sampled_from(("update", "update", "delete", "move")), extra_tags), max_size=6)
# Each example is a chain of real writes: a few dozen chains cover keeping, dropping and re-adding pairs.
db_examples = hypothesis_settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


async def _close_runtime() -> None:
    await runtime.publisher().aclose()  # the runtime leaves its publisher's task to the loop
    await runtime.aclose()


def _rows(d: str) -> tuple[set[tuple[str, str]], dict[tuple[str, str], int]]:
    artifact = Artifact.objects.get(d=d)
    rows = list(CurrentTag.objects.filter(artifact=artifact).values_list("id", "name", "value"))
    assert len(rows) == len({(n, v) for _, n, v in rows}), "a pair is stored twice"
    return {(n, v) for _, n, v in rows}, {(n, v): i for i, n, v in rows}


def test_current_tags_follow_the_head_through_random_edits(transactional_db: None, settings: Any) -> None:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    alice = Signer.generate()
    community = make_community("current-tags.test", members=[alice])
    channels = [make_channel(community, alice), make_channel(community, alice)]
    writer = actor_of(community, alice)
    loop = asyncio.new_event_loop()  # one loop for every write: the runtime's pools belong to it

    def accept(event: dict[str, Any]) -> None:
        _, result = loop.run_until_complete(ingest(writer, event))
        assert result.ok, result

    @db_examples
    @given(first=extra_tags, chain=steps)
    def run(first: list[list[str]], chain: list[tuple[str, list[list[str]]]]) -> None:
        d, home = str(uuid.uuid4()), channels[0]
        event = revision(alice, d=d, h=home, extra=first)
        accept(event)
        assert _rows(d)[0] == set(match_tags(parse_event(event)))
        deleted = False
        for op, extra in chain:
            if deleted:
                op = "restore"
            elif op == "move":
                home = channels[1] if home == channels[0] else channels[0]
            before = _rows(d)[1]
            # A delete carries only envelope tags (artifacts.envelope): its pairs drop every extra one.
            event = revision(alice, d=d, h=home, op=op, prev=event["id"], extra=[] if op == "delete" else extra)
            accept(event)
            deleted = op == "delete"
            pairs, ids = _rows(d)
            assert pairs == set(match_tags(parse_event(event)))
            # A pair the edit kept is the same row: only differences are written.
            assert all(ids[p] == before[p] for p in pairs & before.keys())

    try:
        run()
    finally:
        loop.run_until_complete(_close_runtime())
        loop.close()
