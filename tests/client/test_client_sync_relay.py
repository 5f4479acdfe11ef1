"""The client's Sync against real relay processes (the relay's WebSocket sync). If the relay's NIP-11
stopped advertising artifacts.sync the module would refuse to load, so a run fails loudly instead of
skipping.

* resync on CLIENT KILL of the relay's hub connection: the Sync gets CLOSED "resync:"
  (rule 5), starts over and ends with the same set as a fresh fetch_set;
* restart after the relay process is killed: the Sync retries through a TCP proxy on a
  fixed address while the relay is down, with the backoff observed through the injected
  sleep and random source (the sleep waits only a token 20 ms), and syncs again once a new
  relay process serves the same database;
* after quiescence the live set equals a fresh fetch_set (digest and heads) after creates,
  updates, tag changes, deletions, restores and moves in and out;
* a membership change ends the Sync with resync:, and losing the channel then refuses it;
* the CLI prints the set and the digest a fresh fetch_set computes;
* the conformance suite runs its sync checks and passes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async

from artifacts.client import (
    Backoff,
    Change,
    Keys,
    Relay,
    Restarting,
    Sync,
    Synced,
    SyncFilter,
    SyncRefused,
    SyncUpdate,
    fetch_set,
    httpapi,
    next_revision,
    revision,
)
from artifacts.services import nip11_section
from buzz.chat import channels
from buzz.dev.devservices import free_port
from buzz.identity.communities import CommunityInfo
from tests.client.client_support import NO_QUOTA, ClientWorld, admit, cli
from tests.support.relay import RelayProcess, relays_key

_PROBE = CommunityInfo(1, "probe", "probe", "", "ws://probe/", "0" * 64, "0" * 64, "members")
if "sync" not in nip11_section(_PROBE):
    raise RuntimeError(
        "the relay's NIP-11 does not advertise artifacts.sync: these tests wait for WebSocket sync to be merged"
    )

TYPE = "buzz.task"
WAIT = 20.0


class Sleeps:
    """The injected sleep: records each backoff delay, then waits a token 20 ms instead."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0.02)


class Follower:
    """A Sync run in a task; its updates are collected and can be awaited."""

    def __init__(self, sync: Sync) -> None:
        self.sync = sync
        self.updates: list[SyncUpdate | BaseException] = []
        self.arrived = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for update in self.sync:
                self.updates.append(update)
                self.arrived.set()
        except Exception as err:
            self.updates.append(err)
            self.arrived.set()

    async def wait_for(self, kind: type, count: int = 1, timeout: float = WAIT) -> list[Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            errors = [u for u in self.updates if isinstance(u, BaseException)]
            if errors and kind is not SyncRefused:
                raise errors[0]
            found = [u for u in self.updates if isinstance(u, kind)]
            if len(found) >= count:
                return found
            assert loop.time() < deadline, f"no {count} x {kind.__name__} within {timeout} s: {self.updates}"
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), 0.5)

    async def close(self) -> None:
        await self.sync.stop()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.task, 10)


async def fresh(world: ClientWorld, flt: SyncFilter) -> dict[str, str]:
    async with Relay.connect(world.url, world.a) as relay:
        got = await fetch_set(relay, flt)
    return {d: e.id for d, e in got.items.items()}


