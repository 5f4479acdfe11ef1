"""artifacts.incremental.within_operation as pure asyncio logic, with work functions of the test's own: the
per-process slots, the answer at the deadline while the cancelled work still ends in the background, a
client that goes away, and the failure answers. No database."""

from __future__ import annotations

import asyncio

import psycopg.errors
import psycopg_pool
import pytest

from artifacts import incremental
from tests.support.stalled import Stalled


def _deadline(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def _failure(work: object, seconds: float = 5.0) -> incremental.IncrementalError:
    with pytest.raises(incremental.IncrementalError) as err:
        await incremental.within_operation(_deadline(seconds), work)  # type: ignore[arg-type]
    return err.value


async def test_the_work_answers_and_gives_its_slot_back() -> None:
    async def work() -> str:
        assert incremental._active == 1
        return "page"

    assert await incremental.within_operation(_deadline(5), work) == "page"
    assert incremental._active == 0


async def test_past_the_slots_the_answer_is_503_concurrency_at_once() -> None:
    release = asyncio.Event()

    async def held() -> str:
        await release.wait()
        return "done"

    running = [
        asyncio.ensure_future(incremental.within_operation(_deadline(5), held))
        for _ in range(incremental.MAX_CONCURRENT)
    ]
    await asyncio.sleep(0)
    err = await _failure(held)
    assert (err.status, err.code, err.reason) == (503, "incremental_unavailable", "concurrency")
    release.set()
    assert await asyncio.gather(*running) == ["done"] * incremental.MAX_CONCURRENT
    assert incremental._active == 0


async def test_at_the_deadline_the_answer_comes_at_once_and_the_slot_waits_for_the_work() -> None:
    # As psycopg does with a database that stopped answering: a cancel is taken, then cleanup takes time.
    cancelled, cleanup_done = asyncio.Event(), asyncio.Event()
    finish_cleanup = asyncio.Event()

    async def stuck() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await finish_cleanup.wait()
            cleanup_done.set()
            raise
        return "never"

    err = await _failure(stuck, seconds=0.05)
    assert (err.status, err.reason) == (503, "operation_budget")
    assert not cleanup_done.is_set()
    await cancelled.wait()
    assert incremental._active == 1  # the slot is the work's until it has ended
    finish_cleanup.set()
    await cleanup_done.wait()
    await asyncio.sleep(0)
    assert incremental._active == 0


async def test_a_client_that_goes_away_cancels_the_work() -> None:
    stalled = Stalled()

    async def work() -> str:
        await stalled.wait()
        return "never"

    request = asyncio.ensure_future(incremental.within_operation(_deadline(5), work))
    await stalled.started.wait()
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    await stalled.cancelled.wait()
    await asyncio.sleep(0)
    assert incremental._active == 0


@pytest.mark.parametrize(
    ("raised", "reason"),
    [
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), "statement_budget"),
        (psycopg.OperationalError("server closed the connection unexpectedly"), "database"),
        (psycopg_pool.PoolTimeout("couldn't get a connection"), "database"),
        (TimeoutError(), "database"),
    ],
)
async def test_database_failures_are_503_with_their_reason(raised: BaseException, reason: str) -> None:
    async def work() -> str:
        raise raised

    err = await _failure(work)
    assert (err.status, err.code, err.reason) == (503, "incremental_unavailable", reason)
    assert incremental._active == 0


async def test_an_answer_of_the_work_itself_passes_unchanged() -> None:
    async def work() -> str:
        raise incremental.invalid("malformed token", reason="token")

    err = await _failure(work)
    assert (err.status, err.code, err.reason) == (400, "incremental_invalid", "token")
    assert incremental._active == 0


async def test_the_statement_budget_answers_its_own_expiry_and_nothing_else() -> None:
    with pytest.raises(incremental.IncrementalError) as err:
        async with incremental.statement(_deadline(0.05)):
            await asyncio.Event().wait()
    assert err.value.reason == "statement_budget"
    # A timeout that is not the statement's own passes through (the operation answers it).
    with pytest.raises(TimeoutError):
        async with incremental.statement(_deadline(5)):
            raise TimeoutError
