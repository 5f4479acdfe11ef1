"""Failures that repeat (a dependency is down) logged once per interval with a count, not once per request.

During a Redis or PostgreSQL outage every write fails the same way. A traceback per
write buries the log and costs CPU when the relay can least afford it; one traceback when
the failure starts, then a line per interval with the count, says the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

# The same period as the live publisher's "still failing" lines (buzz/live/publisher.py).
LOG_EVERY = 30.0


@dataclass(slots=True)
class _Outage:
    started: float
    last_line: float
    last_failure: float
    kind: type[BaseException]
    since_line: int = 0
    total: int = 0


class FailureLog:
    """Per-site failure logging for one logger. Sites are short names ("write quota check").

    - The first failure of a site after a success is logged with its traceback.
    - Further failures are counted; once `interval` has passed since the last line, one
      line gives the count since then and the latest error, without a traceback.
    - A failure of another exception type is a new problem: its traceback is logged too.
    - The first success after failures logs one line with the total. A site that never
      reports success ends its outage by a quiet interval: no failure for `interval`.
    Call from one thread (the event loop): the counters are not locked.
    """

    def __init__(
        self, logger: logging.Logger, *, interval: float = LOG_EVERY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._outages: dict[str, _Outage] = {}

    def failed(self, site: str, exc: BaseException) -> None:
        now = self._clock()
        outage = self._outages.get(site)
        if outage is not None and now - outage.last_failure >= self._interval:
            outage = None  # a quiet interval ended the last outage
        if outage is None or not isinstance(exc, outage.kind):
            if outage is None:
                outage = self._outages[site] = _Outage(started=now, last_line=now, last_failure=now, kind=type(exc))
            else:
                outage.kind, outage.last_line, outage.last_failure = type(exc), now, now
            outage.total += 1
            self._logger.error(
                "%s failed (while it keeps failing, this is logged once per %.0f s)",
                site,
                self._interval,
                exc_info=exc,
            )
            return
        outage.total += 1
        outage.since_line += 1
        outage.last_failure = now
        if now - outage.last_line >= self._interval:
            self._logger.error(
                "%s still failing: %d failures in the last %.0f s (%d since it started %.0f s ago); last: %s",
                site,
                outage.since_line,
                now - outage.last_line,
                outage.total,
                now - outage.started,
                _describe(exc),
            )
            outage.last_line, outage.since_line = now, 0

    def succeeded(self, site: str) -> None:
        if not self._outages:
            return
        outage = self._outages.pop(site, None)
        if outage is not None:
            self._logger.warning(
                "%s recovered after %d failures over %.0f s", site, outage.total, self._clock() - outage.started
            )


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
