"""Indexes that repeated the lead of another (issue 14), dropped: they cost every write.

artifacts_artifact(community_id): artifact_identity (community, d) and three more lead with it.
artifacts_revision(community_id): revision_identity (community, id) leads with it.
artifacts_revision(artifact_id): revision_history (artifact, seq) leads with it.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("artifacts", "0007_hot_lookup_indexes"),
        ("buzz", "0007_redundant_key_indexes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="artifact",
            name="community",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="artifacts",
                to="buzz.community",
            ),
        ),
        migrations.AlterField(
            model_name="revision",
            name="artifact",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="revisions",
                to="artifacts.artifact",
            ),
        ),
        migrations.AlterField(
            model_name="revision",
            name="community",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="revisions",
                to="buzz.community",
            ),
        ),
    ]
