"""The client's incremental reads (artifacts.client.incremental and `pull`) against real relay processes.

* a store kept by later passes equals the readable set after updates, deletions, moves out of and into
  the reader's channels, and a membership removal (removeChannel);
* a policy change (an open channel unlisted) gets 409 incremental_reset; the prescribed recovery drops
  exactly the saved rows that are no longer readable, and saves a checkpoint that the next pass uses;
* writes between the pages of a pass are in the store after the next pass;
* a pull stopped between the pages of a recovery goes on from its saved cursor in a new process, and still
  revalidates the rows it held;
* preferences survive their row's removal;
* a current-ID read whose answer passes the response bound is split and still answers every id;
* the CLI: an initial then a later pull, --list, --confirm, a store bound to another query, and a relay
  that does not advertise incremental reads.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async

from artifacts.client import (
    Confirmed,
    CurrentFilter,
    Event,
    Keys,
    Pulled,
    Puller,
    Relay,
    RelayUrl,
    Store,
    httpapi,
    next_revision,
    revision,
)
from buzz.chat import channels
from buzz.models import Community
from tests.client.client_support import NO_QUOTA, ClientWorld, admit, cli, cli_process, make_channel

TYPE = "buzz.task"
ENABLED = {
    **NO_QUOTA,
    "BUZZ_ARTIFACT_INCREMENTAL_ENABLED": "1",
    "BUZZ_INCREMENTAL_SIGNING_KEY": "client-incremental-test-" + "k" * 32,
    "BUZZ_INCREMENTAL_PAGE_ROWS": "3",
}


async def publish(relay: Relay, event: Event) -> Event:
    ok = await relay.publish(event)
    assert ok.accepted, ok
    return event


def task(keys: Keys, h: str, n: int, *, type_: str = TYPE, content: Any = None) -> Event:
    return revision(
        keys, d=str(uuid.uuid4()), h=h, type=type_, op="create", title=f"task {n}", content=content or {"n": n}
    )


def open_channel(world: ClientWorld) -> str:
    ch = uuid.uuid4()
    channels.channel_create(community=world.community, channel_uuid=ch, name="open", creator=world.a.pubkey)
    return str(ch)


def heads(events: Iterable[Event]) -> dict[str, str]:
    return {e.first("d") or "": e.id for e in events}


def store_of(world: ClientWorld, path: Path, query: CurrentFilter) -> Store:
    return Store(path, relay=RelayUrl.parse(world.url), pubkey=world.b.pubkey, query=query)


async def test_later_passes_keep_the_readable_set_and_a_reset_recovers_it(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    relay = relay_factory(**ENABLED)
    world = await sync_to_async(admit)(relay, tmp_path)
    p = world.channel  # A and B
    q = await sync_to_async(make_channel)(world, [world.a, world.b])
    x = await sync_to_async(make_channel)(world, [world.a])  # B can't read it
    listed = await sync_to_async(open_channel)(world)  # B reads it without joining, while it is listed
    query = CurrentFilter.of(types=[TYPE])
    store = store_of(world, tmp_path / "store.db", query)
    puller = Puller(RelayUrl.parse(world.url), world.b, query, store)
    async with Relay.connect(world.url, world.a) as a:
        in_p = [await publish(a, task(world.a, p, n)) for n in range(7)]
        in_q = [await publish(a, task(world.a, q, n)) for n in range(2)]
        in_open = [await publish(a, task(world.a, listed, n)) for n in range(2)]
        note = await publish(a, task(world.a, p, 99, type_="buzz.note"))
        hidden = await publish(a, task(world.a, x, 100))

        first = await puller.pull()
        assert first.kind == "initial" and first.pages >= 4 and first.revalidated == 0
        assert store.heads() == heads(in_p + in_q + in_open)
        assert store.checkpoint is not None
        assert note.first("d") not in store.heads()

        in_p[0] = await publish(a, next_revision(world.a, in_p[0], "update", content={"n": 0.5}))
        gone = await publish(a, next_revision(world.a, in_p[1], "delete"))
        moved_out = await publish(a, next_revision(world.a, in_p[2], "move", h=x))
        moved_in = await publish(a, next_revision(world.a, hidden, "move", h=p))
        fresh = await publish(a, task(world.a, q, 3))
        later = await puller.pull()
        assert later.kind == "later" and later.resets == []
        truth = heads([in_p[0], *in_p[3:], moved_in, *in_q, fresh, *in_open])
        assert store.heads() == truth
        assert {gone.first("d"), moved_out.first("d")}.isdisjoint(store.heads())

        # A membership removal: the relay retains it for this reader, the client drops the channel's rows.
        removal = world.a.sign(9001, [["h", q], ["p", world.b.pubkey]], "")
        assert (await a.publish(removal)).accepted
        dropped = await puller.pull()
        assert dropped.channel_removals >= 1
        truth = heads([in_p[0], *in_p[3:], moved_in, *in_open])
        assert store.heads() == truth

        # A policy change: the open channel is unlisted, so its rows are no longer in B's scope.
        await sync_to_async(channels.channel_edit)(
            community=world.community, channel_uuid=uuid.UUID(listed), actor=None, changes={"listed": "false"}
        )
        recovered = await puller.pull()
        assert recovered.resets == ["policy_changed"] and recovered.kind == "initial"
        assert recovered.revalidated == len(in_open)  # the saved rows the new initial read did not bring
        truth = heads([in_p[0], *in_p[3:], moved_in])
        assert store.heads() == truth
        after = await puller.pull()
        assert (after.kind, after.resets, after.revalidated) == ("later", [], 0)
        assert store.heads() == truth
    store.close()


async def test_writes_between_pages_arrive_with_the_next_pass(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    relay = relay_factory(**ENABLED)
    world = await sync_to_async(admit)(relay, tmp_path)
    query = CurrentFilter.of([world.channel], types=[TYPE])
    store = store_of(world, tmp_path / "store.db", query)
    puller = Puller(RelayUrl.parse(world.url), world.b, query, store)
    async with Relay.connect(world.url, world.a) as a:
        made = [await publish(a, task(world.a, world.channel, n)) for n in range(10)]  # 4 pages of 3
        written: list[Event] = []

        async def between() -> None:
            if len(written) < 3:
                made[len(written)] = await publish(
                    a, next_revision(world.a, made[len(written)], "update", content={"n": -1})
                )
                written.append(made[len(written)])

        puller.between_pages = between
        await puller.pull()
        puller.between_pages = None
        await puller.pull()
        assert len(written) == 3
        assert store.heads() == heads(made)
    store.close()


class Stop(Exception):
    """The client process stopping between two pages."""


async def test_a_pull_stopped_between_pages_goes_on_from_where_it_stopped(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    relay = relay_factory(**ENABLED)
    world = await sync_to_async(admit)(relay, tmp_path)
    x = await sync_to_async(make_channel)(world, [world.a])  # B can't read it
    query = CurrentFilter.of(types=[TYPE])
    path = tmp_path / "store.db"
    store = store_of(world, path, query)
    async with Relay.connect(world.url, world.a) as a:
        made = [await publish(a, task(world.a, world.channel, n)) for n in range(10)]  # 4 pages of 3
        full = await Puller(RelayUrl.parse(world.url), world.b, query, store).pull()
        assert full.pages == 4 and store.heads() == heads(made)
        # A recovery (the checkpoint dropped, as after a reset) while one held row has become unreadable.
        moved = await publish(a, next_revision(world.a, made.pop(4), "move", h=x))
        store.drop_checkpoint()
        stopping = Puller(RelayUrl.parse(world.url), world.b, query, store)
        calls = 0

        async def stop_after_two_pages() -> None:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise Stop

        stopping.between_pages = stop_after_two_pages
        try:
            await stopping.pull()
        except Stop:
            pass
        else:
            raise AssertionError("the pull did not stop between its pages")
        saved = store.pass_state
        assert saved is not None and saved.kind == "initial" and saved.cursor and store.checkpoint is None
        store.close()
        # A new client process, the same store file: it reads the pages after the saved cursor only.
        store = store_of(world, path, query)
        report = await Puller(RelayUrl.parse(world.url), world.b, query, store).pull()
        assert report.resumed and not report.restarted and report.kind == "initial"
        assert report.pages == 1, report  # 9 readable rows: pages of 3, two read before the stop
        assert report.revalidated == 1 and report.removes == 1  # the moved row, held when the recovery began
        assert store.heads() == heads(made) and moved.first("d") not in store.heads()
        assert store.checkpoint is not None and store.pass_state is None
        # The checkpoint is the resumed pass's: a later pass from it reads what changed since.
        made[0] = await publish(a, next_revision(world.a, made[0], "update", content={"n": -1}))
        later = await Puller(RelayUrl.parse(world.url), world.b, query, store).pull()
        assert later.kind == "later" and not later.resumed and store.heads() == heads(made)
    store.close()


async def test_preferences_outlive_their_row(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    relay = relay_factory(**ENABLED)
    world = await sync_to_async(admit)(relay, tmp_path)
    query = CurrentFilter.of([world.channel])
    store = store_of(world, tmp_path / "store.db", query)
    puller = Puller(RelayUrl.parse(world.url), world.b, query, store)
    async with Relay.connect(world.url, world.a) as a:
        made = await publish(a, task(world.a, world.channel, 1))
        d = made.first("d") or ""
        await puller.pull()
        store.set_preference(d, "pinned", "yes")
        deleted = await publish(a, next_revision(world.a, made, "delete"))
        await puller.pull()
        assert d not in store.heads()
        assert store.preferences(d) == {"pinned": "yes"}
        back = await publish(a, next_revision(world.a, deleted, "restore", title="back", content={"n": 2}))
        await puller.pull()
        assert store.heads()[d] == back.id
        assert store.preferences(d) == {"pinned": "yes"}
    store.close()


async def test_a_current_id_batch_over_the_response_bound_is_split(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    # 4,608 bytes is the smallest bound the relay takes; each artifact here is about 2.5 KB, so two fit, not five.
    relay = relay_factory(**{**ENABLED, "BUZZ_INCREMENTAL_RESPONSE_BYTES": "6000", "BUZZ_INCREMENTAL_PAGE_ROWS": "100"})
    world = await sync_to_async(admit)(relay, tmp_path)
    query = CurrentFilter.of([world.channel])
    store = store_of(world, tmp_path / "store.db", query)
    puller = Puller(RelayUrl.parse(world.url), world.b, query, store)
    async with Relay.connect(world.url, world.a) as a:
        made = [await publish(a, task(world.a, world.channel, n, content={"pad": "x" * 2000})) for n in range(5)]
        unknown = str(uuid.uuid4())
        ids = [e.first("d") or "" for e in made] + [unknown, "not-a-uuid"]
        whole = {"artifact": "incremental", "action": "current", "query": query.to_json(), "artifactIds": ids}
        status, body = await httpapi.post_json(RelayUrl.parse(world.url), world.b, "/query", [whole])
        assert (status, body["error"]) == (413, "incremental_limit")  # so the client has to split it
        answer = await puller.confirm(ids)
        assert [(c.type, c.id) for c in answer] == [("upsert", d) for d in ids[:5]] + [
            ("remove", unknown),
            ("remove", "not-a-uuid"),
        ]
        assert store.heads() == heads(made)
        # The pull pages under the same bound: the relay cuts the pages shorter, the client follows.
        await puller.pull()
        assert store.heads() == heads(made)
    store.close()


async def test_the_pull_command(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    relay = relay_factory(**ENABLED)
    world = await sync_to_async(admit)(relay, tmp_path)
    base = ["--relay", world.url, "--key-file", str(world.key_files[1]), "--store", str(tmp_path / "s.db")]
    pull = ["pull", *base, "--type", TYPE]
    async with Relay.connect(world.url, world.a) as a:
        made = [await publish(a, task(world.a, world.channel, n)) for n in range(4)]
        code, out, err = await cli(*pull, "--list")
        assert (code, err) == (0, "")
        lines = out.splitlines()
        assert lines[-1] == (
            "pulled: initial read, 2 pages: 4 upserts, 0 removes, 0 channel removals; 4 artifacts held,"
            " checkpoint saved"
        )
        by_d = sorted(made, key=lambda e: e.first("d") or "")
        assert lines[:-1] == [f'{e.first("d")} {e.id} {TYPE} "{e.first("title")}"' for e in by_d]

        updated = await publish(a, next_revision(world.a, made[0], "update", content={"n": 7}))
        code, out, err = await cli(*pull, "--json", "--confirm", made[1].first("d") or "")
        assert (code, err) == (0, "")
        body = json.loads(out)
        # The window starts 120 s before the last pass: the recent creates and B's grant replay too.
        assert (body["pass"], body["held"], body["resets"]) == ("later", 4, [])
        assert body["upserts"] >= 1
        assert body["confirmed"] == [{"artifactId": made[1].first("d"), "type": "upsert", "event": made[1].to_dict()}]
        saved = store_of(world, tmp_path / "s.db", CurrentFilter.of(types=[TYPE]))
        assert saved.heads()[updated.first("d") or ""] == updated.id
        saved.close()

        code, out, err = await cli(*pull, "--recover")
        assert (code, err) == (0, "")
        assert out.startswith("pulled: initial read, 2 pages: 4 upserts") and "revalidated" not in out

        code, out, err = await cli("pull", *base, "--type", "buzz.note")
        assert (code, out) == (1, "")
        assert err.startswith("error: ") and "holds the rows of another query" in err

    plain = relay_factory(**NO_QUOTA)
    (tmp_path / "plain").mkdir()
    other = await sync_to_async(admit)(plain, tmp_path / "plain")
    code, out, err = await cli(
        "pull", "--relay", other.url, "--key-file", str(other.key_files[1]), "--store", str(tmp_path / "p.db")
    )
    assert (code, out) == (1, "")
    assert err == (
        "error: unsupported: the relay does not advertise NIP-AR incremental reads"
        " (NIP-11 artifacts.incremental version 1)\n"
    )


async def test_follow_confirms_each_live_push_with_a_current_id_read(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    relay = relay_factory(**ENABLED)
    world = await sync_to_async(admit)(relay, tmp_path)
    x = await sync_to_async(make_channel)(world, [world.a])  # B can't read it
    query = CurrentFilter.of(types=[TYPE])  # no #h: the pushes of every channel B reads
    store = store_of(world, tmp_path / "store.db", query)
    puller = Puller(RelayUrl.parse(world.url), world.b, query, store)
    async with Relay.connect(world.url, world.a) as a:
        made = await publish(a, task(world.a, world.channel, 1))
        d = made.first("d") or ""
        updates = puller.follow()
        try:
            first = await asyncio.wait_for(anext(updates), 30)
            assert isinstance(first, Pulled) and store.heads() == {d: made.id}
            updated = await publish(a, next_revision(world.a, made, "update", content={"n": 2}))
            confirmed = await asyncio.wait_for(anext(updates), 30)
            assert isinstance(confirmed, Confirmed)
            assert [(e.type, e.id) for e in confirmed.entries] == [("upsert", d)]
            assert store.heads() == {d: updated.id}
            # Moved where B can't read: B's push is the source's kind-45011 removal; the read says remove.
            await publish(a, next_revision(world.a, updated, "move", h=x))
            confirmed = await asyncio.wait_for(anext(updates), 30)
            assert isinstance(confirmed, Confirmed)
            assert [(e.type, e.id) for e in confirmed.entries] == [("remove", d)]
            assert store.heads() == {}
        finally:
            await updates.aclose()
    store.close()


async def test_pull_follow_prints_each_confirmed_push(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    relay = relay_factory(**ENABLED)
    world = await sync_to_async(admit)(relay, tmp_path)
    args = ["--relay", world.url, "--key-file", str(world.key_files[1]), "--store", str(tmp_path / "s.db")]
    proc = await cli_process("pull", *args, "--follow", "--json")
    assert proc.stdout is not None
    try:
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        assert (first["type"], first["pass"], first["held"]) == ("pulled", "initial", 0)
        async with Relay.connect(world.url, world.a) as a:
            made = await publish(a, task(world.a, world.channel, 1))
        line = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        assert line == {
            "type": "confirmed",
            "changes": [{"artifactId": made.first("d"), "type": "upsert", "event": made.to_dict()}],
        }
    finally:
        proc.terminate()
        await proc.wait()
    code, out, err = await cli("pull", *args, "--follow", "--list")
    assert (code, out) == (2, "") and err.startswith("error: --list and --follow don't go together")  # usage


async def test_after_a_signing_key_change_pull_says_to_recover(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    relay = relay_factory(**ENABLED)
    world = await sync_to_async(admit)(relay, tmp_path)
    store = ["--key-file", str(world.key_files[1]), "--store", str(tmp_path / "s.db")]
    assert (await cli("pull", "--relay", world.url, *store))[0] == 0
    # The same relay (its community now answers at the new process's address) with another signing key.
    rekeyed = relay_factory(**{**ENABLED, "BUZZ_INCREMENTAL_SIGNING_KEY": "another-key-" + "r" * 32})
    address = f"127.0.0.1:{rekeyed.port}"
    await sync_to_async(
        lambda: Community.objects.filter(pk=world.community.pk).update(host=address, public_url=f"ws://{address}/")
    )()
    db = sqlite3.connect(tmp_path / "s.db")
    with db:  # the store file, moved with its relay
        db.execute("UPDATE meta SET value = ? WHERE key = 'relay'", (f"http://{address}",))
    db.close()
    code, out, err = await cli("pull", "--relay", f"ws://{address}/", *store)
    assert (code, out) == (1, "")
    assert "(HTTP 400 incremental_invalid)" in err and "run again with --recover" in err, err
    code, out, err = await cli("pull", "--relay", f"ws://{address}/", *store, "--recover")
    assert (code, err) == (0, "") and out.startswith("pulled: initial read")
