"""Relay-level models: communities (selected by Host) and their relay members."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from django.contrib.postgres.indexes import HashIndex
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from buzz.nostr.url import normalize_url

HEX64 = RegexValidator(r"^[0-9a-f]{64}$", "must be 64 lowercase hex characters")


def validate_public_url(value: str) -> None:
    """A community's public URL: what NIP-42 AUTH names in its relay tag, and whose scheme (wss: https) and host
    NIP-98 signatures name. Anything else would make every correct client's authentication fail."""
    if not value.startswith(("ws://", "wss://")) or normalize_url(value, ignore_trailing_slash=True) is None:
        raise ValidationError("public URL must be a ws:// or wss:// URL with a host, e.g. wss://relay.example.com/")


class ClockTimestamp(models.Func):
    """The database's clock_timestamp(): the time of the statement, on the one clock every node shares.

    Access changes (membership, visibility, deletion) are stamped with it, as head changes are
    (artifacts.services), because incremental reads page on these stamps against the database's
    start time (NIP-AR "Incremental reads"). Python's clock can differ between nodes.
    """

    template = "clock_timestamp()"
    output_field = models.DateTimeField()


class AdmissionMode(models.TextChoices):
    MEMBERS = "members", "members only"
    OPEN = "open", "any authenticated pubkey"


class RelayRole(models.TextChoices):
    OWNER = "owner", "owner"
    ADMIN = "admin", "admin"
    MODERATOR = "moderator", "moderator"
    MEMBER = "member", "member"


_M = TypeVar("_M", bound=models.Model)


class GuardedChange(RuntimeError):
    """A delete or update that would retire a head, remove a revision or change access without the resync
    NIP-AR sync rule 6 requires. Such changes go through moderation's services (or NIP-29 events)."""


class GuardedQuerySet(models.QuerySet[_M]):
    """A queryset whose delete() always raises, and whose update() / bulk_update() raise for `guarded` fields.

    Django's bulk delete and queryset updates (the admin's actions among them) skip every service and
    every live signal, so for these tables they are refused. The services write with their own SQL.
    """

    guarded: frozenset[str] = frozenset()
    why = "use the moderation services (they resync what must resync)"

    def delete(self) -> tuple[int, dict[str, int]]:
        raise GuardedChange(f"{self.model.__name__} rows are never deleted this way: {self.why}")

    def update(self, **kwargs: object) -> int:
        touched = self.guarded & set(kwargs)
        if touched:
            raise GuardedChange(f"{self.model.__name__}.{sorted(touched)[0]} is never updated this way: {self.why}")
        return super().update(**kwargs)

    def bulk_update(self, objs: object, fields: object, batch_size: int | None = None) -> int:
        touched = self.guarded & {str(f) for f in fields}  # type: ignore[attr-defined]
        if touched:
            raise GuardedChange(f"{self.model.__name__}.{sorted(touched)[0]} is never updated this way: {self.why}")
        return super().bulk_update(objs, fields, batch_size=batch_size)  # type: ignore[arg-type]


# Set by the services that change guarded fields through Model.save() and publish the resync themselves.
_services_writing: ContextVar[bool] = ContextVar("buzz_guarded_writes", default=False)


@contextlib.contextmanager
def guarded_writes() -> Iterator[None]:
    """Inside it, Model.save() may change a guarded field. Only the services that publish the change's
    resync (buzz.chat.channels) enter it."""
    token = _services_writing.set(True)
    try:
        yield
    finally:
        _services_writing.reset(token)


