"""Indexes for the write path's exact lookups by event id (issue 14, "No plan cliff").

The hot statements compare the community without searching on it, so the only index their lookups can
use is one led by the looked-up key: a generic plan made on empty or never-analyzed tables can't pick
a (community, ...) index and filter a whole channel (tests/chat/test_hot_plans.py).
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("buzz", "0004_req_page_indexes")]

    operations = [
        migrations.AddIndex(
            model_name="storedevent",
            index=models.Index(fields=["id"], name="event_id_lookup"),
        ),
    ]
