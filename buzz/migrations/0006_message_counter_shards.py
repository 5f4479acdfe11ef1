"""A channel's kind-9 message count in shards (issue 14): MessageCounter replaces ChannelStats.

Every message in a channel updated the channel's one ChannelStats row, so concurrent writers in one
channel queued on that row's lock until each committed (bench/ingest.py: about 40% of the relay's
PostgreSQL backend time waited on it). A message now adds 1 to the shard of the session that writes it.
Each channel's count moves to its shard 0; reversing sums the shards back into one row.
"""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

_FORWARD = """
INSERT INTO buzz_messagecounter (channel_id, shard, message_count, last_message_at)
SELECT channel_id, 0, message_count, last_message_at FROM buzz_channelstats
"""

_BACKWARD = """
INSERT INTO buzz_channelstats (channel_id, message_count, last_message_at)
SELECT c.id, coalesce(sum(m.message_count), 0), max(m.last_message_at)
FROM buzz_channel c LEFT JOIN buzz_messagecounter m ON m.channel_id = c.id GROUP BY c.id
"""


class Migration(migrations.Migration):
    dependencies = [("buzz", "0005_hot_lookup_indexes")]

    operations = [
        migrations.CreateModel(
            name="MessageCounter",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("shard", models.PositiveSmallIntegerField()),
                ("message_count", models.PositiveBigIntegerField(default=0)),
                ("last_message_at", models.DateTimeField(blank=True, null=True)),
                (
                    "channel",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="message_counters",
                        to="buzz.channel",
                    ),
                ),
            ],
        ),
        migrations.AddConstraint(
            model_name="messagecounter",
            constraint=models.UniqueConstraint(fields=("channel", "shard"), name="message_counter_shard_unique"),
        ),
        migrations.AddConstraint(
            model_name="messagecounter",
            constraint=models.CheckConstraint(
                condition=models.Q(("shard__lt", 16)), name="message_counter_shard_range"
            ),
        ),
        migrations.RunSQL(_FORWARD, _BACKWARD),
        migrations.DeleteModel(name="ChannelStats"),
    ]
