"""ensure(), head lookup, NIP-42 and NIP-98 of the client against real relay processes.

* 20 concurrent callers ensure the same record (same channel, type and key; two keys, each
  caller on its own connection): exactly one reports created, the others duplicate or
  unchanged, and the relay stored exactly one revision.
* After a deletion, ensure restores; on changed content, title or tags it updates, keeping the
  content fields and annotation tags it does not set (another key's), or declines when it can't;
  with on_differs="report" it reports the conflict instead; a head in another channel or
  of another type is a conflict; a refusal that is not a conflict raises EnsureRejected.
* The retry limit: a relay whose head keeps moving makes ensure give up after `attempts`
  (a scripted stand-in for the relay: pure logic of the loop).
* NIP-42: the connection authenticates; a key the relay does not admit is refused.
  NIP-98: the head view answers for the named d, deletions included, nothing for others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from artifacts.client import (
    AuthFailed,
    EnsureRejected,
    Event,
    HttpError,
    Keys,
    Ok,
    Outcome,
    Relay,
    RelayUrl,
    derive_d,
    ensure,
    httpapi,
    next_revision,
    revision,
)
from artifacts.models import Revision
from buzz.chat import channels
from tests.client.client_support import NO_QUOTA, ClientWorld, admit, make_channel

TYPE = "buzz.config"


async def world_for(relay_factory: Any, tmp_path: Path) -> ClientWorld:
    relay = relay_factory(**NO_QUOTA)
    return await sync_to_async(admit)(relay, tmp_path)


@sync_to_async
def stored_ops(d: str) -> list[str]:
    return list(Revision.objects.filter(artifact__d=d).order_by("seq").values_list("op", flat=True))


async def test_twenty_concurrent_callers_create_once(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    world = await world_for(relay_factory, tmp_path)
    content = {"version": 1, "theme": "dark"}
    async with contextlib.AsyncExitStack() as stack:
        relays = [await stack.enter_async_context(Relay.connect(world.url, k)) for k in [world.a, world.b] * 10]
        results = await asyncio.gather(
            *(ensure(r, channel=world.channel, type=TYPE, key="theme", title="Theme", content=content) for r in relays)
        )
        d = derive_d(world.channel, TYPE, "theme")
        head = (await relays[0].head([d]))[d]
    outcomes = Counter(r.outcome for r in results)
    assert outcomes[Outcome.CREATED] == 1, outcomes
    assert set(outcomes) <= {Outcome.CREATED, Outcome.DUPLICATE, Outcome.UNCHANGED}, outcomes
    assert {r.d for r in results} == {d}
    assert {r.head_id for r in results} == {head.id}
    assert await stored_ops(d) == ["create"]
    assert json.loads(head.content) == content and head.first("title") == "Theme"


async def test_restore_after_deletion_and_update_on_change(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    world = await world_for(relay_factory, tmp_path)
    base: dict[str, Any] = {"channel": world.channel, "type": TYPE, "key": "retention", "title": "Retention"}
    async with Relay.connect(world.url, world.a) as relay:
        created = await ensure(relay, **base, content={"days": 30}, tags=[["scope", "chat"]])
        assert created.outcome is Outcome.CREATED
        head = (await relay.head([created.d]))[created.d]
        deletion = next_revision(world.a, head, "delete")
        assert (await relay.publish(deletion)).accepted
        restored = await ensure(relay, **base, content={"days": 30}, tags=[["scope", "chat"]])
        assert restored.outcome is Outcome.RESTORED, restored
        head = (await relay.head([created.d]))[created.d]
        assert (head.id, head.first("op"), head.first("prev")) == (restored.head_id, "restore", deletion.id)

        changed = await ensure(relay, **base, content={"days": 90}, tags=[["scope", "chat"]])
        assert changed.outcome is Outcome.UPDATED
        same = await ensure(relay, **base, content={"days": 90}, tags=[["scope", "chat"]])
        assert (same.outcome, same.head_id) == (Outcome.UNCHANGED, changed.head_id)
        retitled = await ensure(
            relay, **{**base, "title": "Chat retention"}, content={"days": 90}, tags=[["scope", "chat"]]
        )
        retagged = await ensure(
            relay, **{**base, "title": "Chat retention"}, content={"days": 90}, tags=[["scope", "all"]]
        )
        assert (retitled.outcome, retagged.outcome) == (Outcome.UPDATED, Outcome.UPDATED)
        head = (await relay.head([created.d]))[created.d]
        assert head.id == retagged.head_id and json.loads(head.content) == {"days": 90}
        assert (head.first("title"), head.first("scope")) == ("Chat retention", "all")
    assert await stored_ops(created.d) == ["create", "delete", "restore", "update", "update", "update"]


async def test_an_update_keeps_what_ensure_does_not_set(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    """NIP-AR "Client behavior": an editor keeps unfamiliar content fields and annotation tags, or declines. B
    annotates A's record (a tag and a content field ensure knows nothing of); A's ensure then finds nothing to
    change, and a change of its own keeps B's additions."""
    world = await world_for(relay_factory, tmp_path)
    base: dict[str, Any] = {"channel": world.channel, "type": TYPE, "key": "theme", "title": "Theme"}
    async with Relay.connect(world.url, world.a) as a, Relay.connect(world.url, world.b) as b:
        created = await ensure(a, **base, content={"version": 1, "theme": "dark"}, tags=[["scope", "ui"]])
        head = (await b.head([created.d]))[created.d]
        annotated = next_revision(
            world.b,
            head,
            "update",
            content={"version": 1, "theme": "dark", "note": "from b"},
            tags=[["scope", "ui"], ["pinned", "1"]],
        )
        assert (await b.publish(annotated)).accepted
        same = await ensure(a, **base, content={"version": 1, "theme": "dark"}, tags=[["scope", "ui"]])
        assert (same.outcome, same.head_id) == (Outcome.UNCHANGED, annotated.id)
        changed = await ensure(a, **base, content={"version": 1, "theme": "light"}, tags=[["scope", "all"]])
        assert changed.outcome is Outcome.UPDATED
        head = (await a.head([created.d]))[created.d]
        assert head.id == changed.head_id
        assert json.loads(head.content) == {"version": 1, "theme": "light", "note": "from b"}
        assert sorted(list(t) for t in head.tags if t[0] in ("scope", "pinned")) == [["pinned", "1"], ["scope", "all"]]

        # Content that is not a JSON object has no fields to keep: ensure declines rather than drop it.
        opaque = next_revision(world.b, head, "update", content="plain text from b")
        assert (await b.publish(opaque)).accepted
        declined = await ensure(a, **base, content={"version": 1, "theme": "dark"})
        assert (declined.outcome, declined.head_id) == (Outcome.CONFLICT, opaque.id)
        assert declined.message.startswith("conflict: the artifact's content is not a JSON object")
    assert await stored_ops(created.d) == ["create", "update", "update", "update"]


