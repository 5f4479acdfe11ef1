"""The relay's ASGI application with one fault injected, for tests of what a crash releases.

A text frame `["CRASH"]` makes the frame handler raise, as an unforeseen bug would. Served by a
real relay process (`RelayProcess(app="tests.transport.crashing_relay:application")`).
"""

from __future__ import annotations

from buzz.asgi import application
from buzz.ws.session import Session

__all__ = ["CRASH", "application"]

CRASH = '["CRASH"]'
_handle = Session.handle


async def _crashing_handle(self: Session, text: str | bytes) -> None:
    if text == CRASH:
        raise RuntimeError("injected crash in the frame handler")
    await _handle(self, text)


setattr(Session, "handle", _crashing_handle)  # noqa: B010 - the one fault this test app injects