class GuardedModel(models.Model):
    """A model whose queryset is a GuardedQuerySet, with the same guard on Model.save(): Django saves an
    instance through the base manager's plain queryset, which GuardedQuerySet never sees, so `obj.retired =
    True; obj.save()` in a shell would retire a head (or change access) with no resync (NIP-AR sync rule 6).
    Saving an existing row that changes a guarded field raises GuardedChange, unless a service that resyncs
    does it (`guarded_writes`). New rows are not checked: creating one changes nothing a sync holds."""

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding and not _services_writing.get():
            self._refuse_guarded_change(kwargs.get("update_fields"))
        super().save(*args, **kwargs)

    def _refuse_guarded_change(self, update_fields: Any) -> None:
        queryset = type(self)._default_manager.get_queryset()
        guarded: frozenset[str] = getattr(queryset, "guarded", frozenset())
        names = sorted(guarded if update_fields is None else guarded & set(update_fields))
        if not names:
            return
        fields = [f for name in names if isinstance(f := self._meta.get_field(name), models.Field)]
        stored = type(self)._base_manager.filter(pk=self.pk).values(*(f.attname for f in fields)).first()
        if stored is None:
            return  # no such row: save() inserts it
        for field in fields:
            if _differs(field, getattr(self, field.attname), stored[field.attname]):
                why = getattr(queryset, "why", GuardedQuerySet.why)
                raise GuardedChange(f"{type(self).__name__}.{field.name} is never changed by save(): {why}")


def _differs(field: models.Field[Any, Any], value: Any, stored: Any) -> bool:
    """Would saving `value` change the stored value? An SQL expression (ClockTimestamp()...) always does."""
    if hasattr(value, "resolve_expression"):
        return True
    try:
        return bool(field.to_python(value) != stored)
    except ValidationError:
        return True  # not a value of the field: it could only be written as something else


class StoredEventQuerySet(GuardedQuerySet["StoredEvent"]):
    # Withholding (a removed message, a redacted or expired revision) is buzz.events.store's, in SQL: undone
    # here it would put a redacted revision back in every NIP-01 replay.
    guarded = frozenset({"deleted_at", "raw", "id", "community", "channel_id", "kind"})
    why = "stored copies change only through buzz.events.store (withhold_sync) and the moderation services"


class ChannelQuerySet(GuardedQuerySet["Channel"]):
    # Deletion and archival go through buzz.chat.channels (or moderation.services), which resync. The type (a
    # DM is read by its members only), `listed` (an unlisted open channel is read by its members and by
    # readers who name it) and the TTL (which puts it under the reaper) change who reads it, or for how long,
    # as visibility does: only buzz.chat.channels changes them, and it signals the change.
    guarded = frozenset(
        {"deleted_at", "archived_at", "visibility", "type", "listed", "ttl_seconds", "community", "uuid"}
    )


class MembershipQuerySet(GuardedQuerySet["Membership"]):
    # Joining, leaving, removal and roles go through buzz.chat.channels, which signals the access change.
    guarded = frozenset({"removed_at", "role", "pubkey", "channel"})
    why = "use buzz.chat.channels (member_put, member_remove), which signal the access change"


class Community(models.Model):
    """One Buzz workspace. Requests select it by their Host header."""

    host = models.CharField(
        max_length=253, unique=True, help_text="Host header value, lowercase, with :port when not default"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    public_url = models.CharField(
        max_length=300,
        validators=[validate_public_url],
        help_text="The ws:// or wss:// URL clients use; NIP-42 AUTH must name it",
    )
    relay_secret = models.CharField(max_length=64, validators=[HEX64], help_text="secp256k1 secret of the relay key")
    relay_pubkey = models.CharField(max_length=64, validators=[HEX64], unique=True)
    admission = models.CharField(max_length=16, choices=AdmissionMode.choices, default=AdmissionMode.MEMBERS)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "communities"
        ordering = ["host"]

    def __str__(self) -> str:
        return f"{self.name} ({self.host})"


class RelayMember(models.Model):
    """A pubkey admitted to a community, with its relay-level role."""

    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="members")
    pubkey = models.CharField(max_length=64, validators=[HEX64])
    role = models.CharField(max_length=16, choices=RelayRole.choices, default=RelayRole.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["community", "pubkey"], name="relay_member_unique")]
        ordering = ["community", "pubkey"]

    def __str__(self) -> str:
        return f"{self.pubkey[:12]}… ({self.role})"


