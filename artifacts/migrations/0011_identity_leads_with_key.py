"""Fewer index entries and constraint checks for every revision (issue 14, "Throughput").

artifact_identity is unique on (d, community) and revision_identity on (id, community), instead of
(community, d) and (community, id): the same uniqueness (and the same ON CONFLICT target, which PostgreSQL
matches whatever the columns' order), now led by the key the write path looks up, so artifact_d_lookup (d)
and revision_id_lookup (id), which repeated them, are dropped. Each new index is built CONCURRENTLY
(writes go on while it reads the table), then takes its constraint's place in one quick ALTER TABLE.

Three foreign keys are no longer database constraints, because the one statement that writes the row also
writes (or holds) what it points at, and that is never deleted but with its community:
- artifact_head_revision, the artifact's head (community, head_id) -> its revision (made in 0004);
- the revision's artifact;
- the current tag's artifact.
Each was a deferred check at every commit (one per current tag written), and each check locked the row it
found. The community's foreign keys stay: a write racing the community's deletion still fails
(buzz.identity.communities.community_delete). removal_move_revision, which needs revision_identity, is
dropped while the constraint is swapped and made again (it reads the move removals, a small table).
"""

from __future__ import annotations

import django.db.models.deletion
from django.contrib.postgres.operations import RemoveIndexConcurrently
from django.db import migrations, models

HEAD_FK = (
    "ALTER TABLE artifacts_artifact ADD CONSTRAINT artifact_head_revision FOREIGN KEY (community_id, head_id)"
    " REFERENCES artifacts_revision (community_id, id) DEFERRABLE INITIALLY DEFERRED"
)
MOVE_FK = (
    "ALTER TABLE artifacts_moveremoval ADD CONSTRAINT removal_move_revision FOREIGN KEY (community_id, move_id)"
    " REFERENCES artifacts_revision (community_id, id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED"
)
DROP_HEAD_FK = "ALTER TABLE artifacts_artifact DROP CONSTRAINT artifact_head_revision"
DROP_MOVE_FK = "ALTER TABLE artifacts_moveremoval DROP CONSTRAINT removal_move_revision"


def _rekey(
    table: str, name: str, old: str, new: str, fields: tuple[str, ...], model: str
) -> list[migrations.operations.base.Operation]:
    """The unique constraint `name` on `table` moves from columns `old` to `new` (model fields `fields`)."""
    index = f"{name}_by_key"
    return [
        migrations.RunSQL(
            f"CREATE UNIQUE INDEX CONCURRENTLY {index} ON {table} ({new})",
            reverse_sql=f"DROP INDEX CONCURRENTLY IF EXISTS {index}",
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f"ALTER TABLE {table} DROP CONSTRAINT {name}, ADD CONSTRAINT {name} UNIQUE USING INDEX {index}",
                    reverse_sql=f"ALTER TABLE {table} DROP CONSTRAINT {name}, ADD CONSTRAINT {name} UNIQUE ({old})",
                )
            ],
            state_operations=[
                migrations.RemoveConstraint(model_name=model, name=name),
                migrations.AddConstraint(
                    model_name=model, constraint=models.UniqueConstraint(fields=fields, name=name)
                ),
            ],
        ),
    ]


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY can't run in a transaction

    dependencies = [
        ("artifacts", "0010_policy_stamp_to_buzz"),
        ("buzz", "0012_identity_leads_with_id"),
    ]

    operations = [
        *_rekey(
            "artifacts_artifact",
            "artifact_identity",
            "community_id, d",
            "d, community_id",
            ("d", "community"),
            "artifact",
        ),
        RemoveIndexConcurrently(model_name="artifact", name="artifact_d_lookup"),
        migrations.RunSQL([DROP_HEAD_FK, DROP_MOVE_FK], reverse_sql=[MOVE_FK, HEAD_FK]),
        *_rekey(
            "artifacts_revision",
            "revision_identity",
            "community_id, id",
            "id, community_id",
            ("id", "community"),
            "revision",
        ),
        migrations.RunSQL(MOVE_FK, reverse_sql=DROP_MOVE_FK),
        RemoveIndexConcurrently(model_name="revision", name="revision_id_lookup"),
        migrations.AlterField(
            model_name="revision",
            name="artifact",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="revisions",
                to="artifacts.artifact",
            ),
        ),
        migrations.AlterField(
            model_name="currenttag",
            name="artifact",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="current_tags",
                to="artifacts.artifact",
            ),
        ),
    ]
