"""Community services (writes) and selectors (reads).

Management commands, the admin and `make run` all go through these functions.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import connection, models, transaction

from buzz.access.changes import access_changed
from buzz.live import signals
from buzz.models import AdmissionMode, Community, RelayMember, RelayRole, validate_public_url
from buzz.nostr import Signer
from buzz.orm import orm_call
from buzz.runtime import fetch_all

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
    validate_public_url(url)
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


@dataclass(frozen=True, slots=True)
class PurgeStep:
    """One table's rows of a community: `where` selects them, with the community's id as %(community)s."""

    table: str
    where: str


def _fk_column(model: type[models.Model], target: type[models.Model]) -> list[models.ForeignKey[Any, Any]]:
    return [f for f in model._meta.concrete_fields if isinstance(f, models.ForeignKey) and f.related_model is target]


def deletion_plan() -> list[PurgeStep]:
    """Every table whose rows belong to a community, in the order a deletion empties them (a table whose rows
    are found through another table's rows before that table). Found from the installed models, so a new
    model is covered as soon as it has a foreign key to Community or to a table covered here: a row with a
    foreign key to Community is the community's; a row whose foreign key cascades from a row of the
    community's is too. Raises ImproperlyConfigured for a foreign key that would not cascade (PROTECT,
    SET_NULL...) from a row of the community's: deleting it would break that row, or keep data that belongs
    to nobody."""
    quote = connection.ops.quote_name
    # model -> (how many foreign keys away from Community, the condition selecting the community's rows)
    owned: dict[type[models.Model], tuple[int, str]] = {Community: (0, '"id" = %(community)s')}
    concrete = [m for m in apps.get_models() if m._meta.managed and not m._meta.proxy]
    changed = True
    while changed:
        changed = False
        for model in concrete:
            if model in owned:
                continue
            direct = _fk_column(model, Community)
            if direct:
                owned[model] = (1, f"{quote(direct[0].column)} = %(community)s")
                changed = True
                continue
            for field in model._meta.concrete_fields:
                if not isinstance(field, models.ForeignKey):
                    continue
                parent = field.related_model
                if parent not in owned:
                    continue
                depth, where = owned[parent]
                target = quote(field.target_field.column)
                owned[model] = (
                    depth + 1,
                    f"{quote(field.column)} IN (SELECT {target} FROM {quote(parent._meta.db_table)} WHERE {where})",  # noqa: S608
                )
                changed = True
                break
    for model in concrete:
        for field in model._meta.concrete_fields:
            if not isinstance(field, models.ForeignKey) or field.related_model not in owned:
                continue
            if field.remote_field.on_delete is not models.CASCADE:
                raise ImproperlyConfigured(
                    f"{model.__name__}.{field.name} does not cascade from {field.related_model.__name__}:"
                    " a community's deletion can't decide what becomes of its rows"
                )
    steps = sorted(
        ((depth, model._meta.db_table, where) for model, (depth, where) in owned.items()),
        key=lambda step: (-step[0], step[1]),
    )
    return [PurgeStep(quote(table), where) for _, table, where in steps]


def deletion_counts(*, community: Community) -> dict[str, int]:
    """The rows `community_delete` would delete now, per table (for the operator's confirmation)."""
    counts: dict[str, int] = {}
    with connection.cursor() as cursor:
        for step in deletion_plan():
            cursor.execute(f"SELECT count(*) FROM {step.table} WHERE {step.where}", {"community": community.pk})  # noqa: S608
            counts[step.table.strip('"')] = int(cursor.fetchone()[0])  # type: ignore[index]
    return counts


def community_delete(*, community: Community) -> dict[str, int]:
    """Delete a community and everything in it, in one transaction: its relay members, tokens, bans,
    channels and memberships, stored events, artifacts with their revisions, current tags, move-source
    records and policy stamp, audit records and retention policy (`deletion_plan`). Returns the rows
    deleted per table.

    Admission closes with the commit: every later check reads the community's row (buzz.access.policy),
    and there is none; its host is unknown to every relay process once that process's directory entry
    expires (seconds). After commit, every open subscription of the community re-checks its reader and ends
    (a REQ with CLOSED "restricted: ...", a sync with CLOSED "resync: ..."), on every node. A write that
    was under way commits nothing: the community's row is locked first, so the write's foreign key check
    waits for this deletion and then fails.

    The audit log is the community's and goes with it; the caller reports the deletion (the command
    prints it). Django's own cascade (Community.delete() in a shell) would delete the rows but tell no
    open subscription, which is why the admin does not offer it."""
    counts: dict[str, int] = {}
    plan = deletion_plan()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT id FROM buzz_community WHERE id = %s FOR UPDATE", [community.pk])
        if cursor.fetchone() is None:
            raise ValidationError(f"community {community.host} no longer exists")
        for step in plan:
            cursor.execute(f"DELETE FROM {step.table} WHERE {step.where}", {"community": community.pk})  # noqa: S608
            counts[step.table.strip('"')] = cursor.rowcount
        # Every node's subscriptions of this community re-check their reader, who is admitted no more.
        signals.publish_standing_on_commit(community.pk, None, signals.WHY_COMMUNITY_DELETED)
        transaction.on_commit(directory.clear)  # this process forgets the host at once
    return counts


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


async def admitted(community: CommunityInfo, pubkey: str) -> bool:
    """NIP-42 admission, on the community's row as it is now (buzz.access.policy.admitted_sql), not on the
    directory's copy: an open community admits every pubkey, a members-only one its relay members, and a
    community deleted since the directory cached it nobody."""
    from buzz.access.policy import admitted_sql  # the policy imports this module

    rows = await fetch_all(f"SELECT {admitted_sql('%s', '%s')}", (community.id, pubkey))
    return bool(rows and rows[0][0])
