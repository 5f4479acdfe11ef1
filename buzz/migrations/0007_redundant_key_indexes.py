"""buzz_storedevent without an index on community_id alone (issue 14): every other index but the id
lookup and the primary key leads with the community, so that one served nothing and cost every insert."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("buzz", "0006_message_counter_shards"),
    ]

    operations = [
        migrations.AlterField(
            model_name="storedevent",
            name="community",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="events", to="buzz.community"
            ),
        ),
    ]
