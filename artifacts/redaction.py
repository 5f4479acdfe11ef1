"""Redaction and retention of NIP-AR revisions: the writes behind moderation, in one place.

NIP-AR "Moderation and retention": a NIP-29 kind-9005 removal redacts a revision (or a move's
relay-signed kind-45011 removal). The relay withholds it from every surface and still records it
as accepted: the row stays, a resubmission is `duplicate:`, redaction never changes which
revision is current, and the id stays valid as prev. Redacting the current revision retires the
artifact (`artifacts_artifact.retired`): current-state queries and the head view leave it out, and
every sync that may hold it is ended with CLOSED "resync: ..." on every node (the RETIRED signal,
sync rule 6). An edit naming the retired head as prev is accepted and makes a new visible head.

Retention tombstones a revision (`expired_at`, its content erased) instead of deleting its row, so
prev checks and `duplicate:` keep working. It never touches a current head, nor a revision a move
removal names (the move and the revision it replaced: what incremental reads of the source need).

Everything here is synchronous ORM code run inside the caller's transaction. The stored copies are
withheld by buzz.events.store, their one writer; signals go out after commit through buzz.live.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

from buzz.chat.removals import Removal
from buzz.events.store import withhold_sync
from buzz.live import signals


@dataclass(frozen=True, slots=True)
class Redaction:
    """What one redaction withheld now (ids already redacted are not repeated) and which artifacts it retired,
    as (d, home channel)."""

    withheld: tuple[str, ...]
    retired: tuple[tuple[str, uuid.UUID], ...]


# Called after each redaction made by a NIP-29 9005 (inside its transaction): moderation records it.
RedactionObserver = Callable[[Removal, Redaction], None]
_observers: list[RedactionObserver] = []


def observe_redactions(observer: RedactionObserver) -> None:
    """Called from AppConfig.ready(): `observer` sees every redaction a 9005 makes."""
    if observer not in _observers:
        _observers.append(observer)


def redact_events(community_id: int, ids: Sequence[str]) -> Redaction:
    """Redact revisions and move removals of a community by event id, in the caller's transaction.

    Ids that are neither, or already redacted, are skipped. Retired artifacts are signalled after commit.
    """
    wanted = sorted(set(ids))
    if not wanted:
        return Redaction((), ())
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE artifacts_revision SET redacted_at = now()"
            " WHERE community_id = %s AND id = ANY(%s) AND redacted_at IS NULL RETURNING id",
            [community_id, wanted],
        )
        revisions = [row[0] for row in cur.fetchall()]
        cur.execute(
            "UPDATE artifacts_moveremoval SET redacted_at = now()"
            " WHERE community_id = %s AND id = ANY(%s) AND redacted_at IS NULL RETURNING id",
            [community_id, wanted],
        )
        removals = [row[0] for row in cur.fetchall()]
        retired: list[tuple[str, uuid.UUID]] = []
        if revisions:
            # The head row is the compare-and-set lock: an edit racing this one either committed first (then
            # the redacted revision is no longer the head, and nothing retires) or waits and then advances the
            # retired head to a new, visible one, as an edit naming the redacted head as prev must.
            cur.execute(
                "UPDATE artifacts_artifact SET retired = true, changed_at = clock_timestamp()"
                " WHERE community_id = %s AND head_id = ANY(%s) AND NOT retired RETURNING d, home",
                [community_id, revisions],
            )
            retired = [(str(d), home) for d, home in cur.fetchall()]
    withhold_sync(community_id=community_id, ids=[*revisions, *removals])
    for d, home in retired:
        signals.publish_on_commit(community_id, home, signals.retired_message(home, d))
    return Redaction(tuple(revisions + removals), tuple(retired))


def redact_removal(removal: Removal) -> None:
    """The kind-9005 removal target for 45010 revisions and 45011 move removals (buzz.chat.removals):
    the permission check (author, or channel owner/admin) has passed and the stored copy is locked."""
    result = redact_events(removal.community_id, [removal.target.id])
    for observer in _observers:
        observer(removal, result)


# --- retention ---------------------------------------------------------------------------------------

# A revision retention may expire: older than the cutoff, not yet expired, not any artifact's current head,
# and not named by a move removal (the move itself and the revision it replaced stay, with the removal).
_EXPIRABLE = """
  r.community_id = %(community)s AND r.expired_at IS NULL AND r.accepted_at < %(cutoff)s
  AND NOT EXISTS (SELECT 1 FROM artifacts_artifact a WHERE a.community_id = r.community_id AND a.head_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM artifacts_moveremoval m WHERE m.community_id = r.community_id AND m.move_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM artifacts_moveremoval m WHERE m.community_id = r.community_id AND m.replaced = r.id)
"""

_KEPT = """
  r.community_id = %(community)s AND r.expired_at IS NULL AND r.accepted_at < %(cutoff)s
  AND (EXISTS (SELECT 1 FROM artifacts_artifact a WHERE a.community_id = r.community_id AND a.head_id = r.id)
       OR EXISTS (SELECT 1 FROM artifacts_moveremoval m WHERE m.community_id = r.community_id AND m.move_id = r.id)
       OR EXISTS (SELECT 1 FROM artifacts_moveremoval m WHERE m.community_id = r.community_id AND m.replaced = r.id))
"""


@dataclass(frozen=True, slots=True)
class ExpiryCounts:
    expirable: int
    kept: int
    sample: tuple[str, ...]


def count_expirable(community_id: int, cutoff: dt.datetime, *, sample: int = 10) -> ExpiryCounts:
    """What an expiry with this cutoff would tombstone now, and what older history it keeps. Writes nothing."""
    args: dict[str, Any] = {"community": community_id, "cutoff": cutoff, "sample": sample}
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM artifacts_revision r WHERE {_EXPIRABLE}", args)  # noqa: S608
        expirable = int(cur.fetchone()[0])  # type: ignore[index]
        cur.execute(f"SELECT count(*) FROM artifacts_revision r WHERE {_KEPT}", args)  # noqa: S608
        kept = int(cur.fetchone()[0])  # type: ignore[index]
        cur.execute(
            f"SELECT r.id FROM artifacts_revision r WHERE {_EXPIRABLE} ORDER BY r.accepted_at, r.seq LIMIT %(sample)s",  # noqa: S608
            args,
        )
        ids = tuple(row[0] for row in cur.fetchall())
    return ExpiryCounts(expirable, kept, ids)


def expire_batch(community_id: int, cutoff: dt.datetime, limit: int) -> list[str]:
    """Tombstone up to `limit` expirable revisions, oldest first, in the caller's transaction; their ids.

    Safe while writes go on: a revision that is not a head now never becomes one again (an edit always
    makes a new revision the head), rows another run holds are skipped, and the row stays, so a
    resubmission is still `duplicate:` and a prev naming it is an ordinary conflict.
    """
    args: dict[str, Any] = {"community": community_id, "cutoff": cutoff, "limit": limit}
    with connection.cursor() as cur:
        cur.execute(
            f"""WITH picked AS (
                  SELECT r.seq FROM artifacts_revision r WHERE {_EXPIRABLE}
                  ORDER BY r.accepted_at, r.seq LIMIT %(limit)s FOR UPDATE OF r SKIP LOCKED
                )
                UPDATE artifacts_revision r SET expired_at = now(), raw = ''
                FROM picked WHERE r.seq = picked.seq RETURNING r.id""",  # noqa: S608
            args,
        )
        ids = [row[0] for row in cur.fetchall()]
    withhold_sync(community_id=community_id, ids=ids, erase=True)
    return ids
