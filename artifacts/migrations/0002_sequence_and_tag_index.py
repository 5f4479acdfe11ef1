from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("artifacts", "0001_initial")]

    operations = [
        # Relay acceptance order, shared by revisions and move removals.
        migrations.RunSQL(
            "CREATE SEQUENCE artifacts_accept_seq",
            "DROP SEQUENCE artifacts_accept_seq",
        ),
        migrations.RunSQL(
            "CREATE INDEX current_tag_match ON artifacts_currenttag USING hash ((name || E'\\x1f' || value))",
            "DROP INDEX current_tag_match",
        ),
    ]
