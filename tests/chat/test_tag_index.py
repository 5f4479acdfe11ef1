"""The tag index holds no row for an h tag that names the event's own channel (buzz_storedevent.h_is_channel,
buzz 0013): `#h` filters match those events on the channel column, with the same answers as before.

The split is pure logic (a property over arbitrary tags); the REQ answers are a real relay's, for events
stored through the write path beside rows stored before the column (an h row each)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from buzz.events.store import indexed_tags
from buzz.nostr import Event, Signer
from tests.support.factories import make_channel, make_community
from tests.support.relay import relay_database_url
from tests.support.wire import publish, query
from tests.support.wsclient import RelayClient

CHANNEL = uuid.UUID("0b5c6a8e-6f4c-4f1e-9d1a-3c2b1a0f9e8d")
_SIGNER = Signer.generate()

names = st.sampled_from(["h", "e", "p", "t", "H", "hh", "title", "1"])
values = st.sampled_from([str(CHANNEL), str(CHANNEL).upper(), str(uuid.UUID(int=7)), "", "x"])
tags = st.lists(st.tuples(names, values, st.lists(values, max_size=2)).map(lambda t: [t[0], t[1], *t[2]]), max_size=8)


def _event(tag_list: list[list[str]]) -> Event:
    return _SIGNER.sign_event(kind=9, tags=tag_list, content="")


@given(tag_list=tags, channel=st.sampled_from([CHANNEL, None, uuid.UUID(int=7)]))
def test_the_rows_and_the_flag_hold_every_indexed_pair_and_no_other(
    tag_list: list[list[str]], channel: uuid.UUID | None
) -> None:
    event = _event(tag_list)
    pairs = _pairs(event)  # every (single-letter name, first value), as the index held them before
    names_, values_, flag = indexed_tags(event, channel)
    rows = list(zip(names_, values_, strict=True))
    own = ("h", str(channel)) if channel is not None else None
    assert flag == (own in pairs)
    assert own not in rows
    assert set(rows) | ({own} if flag else set()) == pairs
    assert len(rows) == len(set(rows))  # each pair once


def _pairs(event: Event) -> set[tuple[str, str]]:
    names_, values_, _ = indexed_tags(event)
    return set(zip(names_, values_, strict=True))


def _rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with psycopg.connect(relay_database_url(), autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(sql, params).fetchall()]


@pytest.fixture
def world(transactional_db: None) -> tuple[Signer, int, uuid.UUID, uuid.UUID]:
    alice = Signer.generate()
    community = make_community("tags.test", members=[alice])
    return alice, community.pk, make_channel(community, alice, name="c"), make_channel(community, alice, name="d")


async def test_h_filters_find_messages_stored_with_and_without_their_h_row(
    world: tuple[Signer, int, uuid.UUID, uuid.UUID], relay_factory: Any
) -> None:
    alice, community, channel, other = world
    relay = relay_factory()
    async with RelayClient.connect(relay.ws_url, host="tags.test") as client:
        assert (await client.auth(alice))[2] is True
        new = alice.sign_event(kind=9, tags=[["h", str(channel)], ["t", "x"]], content="stored now").to_dict()
        assert (await publish(client, new))[2] is True
        # A row stored before h_is_channel: its h row in the tag index, the flag false.
        old = alice.sign_event(kind=9, tags=[["h", str(channel)]], content="stored before")
        with psycopg.connect(relay_database_url(), autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw,"
                " received_at) VALUES (%s, %s, %s, 9, %s, %s, %s, now()) RETURNING key",
                [old.id, community, old.pubkey, old.created_at, channel, old.to_json()],
            )
            (key,) = cur.fetchone()  # type: ignore[misc]
            cur.execute("INSERT INTO buzz_eventtag (event_key, name, value) VALUES (%s, 'h', %s)", [key, str(channel)])
        # Stored through the write path: flagged, and no h row (its t row is still written).
        assert _rows(
            "SELECT e.h_is_channel, array_agg(t.name ORDER BY t.name) FROM buzz_storedevent e"
            " JOIN buzz_eventtag t ON t.event_key = e.key WHERE e.id = %s GROUP BY e.h_is_channel",
            [new["id"]],
        ) == [(True, ["t"])]
        final, events = await query(client, "mine", {"kinds": [9], "#h": [str(channel)]})
        assert final[0] == "EOSE" and {e["id"] for e in events} == {new["id"], old.id}
        # The other channel's id matches neither row (its h row's value is this channel's).
        final, events = await query(client, "none", {"kinds": [9], "#h": [str(other)]})
        assert final[0] == "EOSE" and events == []
        final, events = await query(client, "both", {"kinds": [9], "#h": [str(other), str(channel)], "#t": ["x"]})
        assert final[0] == "EOSE" and [e["id"] for e in events] == [new["id"]]