async def test_conflicts_are_reported_and_refusals_raised(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    world = await world_for(relay_factory, tmp_path)
    other_channel = await sync_to_async(make_channel)(world, [world.a, world.b])
    c_only = await sync_to_async(make_channel)(world, [world.keys[2]])
    base: dict[str, Any] = {"channel": world.channel, "type": TYPE, "title": "T"}
    async with Relay.connect(world.url, world.a) as a, Relay.connect(world.url, world.b) as b:
        first = await ensure(a, **base, key="mode", content={"mode": 1})
        reported = await ensure(b, **base, key="mode", content={"mode": 2}, on_differs="report")
        assert (reported.outcome, reported.head_id) == (Outcome.CONFLICT, first.head_id)
        assert reported.message == "conflict: the artifact has other content"

        # Moved away: ensure never moves it back.
        head = (await a.head([first.d]))[first.d]
        moved = next_revision(world.a, head, "move", h=other_channel)
        assert (await a.publish(moved)).accepted
        elsewhere = await ensure(a, **base, key="mode", content={"mode": 1})
        assert (elsewhere.outcome, elsewhere.head_id) == (Outcome.CONFLICT, moved.id)
        assert elsewhere.message == f"conflict: the artifact has channel {other_channel}"

        # Someone created the derived d first, with another type.
        squatted = derive_d(world.channel, TYPE, "squat")
        squat = revision(world.b, d=squatted, h=world.channel, type="buzz.other", op="create", title="x", content="")
        assert (await b.publish(squat)).accepted
        taken = await ensure(a, **base, key="squat", content={})
        assert (taken.outcome, taken.message) == (Outcome.CONFLICT, "conflict: the artifact has type buzz.other")

        with pytest.raises(EnsureRejected) as refused:
            await ensure(a, **{**base, "channel": c_only}, key="x", content={})
        assert refused.value.reason == "restricted: not a channel member"


def _unlisted_open_channel(world: ClientWorld) -> str:
    """An open channel that is not listed, made by A: C, a relay member who never joined it, may write in it,
    and reads it only by naming it (#h)."""
    ch = uuid.uuid4()
    channels.channel_create(
        community=world.community, channel_uuid=ch, name="unlisted", creator=world.a.pubkey, listed=False
    )
    return str(ch)


async def test_ensure_in_an_unlisted_open_channel_the_key_has_not_joined(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    world = await world_for(relay_factory, tmp_path)
    unlisted = await sync_to_async(_unlisted_open_channel)(world)
    base: dict[str, Any] = {"channel": unlisted, "type": TYPE, "key": "k", "title": "T"}
    async with Relay.connect(world.url, world.keys[2]) as c:
        created = await ensure(c, **base, content={"v": 1})
        assert created.outcome is Outcome.CREATED
        d = created.d
        assert await c.head([d]) == {}  # a read without #h does not cover the channel
        assert (await c.head([d], channels=[unlisted]))[d].id == created.head_id
        again = await ensure(c, **base, content={"v": 1})
        # The same create again (a duplicate when signed in the same second): done, from the head read by #h.
        assert again.outcome in (Outcome.DUPLICATE, Outcome.UNCHANGED) and again.head_id == created.head_id
        updated = await ensure(c, **base, content={"v": 2})
        assert updated.outcome is Outcome.UPDATED
        head = (await c.head([d], channels=[unlisted]))[d]
        assert (await c.publish(next_revision(world.keys[2], head, "delete"))).accepted
        restored = await ensure(c, **base, content={"v": 2})
        assert restored.outcome is Outcome.RESTORED
    assert await stored_ops(d) == ["create", "update", "delete", "restore"]


class MovingHead:
    """A stand-in relay whose head moves on before every write: each write is a conflict."""

    def __init__(self, keys: Keys, channel: str) -> None:
        self.writer = keys
        self.keys: Keys | None = keys
        self.channel = channel
        self.heads = 0
        self.sent: list[Event] = []

    async def publish(self, event: Event, *, timeout: float = 15.0) -> Ok:
        self.sent.append(event)
        return Ok(event.id, False, "conflict: head changed; fetch the current revision and reapply your change")

    async def head(
        self, ds: Sequence[str], *, channels: Sequence[str] | None = None, timeout: float = 15.0
    ) -> dict[str, Event]:
        self.heads += 1
        d = ds[0]
        event = revision(
            self.writer,
            d=d,
            h=self.channel,
            type=TYPE,
            op="update",
            title="other",
            prev=f"{self.heads:064x}",
            content={"n": self.heads},
        )
        return {d: event}


async def test_ensure_gives_up_after_its_attempts() -> None:
    keys = Keys.generate()
    relay = MovingHead(keys, "11111111-1111-4111-8111-111111111111")
    result = await ensure(relay, channel=relay.channel, type=TYPE, key="k", title="T", content={}, attempts=3)
    assert result.outcome is Outcome.CONFLICT and result.attempts == 3
    assert result.message.endswith("(gave up after 3 attempts)")
    assert relay.heads == 3
    assert [e.first("op") for e in relay.sent] == ["create", "update", "update", "update"]


async def test_nip42_and_the_nip98_head_view(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    world = await world_for(relay_factory, tmp_path)
    with pytest.raises(AuthFailed) as refused:
        async with Relay.connect(world.url, world.outsider):
            pass
    assert refused.value.reason == "restricted: not a relay member"
    async with Relay.connect(world.url, world.a) as a, Relay.connect(world.url, world.keys[2]) as c:
        assert a.authenticated == world.a.pubkey
        live = revision(
            world.a,
            d=derive_d(world.channel, TYPE, "x"),
            h=world.channel,
            type=TYPE,
            op="create",
            title="x",
            content="{}",
        )
        gone = revision(
            world.a,
            d=derive_d(world.channel, TYPE, "y"),
            h=world.channel,
            type=TYPE,
            op="create",
            title="y",
            content="{}",
        )
        assert (await a.publish(live)).accepted and (await a.publish(gone)).accepted
        deletion = next_revision(world.a, gone, "delete")
        assert (await a.publish(deletion)).accepted
        unknown = derive_d(world.channel, TYPE, "never")
        heads = await a.head([live.first("d") or "", gone.first("d") or "", unknown])
        assert {d: e.id for d, e in heads.items()} == {live.first("d"): live.id, gone.first("d"): deletion.id}
        # C is a relay member outside the channel: nothing, as for an unknown d.
        assert await c.head([live.first("d") or ""]) == {}
    # NIP-98 signed by a key the relay does not admit: refused, with the relay's reason.
    with pytest.raises(HttpError) as http:
        await httpapi.head(RelayUrl.parse(world.url), world.outsider, [live.first("d") or ""])
    assert (http.value.status, http.value.reason) == (403, "restricted: not a relay member")


async def test_query_says_when_a_page_is_full(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    world = await world_for(relay_factory, tmp_path)
    async with Relay.connect(world.url, world.a) as a:
        for n in range(3):
            ev = revision(world.a, d=derive_d(world.channel, TYPE, f"p{n}"), h=world.channel, type=TYPE, op="create",
                          title=f"p{n}", content="{}")  # fmt: skip
            assert (await a.publish(ev)).accepted
        flt: dict[str, Any] = {"artifact": "current", "#h": [world.channel], "#type": [TYPE]}
        first = await a.query({**flt, "limit": 2})
        assert (len(first), first.full, first.next_offset) == (2, True, 2)  # more may follow: not the whole set
        rest = await a.query({**flt, "limit": 2, "offset": 2})
        assert (len(rest), rest.full, rest.next_offset) == (1, False, None)
        whole = await a.query({**flt, "limit": 10})
        assert {e.id for e in whole} == {e.id for e in [*first, *rest]} and not whole.full
