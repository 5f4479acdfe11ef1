"""A black-box NIP-AR conformance suite: `python -m artifacts.client conformance --relay URL --key-file A
--key-file B [--key-file C]`. It talks to the relay over its public protocol only, so it runs against any
implementation; whatever the relay's NIP-11 does not advertise is skipped, saying so."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from ..events import Keys
from ..httpapi import RelayUrl
from ..text import terminal_safe
from . import checks_incremental, checks_reads, checks_sync, checks_writes
from .runner import CHECKS, Report, run_checks
from .world import SetupFailed, World

__all__ = ["CHECKS", "Report", "run_suite"]
# The suite runs the write path first, then reads, then sync, then incremental reads (each module in
# declaration order).
_ORDER = [m.__name__ for m in (checks_writes, checks_reads, checks_sync, checks_incremental)]
CHECKS.sort(key=lambda c: _ORDER.index(c.fn.__module__))


async def run_suite(
    relay: str | RelayUrl, keys: Sequence[Keys], *, out: TextIO | None = None, only: Sequence[str] | None = None
) -> Report:
    """Run every check; print PASS/FAIL/SKIP lines, then `N skipped` and last `N passed, N failed`."""
    stream = out or sys.stdout
    url = relay if isinstance(relay, RelayUrl) else RelayUrl.parse(relay)
    report = Report()
    stream.write(f"NIP-AR conformance against {url.ws}\n")
    try:
        world = await World.open(url, keys, stream)
    except SetupFailed as err:
        report.failed += 1
        report.failures.append(f"FAIL setup: {err}")
        stream.write(terminal_safe(f"FAIL setup: {err}") + "\n")
    else:
        try:
            stream.write(
                f"channels P={world.channels.p} Q={world.channels.q} R={world.channels.r}, type {world.type}\n"
            )
            await run_checks(world, stream, report, only)
        finally:
            await world.close()
    stream.write(f"{report.skipped} skipped\n")
    stream.write(f"{report.passed} passed, {report.failed} failed\n")
    stream.flush()
    return report
