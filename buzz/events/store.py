"""Stored events: the one writer of `buzz_storedevent` and its NIP-01 tag index.

Every path that stores a signed event goes through here: kind-9 messages, NIP-29
group events and relay-signed state, NIP-AR revisions and move removals. The hot
paths write in one SQL statement together with their other rows, so this module
gives them the statement's pieces (`insert_ctes`, `insert_params`) instead of
running its own round trip; the synchronous ORM services call `store_sync`, which
runs the same pieces on Django's connection. Withholding (a removed message, a
redacted or expired revision) and replacing relay state also happen only here, so
a change to how stored copies are kept is a change to this module alone.

A stored copy is keyed by (community, event id): one signed event sent to two communities is
stored in each, and everything found by event id is looked up within one community. The tag index
points at the copy's surrogate `key`. `check_storable` refuses, before any write, what the columns
can never hold, so such an event is `invalid:`, not a failed INSERT answered as transient.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection

from buzz.nostr import Event, ProtocolError
from buzz.runtime import fetch_all
from buzz.sqlarrays import TextArray

# The stored copy's identity: what a resubmission of the same event to the same community collides on.
CONFLICT_TARGET = "(community_id, id)"

# buzz_eventtag.value is varchar(4096): the first value of a single-letter tag, indexed for `#x` filters.
INDEXED_VALUE_CHARS = 4096


def check_storable(event: Event) -> None:
    """Refuse what PostgreSQL can't store: U+0000 in any tag element (text can't hold it; tag names and
    values are stored as text by the tag indexes), or an indexed tag value over INDEXED_VALUE_CHARS.
    Content may hold U+0000: the stored JSON escapes it. Raises ProtocolError("invalid: ...")."""
    for tag in event.tags:
        for item in tag:
            if "\x00" in item:
                raise ProtocolError("invalid: tags can't contain U+0000 (NUL)")
        if _indexed(tag) and len(tag[1]) > INDEXED_VALUE_CHARS:
            raise ProtocolError(
                f"invalid: the first value of a single-letter tag is at most {INDEXED_VALUE_CHARS} characters"
            )


def _indexed(tag: tuple[str, ...]) -> bool:
    return len(tag) >= 2 and len(tag[0]) == 1 and tag[0].isascii() and tag[0].isalpha()


def event_json(event: Event) -> str:
    """The stored text of an event: compact JSON, served back verbatim by every read."""
    return event.to_json()


def indexed_tags(event: Event, channel: uuid.UUID | None = None) -> tuple[list[str], list[str], bool]:
    """Single-letter tags with their first value: what a NIP-01 `#x` filter matches. The h tag naming
    `channel` (its first value `str(channel)`, exactly) is left out, and the third value says so: the
    stored row's channel column answers `#h` for it (h_is_channel), one tag row less for every message."""
    names: list[str] = []
    values: list[str] = []
    seen: set[tuple[str, str]] = set()
    own_h = ("h", str(channel)) if channel is not None else None
    for tag in event.tags:
        if _indexed(tag):
            key = (tag[0], tag[1])
            if key not in seen:
                seen.add(key)
                if key != own_h:
                    names.append(tag[0])
                    values.append(tag[1])
    return names, values, own_h in seen


def insert_ctes(name: str, key: str, *, source: str | None = None) -> str:
    """Two CTEs for a larger statement: `{name}` stores the event given by the `{key}_*` parameters
    (see `insert_params`) and returns its key and id, `{name}_tags` writes its tag index.

    Nothing is written when `{key}_id` is NULL (an optional event, such as the removal of a
    move that is not a move), when `source` names a CTE that returned no row, or when the
    event is stored already; other CTEs can test `EXISTS (SELECT 1 FROM {name})`.
    """
    origin = f" FROM {source}" if source else ""
    return f"""{name} AS (
  INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, h_is_channel, raw,
                                received_at)
  SELECT %({key}_id)s::varchar, %({key}_community)s::bigint, %({key}_pubkey)s::varchar, %({key}_kind)s::int,
         %({key}_created_at)s::bigint, %({key}_channel)s::uuid, %({key}_h_is_channel)s::boolean,
         %({key}_raw)s::text, now(){origin}
  WHERE %({key}_id)s::varchar IS NOT NULL
  ON CONFLICT {CONFLICT_TARGET} DO NOTHING RETURNING key, id
), {name}_tags AS (
  INSERT INTO buzz_eventtag (event_key, name, value)
  SELECT {name}.key, t.n, t.v FROM {name}, unnest(%({key}_tag_names)s::text[], %({key}_tag_values)s::text[]) AS t(n, v)
)"""  # noqa: S608 - identifiers come from code, values are placeholders


