"""NIP-AR storage: the head pointer per artifact, every accepted revision, the current-tag index,
relay-signed move removals, and the clocks later views read (acceptance order, change times).

Only artifacts.services writes these tables.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models

from buzz.models import Community, GuardedChange, GuardedModel, GuardedQuerySet


class ArtifactQuerySet(GuardedQuerySet["Artifact"]):
    # The head pointer and what reads filter on: only artifacts.services and artifacts.redaction move them.
    guarded = frozenset({"head_id", "home", "deleted", "retired", "community", "d", "type"})


class RevisionQuerySet(GuardedQuerySet["Revision"]):
    # Redaction and retention (artifacts.redaction) set these, with the resync they need.
    guarded = frozenset({"redacted_at", "expired_at", "raw", "id", "community", "artifact", "channel"})


class CurrentTagQuerySet(GuardedQuerySet["CurrentTag"]):
    # What current-state queries match on: artifacts.services replaces the rows with each accepted revision.
    guarded = frozenset({"artifact", "name", "value"})
    why = "the current tags change only with an accepted revision (artifacts.services)"


class MoveRemovalQuerySet(GuardedQuerySet["MoveRemoval"]):
    guarded = frozenset({"redacted_at", "raw", "id", "community", "artifact", "source"})


def _refuse_delete(what: str) -> GuardedChange:
    return GuardedChange(
        f"{what} is never deleted: redact it with NIP-29 kind 9005 or moderation.services (they resync open syncs)"
    )


class Artifact(GuardedModel):
    """One artifact identity (community, d) and its current head. The head row is the CAS lock."""

    # No index of its own: artifact_identity and three more lead with the community.
    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="artifacts", db_index=False)
    d = models.UUIDField()
    type = models.CharField(max_length=128)
    # The current head (its event id) and the facts about it that reads filter on. The head is the
    # revision (community, head_id), written by the same statement (artifacts.services) and never deleted:
    # no foreign key checks it at every commit (migration 0011 dropped the one migration 0004 made).
    head_id = models.CharField(max_length=64, null=True)
    home = models.UUIDField(help_text="h of the current head")
    root = models.CharField(max_length=64, null=True, blank=True)
    deleted = models.BooleanField(default=False, help_text="the current head is op=delete")
    retired = models.BooleanField(default=False, help_text="the current head is redacted")
    created_at = models.DateTimeField()
    # Database clock (clock_timestamp()) of the last head change: incremental reads page on it.
    changed_at = models.DateTimeField()
    # The p values (64 hex) of the last revision that is not a deletion. NIP-AR: a revision must not
    # "repeat mention ... for tags carried over from the previous revision"; a deletion carries no p
    # tags, so a restore is compared with the revision before it (issue 9, item 2).
    p_tags = ArrayField(models.CharField(max_length=64), default=list, db_default=[])

    objects = ArtifactQuerySet.as_manager()

    class Meta:
        # Led by d, not the community: the write path's exact lookup by d compares the community without
        # searching on it, so this is the one index it can use, whatever the statistics say
        # (tests/chat/test_hot_plans.py), and no second index on d costs every write (migration 0011).
        constraints = [models.UniqueConstraint(fields=["d", "community"], name="artifact_identity")]
        indexes = [
            models.Index(fields=["community", "home", "d"], name="artifact_home"),
            # Incremental reads page head changes by (changed_at, d) (artifacts.incremental): the community's,
            models.Index(fields=["community", "changed_at", "d"], name="artifact_change_order"),
            # and a channel's, merged over a few channels on initial pages.
            models.Index(fields=["community", "home", "changed_at", "d"], name="artifact_home_changes"),
            # Finds the artifact a revision heads (redaction, the head view).
            models.Index(fields=["community", "head_id"], name="artifact_head"),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.d}"

    def delete(self, using: object = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        raise _refuse_delete("an artifact")


class Revision(GuardedModel):
    """An accepted kind-45010 event, keyed by (community, event id): a resubmission is found by that key,
    and one signed event sent to two communities is a revision in each. The row's own key is `seq`."""

    # Relay acceptance order (the database sequence artifacts_accept_seq, shared with move removals).
    seq = models.BigIntegerField(primary_key=True)
    id = models.CharField(max_length=64)
    # Neither key has an index of its own: revision_channel leads with the community, revision_history
    # with the artifact (an index less for every revision written). The artifact is the row the same
    # statement inserted or advanced, and an artifact is deleted only with its community (whose foreign
    # key stays, so a write racing the community's deletion fails): no constraint re-checks it at commit.
    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="revisions", db_index=False)
    artifact = models.ForeignKey(
        Artifact, on_delete=models.CASCADE, related_name="revisions", db_index=False, db_constraint=False
    )
    op = models.CharField(max_length=8)
    channel = models.UUIDField(help_text="h: the channel this revision was published in (its read scope)")
    prev = models.CharField(max_length=64, null=True, blank=True)
    root = models.CharField(max_length=64, null=True, blank=True)
    pubkey = models.CharField(max_length=64)
    created_at = models.BigIntegerField(help_text="the signer's created_at; never orders anything")
    raw = models.TextField()
    # Database-clock acceptance time.
    accepted_at = models.DateTimeField()
    # Moderation: a redacted revision is withheld everywhere but stays accepted (valid as prev).
    redacted_at = models.DateTimeField(null=True, blank=True)
    # Retention: an expired revision's content is gone; its id still anchors prev checks.
    expired_at = models.DateTimeField(null=True, blank=True)

    objects = RevisionQuerySet.as_manager()

    class Meta:
        # Led by the id, for the write path's exact lookup (a resubmission): see artifact_identity.
        constraints = [models.UniqueConstraint(fields=["id", "community"], name="revision_identity")]
        indexes = [
            models.Index(fields=["artifact", "seq"], name="revision_history"),
            models.Index(fields=["community", "channel", "seq"], name="revision_channel"),
            # Retention finds the revisions it may still expire, oldest first.
            models.Index(
                fields=["community", "accepted_at"],
                name="revision_expiry",
                condition=models.Q(expired_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.op} {self.id[:12]}…"

    def delete(self, using: object = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        raise _refuse_delete("a revision")


class CurrentTag(GuardedModel):
    """(tag name, first value) of the current head only; replaced on every accepted revision."""

    # Written with the head change that makes them current (artifacts.services), by the artifact's key
    # that statement holds: no constraint re-checks the artifact for every tag at commit (see Revision).
    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="current_tags", db_constraint=False)
    name = models.CharField(max_length=128)
    value = models.TextField()

    objects = CurrentTagQuerySet.as_manager()

    def delete(self, using: object = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        # One row gone takes the artifact out of every current query on that tag, and no sync would hear of it.
        raise _refuse_delete("a current tag")

    # Matched through an index on (name, md5(value)) made in migration 0002: a value may be longer than a
    # btree entry allows, and predicates are exact matches only.


class MoveRemoval(GuardedModel):
    """The relay-signed kind-45011 event a move stores in its source channel.

    Its id alone is a key: the relay key that signs it is its community's own (Community.relay_pubkey
    is unique), so two communities never make the same removal.
    """

    id = models.CharField(primary_key=True, max_length=64)
    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="move_removals")
    artifact = models.ForeignKey(Artifact, on_delete=models.CASCADE, related_name="move_removals")
    source = models.UUIDField()
    replaced = models.CharField(max_length=64, help_text="the revision the move replaced")
    # The move revision (community, move_id): a composite foreign key made in migration 0004.
    move_id = models.CharField(max_length=64)
    raw = models.TextField()
    seq = models.BigIntegerField(unique=True)
    accepted_at = models.DateTimeField()
    # Moderation: a redacted removal (a 9005 naming it) is withheld like a redacted revision.
    redacted_at = models.DateTimeField(null=True, blank=True)

    objects = MoveRemovalQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["community", "source", "seq"], name="removal_source"),
            models.Index(fields=["community", "move_id"], name="removal_move"),
            # Incremental reads page move-source records by acceptance time (artifacts.incremental).
            models.Index(fields=["community", "accepted_at"], name="removal_accepted"),
            # Retention keeps the revision a move replaced (and the move): it looks both up.
            models.Index(fields=["community", "replaced"], name="removal_replaced"),
        ]

    def __str__(self) -> str:
        return f"removal of {self.artifact_id} from {self.source}"

    def delete(self, using: object = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        raise _refuse_delete("a move removal")
