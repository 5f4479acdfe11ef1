"""Indexes for the NIP-AR write path's exact lookups by d and by revision id (issue 14, "No plan cliff").

See buzz 0005_hot_lookup_indexes: the write statements compare the community without searching on it,
so these are the only indexes their lookups can use, whatever the statistics say.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("artifacts", "0006_incremental_indexes")]

    operations = [
        migrations.AddIndex(
            model_name="artifact",
            index=models.Index(fields=["d"], name="artifact_d_lookup"),
        ),
        migrations.AddIndex(
            model_name="revision",
            index=models.Index(fields=["id"], name="revision_id_lookup"),
        ),
    ]
