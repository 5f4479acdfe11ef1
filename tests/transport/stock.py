"""A channel stocked with many large stored events, written straight into the tables (fast)."""

from __future__ import annotations

import time
import uuid

import psycopg

from buzz.events.store import event_json
from buzz.nostr import Signer
from tests.support.factories import make_channel, make_community
from tests.support.relay import relay_database_url


def stock_channel(host: str, *, events: int, payload: int) -> tuple[Signer, uuid.UUID]:
    """A community for `host` with one reader and a channel holding `events` kind-9 events of about
    `payload` bytes of distinct content each (so that no layer can compress them away)."""
    reader = Signer.generate()
    community = make_community(host, "Slow", members=[reader])
    channel = make_channel(community, reader, name="firehose")
    writer = Signer.generate()
    now = int(time.time())
    rows = []
    for i in range(events):
        content = uuid.uuid4().hex * (payload // 32)
        ev = writer.sign_event(kind=9, tags=[["h", str(channel)]], content=content, created_at=now - i)
        rows.append((ev.id, community.pk, ev.pubkey, 9, ev.created_at, channel, event_json(ev)))
    with psycopg.connect(relay_database_url()) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw, received_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, now())",
            rows,
        )
        cur.executemany(
            "INSERT INTO buzz_eventtag (event_key, name, value)"
            " SELECT key, 'h', %s FROM buzz_storedevent WHERE community_id = %s AND id = %s",
            [(str(channel), r[1], r[0]) for r in rows],
        )
        # What autovacuum would soon do: with stale statistics the planner sorts the whole channel per page.
        cur.execute("ANALYZE buzz_storedevent")
        cur.execute("ANALYZE buzz_eventtag")
    return reader, channel
