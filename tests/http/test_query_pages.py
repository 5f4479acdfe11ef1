"""NIP-AR views never present a cut result as complete, against a real relay process.

`head` answers for every artifact it names: its limit is the number of #d values, a smaller
explicit limit or an offset is a 400. A `current` or `history` page that fills its limit says
so in `Buzz-Page-Full: true` (and `Buzz-Next-Offset`), a page that doesn't in
`Buzz-Page-Full: false`; the body stays a JSON array.

The data: 150 artifacts in one channel, written through the real write path (WebSocket
EVENTs), one of them updated (so history has 151 revisions) and one deleted (current: 149).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.models import Community
from buzz.nostr import Signer
from tests.artifacts.query_model import Author, Channel, World
from tests.http.http_support import Answer, view
from tests.support.relay import RelayProcess, relays_key
from tests.support.wire import publish
from tests.support.wsclient import RelayClient

pytestmark = pytest.mark.django_db

HOST = "query-pages.test"
N = 150  # more than the default page (100), within max_values (256)


@dataclass
class Env:
    relay: RelayProcess
    w: Signer
    channel: str
    ds: list[str] = field(default_factory=list)  # sorted, the order current and head answer in
    deleted: str = ""


async def _populate(env: Env) -> None:
    world = World()
    world.channels[env.channel] = Channel(env.channel, "open", True, members={env.w.pubkey})
    author = Author(world, env.w)
    async with RelayClient.connect(env.relay.ws_url, host=HOST) as client:
        assert (await client.auth(env.w))[2] is True

        async def put(d: str, op: str, **kw: Any) -> None:
            event = author.revision(d, op, **kw)
            reply = await publish(client, event)
            assert reply[2] is True, reply
            author.accepted(event)

        for _ in range(N):
            d = str(uuid.uuid4())
            env.ds.append(d)
            await put(d, "create", h=env.channel, type_name="test.page", tags=[["k", "v"]])
        env.ds.sort()
        await put(env.ds[0], "update", tags=[["k", "v"]])
        env.deleted = env.ds[1]
        await put(env.deleted, "delete")


@pytest.fixture(scope="module")
def env(django_db_setup: None, django_db_blocker: Any) -> Iterator[Env]:
    with django_db_blocker.unblock():
        Community.objects.filter(host=HOST).delete()
        w = Signer.generate()
        community = community_create(host=HOST, name="Query pages")
        member_add(community=community, pubkey=w.pubkey)
        cid = uuid.uuid4()
        channels.channel_create(community=community, channel_uuid=cid, name="pages", creator=w.pubkey)
    relay = RelayProcess(env={"BUZZ_WRITES_PER_SECOND": "0"})
    data = Env(relay=relay, w=w, channel=str(cid))
    try:
        relay.start()
        asyncio.run(_populate(data))
        yield data
    finally:
        relay.stop()
        with django_db_blocker.unblock():
            Community.objects.filter(host=HOST).delete()


@pytest.fixture(autouse=True)
def _relay_log(request: pytest.FixtureRequest, env: Env) -> None:
    request.node.stash[relays_key] = [env.relay]


async def q(env: Env, filt: dict[str, Any], path: str = "/query") -> Answer:
    return await view(env.relay, env.w, HOST, filt, path)


def d_of(event: dict[str, Any]) -> str:
    return str(next(t[1] for t in event["tags"] if t[0] == "d"))


def page_marks(answer: Answer) -> tuple[str | None, str | None]:
    return answer.headers.get("buzz-page-full"), answer.headers.get("buzz-next-offset")


async def test_head_returns_every_named_artifact(env: Env) -> None:
    head = {"artifact": "head", "#d": env.ds}
    answer = await q(env, head)
    assert answer.status == 200, answer.body
    events = answer.json()
    # All 150, the deletion among them, each once and in d order; nothing cut at the default page of 100.
    assert [d_of(e) for e in events] == env.ds
    assert page_marks(answer) == ("false", None)
    count = await q(env, head, "/count")
    assert (count.status, count.json()) == (200, {"count": N})
    # An explicit limit at (or above) the number of names answers the same.
    for limit in (N, N + 1, 1000):
        again = await q(env, {**head, "limit": limit})
        assert again.status == 200 and [d_of(e) for e in again.json()] == env.ds, limit


async def test_head_refuses_a_limit_or_offset_that_would_cut_it(env: Env) -> None:
    head = {"artifact": "head", "#d": env.ds}
    for extra, words in (
        ({"limit": N - 1}, f"at least {N}"),
        ({"limit": 100}, f"at least {N}"),
        ({"limit": 1}, f"at least {N}"),
        ({"offset": 1}, "no offset"),
        ({"limit": N, "offset": 10}, "no offset"),
    ):
        for path in ("/query", "/count"):
            answer = await q(env, {**head, **extra}, path)
            assert answer.status == 400, (extra, path, answer.body)
            reason = answer.json()["error"]
            assert reason.startswith("invalid: the head view returns every named artifact") and words in reason
    # Duplicated names count once: the limit is the number of distinct artifacts named.
    answer = await q(env, {"artifact": "head", "#d": [env.ds[5], env.ds[5], env.ds[6]], "limit": 2})
    assert answer.status == 200 and [d_of(e) for e in answer.json()] == env.ds[5:7]
    assert (await q(env, {"artifact": "head", "#d": env.ds[:3], "offset": 0})).status == 200


async def test_current_marks_a_full_page(env: Env) -> None:
    live = [d for d in env.ds if d != env.deleted]  # 149
    # The default page (100 of 149) is full: the answer says so, and where the next page starts.
    first = await q(env, {"artifact": "current"})
    assert first.status == 200
    assert [d_of(e) for e in first.json()] == live[:100]
    assert page_marks(first) == ("true", "100")
    # Reading on from the offset it gives, the rest fits in a page: not full, no next offset.
    rest = await q(env, {"artifact": "current", "offset": 100})
    assert [d_of(e) for e in rest.json()] == live[100:]
    assert page_marks(rest) == ("false", None)
    # A page that happens to end exactly at the last artifact is full too: a full page may have more.
    exact = await q(env, {"artifact": "current", "limit": 49, "offset": 100})
    assert len(exact.json()) == 49 and page_marks(exact) == ("true", "149")
    after = await q(env, {"artifact": "current", "limit": 49, "offset": 149})
    assert after.json() == [] and page_marks(after) == ("false", None)
    small = await q(env, {"artifact": "current", "limit": 10, "offset": 20})
    assert [d_of(e) for e in small.json()] == live[20:30] and page_marks(small) == ("true", "30")
    # An empty page past the end is not full.
    deep = await q(env, {"artifact": "current", "limit": 1, "offset": 10000})
    assert deep.status == 200 and deep.json() == [] and page_marks(deep) == ("false", None)
    # The marks are headers only: the body stays a JSON array, and /count carries none.
    assert first.headers["content-type"] == "application/json" and isinstance(first.json(), list)
    count = await q(env, {"artifact": "current", "limit": 5}, "/count")
    assert count.json() == {"count": 149} and page_marks(count) == (None, None)


async def test_history_marks_a_full_page(env: Env) -> None:
    history = {"artifact": "history", "#h": [env.channel]}
    total = await q(env, history, "/count")
    assert total.json() == {"count": N + 2}  # 150 creates, one update, one delete
    first = await q(env, {**history, "limit": 1000})
    assert len(first.json()) == N + 2 and page_marks(first) == ("false", None)
    page = await q(env, {**history, "limit": 60, "offset": 60})
    assert len(page.json()) == 60 and page_marks(page) == ("true", "120")
    last = await q(env, {**history, "limit": 60, "offset": 120})
    assert len(last.json()) == N + 2 - 120 and page_marks(last) == ("false", None)
    # The pages join up to the whole history, in acceptance order.
    default = await q(env, history)
    assert page_marks(default) == ("true", "100")
    rest = await q(env, {**history, "offset": 100})
    ids = [e["id"] for e in default.json() + rest.json()]
    assert ids == [e["id"] for e in first.json()]
