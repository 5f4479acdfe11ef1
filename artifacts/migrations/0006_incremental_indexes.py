# Incremental reads (artifacts.incremental): index order for head changes and move-source records.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("artifacts", "0005_redaction_retention"),
        ("buzz", "0003_community_event_keys"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="artifact",
            name="artifact_changed",
        ),
        migrations.AddIndex(
            model_name="artifact",
            index=models.Index(fields=["community", "changed_at", "d"], name="artifact_change_order"),
        ),
        migrations.AddIndex(
            model_name="moveremoval",
            index=models.Index(fields=["community", "accepted_at"], name="removal_accepted"),
        ),
    ]
