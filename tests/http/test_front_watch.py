"""The front's watch for a client's disconnect (buzz.web.front._DisconnectWatch), as asyncio logic: a view is
awaited on the request's own task; a listener on `receive` starts only once the view has run for
DISCONNECT_WATCH_AFTER; a disconnect then cancels the view, and nothing else does. The same behaviour
through a relay process: tests/http/test_http_failures.py::test_a_read_whose_client_goes_away_is_cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.http import HttpResponse

from buzz.web import front
from tests.support.stalled import Stalled


class Client:
    """`receive` after the body: waits until the test disconnects the client; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        await self.gone.wait()
        return {"type": "http.disconnect"}


@pytest.fixture(autouse=True)
def short_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front, "DISCONNECT_WATCH_AFTER", 0.01)


async def test_a_view_that_ends_soon_never_gets_a_listener() -> None:
    client = Client()

    async def view() -> HttpResponse:
        return HttpResponse("done")

    response = await front._DisconnectWatch(client.receive).serving(view())
    await asyncio.sleep(0.05)  # past the watch's delay: its timer was cancelled with the view's end
    assert response.content == b"done" and client.calls == 0


async def test_a_client_that_goes_away_cancels_a_running_view() -> None:
    client, stalled = Client(), Stalled()

    async def view() -> HttpResponse:
        await stalled.wait()
        return HttpResponse("never")

    async def request() -> Any:
        return await front._DisconnectWatch(client.receive).serving(view())

    task = asyncio.ensure_future(request())
    await stalled.started.wait()
    while client.calls == 0:  # the listener starts once the view has run a while
        await asyncio.sleep(0.005)
    client.gone.set()
    with pytest.raises(front._ClientGone):
        await task
    assert stalled.cancelled.is_set() and task.cancelling() == 0


async def test_a_slow_view_answers_and_its_listener_goes() -> None:
    client, release = Client(), asyncio.Event()

    async def view() -> HttpResponse:
        await release.wait()
        return HttpResponse("slow")

    task = asyncio.ensure_future(front._DisconnectWatch(client.receive).serving(view()))
    while client.calls == 0:
        await asyncio.sleep(0.005)
    release.set()
    assert (await task).content == b"slow"
    client.gone.set()  # a disconnect after the answer cancels nothing: the listener is gone
    await asyncio.sleep(0.02)
    assert client.calls == 1 and not task.cancelled()


async def test_a_cancel_that_is_not_a_disconnect_is_not_swallowed() -> None:
    client, stalled = Client(), Stalled()

    async def view() -> HttpResponse:
        await stalled.wait()
        return HttpResponse("never")

    task = asyncio.ensure_future(front._DisconnectWatch(client.receive).serving(view()))
    await stalled.started.wait()
    await asyncio.sleep(0.03)  # the listener is running
    task.cancel()  # e.g. the server shutting down
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.calls == 1
