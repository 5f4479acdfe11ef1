from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("artifacts", "0001_initial")]

    operations = [
        # Relay acceptance order, shared by revisions and move removals.
        migrations.RunSQL(
            "CREATE SEQUENCE artifacts_accept_seq",
            "DROP SEQUENCE artifacts_accept_seq",
        ),
        # Exact (name, value) matches of current-state predicates. A value may be longer than a btree
        # entry allows, so the index holds md5(value) and the query compares the value itself too.
        migrations.RunSQL(
            "CREATE INDEX current_tag_match ON artifacts_currenttag (name, md5(value), artifact_id)",
            "DROP INDEX current_tag_match",
        ),
    ]
