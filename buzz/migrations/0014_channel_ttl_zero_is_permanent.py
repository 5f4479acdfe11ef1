"""A channel created with a ttl tag of "0" is permanent (buzz.chat.channels.parse_ttl), as its metadata
always said: its ttl_seconds becomes NULL. It was stored as 0, which incremental reads and the writes'
deadline took for a TTL channel (its artifacts were never discovered, and a write set a deadline the TTL
reaper then acted on). Each community with such a channel gets its policy stamp advanced, as any TTL
change does, so incremental checkpoints taken while those artifacts were left out are refused
(policy_changed) and clients start over. A channel the reaper already archived stays archived."""

from __future__ import annotations

from django.db import migrations

FIX = """
WITH fixed AS (
  UPDATE buzz_channel SET ttl_seconds = NULL, deadline = NULL WHERE ttl_seconds = 0 RETURNING community_id
)
INSERT INTO buzz_policystamp (community_id, stamp, changed_at)
SELECT DISTINCT community_id, 1, clock_timestamp() FROM fixed
ON CONFLICT (community_id) DO UPDATE SET stamp = buzz_policystamp.stamp + 1, changed_at = clock_timestamp()
"""


class Migration(migrations.Migration):
    dependencies = [("buzz", "0013_storedevent_h_is_channel")]

    operations = [migrations.RunSQL(FIX, reverse_sql=migrations.RunSQL.noop)]
