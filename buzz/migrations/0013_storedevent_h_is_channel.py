"""buzz_storedevent.h_is_channel: the event's h tag names its own channel, and the tag index holds no h row
for it (issue 14, "Throughput": one tag row and its three index entries less for every message, revision
and group event). A `#h` filter matches such an event on this column and the channel's
(buzz.events.query). Added with a constant default, which PostgreSQL stores without rewriting the table;
rows stored before keep their h rows and match through them as before."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("buzz", "0012_identity_leads_with_id")]

    operations = [
        migrations.AddField(
            model_name="storedevent",
            name="h_is_channel",
            field=models.BooleanField(db_default=False, default=False),
        ),
    ]
