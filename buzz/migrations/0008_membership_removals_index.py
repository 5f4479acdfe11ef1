"""buzz_membership's retained removals by reader and time (NIP-AR incremental reads): a later pass reports
the reader's removals in its window (removeChannel) from the reader's own rows, where it used to probe the
reader's membership in every other channel of the community on every page."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("buzz", "0007_redundant_key_indexes"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="membership",
            index=models.Index(
                condition=models.Q(("removed_at__isnull", False)),
                fields=["pubkey", "removed_at"],
                name="membership_removals",
            ),
        ),
    ]