def insert_params(key: str, *, community_id: int, event: Event | None, channel: uuid.UUID | None) -> dict[str, Any]:
    """The parameters of `insert_ctes(..., key)`; `event` None writes nothing."""
    names, values, h_is_channel = indexed_tags(event, channel) if event is not None else ([], [], False)
    return {
        f"{key}_id": event.id if event is not None else None,
        f"{key}_community": community_id,
        f"{key}_pubkey": event.pubkey if event is not None else None,
        f"{key}_kind": event.kind if event is not None else None,
        f"{key}_created_at": event.created_at if event is not None else None,
        f"{key}_channel": channel,
        f"{key}_h_is_channel": h_is_channel,
        f"{key}_raw": event_json(event) if event is not None else None,
        f"{key}_tag_names": TextArray(names),
        f"{key}_tag_values": TextArray(values),
    }


_STORE = f"WITH {insert_ctes('ins', 'ev')} SELECT count(*) FROM ins"  # noqa: S608

# An event the relay accepted is stored with its own id, withheld or not, for good (`withhold_sync`).
_STORED = "SELECT deleted_at IS NULL FROM buzz_storedevent WHERE id = %s AND community_id = %s"


async def stored_as(community_id: int, event_id: str) -> bool | None:
    """Whether this event was accepted here: None if never, True if readers get it, False if it is withheld."""
    rows = await fetch_all(_STORED, (event_id, community_id))
    return bool(rows[0][0]) if rows else None


def store_sync(*, community_id: int, event: Event, channel: uuid.UUID | None) -> bool:
    """Store one event inside the caller's ORM transaction. False if it was stored already."""
    with connection.cursor() as cur:
        cur.execute(_STORE, insert_params("ev", community_id=community_id, event=event, channel=channel))
        row = cur.fetchone()
    return bool(row and row[0])


def withhold_sync(*, community_id: int, ids: Sequence[str], erase: bool = False) -> int:
    """Withhold stored copies from every read (a removed message, a redacted or expired revision), and
    drop their mention records (a withheld event notifies nobody).

    The rows stay: an id once accepted is never accepted again. `erase` also empties the stored text
    (retention: the content is gone, the id still answers `duplicate:`), in the same statement. Returns
    how many rows changed now.
    """
    if not ids:
        return 0
    with connection.cursor() as cur:
        if erase:
            cur.execute(
                "UPDATE buzz_storedevent SET deleted_at = COALESCE(deleted_at, now()), raw = ''"
                " WHERE community_id = %s AND id = ANY(%s) AND (deleted_at IS NULL OR raw <> '')",
                [community_id, list(ids)],
            )
        else:
            cur.execute(
                "UPDATE buzz_storedevent SET deleted_at = now()"
                " WHERE community_id = %s AND id = ANY(%s) AND deleted_at IS NULL",
                [community_id, list(ids)],
            )
        changed = int(cur.rowcount)
        cur.execute(
            "DELETE FROM buzz_mention WHERE community_id = %s AND event_id = ANY(%s)", [community_id, list(ids)]
        )
        return changed


def discard_sync(*, community_id: int, channel: uuid.UUID, kinds: Iterable[int]) -> int | None:
    """Delete a channel's stored events of replaceable kinds (relay-signed state, replaced as a whole).

    Returns the newest created_at among them (None when there were none): a replacement must be newer.
    """
    with connection.cursor() as cur:
        cur.execute(
            "WITH gone AS (SELECT key, created_at FROM buzz_storedevent WHERE community_id = %s AND channel_id = %s"
            " AND kind = ANY(%s) FOR UPDATE),"
            " tags AS (DELETE FROM buzz_eventtag WHERE event_key IN (SELECT key FROM gone)),"
            " rows AS (DELETE FROM buzz_storedevent WHERE key IN (SELECT key FROM gone))"
            " SELECT max(created_at) FROM gone",
            [community_id, channel, list(kinds)],
        )
        row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else None
