"""buzz_membership's retained removals by reader and time (NIP-AR incremental reads): a later pass reports
the reader's removals in its window (removeChannel) from the reader's own rows, where it used to probe the
reader's membership in every other channel of the community on every page.

Built CONCURRENTLY: kind-9 writes update memberships (their read marks), and a plain CREATE INDEX would
hold them back while it reads the whole table. The index holds removed memberships only."""

from __future__ import annotations

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY can't run in a transaction

    dependencies = [
        ("buzz", "0007_redundant_key_indexes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="membership",
            index=models.Index(
                condition=models.Q(("removed_at__isnull", False)),
                fields=["pubkey", "removed_at"],
                name="membership_removals",
            ),
        ),
    ]
