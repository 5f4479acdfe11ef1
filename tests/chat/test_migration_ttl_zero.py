"""Migration buzz 0014: a channel stored with ttl_seconds 0 (a 9007 with ["ttl", "0"]) becomes the permanent
channel its metadata said it was, and its community's policy stamp advances (incremental checkpoints taken
while its artifacts were left out are refused); other channels are untouched."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community
from tests.support.migrations import migrate, schema_at

BEFORE = [("buzz", "0013_storedevent_h_is_channel")]
AFTER = [("buzz", "0014_channel_ttl_zero_is_permanent")]


@pytest.fixture
def before(transactional_db: None) -> Iterator[None]:
    with schema_at(BEFORE):
        yield


def _row(sql: str, params: list[Any]) -> tuple[Any, ...]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    assert row is not None
    return tuple(row)


def test_a_zero_ttl_becomes_no_ttl_and_the_stamp_advances(before: None) -> None:
    owner = Signer.generate()
    community = make_community("ttl-zero.test", members=[owner])
    quiet = make_community("ttl-other.test", members=[owner])
    zero, hour, permanent = (make_channel(community, owner, name=n) for n in ("zero", "hour", "permanent"))
    elsewhere = make_channel(quiet, owner, name="hour")
    with connection.cursor() as cur:
        cur.execute("UPDATE buzz_channel SET ttl_seconds = 0, deadline = now() WHERE uuid = %s", [zero])
        cur.execute("UPDATE buzz_channel SET ttl_seconds = 3600, deadline = now() WHERE uuid = ANY(%s)",
                    [[hour, elsewhere]])  # fmt: skip
    stamp = "SELECT coalesce((SELECT stamp FROM buzz_policystamp WHERE community_id = %s), 0)"
    stamps = (_row(stamp, [community.pk])[0], _row(stamp, [quiet.pk])[0])
    migrate(AFTER)
    ttl = "SELECT ttl_seconds, deadline IS NULL FROM buzz_channel WHERE uuid = %s"
    assert _row(ttl, [zero]) == (None, True)
    assert _row(ttl, [hour]) == (3600, False) and _row(ttl, [elsewhere]) == (3600, False)
    assert _row(ttl, [permanent]) == (None, True)
    assert (_row(stamp, [community.pk])[0], _row(stamp, [quiet.pk])[0]) == (stamps[0] + 1, stamps[1])
