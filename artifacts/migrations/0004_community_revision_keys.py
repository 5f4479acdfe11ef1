r"""Revisions keyed by (community, id), and the p tags a restore is compared with (issue 9, items 8 and 2).

* The same signed revision may be accepted in two communities. `seq` (relay acceptance order, unique
  already) becomes the primary key and (community, id) a unique key. What pointed at a revision by its
  id alone now points at (community, id) with a composite foreign key, which Django can't declare:
  the artifact's head (head_id, deferred: a create inserts the head pointer before the revision) and a
  move removal's move (move_id). Both keep their event-id columns, so nothing reading them changes.
* p_tags: the p values of each artifact's last revision that is not a deletion, read from the stored
  raw events. PostgreSQL refuses to parse a \u0000 escape (content may hold one); it becomes \u0020
  first, which keeps the text valid JSON (also after an escaped backslash, "\\u0000") and can't touch
  a p value (64 hex characters).

Existing rows keep their data. Reversible while no revision id is accepted in two communities.
"""

from __future__ import annotations

import django.contrib.postgres.fields
from django.db import migrations, models

# Drops, by what they are rather than by Django's hashed names: the foreign keys into
# artifacts_revision, the single-column indexes on the columns that held them, the primary key of
# artifacts_revision, its LIKE copy and the unique constraint on seq.
_DROP_OLD_KEYS = """
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT conrelid::regclass AS tab, conname FROM pg_constraint
           WHERE contype = 'f' AND confrelid = 'artifacts_revision'::regclass
             AND conrelid IN ('artifacts_artifact'::regclass, 'artifacts_moveremoval'::regclass) LOOP
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', r.tab, r.conname);
  END LOOP;
  FOR r IN SELECT i.relname FROM pg_index x
           JOIN pg_class i ON i.oid = x.indexrelid
           JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
           WHERE x.indnatts = 1 AND NOT x.indisprimary AND NOT x.indisunique
             AND ((x.indrelid = 'artifacts_artifact'::regclass AND a.attname = 'head_id')
               OR (x.indrelid = 'artifacts_moveremoval'::regclass AND a.attname = 'move_id')
               OR (x.indrelid = 'artifacts_revision'::regclass AND a.attname = 'id')) LOOP
    EXECUTE format('DROP INDEX %I', r.relname);
  END LOOP;
  FOR r IN SELECT conname FROM pg_constraint
           WHERE conrelid = 'artifacts_revision'::regclass AND contype = 'u'
             AND conkey = ARRAY[(SELECT attnum FROM pg_attribute
                                 WHERE attrelid = 'artifacts_revision'::regclass AND attname = 'seq')] LOOP
    EXECUTE format('ALTER TABLE artifacts_revision DROP CONSTRAINT %I', r.conname);
  END LOOP;
END $$;
"""

REKEY = [
    _DROP_OLD_KEYS,
    "ALTER TABLE artifacts_revision DROP CONSTRAINT artifacts_revision_pkey",
    "ALTER TABLE artifacts_revision ADD CONSTRAINT artifacts_revision_pkey PRIMARY KEY (seq)",
]

UNKEY = [
    "ALTER TABLE artifacts_revision DROP CONSTRAINT artifacts_revision_pkey",
    "ALTER TABLE artifacts_revision ADD CONSTRAINT artifacts_revision_pkey PRIMARY KEY (id)",
    "CREATE INDEX artifacts_revision_id_like ON artifacts_revision (id varchar_pattern_ops)",
    "ALTER TABLE artifacts_revision ADD CONSTRAINT artifacts_revision_seq_key UNIQUE (seq)",
    "ALTER TABLE artifacts_artifact ADD CONSTRAINT artifacts_artifact_head_id_fk_artifacts_revision_id"
    " FOREIGN KEY (head_id) REFERENCES artifacts_revision (id) DEFERRABLE INITIALLY DEFERRED",
    "CREATE INDEX artifacts_artifact_head_id ON artifacts_artifact (head_id)",
    "CREATE INDEX artifacts_artifact_head_id_like ON artifacts_artifact (head_id varchar_pattern_ops)",
    "ALTER TABLE artifacts_moveremoval ADD CONSTRAINT artifacts_moveremoval_move_id_fk_artifacts_revision_id"
    " FOREIGN KEY (move_id) REFERENCES artifacts_revision (id) DEFERRABLE INITIALLY DEFERRED",
    "CREATE INDEX artifacts_moveremoval_move_id ON artifacts_moveremoval (move_id)",
    "CREATE INDEX artifacts_moveremoval_move_id_like ON artifacts_moveremoval (move_id varchar_pattern_ops)",
]

