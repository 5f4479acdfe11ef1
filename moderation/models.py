"""Moderation and retention records: the per-community retention policy and the audit log.

Only moderation.services writes these tables. Every moderation action (a redaction, an expiry run,
a channel's archive, unarchive or deletion, a policy reset, a retention change, a TTL reap) leaves one
AuditRecord saying who did it, what, to what, when and why.
"""

from __future__ import annotations

from django.db import models

from buzz.models import Community, GuardedQuerySet


class RetentionPolicy(models.Model):
    """How long a community keeps revision history that is no longer current.

    `keep` zero keeps only what must stay (current heads and what prev checks and incremental reads need).
    A community without a row keeps everything.
    """

    community = models.OneToOneField(Community, on_delete=models.CASCADE, related_name="retention_policy")
    keep = models.DurationField(help_text="non-current revisions older than this are expired")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "retention policy"
        verbose_name_plural = "retention policies"

    def __str__(self) -> str:
        return f"{self.community.host}: keep {self.keep}"


class AuditAction(models.TextChoices):
    REDACT = "redact", "redact"
    EXPIRE = "expire", "expire"
    ARCHIVE = "archive", "archive"
    UNARCHIVE = "unarchive", "unarchive"
    DELETE_CHANNEL = "delete_channel", "delete channel"
    POLICY_RESET = "policy_reset", "policy reset"
    RETENTION_SET = "retention_set", "retention set"
    REAP_TTL = "reap_ttl", "reap TTL channels"


class AuditRecordQuerySet(GuardedQuerySet["AuditRecord"]):
    guarded = frozenset({"community", "who", "action", "target", "reason", "detail", "created_at"})
    why = "the audit log is append-only"


class AuditRecord(models.Model):
    """One moderation action. Append-only: nothing updates or deletes these rows."""

    community = models.ForeignKey(
        Community, on_delete=models.CASCADE, related_name="audit_records", null=True, blank=True
    )
    # Who: an admin username ("admin:NAME"), a pubkey (a NIP-29 9005), or "command".
    who = models.CharField(max_length=200)
    action = models.CharField(max_length=20, choices=AuditAction.choices)
    target = models.TextField(blank=True, default="")
    reason = models.TextField(blank=True, default="")
    # What happened: revision ids withheld, the d's retired, channels affected, syncs resynced.
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = AuditRecordQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "audit record"
        verbose_name_plural = "audit log"
        permissions = [
            ("redact_revision", "Can redact revisions"),
            ("archive_channel", "Can archive and unarchive channels"),
            ("expire_revisions", "Can run retention expiry"),
            ("delete_channel", "Can delete channels"),
            ("reset_policy", "Can reset the access policy"),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.who} {self.action} {self.target}"