async def quiescent(world: ClientWorld, sync: Sync, flt: SyncFilter) -> dict[str, str]:
    """Wait until the live set equals a fresh fetch_set; return it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        expected = await fresh(world, flt)
        held = {d: e.id for d, e in sync.items.items()}
        if held == expected:
            return expected
        assert loop.time() < deadline, f"live set {held} never matched a fresh sync {expected}"
        await asyncio.sleep(0.2)


async def publish(relay: Relay, event: Any) -> Any:
    ok = await relay.publish(event)
    assert ok.accepted, ok
    return event


def task(keys: Keys, h: str, n: int, status: str = "open") -> Any:
    return revision(
        keys,
        d=str(uuid.uuid4()),
        h=h,
        type=TYPE,
        op="create",
        title=f"task {n}",
        content={"n": n},
        tags=[["status", status]],
    )


def assert_advertised(doc: dict[str, Any]) -> None:
    sync = doc.get("artifacts", {}).get("sync")
    assert isinstance(sync, dict) and sync.get("version") == 1, f"NIP-11 artifacts.sync is {sync!r}"


async def test_resync_on_client_kill_of_the_hub_connection(
    relay_factory: Any, tmp_path: Path, redis_flush: Any, redis_client: redis.Redis
) -> None:
    relay = relay_factory(**NO_QUOTA)
    world = await sync_to_async(admit)(relay, tmp_path)
    assert_advertised(await httpapi.information(httpapi.RelayUrl.parse(world.url)))
    flt = SyncFilter.of([world.channel], types=[TYPE])
    async with Relay.connect(world.url, world.a) as a:
        for n in range(3):
            await publish(a, task(world.a, world.channel, n))
        sleeps = Sleeps()
        follower = Follower(Sync(world.url, world.b, flt, sleep=sleeps))
        try:
            await follower.wait_for(Synced)
            hub = [
                c
                for c in redis_client.client_list()
                if str(c.get("name", "")).startswith(f"buzz-hub-pubsub-{relay.pid}-")
            ]
            assert len(hub) == 1, hub
            assert redis_client.client_kill_filter(_id=str(hub[0]["id"])) == 1
            restart = (await follower.wait_for(Restarting))[0]
            assert restart.cause == "resync", restart
            await follower.wait_for(Synced, 2)
            await publish(a, task(world.a, world.channel, 99))  # live again after the new sync
            assert len(await quiescent(world, follower.sync, flt)) == 4
            assert follower.sync.resyncs >= 1 and len(sleeps.delays) == follower.sync.resyncs
        finally:
            await follower.close()


class Proxy:
    """A TCP proxy on a fixed local port to whichever relay process is current (`target`)."""

    def __init__(self) -> None:
        self.port = free_port("127.0.0.1")
        self.target: int | None = None
        self.server: asyncio.Server | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.target is None:
                raise OSError("no relay")
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Proxy]:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        try:
            yield self
        finally:
            self.server.close()


async def test_restart_after_the_relay_process_is_killed_with_backoff_observed(
    request: pytest.FixtureRequest, transactional_db: None, tmp_path: Path, redis_flush: Any
) -> None:
    proxy = Proxy()
    first, second = RelayProcess(env=NO_QUOTA), RelayProcess(env=NO_QUOTA)
    request.node.stash[relays_key] = [first, second]
    async with proxy.running():
        first.start()
        proxy.target = first.port
        # The community is the address the client uses: the proxy's.
        world = await sync_to_async(admit)(first, tmp_path, address=f"127.0.0.1:{proxy.port}")
        flt = SyncFilter.of([world.channel], types=[TYPE])
        fractions = iter([0.5] * 10_000)
        sleeps = Sleeps()
        sync = Sync(
            world.url, world.b, flt, sleep=sleeps, backoff=Backoff(base=0.1, cap=3.2, random=lambda: next(fractions))
        )
        follower = Follower(sync)
        try:
            async with Relay.connect(world.url, world.a) as a:
                kept = await publish(a, task(world.a, world.channel, 1))
            await follower.wait_for(Synced)
            assert first.proc is not None
            first.proc.kill()  # the relay process dies; the proxy refuses until the next one is up
            first.proc.wait()
            proxy.target = None
            await follower.wait_for(Restarting, 3)
            second.start()
            proxy.target = second.port
            await follower.wait_for(Synced, 2)
            async with Relay.connect(world.url, world.a) as a:
                await publish(a, next_revision(world.a, kept, "update", content={"n": 2}))
            assert len(await quiescent(world, sync, flt)) == 1
        finally:
            await follower.close()
            second.stop()
            first.stop()
    restarts = [u for u in follower.updates if isinstance(u, Restarting)]
    assert restarts[0].cause == "disconnect"
    # Failures in a row double the ceiling (capped); random() = 0.5 halves it: observed, never slept.
    assert sleeps.delays == [0.5 * min(3.2, 0.1 * 2 ** (n - 1)) for n in range(1, len(sleeps.delays) + 1)]
    assert sync.resyncs == len(restarts) == len(sleeps.delays)


async def test_the_live_set_after_quiescence_equals_a_fresh_fetch(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    relay = relay_factory(**NO_QUOTA)
    world = await sync_to_async(admit)(relay, tmp_path)
    other = await sync_to_async(lambda: _channel(world))()
    flt = SyncFilter.of([world.channel], types=[TYPE], tags={"status": ["open"]})
    async with Relay.connect(world.url, world.a) as a:
        heads = [await publish(a, task(world.a, world.channel, n)) for n in range(8)]
        outside = await publish(a, task(world.a, other, 100))
        follower = Follower(Sync(world.url, world.b, flt))
        try:
            await follower.wait_for(Synced)
            heads[0] = await publish(a, next_revision(world.a, heads[0], "update", content={"n": 0.5}))
            heads[1] = await publish(a, next_revision(world.a, heads[1], "update", tags=[["status", "done"]]))
            heads[2] = await publish(a, next_revision(world.a, heads[2], "delete"))
            heads[2] = await publish(
                a,
                next_revision(world.a, heads[2], "restore", title="back", content={"n": 2}, tags=[["status", "open"]]),
            )
            heads[3] = await publish(a, next_revision(world.a, heads[3], "delete"))
            heads[4] = await publish(a, next_revision(world.a, heads[4], "move", h=other))
            await publish(a, next_revision(world.a, outside, "move", h=world.channel))
            for n in range(8, 12):
                await publish(a, task(world.a, world.channel, n))
            settled = await quiescent(world, follower.sync, flt)
            assert len(settled) == 8 - 3 + 1 + 4  # 1 unmatched, 1 deleted, 1 moved out; 1 moved in; 4 new
            assert follower.sync.digest == (await fetch_set(a, flt)).digest
            changes = [u for u in follower.updates if isinstance(u, Change)]
            assert {c.cause for c in changes} >= {"updated", "unmatched", "deleted", "new"}
        finally:
            await follower.close()


def _channel(world: ClientWorld) -> str:
    ch = uuid.uuid4()
    channels.channel_create(
        community=world.community, channel_uuid=ch, name="other", creator=world.a.pubkey, visibility="private"
    )
    channels.member_put(community=world.community, channel_uuid=ch, actor=None, pubkey=world.b.pubkey)
    return str(ch)


async def test_a_membership_change_resyncs_and_losing_the_channel_refuses(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    relay = relay_factory(**NO_QUOTA)
    world = await sync_to_async(admit)(relay, tmp_path)
    follower = Follower(Sync(world.url, world.b, SyncFilter.of([world.channel]), sleep=Sleeps()))
    try:
        await follower.wait_for(Synced)
        async with Relay.connect(world.url, world.a) as a:
            removal = world.a.sign(9001, [["h", world.channel], ["p", world.b.pubkey]], "")
            assert (await a.publish(removal)).accepted
        assert (await follower.wait_for(Restarting))[0].cause == "resync"
        refused = await follower.wait_for(SyncRefused)
        assert refused[0].reason.startswith("restricted:")
    finally:
        await follower.close()


async def test_the_cli_prints_the_fresh_digest(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    relay = relay_factory(**NO_QUOTA)
    world = await sync_to_async(admit)(relay, tmp_path)
    flt = SyncFilter.of([world.channel], types=[TYPE])
    async with Relay.connect(world.url, world.a) as a:
        for n in range(5):
            await publish(a, task(world.a, world.channel, n))
        digest = (await fetch_set(a, flt)).digest
    code, out, err = await cli(
        "sync", "--relay", world.url, "--key-file", str(world.key_files[1]), "--channel", world.channel, "--type", TYPE
    )
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == f"digest {digest} (5 artifacts)"


@pytest.mark.slow
async def test_conformance_runs_and_passes_the_sync_checks(
    relay_factory: Any, tmp_path: Path, redis_flush: Any
) -> None:
    world = await sync_to_async(admit)(relay_factory(), tmp_path)
    keys = [arg for f in world.key_files for arg in ("--key-file", str(f))]
    code, out, _ = await cli("conformance", "--relay", world.url, *keys, "--only", "sync", timeout=110)
    lines = out.splitlines()
    report = "\n".join(lines)
    assert code == 0, report
    assert [line for line in lines if line.startswith(("FAIL", "SKIP"))] == [], report
    assert sum(line.startswith("PASS sync") for line in lines) >= 10, report