COMPOSITE_FKS = [
    # Deferred: a create's one statement inserts the artifact (head_id set) before its revision.
    "ALTER TABLE artifacts_artifact ADD CONSTRAINT artifact_head_revision FOREIGN KEY (community_id, head_id)"
    " REFERENCES artifacts_revision (community_id, id) DEFERRABLE INITIALLY DEFERRED",
    "ALTER TABLE artifacts_moveremoval ADD CONSTRAINT removal_move_revision FOREIGN KEY (community_id, move_id)"
    " REFERENCES artifacts_revision (community_id, id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED",
]

DROP_COMPOSITE_FKS = [
    "ALTER TABLE artifacts_artifact DROP CONSTRAINT artifact_head_revision",
    "ALTER TABLE artifacts_moveremoval DROP CONSTRAINT removal_move_revision",
]

BACKFILL_P_TAGS = r"""
UPDATE artifacts_artifact a SET p_tags = coalesce((
  SELECT array_agg(DISTINCT t.tag ->> 1)
  FROM (SELECT r.raw FROM artifacts_revision r
        WHERE r.artifact_id = a.id AND r.op <> 'delete' ORDER BY r.seq DESC LIMIT 1) AS last,
       json_array_elements(replace(last.raw, '\u0000', '\u0020')::json -> 'tags') AS t(tag)
  WHERE t.tag ->> 0 = 'p' AND t.tag ->> 1 ~ '^[0-9a-f]{64}$'
), '{}')
"""


class Migration(migrations.Migration):
    dependencies = [("artifacts", "0003_currenttag_statistics")]

    operations = [
        migrations.SeparateDatabaseAndState(
            # The columns head_id and move_id stay as they are (varchar(64), the event id).
            database_operations=[],
            state_operations=[
                migrations.RemoveField(model_name="artifact", name="head"),
                migrations.RemoveField(model_name="moveremoval", name="move"),
                migrations.AddField(
                    model_name="artifact", name="head_id", field=models.CharField(max_length=64, null=True)
                ),
                migrations.AddField(
                    model_name="moveremoval",
                    name="move_id",
                    field=models.CharField(default=None, max_length=64),
                    preserve_default=False,
                ),
            ],
        ),
        migrations.AddConstraint(
            model_name="revision",
            constraint=models.UniqueConstraint(fields=("community", "id"), name="revision_identity"),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(REKEY, UNKEY)],
            state_operations=[
                migrations.AlterField(model_name="revision", name="id", field=models.CharField(max_length=64)),
                migrations.AlterField(
                    model_name="revision",
                    name="seq",
                    field=models.BigIntegerField(primary_key=True, serialize=False),
                ),
            ],
        ),
        migrations.RunSQL(COMPOSITE_FKS, DROP_COMPOSITE_FKS),
        migrations.AddIndex(
            model_name="artifact",
            index=models.Index(fields=["community", "head_id"], name="artifact_head"),
        ),
        migrations.AddIndex(
            model_name="moveremoval",
            index=models.Index(fields=["community", "move_id"], name="removal_move"),
        ),
        migrations.AddField(
            model_name="artifact",
            name="p_tags",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=64), db_default=[], default=list, size=None
            ),
        ),
        migrations.RunSQL(BACKFILL_P_TAGS, migrations.RunSQL.noop),
    ]
