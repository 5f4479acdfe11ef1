"""Helpers for the write-path tests (kind 9 and NIP-AR side by side). Not a test module.

Signed kind-9 messages and kind-45010 revisions with whatever tags a test needs, and one
EVENT -> OK round trip over a RelayClient.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from typing import Any

from buzz.nostr import Signer
from tests.support.wsclient import RelayClient

HEAD_UNAVAILABLE = "conflict: head unavailable"
IDENTITY_TAKEN = "conflict: artifact identity is taken"


def message(
    signer: Signer,
    channel: uuid.UUID | str,
    *,
    root: str | None = None,
    extra: list[list[str]] | None = None,
    content: str | None = None,
) -> dict[str, Any]:
    """A kind-9 message in `channel`; `root` adds the NIP-10 ["e", root, "", "root"] tag."""
    tags: list[list[str]] = [["h", str(channel)]]
    if root is not None:
        tags.append(["e", root, "", "root"])
    tags.extend(extra or [])
    body = secrets.token_hex(6) if content is None else content
    return signer.sign_event(kind=9, tags=tags, content=body, created_at=int(time.time())).to_dict()


def revision(
    signer: Signer,
    *,
    d: uuid.UUID | str,
    h: uuid.UUID | str,
    op: str,
    prev: str | None = None,
    root: str | None = None,
    type_: str = "buzz.task",
    title: str = "A task",
    extra: list[list[str]] | None = None,
    content: str | None = None,
) -> dict[str, Any]:
    """A kind-45010 revision with the envelope tags (title left out on delete) and `extra` tags."""
    tags: list[list[str]] = [["ar", "1"], ["d", str(d)], ["h", str(h)], ["type", type_]]
    if op != "delete":
        tags.append(["title", title])
    tags.append(["op", op])
    if root is not None:
        tags.append(["root", root])
    if prev is not None:
        tags.append(["prev", prev])
    tags.extend(extra or [])
    if content is None:
        content = "" if op == "delete" else json.dumps({"version": 1, "n": secrets.token_hex(4)})
    return signer.sign_event(kind=45010, tags=tags, content=content, created_at=int(time.time())).to_dict()


async def send(client: RelayClient, event: dict[str, Any]) -> list[Any]:
    """EVENT, then its ["OK", id, ok, message]."""
    await client.send_json(["EVENT", event])
    return await client.expect("OK", where=lambda m: len(m) > 1 and m[1] == event["id"])


async def accepted(client: RelayClient, event: dict[str, Any]) -> str:
    """Send an event that must be accepted; its id."""
    reply = await send(client, event)
    assert reply[2] is True and reply[3] == "", reply
    return str(event["id"])
