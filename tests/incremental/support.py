"""Helpers for the NIP-AR incremental-read tests: the relay environment, signed POST /query, and a client
that keeps a local store the way the spec's client does. Not a test module.

The client applies each page in order (upsert: the row is the event, with its h as its saved home;
remove: the row goes; removeChannel: every row whose saved home is that channel goes), follows
nextCursor, and saves the checkpoint of the final page only. On 409 incremental_reset it runs the
prescribed recovery: a new initial read, then current-ID reads (at most 100 per batch) for every ID
it holds, and saves the new checkpoint only after both. It removes a row only when told to.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from buzz.nostr import Signer
from tests.support.factories import nip98
from tests.support.relay import RelayProcess
from tests.support.wire import raw_request

# One key for every relay of a test: a continuation signed by one instance is verified by another.
SIGNING_KEY = "test-incremental-" + secrets.token_hex(24)
RELAY_ENV = {
    "BUZZ_WRITES_PER_SECOND": "0",
    "BUZZ_ARTIFACT_INCREMENTAL_ENABLED": "1",
    "BUZZ_INCREMENTAL_SIGNING_KEY": SIGNING_KEY,
}


def env(**overrides: str) -> dict[str, str]:
    return {**RELAY_ENV, **overrides}


async def post(relay: RelayProcess, host: str, who: Signer | str, body: Any) -> tuple[int, Any]:
    """A signed POST /query (NIP-98 for a Signer, a bearer token for a str): (status, decoded JSON). A body of
    bytes is sent as it is."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Host": host, "Content-Type": "application/json"}
    if isinstance(who, Signer):
        headers["Authorization"] = nip98(who, host, "POST", "/query", data)
    else:
        headers["Authorization"] = f"Bearer {who}"
    status, raw = await asyncio.to_thread(raw_request, relay, "POST", "/query", headers, data, 30)
    return status, json.loads(raw)


def incremental(query: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
    return [{"artifact": "incremental", "query": query, **extra}]


def current_ids(query: dict[str, Any], ids: Sequence[str]) -> list[dict[str, Any]]:
    return [{"artifact": "incremental", "action": "current", "query": query, "artifactIds": list(ids)}]


def home_of(event: dict[str, Any]) -> str:
    return next(t[1] for t in event["tags"] if t[0] == "h")


class ReadFailed(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status} {body}")
        self.status = status
        self.body = body


@dataclass
class Store:
    """A client's local store for one query: d -> the saved event (its home is its h tag)."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    applied: list[dict[str, Any]] = field(default_factory=list)

    def apply(self, change: dict[str, Any]) -> None:
        self.applied.append(change)
        kind = change["type"]
        if kind == "upsert":
            assert change["event"]["tags"], change
            self.rows[change["artifactId"]] = change["event"]
        elif kind == "remove":
            self.rows.pop(change["artifactId"], None)
        elif kind == "removeChannel":
            for d in [d for d, e in self.rows.items() if home_of(e) == change["channelId"]]:
                del self.rows[d]
        else:
            raise AssertionError(f"unknown change {change}")

    def heads(self) -> dict[str, str]:
        return {d: e["id"] for d, e in self.rows.items()}


@dataclass
class Client:
    """A spec-following incremental client over one or more relays (pages go to them in turn)."""

    relays: Sequence[RelayProcess]
    host: str
    who: Signer | str
    query: dict[str, Any]
    store: Store = field(default_factory=Store)
    checkpoint: str | None = None
    pages: int = 0
    resets: list[str] = field(default_factory=list)
    started: str | None = None  # the startedAt of the last pass read whole
    # Called between two pages of a pass (the simulation writes there).
    between_pages: Callable[[], Awaitable[None]] | None = None

    async def _post(self, body: Any) -> tuple[int, Any]:
        relay = self.relays[self.pages % len(self.relays)]
        self.pages += 1
        return await post(relay, self.host, self.who, body)

    async def _pass(self, checkpoint: str | None) -> tuple[str, list[dict[str, Any]]]:
        """Every page of one pass: (its checkpoint, the changes in order). Raises ReadFailed."""
        changes: list[dict[str, Any]] = []
        extra = {} if checkpoint is None else {"checkpoint": checkpoint}
        started: str | None = None
        while True:
            status, body = await self._post(incremental(self.query, **extra))
            if status != 200:
                raise ReadFailed(status, body)
            assert body["version"] == 1 and body["overlapSeconds"] == 120, body
            assert started in (None, body["startedAt"]), "startedAt is fixed for the whole pass"
            started = body["startedAt"]
            changes.extend(body["changes"])
            if body["nextCursor"] is None:
                assert "checkpoint" in body
                self.started = started
                return body["checkpoint"], changes
            assert "checkpoint" not in body, "only the final page carries a checkpoint"
            extra = {"cursor": body["nextCursor"]}
            if self.between_pages is not None:
                await self.between_pages()

    async def current(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(0, len(ids), 100):
            batch = list(ids[i : i + 100])
            status, body = await self._post(current_ids(self.query, batch))
            if status != 200:
                raise ReadFailed(status, body)
            assert [c["artifactId"] for c in body["changes"]] == batch, "one change per id, in request order"
            out.extend(body["changes"])
        return out

    async def sync(self) -> None:
        """One pass from the saved checkpoint (an initial read without one), with recovery on a reset.
        Applies each page only after the whole pass read (a failed pass applies nothing, saves nothing)."""
        try:
            checkpoint, changes = await self._pass(self.checkpoint)
        except ReadFailed as failed:
            if failed.status != 409 or failed.body.get("error") != "incremental_reset":
                raise
            self.resets.append(failed.body["reason"])
            await self.recover()
            return
        for change in changes:
            self.store.apply(change)
        self.checkpoint = checkpoint

    async def recover(self) -> None:
        """A new initial read, then current-ID reads for every saved ID; progress saved only after both."""
        checkpoint, changes = await self._pass(None)
        known = sorted(self.store.rows)
        revalidated = await self.current(known)
        for change in changes + revalidated:
            self.store.apply(change)
        self.checkpoint = checkpoint
