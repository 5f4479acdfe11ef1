from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("artifacts", "0002_sequence_and_tag_index")]

    operations = [
        # The planner's view of how tag names and values go together: without it a common name with a rare
        # value (or the reverse) is misjudged and current-state queries pick a scan (bench/query_current.py).
        migrations.RunSQL(
            "CREATE STATISTICS artifacts_currenttag_match (mcv, dependencies) ON name, value, md5(value)"
            " FROM artifacts_currenttag",
            "DROP STATISTICS IF EXISTS artifacts_currenttag_match",
        ),
    ]
