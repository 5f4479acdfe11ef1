"""Community services (writes) and selectors (reads).

Management commands, the admin and `make run` all go through these functions.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from django.core.exceptions import ValidationError
from django.db import transaction

from buzz.access.changes import access_changed
from buzz.live import signals
from buzz.models import AdmissionMode, Community, RelayMember, RelayRole
from buzz.nostr import Signer
from buzz.orm import orm_call
from buzz.runtime import runtime

_HOST_RE = re.compile(r"^[a-z0-9.-]{1,253}(:[0-9]{1,5})?$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


# A Host header is `host [":" port]` (RFC 9110 7.2, RFC 3986 3.2.2): a name or an IP literal, then only
# digits. The same shape Django's get_host accepts, so a host the front passes on never fails there.
_HOST_HEADER_RE = re.compile(r"^(?:[a-z0-9.-]+|\[[a-f0-9]*:[a-f0-9.:]+\])(?::[0-9]{1,5})?$")
# A 253-character DNS name, its root dot, ":" and five digits. Anything longer is refused unread.
MAX_HOST_HEADER: Final = 260


def host_header_ok(host: str) -> bool:
    """Is this a well-formed Host header value? (RFC 9112 3.2: a server answers 400 to one that isn't.)"""
    return 0 < len(host) <= MAX_HOST_HEADER and _HOST_HEADER_RE.match(host.lower()) is not None


def normalize_host(host: str) -> str:
    """Lowercase a Host header value, drop the root dot of a fully qualified name (`relay.example.` is
    `relay.example`) and a default port; keep any other port. A value that isn't `host[:port]` (such as
    `localhost:7777.`, whose port is not a number) is returned lowercased, so it names no community."""
    value = host.strip().lower()
    name, sep, port = value.rpartition(":")
    if not (sep and port.isdigit()):
        name, port = value, ""
    if ":" in name and not name.startswith("["):
        return value
    if name.endswith("."):
        name = name[:-1]
    if port in ("80", "443"):
        port = ""
    return f"{name}:{port}" if port else name


def _check_host(host: str) -> str:
    value = normalize_host(host)
    if not _HOST_RE.match(value):
        raise ValidationError(f"invalid host {host!r}: expected a host name with an optional :port")
    return value


def check_pubkey(pubkey: str) -> str:
    if not _HEX64_RE.match(pubkey):
        raise ValidationError(f"invalid pubkey {pubkey!r}: expected 64 lowercase hex characters")
    return pubkey


def community_create(
    *,
    host: str,
    name: str,
    public_url: str | None = None,
    owner: str | None = None,
    admission: str = AdmissionMode.MEMBERS,
    description: str = "",
) -> Community:
    host = _check_host(host)
    if not name.strip():
        raise ValidationError("community name must not be blank")
    if admission not in AdmissionMode.values:
        raise ValidationError(f"admission must be one of {', '.join(AdmissionMode.values)}")
    if owner is not None:
        check_pubkey(owner)
    url = public_url or f"ws://{host}/"
    if not (url.startswith("ws://") or url.startswith("wss://")):
        raise ValidationError("public URL must start with ws:// or wss://")
    if Community.objects.filter(host=host).exists():
        raise ValidationError(f"a community for host {host} already exists")
    signer = Signer.generate()
    with transaction.atomic():
        community = Community(
            host=host,
            name=name.strip(),
            description=description,
            public_url=url,
            relay_secret=signer.secret_hex,
            relay_pubkey=signer.pubkey,
            admission=admission,
        )
        community.full_clean()
        community.save()
        if owner is not None:
            RelayMember.objects.create(community=community, pubkey=owner, role=RelayRole.OWNER)
    return community


def member_add(*, community: Community, pubkey: str, role: str = RelayRole.MEMBER) -> tuple[RelayMember, bool]:
    """Add a relay member, or change the role of an existing one. Returns (member, created)."""
    check_pubkey(pubkey)
    if role not in RelayRole.values:
        raise ValidationError(f"role must be one of {', '.join(RelayRole.values)}")
    with transaction.atomic():
        member, created = RelayMember.objects.update_or_create(
            community=community, pubkey=pubkey, defaults={"role": role}
        )
        if created and community.admission != AdmissionMode.OPEN:
            access_changed(community.pk)  # admitted (again) to a members-only community
    return member, created


def member_remove(*, community: Community, pubkey: str) -> bool:
    """Remove a relay member. False when the pubkey was not one.

    AUTH and every later access decision refuse it from then on (buzz.access.policy); after
    commit, its open subscriptions on every node re-check and end with CLOSED "restricted: ...".
    """
    check_pubkey(pubkey)
    with transaction.atomic():
        deleted, _ = RelayMember.objects.filter(community=community, pubkey=pubkey).delete()
        if deleted:
            signals.publish_standing_on_commit(community.pk, pubkey, signals.WHY_RELAY_MEMBER)
            access_changed(community.pk)
    return bool(deleted)


def community_by_host(host: str) -> Community:
    """Raises Community.DoesNotExist for an unknown host."""
    return Community.objects.get(host=normalize_host(host))


# --- selectors used by the async front and the WebSocket consumer ---------


@dataclass(frozen=True, slots=True)
class CommunityInfo:
    """The immutable facts about a community that every request needs."""

    id: int
    host: str
    name: str
    description: str
    public_url: str
    relay_pubkey: str
    relay_secret: str
    admission: str


class CommunityDirectory:
    """Host -> community lookup with short-lived, bounded caches (one owner object per process).

    Requests choose their community before any authentication, so the cache must not grow with what
    clients send: known hosts are kept in an LRU of at most `max_size`, unknown ones apart in a smaller
    LRU of `max_misses` (so a flood of made-up Host headers can't push known communities out), and a
    malformed or over-long Host is never looked up nor cached.
    """

    def __init__(self, ttl: float = 5.0, *, max_size: int = 1024, max_misses: int = 256) -> None:
        self._ttl = ttl
        self._max_size = max_size
        self._max_misses = max_misses
        self._known: OrderedDict[str, tuple[float, CommunityInfo]] = OrderedDict()
        self._unknown: OrderedDict[str, float] = OrderedDict()

    def clear(self) -> None:
        self._known.clear()
        self._unknown.clear()

    def sizes(self) -> tuple[int, int]:
        """(known hosts cached, unknown hosts cached)."""
        return len(self._known), len(self._unknown)

    def _cached(self, key: str, now: float) -> tuple[bool, CommunityInfo | None]:
        known = self._known.get(key)
        if known is not None and known[0] > now:
            self._known.move_to_end(key)
            return True, known[1]
        unknown = self._unknown.get(key)
        if unknown is not None and unknown > now:
            self._unknown.move_to_end(key)
            return True, None
        return False, None

    def _store(self, key: str, expires: float, info: CommunityInfo | None) -> None:
        if info is not None:
            self._unknown.pop(key, None)
            self._known[key] = (expires, info)
            self._known.move_to_end(key)
            while len(self._known) > self._max_size:
                self._known.popitem(last=False)
        else:
            self._known.pop(key, None)
            self._unknown[key] = expires
            self._unknown.move_to_end(key)
            while len(self._unknown) > self._max_misses:
                self._unknown.popitem(last=False)

    async def lookup(self, host: str) -> CommunityInfo | None:
        if not host_header_ok(host):
            return None
        key = normalize_host(host)
        now = time.monotonic()
        found, cached = self._cached(key, now)
        if found:
            return cached
        info = await orm_call(_load_info)(key)
        self._store(key, now + self._ttl, info)
        return info


def _load_info(host: str) -> CommunityInfo | None:
    c = Community.objects.filter(host=host).first()
    if c is None:
        return None
    return CommunityInfo(
        id=c.pk,
        host=c.host,
        name=c.name,
        description=c.description,
        public_url=c.public_url,
        relay_pubkey=c.relay_pubkey,
        relay_secret=c.relay_secret,
        admission=c.admission,
    )


directory = CommunityDirectory()


async def relay_role(community_id: int, pubkey: str) -> str | None:
    """The relay-level role of pubkey, or None when it is not a relay member."""
    pool = await runtime.pool()
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT role FROM buzz_relaymember WHERE community_id = %s AND pubkey = %s", (community_id, pubkey)
        )
        row = await cur.fetchone()
    return str(row[0]) if row else None


async def admitted(community: CommunityInfo, pubkey: str) -> bool:
    """NIP-42 admission: members-only communities admit relay members only."""
    if community.admission == AdmissionMode.OPEN:
        return True
    return await relay_role(community.id, pubkey) is not None
