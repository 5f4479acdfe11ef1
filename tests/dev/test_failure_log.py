"""A failing dependency is logged once per interval with a count, not once per request.

The counting rules are pure logic (a fake clock). The relay test cuts Redis off a real relay
process and counts the tracebacks in its log while every write fails.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from buzz.dev.devservices import free_port
from buzz.failure_log import FailureLog
from buzz.identity.communities import community_create, member_add
from buzz.nostr import Signer
from tests.support.relay import RelayFactory
from tests.support.wsclient import RelayClient

HOST = "failure-log.test"
TRACEBACK = "Traceback (most recent call last)"


def logged_tracebacks(log: str) -> int:
    """Exceptions logged with a traceback; a chained one prints several "Traceback" headers."""
    chained = log.count("During handling of the above exception") + log.count("The above exception was the direct")
    return log.count(TRACEBACK) - chained


def answering(event_id: str) -> Callable[[list[Any]], bool]:
    return lambda message: len(message) > 1 and message[1] == event_id


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, bool]]:
    """(message, has a traceback) of each record, oldest first."""
    return [(r.getMessage(), r.exc_info is not None) for r in caplog.records]


def test_one_traceback_then_a_count_per_interval_then_recovery(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    failures = FailureLog(logging.getLogger("test.failure_log"), interval=30.0, clock=clock)
    caplog.set_level(logging.INFO, logger="test.failure_log")

    for _ in range(50):  # an outage: 50 requests within the first interval
        failures.failed("write quota check", ConnectionError("Connection refused"))
        clock.now += 0.1
    assert records(caplog) == [
        ("write quota check failed (while it keeps failing, this is logged once per 30 s)", True)
    ]

    caplog.clear()
    clock.now = 1000.0 + 30.0
    failures.failed("write quota check", ConnectionError("Connection refused"))
    failures.failed("write quota check", ConnectionError("Connection refused"))
    assert records(caplog) == [
        (
            "write quota check still failing: 50 failures in the last 30 s (51 since it started 30 s ago); "
            "last: ConnectionError: Connection refused",
            False,
        )
    ]

    caplog.clear()
    clock.now += 5.0
    failures.succeeded("write quota check")
    failures.succeeded("write quota check")
    assert records(caplog) == [("write quota check recovered after 52 failures over 35 s", False)]

    # After recovery, the next failure is a new outage: its traceback is logged again.
    caplog.clear()
    failures.failed("write quota check", ConnectionError("Connection refused"))
    assert records(caplog) == [
        ("write quota check failed (while it keeps failing, this is logged once per 30 s)", True)
    ]


def test_another_kind_of_failure_and_another_site_get_their_own_traceback(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    failures = FailureLog(logging.getLogger("test.failure_log"), interval=30.0, clock=clock)
    caplog.set_level(logging.INFO, logger="test.failure_log")
    failures.failed("write quota check", ConnectionError("down"))
    failures.failed("write quota check", ConnectionError("down"))
    failures.failed("write quota check", TypeError("a bug, not the outage"))
    failures.failed("storing a kind 9 event", ConnectionError("down"))
    failures.succeeded("storing a kind 9 event")
    assert [(message.split(" (")[0], tb) for message, tb in records(caplog)] == [
        ("write quota check failed", True),
        ("write quota check failed", True),
        ("storing a kind 9 event failed", True),
        ("storing a kind 9 event recovered after 1 failures over 0 s", False),
    ]


def test_a_quiet_interval_ends_an_outage_without_a_success(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    failures = FailureLog(logging.getLogger("test.failure_log"), interval=30.0, clock=clock)
    caplog.set_level(logging.INFO, logger="test.failure_log")
    failures.failed("COUNT", ConnectionError("down"))
    clock.now += 29.0
    failures.failed("COUNT", ConnectionError("down"))  # the same outage: counted, not logged
    clock.now += 30.0
    failures.failed("COUNT", ConnectionError("down"))  # 30 s without a failure: a new outage
    assert records(caplog) == [
        ("COUNT failed (while it keeps failing, this is logged once per 30 s)", True),
        ("COUNT failed (while it keeps failing, this is logged once per 30 s)", True),
    ]


async def test_a_redis_outage_logs_one_traceback_not_one_per_write(relay_factory: RelayFactory) -> None:
    writer = Signer.generate()

    def admit() -> None:
        member_add(community=community_create(host=HOST, name="Failure log"), pubkey=writer.pubkey)

    await sync_to_async(admit)()
    # Nothing listens there: every write's quota check fails, as with an embedded Redis that died.
    relay = relay_factory(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    writes = 40
    async with RelayClient.connect(relay.ws_url, host=HOST) as client:
        assert (await client.auth(writer))[2]
        for _ in range(writes):
            event = writer.sign_event(kind=9, tags=[["h", str(uuid.uuid4())]], content="x").to_dict()
            await client.send_json(["EVENT", event])
            ok = await client.expect("OK", where=answering(event["id"]))
            assert ok[2:] == [False, "error: could not check the write quota, try again"]
    log = relay.log_text()
    assert log.count("write quota check failed") == 1, log
    assert logged_tracebacks(log) == 1, log
