"""Relay-level models: communities (selected by Host) and their relay members."""

from __future__ import annotations

from django.contrib.postgres.indexes import HashIndex
from django.core.validators import RegexValidator
from django.db import models

HEX64 = RegexValidator(r"^[0-9a-f]{64}$", "must be 64 lowercase hex characters")


class AdmissionMode(models.TextChoices):
    MEMBERS = "members", "members only"
    OPEN = "open", "any authenticated pubkey"


class RelayRole(models.TextChoices):
    OWNER = "owner", "owner"
    ADMIN = "admin", "admin"
    MODERATOR = "moderator", "moderator"
    MEMBER = "member", "member"


class Community(models.Model):
    """One Buzz workspace. Requests select it by their Host header."""

    host = models.CharField(max_length=253, unique=True, help_text="Host header value, lowercase, with :port when not default")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    public_url = models.CharField(
        max_length=300, help_text="The ws:// or wss:// URL clients use; NIP-42 AUTH must name it"
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


class StoredEvent(models.Model):
    """A signed event the relay accepted and serves back (kind-9 messages, relay-signed state...).

    `raw` is the event's JSON exactly as served, so reads never re-serialize.
    Artifact revisions live in artifacts.Revision, not here.
    """

    id = models.CharField(primary_key=True, max_length=64, validators=[HEX64])
    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="events")
    pubkey = models.CharField(max_length=64)
    kind = models.IntegerField()
    created_at = models.BigIntegerField()
    channel_id = models.UUIDField(null=True, blank=True, help_text="h tag: the channel the event belongs to")
    raw = models.TextField()
    received_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["community", "kind", "-created_at"], name="event_kind_time"),
            models.Index(fields=["community", "channel_id", "-created_at"], name="event_channel_time"),
            models.Index(fields=["community", "pubkey", "-created_at"], name="event_author_time"),
        ]

    def __str__(self) -> str:
        return f"kind {self.kind} {self.id[:12]}…"


class EventTag(models.Model):
    """Single-letter tag index for NIP-01 `#x` filters: tag name and its FIRST value."""

    event = models.ForeignKey(StoredEvent, on_delete=models.CASCADE, related_name="tag_index")
    name = models.CharField(max_length=1)
    value = models.CharField(max_length=4096)

    class Meta:
        # Hash, not btree: a tag value may be longer than a btree entry allows.
        indexes = [HashIndex(fields=["value"], name="event_tag_value")]
