"""Work that never ends by itself, for tests of what cancels it:

stalled = Stalled()
task = asyncio.ensure_future(stalled.wait())   # or awaited inside a view or a read under test
await stalled.started.wait()
...                                             # cancel it the way under test
assert stalled.cancelled.is_set()
"""

from __future__ import annotations

import asyncio


class Stalled:
    """An await that never finishes by itself: records that it started and that it was cancelled."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def wait(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
