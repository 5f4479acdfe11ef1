"""What a subscription and its connection know of each other: two small protocols.

A subscription (an ordinary REQ, or a mode an app registers, such as NIP-AR sync)
sees its connection only through `SubscriptionHost`; the connection
(buzz.ws.session.Session) sees its subscriptions only through `Subscription`.
Neither module imports the other.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo
from buzz.limits import Limits
from buzz.ws.outbound import Outbound


class Subscription(Protocol):
    """One open subscription of a connection, under the client's subscription id."""

    @property
    def sub_id(self) -> str: ...

    def start(self) -> None:
        """Begin serving (a task of its own); replies go through the host's outbound queue."""

    async def close(self) -> None:
        """CLOSE, a replacing REQ, or a disconnect: stop every read and release live interest. Idempotent."""


class SubscriptionHost(Protocol):
    """The connection a subscription belongs to."""

    @property
    def community(self) -> CommunityInfo: ...

    @property
    def actor(self) -> Actor | None: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def outbound(self) -> Outbound: ...

    @property
    def reads(self) -> asyncio.Semaphore:
        """The connection's bound on its concurrent stored reads (buzz.events.query's read slots)."""

    def reply(self, message: list[Any]) -> bool:
        """Queue a reply without waiting; on a full queue the connection is closed (False)."""

    def subscription_ended(self, sub: Subscription, reason: str) -> None:
        """The relay ends `sub`: CLOSED with `reason` goes out, and the connection forgets it."""

    def abort(self) -> None:
        """The client can't keep up (its outbound queue is full): close the connection."""
