"""artifacts_artifact's heads by channel in change order (NIP-AR incremental reads): an initial page over a
few channels reads each channel's heads in (changed_at, d) order and merges them, so it reads about a page
of heads whatever the channels' share of the community. Walking the community's change order
(artifact_change_order) and keeping the reader's rows read every head of the community before it for a
reader of a small channel (about 19 ms a page for one channel of 10 heads beside 100,000 others, against
0.3 ms).

Built CONCURRENTLY: revision writes update artifacts while it reads the table."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY can't run in a transaction

    dependencies = [
        ("artifacts", "0008_redundant_key_indexes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="artifact",
            index=models.Index(fields=["community", "home", "changed_at", "d"], name="artifact_home_changes"),
        ),
    ]
