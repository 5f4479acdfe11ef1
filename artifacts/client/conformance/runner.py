"""The conformance runner: named checks, each against the spec rule it names; PASS, FAIL or SKIP.

A check is an async function of the World, registered with @check("area: rule", needs=...).
`needs` names capabilities read from NIP-11 (sync, incremental, head, history, limit:<name>) or a
third key (C); a check whose needs the relay does not advertise is skipped, saying so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from ..text import terminal_safe

if TYPE_CHECKING:
    from .world import World

CheckFn = Callable[["World"], Awaitable[None]]
CHECK_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    fn: CheckFn
    needs: tuple[str, ...]


# The suite, in the order the checks are declared (the checks_* modules register them on import).
CHECKS: list[Check] = []


def check(name: str, *, needs: Sequence[str] = ()) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        if any(c.name == name for c in CHECKS):
            raise RuntimeError(f"two checks are named {name!r}")
        CHECKS.append(Check(name, fn, tuple(needs)))
        return fn

    return register


class CheckFailed(Exception):
    """The relay broke the rule the check names; the message says how."""


class Skipped(Exception):
    """The check cannot run against this relay (raised inside a check); the message says why."""


def expect(condition: object, detail: str) -> None:
    if not condition:
        raise CheckFailed(detail)


def short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Report:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)


async def run_checks(world: World, out: TextIO, report: Report, only: Sequence[str] | None) -> None:
    for c in CHECKS:
        if only and not any(c.name.startswith(prefix) for prefix in only):
            continue
        missing = [need for need in c.needs if not world.has(need)]
        if missing:
            report.skipped += 1
            out.write(terminal_safe(f"SKIP {c.name}: {world.why_not(missing[0])}") + "\n")
            out.flush()
            continue
        started = time.monotonic()
        try:
            await asyncio.wait_for(c.fn(world), CHECK_TIMEOUT)
        except CheckFailed as err:
            verdict = f"FAIL {c.name}: {err}"
        except Skipped as err:
            report.skipped += 1
            out.write(terminal_safe(f"SKIP {c.name}: {err}") + "\n")
            out.flush()
            continue
        except TimeoutError:
            verdict = f"FAIL {c.name}: no result within {CHECK_TIMEOUT:g} s"
        except Exception as err:
            verdict = f"FAIL {c.name}: {err.__class__.__name__}: {err}"
        else:
            report.passed += 1
            out.write(f"PASS {c.name} ({time.monotonic() - started:.1f} s)\n")
            out.flush()
            continue
        report.failed += 1
        report.failures.append(verdict)
        out.write(terminal_safe(verdict) + "\n")
        out.flush()
