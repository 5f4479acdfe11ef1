"""Current-head reads for live sync (NIP-AR sync rules 3 and 4), shared by every sync of a process.

A change signal names one d; every sync that holds or might gain that d must read its
current head. Read one by one, a change seen by a thousand syncs would be a thousand
queries. The reader batches instead: a request joins the next batch, and a batch
starts only after every request in it was made, so each request is answered by a
read that began after the change that caused it (which is what rule 4 needs: never
a head older than one the sync sent). Reads go to the writer database (the main
pool), never to a replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from artifacts.envelope import AUTH_TAG
from buzz.access.policy import policy_stamp_sql
from buzz.runtime import runtime

log = logging.getLogger(__name__)

# d values per query; a larger batch is split.
BATCH_MAX = 500

# With each head, the access epoch of its channel (Channel.access_epoch) and the community's policy stamp
# (buzz.access.policy.policy_stamp_sql): read in the same statement, so a sync that knew other values checks its
# reader's access before it sends the head (a change whose signal has not reached it yet).
_HEADS = f"""
SELECT a.d, a.home, a.deleted, a.retired, r.id, r.seq, r.raw, c.access_epoch,
       {policy_stamp_sql("a.community_id")}
FROM artifacts_artifact a JOIN artifacts_revision r ON r.community_id = a.community_id AND r.id = a.head_id
LEFT JOIN buzz_channel c ON c.community_id = a.community_id AND c.uuid = a.home
WHERE a.community_id = %s AND a.d = ANY(%s::uuid[])
"""  # noqa: S608 - composed from code, values are placeholders


@dataclass(frozen=True, slots=True)
class Head:
    """The current head of one artifact, as the writer has it now."""

    d: str
    home: uuid.UUID
    deleted: bool
    retired: bool
    event_id: str
    seq: int
    raw: str
    # (tag name, first value) pairs of the head, as artifacts.envelope.match_tags gives them.
    tags: tuple[tuple[str, str], ...]
    # Who may read `home`, as of this read: (its channel's access epoch, the community's policy stamp).
    access: tuple[int, int] = (0, 0)
    # `home` as text, made once per read: what a sync's checks of each change key on (a UUID hashes and
    # compares in Python, a str in C).
    channel: str = field(init=False, compare=False, repr=False)
    # Whether the head matches a query's predicates, by predicates, filled in by the syncs that ask:
    # one Head answers every sync of the process that reads this d in one batch.
    matched: dict[Any, bool] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "channel", str(self.home))


def _match_tags(raw_tags: Sequence[Any]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for tag in raw_tags:
        if len(tag) < 2 or tag[0] == AUTH_TAG:
            continue
        key = (str(tag[0]), str(tag[1]))
        if key not in seen:
            seen.add(key)
            out.append(key)
    return tuple(out)


def head_of(row: tuple[Any, ...]) -> Head:
    d, home, deleted, retired, event_id, seq, raw, epoch, stamp = row
    return Head(
        d=str(d),
        home=home,
        deleted=bool(deleted),
        retired=bool(retired),
        event_id=event_id,
        seq=int(seq),
        raw=raw,
        tags=_match_tags(json.loads(raw)["tags"]),
        access=(int(epoch or 0), int(stamp or 0)),
    )


# Told the outcome of one request: the d asked for, its head (None: no such d), or the exception the read
# failed with. The d comes with the answer, so a caller can hand over a bound method, not a closure per request.
HeadCallback = Callable[[str, Head | None, BaseException | None], None]


class HeadReader:
    """One per process and event loop. `read` returns the head of (community, d), or None if no such d.

    `submit` is the same read without a task or a future per request: the reader calls back with
    the result, on its own task, as soon as the batch's rows are in. A thousand syncs that read the
    same changed d are one query and a thousand plain calls.
    """

    def __init__(self) -> None:
        self._waiting: dict[tuple[int, str], list[HeadCallback]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def read(self, community_id: int, d: str) -> Head | None:
        """Raises when the read failed (the caller resyncs: rule 5)."""
        fut: asyncio.Future[Head | None] = asyncio.get_running_loop().create_future()

        def done(_d: str, head: Head | None, exc: BaseException | None) -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(head)

        self.submit(community_id, d, done)
        return await fut

    def submit(self, community_id: int, d: str, callback: HeadCallback) -> None:
        """Ask for the head of (community, d); `callback` gets it from a read that starts after this call.

        The callback must not block or raise (an exception is logged); it may submit again, which
        joins the next batch.
        """
        key = (community_id, d)
        waiting = self._waiting.get(key)
        if waiting is not None:
            waiting.append(callback)  # a thousand syncs asking for one changed d: this line, 999 times
            return
        self._waiting[key] = [callback]
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="artifact-head-reader")

    async def _run(self) -> None:
        while True:
            if not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            # Everything asked for so far goes into this batch; what is asked from now on waits for the next.
            batch, self._waiting = self._waiting, {}
            by_community: dict[int, list[str]] = {}
            for community_id, d in batch:
                by_community.setdefault(community_id, []).append(d)
            for community_id, ds in by_community.items():
                for start in range(0, len(ds), BATCH_MAX):
                    chunk = ds[start : start + BATCH_MAX]
                    failure: BaseException | None = None
                    heads: dict[str, Head] = {}
                    try:
                        heads = await self._query(community_id, chunk)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        log.warning("head read failed: %s", exc)
                        failure = exc
                    for d in chunk:
                        head = heads.get(d)
                        for callback in batch[(community_id, d)]:
                            try:
                                callback(d, head, failure)
                            except Exception:
                                log.exception("a head read's callback raised")

    @staticmethod
    async def _query(community_id: int, ds: list[str]) -> dict[str, Head]:
        pool = await runtime.pool()
        async with pool.connection() as conn:
            rows = await (await conn.execute(_HEADS, (community_id, ds))).fetchall()
        return {str(row[0]): head_of(row) for row in rows}


def head_reader() -> HeadReader:
    """The process's reader (one per event loop, owned by buzz.runtime)."""
    return runtime.shared("artifacts.heads", HeadReader)
