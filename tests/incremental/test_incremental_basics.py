"""NIP-AR incremental reads against a real relay: the response shape, paging under one startedAt, a
later pass from a checkpoint (updates, deletes, moves out and into TTL channels, grants and removals),
current-ID reads, #h scope, unlisted channels, and NIP-11."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.chat import channels
from buzz.nostr import Signer
from tests.incremental.support import Client, current_ids, env, incremental, post
from tests.support.factories import make_channel, make_community, revision
from tests.support.relay import RelayProcess
from tests.support.wire import accept, logged_in, request

HOST = "incremental-basics.test"
QUERY = {"artifact": "current", "#type": ["buzz.task"]}
pytestmark = pytest.mark.timeout(300)
STARTED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class World:
    def __init__(self) -> None:
        self.w, self.r, self.x = Signer.generate(), Signer.generate(), Signer.generate()
        self.community = make_community(HOST, members=[self.w, self.r, self.x])
        self.p1 = make_channel(self.community, self.w, visibility="private", members=[self.r])
        self.p2 = make_channel(self.community, self.w, visibility="private")
        self.hidden = make_channel(self.community, self.w, visibility="private")
        self.unlisted = make_channel(self.community, self.w, listed=False)
        self.ttl = uuid.uuid4()
        channels.channel_create(
            community=self.community,
            channel_uuid=self.ttl,
            name="ttl",
            creator=self.w.pubkey,
            visibility="private",
            ttl_seconds=3600,
        )
        channels.member_put(community=self.community, channel_uuid=self.ttl, actor=None, pubkey=self.r.pubkey)
        self.heads: dict[str, dict[str, Any]] = {}


@pytest.fixture
def world(transactional_db: None) -> World:
    return World()


async def _write(
    relay: RelayProcess,
    world: World,
    d: str,
    h: uuid.UUID,
    op: str,
    type_: str = "buzz.task",
    content: str | None = None,
) -> dict[str, Any]:
    prev = world.heads[d]["id"] if d in world.heads else None
    event = revision(world.w, d=d, h=h, op=op, prev=prev, type_=type_, content=content)
    async with logged_in(relay, world.w, host=HOST) as client:
        await accept(client, event)
    world.heads[d] = event
    return event


async def test_initial_read_pages_under_one_start_then_a_later_pass_reports_each_change(
    world: World, relay_factory: Any
) -> None:
    relay = relay_factory(**env(BUZZ_INCREMENTAL_PAGE_ROWS="3"))
    ds = [str(uuid.uuid4()) for _ in range(8)]
    for d in ds[:7]:
        await _write(relay, world, d, world.p1, "create")
    await _write(relay, world, ds[7], world.p1, "create", type_="buzz.note")  # not matching the query
    hidden = await _write(relay, world, str(uuid.uuid4()), world.hidden, "create")
    in_ttl = await _write(relay, world, str(uuid.uuid4()), world.ttl, "create")

    status, first = await post(relay, HOST, world.r, incremental(QUERY))
    assert status == 200, first
    assert set(first) == {"version", "startedAt", "overlapSeconds", "changes", "nextCursor"}
    assert first["version"] == 1 and first["overlapSeconds"] == 120 and STARTED.match(first["startedAt"])
    assert len(first["changes"]) == 3 and first["nextCursor"]

    client = Client([relay], HOST, world.r, QUERY)
    await client.sync()
    assert client.store.heads() == {d: world.heads[d]["id"] for d in ds[:7]}
    assert hidden["id"] not in str(client.store.applied) and in_ttl["id"] not in str(client.store.applied)
    assert client.pages == 3  # 7 rows, 3 a page

    # Later: an update, a delete, a move to a channel the reader can't read, a move into a TTL channel,
    # a grant of p2 (its existing heads replay), and a removal from p1 (removeChannel).
    await _write(relay, world, ds[0], world.p1, "update")
    await _write(relay, world, ds[1], world.p1, "delete")
    await _write(relay, world, ds[2], world.hidden, "move")
    await _write(relay, world, ds[3], world.ttl, "move")
    old_in_p2 = await _write(relay, world, str(uuid.uuid4()), world.p2, "create")
    await sync_to_async(channels.member_put)(
        community=world.community, channel_uuid=world.p2, actor=None, pubkey=world.r.pubkey
    )
    await client.sync()
    expected = {d: world.heads[d]["id"] for d in (ds[0], ds[4], ds[5], ds[6])}
    expected[old_in_p2["tags"][1][1]] = old_in_p2["id"]
    assert client.store.heads() == expected
    assert client.resets == []

    await sync_to_async(channels.member_remove)(
        community=world.community, channel_uuid=world.p1, actor=None, pubkey=world.r.pubkey
    )
    await client.sync()
    assert {"type": "removeChannel", "channelId": str(world.p1)} in client.store.applied
    assert client.store.heads() == {old_in_p2["tags"][1][1]: old_in_p2["id"]}


async def test_current_id_reads_answer_each_id_in_order(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env())
    live = await _write(relay, world, str(uuid.uuid4()), world.p1, "create")
    gone = await _write(relay, world, str(uuid.uuid4()), world.p1, "create")
    await _write(relay, world, gone["tags"][1][1], world.p1, "delete")
    ttl = await _write(relay, world, str(uuid.uuid4()), world.ttl, "create")
    hidden = await _write(relay, world, str(uuid.uuid4()), world.hidden, "create")
    ids = [
        hidden["tags"][1][1],
        "not-a-uuid",
        live["tags"][1][1],
        gone["tags"][1][1],
        ttl["tags"][1][1],
        str(uuid.uuid4()),
        live["tags"][1][1].upper(),
    ]
    status, body = await post(relay, HOST, world.r, current_ids(QUERY, ids))
    assert status == 200, body
    assert set(body) == {"version", "startedAt", "changes"} and STARTED.match(body["startedAt"])
    assert [c["artifactId"] for c in body["changes"]] == ids
    assert [c["type"] for c in body["changes"]] == [
        "remove",
        "remove",
        "upsert",
        "remove",
        "remove",
        "remove",
        "remove",
    ]
    assert body["changes"][2]["event"] == live


async def test_unlisted_open_channels_need_h_and_h_limits_candidates(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**env())
    in_unlisted = await _write(relay, world, str(uuid.uuid4()), world.unlisted, "create")
    in_p1 = await _write(relay, world, str(uuid.uuid4()), world.p1, "create")
    wide = Client([relay], HOST, world.r, QUERY)
    await wide.sync()
    assert wide.store.heads() == {in_p1["tags"][1][1]: in_p1["id"]}
    named = Client([relay], HOST, world.r, {**QUERY, "#h": [str(world.unlisted)]})
    await named.sync()
    assert named.store.heads() == {in_unlisted["tags"][1][1]: in_unlisted["id"]}
    status, body = await post(relay, HOST, world.r, current_ids(QUERY, [in_unlisted["tags"][1][1]]))
    assert status == 200 and body["changes"] == [{"type": "remove", "artifactId": in_unlisted["tags"][1][1]}]
    # #h p1 only: a removal from p1 is reported, and nothing from elsewhere.
    only_p1 = Client([relay], HOST, world.r, {**QUERY, "#h": [str(world.p1)]})
    await only_p1.sync()
    await _write(relay, world, str(uuid.uuid4()), world.unlisted, "create")
    await sync_to_async(channels.member_remove)(
        community=world.community, channel_uuid=world.p1, actor=None, pubkey=world.r.pubkey
    )
    await only_p1.sync()
    assert only_p1.store.rows == {}
    assert only_p1.store.applied[-1] == {"type": "removeChannel", "channelId": str(world.p1)}


async def test_nip11_advertises_incremental_only_when_enabled(world: World, relay_factory: Any) -> None:
    on, off = relay_factory(**env()), relay_factory(BUZZ_WRITES_PER_SECOND="0")
    headers = {"Host": HOST, "Accept": "application/nostr+json"}
    _, doc_on = request(on, "GET", "/", headers)
    _, doc_off = request(off, "GET", "/", headers)
    assert doc_on["artifacts"]["incremental"] == {
        "version": 1,
        "overlapSeconds": 120,
        "pageRows": 100,
        "currentRows": 100,
        "responseBytes": 8388608,
        "permanentChannelsOnly": True,
        "checkpointLifetimeSeconds": 2592000,
    }
    assert "incremental" not in doc_off["artifacts"]
    status, body = await post(off, HOST, world.r, incremental(QUERY))
    assert status == 400 and "artifact must be one of" in body["error"]
