"""The relay's domain error: a refusal that carries its NIP-01 reason.

Services and selectors raise it (or a subclass) with a reason such as
"restricted: not a channel member"; transports turn it into their own shape: an OK
false or CLOSED on the WebSocket, a JSON error with the status of its prefix over
HTTP (buzz.web.errors). Nothing below the views knows an HTTP status.
"""

from __future__ import annotations


class Refused(Exception):
    """A refused request. `reason` is the client-facing NIP-01 reason, "<prefix>: <text>"."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    @property
    def prefix(self) -> str:
        return self.reason.split(":", 1)[0]
