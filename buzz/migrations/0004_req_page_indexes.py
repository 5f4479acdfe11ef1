"""Indexes for the REQ pages the relay serves (issue 9, item 12: "A few clients can stall the database").

`REQ {"kinds":[9],"#h":[channel],"limit":1000}` on a 20,000-message channel ran as a parallel
sequential scan and an on-disk sort of every row of the channel, raw JSON included, for each
100-row page (buzz.events.query). Most of the fix is in the statement: one channel and one kind
are now written with `=` (`= ANY` of one value kept the planner from walking any index in order).
This index then holds the page's order, `created_at DESC, id`, after the equalities of the shape
`kinds` + `#h`, so a page is an index walk that reads only the rows of that kind and stops at its
limit: `event_page_kind` (community, channel, kind, created_at DESC, id). A page of `#h` without
`kinds` walks `event_channel_time` (0001) with an incremental sort of equal created_at values;
no second index for it, each one costs every insert.

It covers only rows that are not deleted (every read has `deleted_at IS NULL`). It is built
CONCURRENTLY, so a migration on a live relay does not lock out writes while it builds. It is
database-only (no model state): nothing in Django's ORM needs to know of it.
"""

from __future__ import annotations

from django.db import migrations

FORWARD = [
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS event_page_kind ON buzz_storedevent"
    " (community_id, channel_id, kind, created_at DESC, id) WHERE deleted_at IS NULL",
]

BACKWARD = [
    "DROP INDEX CONCURRENTLY IF EXISTS event_page_kind",
]


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY can't run in a transaction

    dependencies = [("buzz", "0003_community_event_keys")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
