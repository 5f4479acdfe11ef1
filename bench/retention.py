"""Retention expiry: revisions tombstoned per second by `moderation.services.expire` (what
`manage.py retention run` does), beside a same-run baseline.

Two communities get the same history: --artifacts artifacts with --revisions revisions each (one
head each, the rest expirable), every revision with its stored copy, as the write path leaves
them. The figure is expire() on the first one, in --batch-size batches. The baseline, on the
second, is the least any expiry must do: the same batches of plain UPDATEs that tombstone the
revisions and withhold their stored copies, picked by the head check alone (no move records, no
row locks, no audit). The ratio is the cost of doing it safely.

    python bench/run.py retention [--artifacts 2000] [--revisions 10] [--batch-size 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common

DB = "bench_retention"

_POPULATE = """
WITH arts AS (
  INSERT INTO artifacts_artifact (community_id, d, type, head_id, home, root, deleted, retired, p_tags, created_at,
                                  changed_at)
  SELECT %(c)s, md5('d' || %(c)s || ':' || a)::uuid, 'buzz.task', md5(%(c)s || ':' || a || ':' || %(k)s), %(h)s,
         NULL, false, false, '{}', now(), now()
  FROM generate_series(1, %(n)s) AS a RETURNING id, d
), revs AS (
  INSERT INTO artifacts_revision (seq, id, community_id, artifact_id, op, channel, prev, root, pubkey, created_at, raw,
                                  accepted_at)
  SELECT nextval('artifacts_accept_seq'), md5(%(c)s || ':' || a || ':' || r), %(c)s, arts.id,
         CASE WHEN r = 1 THEN 'create' ELSE 'update' END, %(h)s, NULL, NULL, repeat('a', 64), 0,
         '{"kind":45010,"content":"' || repeat('x', 200) || '"}', now() - interval '1 day'
  FROM generate_series(1, %(n)s) AS a
  JOIN arts ON arts.d = md5('d' || %(c)s || ':' || a)::uuid
  CROSS JOIN generate_series(1, %(k)s) AS r RETURNING id
)
INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw, received_at)
SELECT id, %(c)s, repeat('a', 64), 45010, 0, %(h)s, '{}', now() FROM revs
"""

_BASELINE = """
WITH picked AS (
  SELECT r.seq FROM artifacts_revision r
  WHERE r.community_id = %(c)s AND r.expired_at IS NULL AND r.accepted_at < %(cutoff)s
    AND NOT EXISTS (SELECT 1 FROM artifacts_artifact a WHERE a.community_id = r.community_id AND a.head_id = r.id)
  LIMIT %(limit)s
), done AS (
  UPDATE artifacts_revision r SET expired_at = now(), raw = '' FROM picked WHERE r.seq = picked.seq RETURNING r.id
), stored AS (
  UPDATE buzz_storedevent e SET deleted_at = now(), raw = ''
  WHERE e.community_id = %(c)s AND e.id IN (SELECT id FROM done)
)
SELECT count(*) FROM done
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=int, default=2000)
    parser.add_argument("--revisions", type=int, default=10, help="revisions per artifact (one is the head)")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--json", help="write the figures to this file")
    options = parser.parse_args()
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        url = common.with_dbname(env["DATABASE_URL"], DB)
        common.recreate_database(url)
        env["DATABASE_URL"] = url
        common.checked(common.manage(env, "migrate", "-v0"), "migrate")
        os.environ.update(env)
        import django

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "buzz.settings")
        django.setup()
        run(options)


def run(options: argparse.Namespace) -> None:
    import uuid

    from django.db import connection, transaction
    from django.utils import timezone

    from buzz.chat.channels import channel_create
    from buzz.identity.communities import community_create
    from buzz.nostr import Signer
    from moderation.services import expire, set_retention

    owner = Signer.generate()
    communities = []
    for name in ("figure", "baseline"):
        community = community_create(host=f"{name}.bench", name=name)
        channel = uuid.uuid4()
        channel_create(community=community, channel_uuid=channel, name="bench", creator=owner.pubkey)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(_POPULATE, {"c": community.pk, "h": channel, "n": options.artifacts, "k": options.revisions})
        communities.append(community)
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    expected = options.artifacts * (options.revisions - 1)
    figure, baseline = communities
    set_retention(figure, dt.timedelta(hours=1), actor="bench")

    start = time.perf_counter()
    plan = expire(figure, actor="bench", reason="bench", batch_size=options.batch_size)
    figure_s = time.perf_counter() - start
    if plan.expired != expected:
        raise common.BenchError(f"expire() tombstoned {plan.expired}, expected {expected}")

    cutoff = timezone.now() - dt.timedelta(hours=1)
    done = 0
    start = time.perf_counter()
    while True:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(_BASELINE, {"c": baseline.pk, "cutoff": cutoff, "limit": options.batch_size})
            row = cur.fetchone()
        n = int(row[0]) if row else 0
        done += n
        if n < options.batch_size:
            break
    baseline_s = time.perf_counter() - start
    if done != expected:
        raise common.BenchError(f"the baseline tombstoned {done}, expected {expected}")

    rate, base = expected / figure_s, expected / baseline_s
    common.header(
        "retention expiry",
        [
            f"{options.artifacts} artifacts x {options.revisions} revisions, {expected} to expire,"
            f" batches of {options.batch_size}",
        ],
    )
    print(f"expire() (retention run)    {rate:10.0f} revisions/s  ({figure_s:.2f} s)")
    print(f"baseline (plain UPDATEs)    {base:10.0f} revisions/s  ({baseline_s:.2f} s)")
    print(f"ratio                       {common.ratio(rate, base)}")
    common.write_json(
        options.json,
        {"expire_per_s": rate, "baseline_per_s": base, "revisions": expected, "batch_size": options.batch_size},
    )


if __name__ == "__main__":
    main()
