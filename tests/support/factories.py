"""Test data, made the way the product makes it: communities, members, channels, tokens, and signed events.

World builders go through the real services (buzz.identity.communities, buzz.chat.channels,
buzz.identity.tokens), so they need the test database (`db` or `transactional_db`). The
event factories are pure: a Signer (buzz.nostr) signs each event at the current second.

    community = make_community("team.test", members=[alice, bob])
    chat = make_channel(community, alice, visibility="private", members=[bob])
    token = make_token(community, bob, ["messages:read"], channels=[chat])
    await publish(client, message(bob, chat))
    await publish(client, revision(bob, d=uuid.uuid4(), h=chat))
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import secrets
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from buzz.models import Community
from buzz.nostr import Signer

# Reasons the policy gives (buzz.access.policy), spelled out here so a test states what it expects.
NOT_A_MEMBER = "restricted: not a channel member"
TOKEN_INVALID = "auth-required: this token is revoked or expired"
TOKEN_CHANNEL = "restricted: this token does not cover that channel"
READ_WRITE = ("messages:read", "messages:write")

ARTIFACT_KIND = 45010
HTTP_AUTH_KIND = 27235


def signers(n: int) -> list[Signer]:
    """`n` fresh keys."""
    return [Signer.generate() for _ in range(n)]


# --- the world, through the services ----------------------------------------------------


def make_community(host: str, name: str | None = None, *, members: Iterable[Signer] = ()) -> Community:
    """A community at `host` with `members` admitted as relay members."""
    from buzz.identity.communities import community_create

    community = community_create(host=host, name=name or host)
    admit(community, *members)
    return community


def admit(community: Community, *members: Signer) -> None:
    """Admit each signer as a relay member of `community`."""
    from buzz.identity.communities import member_add

    for signer in members:
        member_add(community=community, pubkey=signer.pubkey)


def make_channel(
    community: Community,
    creator: Signer,
    *,
    visibility: str = "open",
    name: str | None = None,
    members: Iterable[Signer] = (),
    admins: Iterable[Signer] = (),
    listed: bool = True,
    channel_uuid: uuid.UUID | None = None,
) -> uuid.UUID:
    """A stream channel created by `creator` (its owner), with `admins` and `members` put in, in that order."""
    from buzz.chat import channels

    cid = channel_uuid or uuid.uuid4()
    channels.channel_create(
        community=community,
        channel_uuid=cid,
        name=name if name is not None else str(cid)[:8],
        creator=creator.pubkey,
        visibility=visibility,
        listed=listed,
    )
    for signer in admins:
        channels.member_put(community=community, channel_uuid=cid, actor=None, pubkey=signer.pubkey, role="admin")
    for signer in members:
        channels.member_put(community=community, channel_uuid=cid, actor=None, pubkey=signer.pubkey)
    return cid


def make_token(
    community: Community,
    signer: Signer,
    scopes: Iterable[str] = READ_WRITE,
    *,
    channels: Iterable[uuid.UUID | str] | None = None,
    expires_in: dt.timedelta | None = None,
) -> str:
    """A bearer token for `signer` holding `scopes`, limited to `channels` when given."""
    from buzz.identity.tokens import token_create

    limited = None if channels is None else [str(c) for c in channels]
    return token_create(
        community=community, pubkey=signer.pubkey, scopes=list(scopes), channels=limited, expires_in=expires_in
    ).token


# --- signed events -----------------------------------------------------------------------


def signed(
    signer: Signer, kind: int, tags: Sequence[Sequence[str]], content: str | None = None, created_at: int | None = None
) -> dict[str, Any]:
    """A signed event created now. The default content is random, so two otherwise equal events
    signed in the same second still have different ids."""
    if content is None:
        content = secrets.token_hex(4)
    when = int(time.time()) if created_at is None else created_at
    return signer.sign_event(kind=kind, tags=[list(t) for t in tags], content=content, created_at=when).to_dict()


def message(
    signer: Signer,
    channel: uuid.UUID | str,
    content: str | None = None,
    extra: Sequence[Sequence[str]] = (),
    *,
    root: str | None = None,
    p: Iterable[str] = (),
    created_at: int | None = None,
) -> dict[str, Any]:
    """A kind-9 chat message in `channel`: a reply in `root`'s thread when given, mentioning each of `p`."""
    tags: list[list[str]] = [["h", str(channel)]]
    if root is not None:
        tags.append(["e", root, "", "root"])
    tags.extend(["p", pk] for pk in p)
    tags.extend(list(t) for t in extra)
    return signed(signer, 9, tags, content, created_at)


class _Auto:
    """The default title: one for every op but a delete (which carries none)."""


AUTO_TITLE = _Auto()


def revision(
    signer: Signer,
    *,
    d: uuid.UUID | str,
    h: uuid.UUID | str,
    op: str = "create",
    prev: str | None = None,
    root: str | None = None,
    type_: str = "buzz.task",
    title: str | _Auto | None = AUTO_TITLE,
    p: Iterable[str] = (),
    extra: Sequence[Sequence[str]] = (),
    content: str | None = None,
    created_at: int | None = None,
) -> dict[str, Any]:
    """A NIP-AR kind-45010 revision with the envelope tags in the spec's order:
    ar, d, h, type, title, op, root, prev, then `p` mentions and `extra` tags as given.

    `title`: by default "Plan" unless op is delete; a string is always sent (even on a delete, or
    blank), None never. `content`: by default "" for a delete, else a small JSON object with a
    random field, so equal revisions signed in the same second differ.
    """
    tags: list[list[str]] = [["ar", "1"], ["d", str(d)], ["h", str(h)], ["type", type_]]
    if isinstance(title, _Auto):
        if op != "delete":
            tags.append(["title", "Plan"])
    elif title is not None:
        tags.append(["title", title])
    tags.append(["op", op])
    if root is not None:
        tags.append(["root", root])
    if prev is not None:
        tags.append(["prev", prev])
    tags.extend(["p", pk] for pk in p)
    tags.extend(list(t) for t in extra)
    if content is None:
        content = "" if op == "delete" else json.dumps({"version": 1, "n": secrets.token_hex(4)})
    return signed(signer, ARTIFACT_KIND, tags, content, created_at)


def nip98_url(signer: Signer, url: str, method: str, body: bytes = b"") -> str:
    """`Authorization: Nostr <base64>` for one request to `url`. A nonce tag keeps two requests in
    the same second from having the same event id, which the relay's replay guard would refuse."""
    tags = [["u", url], ["method", method], ["nonce", secrets.token_hex(8)]]
    if body:
        tags.append(["payload", hashlib.sha256(body).hexdigest()])
    event = signer.sign_event(kind=HTTP_AUTH_KIND, tags=tags, content="", created_at=int(time.time()))
    return "Nostr " + base64.b64encode(json.dumps(event.to_dict()).encode()).decode()


def nip98(signer: Signer, host: str, method: str, path: str, body: bytes = b"") -> str:
    """The NIP-98 header for http://<host><path> (a test community's public_url is ws://<host>/)."""
    return nip98_url(signer, f"http://{host}{path}", method, body)
