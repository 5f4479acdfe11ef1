"""Input the database can never store is refused as `invalid:`, not answered as transient (issue 9, item 12).

PostgreSQL text can't hold U+0000, and the NIP-01 tag index keeps a single-letter tag's first
value in a column of at most 4,096 characters. Such an event used to reach the INSERT and come back
as "error: could not store the event, try again" (HTTP 503) with a traceback: a client told to
retry would retry forever. The relay checks both before storage, for every kind: a NUL anywhere in
a tag (a kind-9 tag value, an artifact's title, a client-defined tag, a tag name), or an indexed
value over the limit, gets `invalid:` with a reason, and nothing is stored. NUL in content is fine:
it is stored JSON-escaped and served back verbatim.

The property test sends events whose tags hypothesis chooses (names and values of any Unicode, NUL
included, values around the length limit), as kind 9 and as NIP-AR creates, and checks that none is
answered with `error:`, that a refused one is not stored, and that an accepted one is served back as
it was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.models import Community
from buzz.nostr import Signer
from tests.artifacts.write_support import message, revision, send
from tests.support.records import stored
from tests.support.wire import http, query
from tests.support.wsclient import RelayClient

HOST = "unstorable.test"
RELAY_ENV = {"BUZZ_WRITES_PER_SECOND": "0"}
INDEXED_VALUE_CHARS = 4096


@dataclass
class World:
    community: Community
    alice: Signer
    chat: uuid.UUID


@pytest.fixture
def world(transactional_db: None) -> World:
    community = community_create(host=HOST, name="Unstorable")
    alice = Signer.generate()
    member_add(community=community, pubkey=alice.pubkey)
    chat = uuid.uuid4()
    channels.channel_create(community=community, channel_uuid=chat, name="chat", creator=alice.pubkey)
    return World(community, alice, chat)


def kind9(world: World, tags: list[list[str]], content: str | None = None) -> dict[str, Any]:
    return message(world.alice, world.chat, extra=tags, content=content)


def create(world: World, tags: list[list[str]], *, title: str = "A task") -> dict[str, Any]:
    return revision(world.alice, d=uuid.uuid4(), h=world.chat, op="create", title=title, extra=tags)


def cases(world: World) -> list[tuple[str, dict[str, Any]]]:
    long_value = "x" * (INDEXED_VALUE_CHARS + 1)
    return [
        ("kind 9, NUL in a single-letter tag value", kind9(world, [["t", "a\x00b"]])),
        ("kind 9, NUL in a multi-letter tag value", kind9(world, [["client", "\x00"]])),
        ("kind 9, NUL in a later element", kind9(world, [["e", "ab" * 32, "wss://x\x00", "root"]])),
        ("kind 9, NUL as a tag name", kind9(world, [["\x00", "x"]])),
        ("kind 9, indexed value over the limit", kind9(world, [["t", long_value]])),
        ("kind 9, multibyte indexed value over the limit", kind9(world, [["t", "é" * (INDEXED_VALUE_CHARS + 1)]])),
        ("artifact, NUL in the title", create(world, [], title="Fix\x00it")),
        ("artifact, NUL in a client tag value", create(world, [["status", "open\x00"]])),
        ("artifact, NUL in a client tag name", create(world, [["sta\x00tus", "open"]])),
        ("artifact, NUL in a single-letter tag", create(world, [["t", "\x00"]])),
    ]


async def test_unstorable_tags_are_invalid_over_websocket(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(world.alice))[2] is True
        for name, event in cases(world):
            reply = await send(client, event)
            assert reply[2] is False and reply[3].startswith("invalid:"), (name, reply)
            assert not await stored(event["id"]), name
        # The limit itself is storable, and so is NUL in content (stored JSON-escaped).
        for event in (kind9(world, [["t", "x" * INDEXED_VALUE_CHARS]]), kind9(world, [], content="a\x00b")):
            reply = await send(client, event)
            assert reply[2:] == [True, ""], reply
            _, found = await query(client, "back", {"ids": [event["id"]]})
            assert found == [event]
    # The relay logged no traceback for any of them.
    assert "Traceback" not in relay.log_text()


async def test_unstorable_tags_are_400_over_http(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    for name, event in cases(world):
        body = json.dumps(event).encode()
        status, answer = await http(relay, "POST", "/events", host=HOST, signer=world.alice, body=body)
        assert status == 400 and answer["message"].startswith("invalid:"), (name, status, answer)
    assert "Traceback" not in relay.log_text()


# --- property: no tag content gets error: -------------------------------------------------

_names = st.one_of(
    st.sampled_from(["t", "p", "e", "x", "status", "title", "project", "ar", "d", "op"]),
    st.text(min_size=1, max_size=4),
)
_values = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="ab\x00é", max_size=12),
    st.text(alphabet="ab\x00é", min_size=INDEXED_VALUE_CHARS - 2, max_size=INDEXED_VALUE_CHARS + 2),
)
_tag = st.tuples(_names, st.lists(_values, max_size=3)).map(lambda t: [t[0], *t[1]])
_tags = st.lists(_tag, max_size=5)
_titles = st.one_of(st.just("A task"), st.text(min_size=1, max_size=20))


def test_no_tag_content_is_answered_as_transient(world: World, relay_factory: Any, redis_flush: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()

    async def connect() -> RelayClient:
        client = await stack.enter_async_context(RelayClient.connect(relay.ws_url, host=HOST))
        assert (await client.auth(world.alice))[2] is True
        return client

    client = loop.run_until_complete(connect())
    answers: dict[str, int] = {}

    async def roundtrip(event: dict[str, Any]) -> None:
        reply = await send(client, event)
        assert not reply[3].startswith("error:"), (event["kind"], event["tags"], reply)
        _, found = await query(client, "back", {"ids": [event["id"]]})
        if reply[2]:
            assert found == [event], reply
        else:
            assert found == [], reply
        key = f"{event['kind']} {reply[3].split(':')[0] or 'accepted'}"
        answers[key] = answers.get(key, 0) + 1

    @settings(max_examples=250, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(tags=_tags, title=_titles, artifact=st.booleans())
    def check(tags: list[list[str]], title: str, artifact: bool) -> None:
        event = create(world, tags, title=title) if artifact else kind9(world, tags)
        loop.run_until_complete(roundtrip(event))

    try:
        check()
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()
    # Both kinds reached acceptance and refusal: the property covered both sides.
    assert {"9 accepted", "9 invalid", "45010 accepted", "45010 invalid"} <= set(answers), answers
    assert "Traceback" not in relay.log_text()