class StoredEvent(GuardedModel):
    """A signed event the relay accepted and serves back (kind-9 messages, relay-signed state...).

    `raw` is the event's JSON exactly as served, so reads never re-serialize.
    Artifact revisions are stored here too (their channel's replay), besides artifacts.Revision.

    Keyed by (community, id): communities are separate workspaces, and one signed event sent to two of
    them is stored in each. `key` is a surrogate, because a foreign key (the tag index) can't point at a
    composite key in Django; raw SQL keeps reading `id` as the NIP-01 event id.
    """

    key = models.BigAutoField(primary_key=True)
    id = models.CharField(max_length=64, validators=[HEX64])
    # No index of its own: every index of the table but two (the key, stored_event_identity) leads with it.
    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="events", db_index=False)
    pubkey = models.CharField(max_length=64)
    kind = models.IntegerField()
    created_at = models.BigIntegerField()
    channel_id = models.UUIDField(null=True, blank=True, help_text="h tag: the channel the event belongs to")
    raw = models.TextField()
    received_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # The event has an h tag whose first value is `channel_id` as text (every kind-9 message, revision and
    # group event does): the tag index holds no row for that h, and a `#h` filter matches it on this
    # column and the channel's (buzz.events.store, buzz.events.query). Rows stored before it have their h row.
    h_is_channel = models.BooleanField(default=False, db_default=False)

    objects = StoredEventQuerySet.as_manager()

    class Meta:
        # Led by the id: the exact lookup by event id (a reply's root, an artifact's anchor) compares the
        # community without searching on it, so this is the one index it can use, whatever the statistics
        # say (tests/chat/test_hot_plans.py), and no second index on id costs every write (migration 0012).
        constraints = [models.UniqueConstraint(fields=["id", "community"], name="stored_event_identity")]
        indexes = [
            models.Index(fields=["community", "kind", "-created_at"], name="event_kind_time"),
            models.Index(fields=["community", "channel_id", "-created_at"], name="event_channel_time"),
            models.Index(fields=["community", "pubkey", "-created_at"], name="event_author_time"),
        ]

    def __str__(self) -> str:
        return f"kind {self.kind} {self.id[:12]}…"

    def delete(self, using: object = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        # Model.delete() goes through Django's collector, not StoredEventQuerySet.delete().
        raise GuardedChange(f"a stored event is never deleted this way: {StoredEventQuerySet.why}")


class EventTag(models.Model):
    """Single-letter tag index for NIP-01 `#x` filters: tag name and its FIRST value, per stored copy."""

    # Inserted by the statement that stores the event (buzz.events.store), and deleted before it wherever
    # events are deleted (discard_sync, community_delete): no constraint re-checks the event for every tag
    # at commit (migration 0012).
    event = models.ForeignKey(
        StoredEvent, on_delete=models.CASCADE, related_name="tag_index", db_column="event_key", db_constraint=False
    )
    name = models.CharField(max_length=1)
    # buzz.events.store refuses a longer value (or a NUL) before storage: INDEXED_VALUE_CHARS.
    value = models.CharField(max_length=4096)

    class Meta:
        # Hash, not btree: a tag value may be longer than a btree entry allows.
        indexes = [HashIndex(fields=["value"], name="event_tag_value")]


# --- channels (NIP-29 groups) ------------------------------------------------


class Visibility(models.TextChoices):
    OPEN = "open", "open"
    PRIVATE = "private", "private"


class ChannelType(models.TextChoices):
    STREAM = "stream", "stream"
    FORUM = "forum", "forum"
    DM = "dm", "direct message"
    WORKFLOW = "workflow", "workflow"


class ChannelRole(models.TextChoices):
    OWNER = "owner", "owner"
    ADMIN = "admin", "admin"
    MEMBER = "member", "member"
    GUEST = "guest", "guest"
    BOT = "bot", "bot"


class Channel(GuardedModel):
    """A NIP-29 group. Its id is the client-chosen UUID of its `h` tag, unique within a community."""

    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="channels")
    uuid = models.UUIDField()
    name = models.CharField(max_length=200)
    about = models.TextField(blank=True, default="")
    topic = models.CharField(max_length=500, blank=True, default="")
    purpose = models.CharField(max_length=500, blank=True, default="")
    visibility = models.CharField(max_length=8, choices=Visibility.choices, default=Visibility.OPEN)
    listed = models.BooleanField(default=True, help_text="unlisted open channels are readable but not discovered")
    type = models.CharField(max_length=10, choices=ChannelType.choices, default=ChannelType.STREAM)
    ttl_seconds = models.PositiveIntegerField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True, help_text="TTL channels: archived by the reaper after this")
    created_by = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    # Database clock (ClockTimestamp), as every access change below.
    deleted_at = models.DateTimeField(null=True, blank=True)
    access_changed_at = models.DateTimeField(
        null=True, blank=True, help_text="last visibility change (database clock); empty if never changed"
    )
    # Advanced in the transaction of every change to who reads the channel (a membership, the visibility, the
    # deletion: buzz.chat.channels._signal_access). A live NIP-AR sync compares it, read with each head, with
    # the value it knew: a change whose signal has not reached it yet is checked before a head goes out.
    access_epoch = models.BigIntegerField(default=0, db_default=0, editable=False)

    objects = ChannelQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["community", "uuid"], name="channel_uuid_unique")]
        indexes = [
            # A community's TTL channels, which every NIP-AR incremental page reads (they count for nothing
            # there): from the TTL channels' own entries, not from every channel of the community.
            models.Index(fields=["community"], condition=models.Q(ttl_seconds__isnull=False), name="channel_ttl"),
        ]
        ordering = ["community", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.uuid})"

    def delete(self, using: object = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        raise GuardedChange("a channel is deleted by buzz.chat.channels.channel_delete (NIP-29 9008), never removed")


class Membership(GuardedModel):
    """A channel membership. A removal sets removed_at; the row stays (incremental reads replay it)."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="memberships")
    pubkey = models.CharField(max_length=64, validators=[HEX64])
    role = models.CharField(max_length=8, choices=ChannelRole.choices, default=ChannelRole.MEMBER)
    # Both on the database clock (ClockTimestamp): incremental reads page on them.
    joined_at = models.DateTimeField(db_default=ClockTimestamp())
    removed_at = models.DateTimeField(null=True, blank=True)
    # Read state: the channel's message count when this member last read (or posted).
    # Unread = the sum of the channel's MessageCounter shards - read_mark, so a message costs O(1) writes.
    read_mark = models.PositiveBigIntegerField(default=0)

    objects = MembershipQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "pubkey"],
                condition=models.Q(removed_at__isnull=True),
                name="membership_active_unique",
            )
        ]
        indexes = [
            models.Index(fields=["pubkey", "channel"], name="membership_by_pubkey"),
            # A reader's retained removals in a time window (NIP-AR incremental reads, removeChannel): from
            # the reader's own rows, not from every channel of the community.
            models.Index(
                fields=["pubkey", "removed_at"],
                condition=models.Q(removed_at__isnull=False),
                name="membership_removals",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pubkey[:12]}… in {self.channel_id} ({self.role})"

    def delete(self, using: object = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        raise GuardedChange("a membership is never deleted: buzz.chat.channels.member_remove sets removed_at")


class Ban(models.Model):
    """Relay-level ban: every write is `blocked:`; reads are refused too."""

    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="bans")
    pubkey = models.CharField(max_length=64, validators=[HEX64])
    reason = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    lifted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["community", "pubkey"], name="ban_lookup")]

    def __str__(self) -> str:
        return f"ban {self.pubkey[:12]}…"


class PolicyStamp(models.Model):
    """One per community: its access-policy stamp, advanced in the transaction of every change to who may read
    in the community that no channel's own access epoch records: a channel's visibility, listing, TTL or
    deletion, a ban, relay admission, a token's revocation, an operator's policy reset
    (buzz.access.changes.access_changed). Membership grants and removals, and every write, leave it alone.

    NIP-AR incremental-read tokens bind it (a token minted before a change is refused after it), a live sync
    compares it with each head, and it is part of every channel's effective access epoch
    (buzz.access.policy.ChannelAccess.epoch), so a live REQ re-decides its reader's standing too.
    """

    community = models.OneToOneField(Community, on_delete=models.CASCADE, primary_key=True)
    stamp = models.BigIntegerField(default=0)
    changed_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"policy stamp {self.stamp} of community {self.community_id}"


class Timeout(models.Model):
    """Relay-level timeout: writes are `restricted:` until `until`; reads continue."""

    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="timeouts")
    pubkey = models.CharField(max_length=64, validators=[HEX64])
    until = models.DateTimeField()
    reason = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["community", "pubkey", "until"], name="timeout_lookup")]

    def __str__(self) -> str:
        return f"timeout {self.pubkey[:12]}… until {self.until:%Y-%m-%d %H:%M}"


class ApiToken(models.Model):
    """A bearer credential for a pubkey, limited to scopes and optionally to channels. Stored hashed."""

    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="tokens")
    pubkey = models.CharField(max_length=64, validators=[HEX64])
    name = models.CharField(max_length=200, blank=True, default="")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="first characters of the token, to recognise it")
    scopes = models.JSONField(default=list)
    channels = models.JSONField(null=True, blank=True, help_text="channel UUIDs; null means every channel")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… for {self.pubkey[:12]}…"


# --- message counters ----------------------------------------------------------


# A message adds 1 to one shard of its channel's count: the shard of the database session that writes it
# (pg_backend_pid() % MESSAGE_COUNTER_SHARDS), so concurrent writers in one channel don't queue on one row
# until each commits. The channel's count is the sum of its shards.
MESSAGE_COUNTER_SHARDS = 16


class MessageCounter(models.Model):
    """One shard of a channel's kind-9 message count; only kind-9 messages move it, artifact revisions never
    do. A shard's row is made by the first message counted in it (buzz.chat.messages)."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="message_counters")
    shard = models.PositiveSmallIntegerField()
    message_count = models.PositiveBigIntegerField(default=0)
    last_message_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "shard"], name="message_counter_shard_unique"),
            models.CheckConstraint(
                condition=models.Q(shard__lt=MESSAGE_COUNTER_SHARDS), name="message_counter_shard_range"
            ),
        ]


class ThreadStats(models.Model):
    """Reply count per thread root (NIP-10 `root` marker)."""

    community = models.ForeignKey(Community, on_delete=models.CASCADE)
    root_id = models.CharField(max_length=64)
    channel_id = models.UUIDField()
    reply_count = models.PositiveBigIntegerField(default=0)
    last_reply_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["community", "root_id"], name="thread_root_unique")]


class Mention(models.Model):
    """A `p` tag naming a pubkey in a channel event: the mention/notification record."""

    community = models.ForeignKey(Community, on_delete=models.CASCADE)
    pubkey = models.CharField(max_length=64)
    event_id = models.CharField(max_length=64)
    channel_id = models.UUIDField()
    kind = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # Per community: the same signed event may be stored in two communities (buzz.events.store).
        constraints = [models.UniqueConstraint(fields=["community", "event_id", "pubkey"], name="mention_unique")]
        indexes = [models.Index(fields=["community", "pubkey", "-created_at"], name="mention_inbox")]
