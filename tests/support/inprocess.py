"""The write services driven in-process, as a relay process drives them: through buzz.runtime's pools and
publisher, against the test database and this run's Redis, with their round trips and PUBLISHes counted.

    async with Harness.open() as h:
        trips, publishes, result = await h.measure(ingest(actor, event))

The data the services read must be committed first (the pool's connections are not the test's), so tests
using this ask for `transactional_db`. The runtime makes a pool and publisher for the test's event loop;
closing the harness shuts them down again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo
from buzz.models import Community
from buzz.nostr import Signer
from buzz.runtime import runtime
from tests.support.pgtrace import PoolTracer, Trips

T = TypeVar("T")
SENTINEL_TOPIC = "test-sentinel"
WAIT = 15.0  # seconds: generous, for a loaded machine; never a timing assertion


def community_info(community: Community) -> CommunityInfo:
    """The request-time facts of a community row, as buzz.identity.communities' directory loads them."""
    return CommunityInfo(
        id=community.pk,
        host=community.host,
        name=community.name,
        description=community.description,
        public_url=community.public_url,
        relay_pubkey=community.relay_pubkey,
        relay_secret=community.relay_secret,
        admission=community.admission,
    )


@contextlib.asynccontextmanager
async def every_connection(
    pool: AsyncConnectionPool[AsyncConnection[Any]],
) -> AsyncIterator[list[AsyncConnection[Any]]]:
    """Every connection the pool has opened, held at once, so that none is handed out twice."""
    async with contextlib.AsyncExitStack() as held:
        yield [await held.enter_async_context(pool.connection()) for _ in range(pool.get_stats()["pool_size"])]


def actor_of(community: Community, signer: Signer) -> Actor:
    """A NIP-42 login of `signer` in `community` (every scope, every channel)."""
    return Actor(community=community_info(community), pubkey=signer.pubkey)


@dataclass
class Harness:
    tracer: PoolTracer
    listener: Any  # redis.asyncio PubSub, psubscribed to this run's prefix
    client: aioredis.Redis
    prefix: str

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, *pools: AsyncConnectionPool[AsyncConnection[Any]]) -> AsyncIterator[Harness]:
        """Traces the runtime's pool and write pool, and `pools` (an app's pools, buzz.runtime.session_pool)."""
        prefix = os.environ["BUZZ_REDIS_PREFIX"]
        client = aioredis.Redis.from_url(os.environ["REDIS_URL"])
        listener = client.pubsub()
        await listener.psubscribe(prefix + "*")
        try:
            tracer = PoolTracer(await runtime.pool(), await runtime.write_pool(), *pools)
            yield cls(tracer, listener, client, prefix)
        finally:
            # The runtime flushes its publisher but leaves its task to the loop (a relay's lasts as long).
            await runtime.publisher().aclose()
            await runtime.aclose()
            await listener.aclose()
            await client.aclose()

    async def measure(self, call: Awaitable[T]) -> tuple[Trips, list[str], T]:
        """Run `call`; its database round trips, and the topics of the PUBLISHes it made (in order)."""
        async with self.tracer.window() as trips:
            result = await call
        return trips, await self._published(), result

    async def _published(self) -> list[str]:
        """Topics published since the last call. The publisher's queue is flushed first, then a sentinel
        is published: Redis delivers in the order it executed the PUBLISHes, so everything before the
        sentinel has arrived when the sentinel does."""
        assert await runtime.publisher().flush(timeout=WAIT), "the publisher did not drain"
        sentinel = self.prefix + SENTINEL_TOPIC
        await self.client.publish(sentinel, json.dumps({"t": "sentinel"}))
        topics: list[str] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while loop.time() < deadline:
            # None also stands for a subscribe confirmation read past, so read on until the deadline.
            message = await self.listener.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is None:
                continue
            channel = message["channel"].decode()
            if channel == sentinel:
                return topics
            topics.append(channel.removeprefix(self.prefix))
        raise AssertionError(f"no sentinel within {WAIT} s; got {topics}")
