"""Fewer index entries and constraint checks for every stored event (issue 14, "Throughput").

stored_event_identity is unique on (id, community) instead of (community, id): the same uniqueness (and the
same ON CONFLICT target, which PostgreSQL matches whatever the columns' order), now led by the id, so it
serves the write path's exact lookup by event id, and event_id_lookup (id), which repeated it, is dropped.
The new index is built CONCURRENTLY (writes go on while it reads the table), then takes the constraint's
place in one quick ALTER TABLE.

The tag index's foreign key to its event is no longer a database constraint: the statement that stores an
event inserts its tags, and every deletion of events deletes their tags first, so the deferred check it
ran for every tag at commit found nothing to refuse. The community's foreign key stays: a write racing the
community's deletion still fails (buzz.identity.communities.community_delete).
"""

from __future__ import annotations

import django.db.models.deletion
from django.contrib.postgres.operations import RemoveIndexConcurrently
from django.db import migrations, models

BUILD = "CREATE UNIQUE INDEX CONCURRENTLY stored_event_identity_by_id ON buzz_storedevent (id, community_id)"
UNBUILD = "DROP INDEX CONCURRENTLY IF EXISTS stored_event_identity_by_id"
SWAP = (
    "ALTER TABLE buzz_storedevent DROP CONSTRAINT stored_event_identity,"
    " ADD CONSTRAINT stored_event_identity UNIQUE USING INDEX stored_event_identity_by_id"
)
UNSWAP = (
    "ALTER TABLE buzz_storedevent DROP CONSTRAINT stored_event_identity,"
    " ADD CONSTRAINT stored_event_identity UNIQUE (community_id, id)"
)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY can't run in a transaction

    dependencies = [("buzz", "0011_policy_stamp")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(BUILD, reverse_sql=UNBUILD),
                migrations.RunSQL(SWAP, reverse_sql=UNSWAP),
            ],
            state_operations=[
                migrations.RemoveConstraint(model_name="storedevent", name="stored_event_identity"),
                migrations.AddConstraint(
                    model_name="storedevent",
                    constraint=models.UniqueConstraint(fields=("id", "community"), name="stored_event_identity"),
                ),
            ],
        ),
        RemoveIndexConcurrently(model_name="storedevent", name="event_id_lookup"),
        migrations.AlterField(
            model_name="eventtag",
            name="event",
            field=models.ForeignKey(
                db_column="event_key",
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="tag_index",
                to="buzz.storedevent",
            ),
        ),
    ]
