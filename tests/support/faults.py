"""Faults a test injects around real relay processes: Redis held back for a while, an access change whose
signal never leaves the test's process, and the next message of one subscription.

async with redis_paused(redis_client, 2000, "WRITE"):   # PUBLISH waits; reads go on
    ...                                                   # on leaving, the pause has run out
await unsignalled(channels.member_remove, monkeypatch)(community=..., channel_uuid=..., actor=None, pubkey=...)
message = await next_for(client, "s")                    # the next EVENT/EOSE/CLOSED of "s"
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async

from buzz.live import signals
from tests.support.wsclient import RelayClient


@contextlib.asynccontextmanager
async def redis_paused(client: redis.Redis, ms: int, mode: str) -> AsyncIterator[None]:
    """CLIENT PAUSE `ms` `mode` (WRITE: PUBLISH waits, reads don't; ALL: every command, SUBSCRIBE too) for the
    body; leaving waits for the pause to run out, then makes sure it has (CLIENT UNPAUSE)."""
    client.execute_command("CLIENT", "PAUSE", ms, mode)
    try:
        yield
    finally:
        await asyncio.sleep(ms / 1000)
        client.execute_command("CLIENT", "UNPAUSE")


def unsignalled(change: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Awaitable[Any]]:
    """`change` (an ORM service) run in a worker thread with the access signals it publishes after commit never
    sent: the relay processes hear nothing of it (a signal delayed past everything that follows)."""

    def run(**kwargs: Any) -> Any:
        with monkeypatch.context() as patch:
            patch.setattr(signals, "publish_on_commit", lambda *args, **kw: None)
            patch.setattr(signals, "publish_standing_on_commit", lambda *args, **kw: None)
            return change(**kwargs)

    return sync_to_async(run)


async def next_for(client: RelayClient, sub: str, timeout: float = 15.0) -> list[Any]:
    """The next EVENT, EOSE or CLOSED of subscription `sub` (other messages are skipped)."""
    while True:
        message = await client.recv_json(timeout)
        if isinstance(message, list) and len(message) > 1 and message[1] == sub and message[0] != "OK":
            return message
