"""Live signals: the messages the relay publishes after a commit, and the one place that publishes them.

A signal goes to the topic of the channel it concerns (buzz.live.hub.topic_for_channel)
and is published only after the transaction that made it true has committed:

* `publish_committed` for the async write paths: after commit and before OK, queued on
  the process's publisher and retried until Redis takes it (NIP-AR sync rule 5).
* `publish_on_commit` for the synchronous ORM services (NIP-29 channel changes, the
  admin, management commands): registered with `transaction.on_commit`.

Message types are the constants below; a listener dispatches on the `t` field.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Final

from django.conf import settings

from buzz.live.hub import topic_for_channel
from buzz.live.publisher import publish_blocking_on_commit
from buzz.nostr import Event
from buzz.runtime import runtime

# A stored event of the channel, for live NIP-01 delivery: {"t": "event", "event": {...}}.
EVENT: Final = "event"
# Read access to the channel may have changed; subscribers re-check: {"t": "access", "channel", "why"}.
ACCESS: Final = "access"

# Something a channel's subscribers may hold left its current state without a new event (a moderation
# redaction retiring an artifact's head): {"t": "retired", "channel", "d"}. Syncs holding it resync.
RETIRED: Final = "retired"

# Why an access signal was sent (the `why` field).
WHY_CREATED: Final = "created"
WHY_MEMBERSHIP: Final = "membership"
WHY_VISIBILITY: Final = "visibility"
WHY_DELETED: Final = "deleted"
WHY_BAN: Final = "ban"

# Seconds an OK waits for its signal to be published; past that it stays queued and is retried.
PUBLISH_WAIT: Final = 1.0


def event_message(event: Event) -> dict[str, Any]:
    return {"t": EVENT, "event": event.to_dict()}


def access_message(channel: uuid.UUID, why: str) -> dict[str, Any]:
    return {"t": ACCESS, "channel": str(channel), "why": why}


def retired_message(channel: uuid.UUID, d: str) -> dict[str, Any]:
    return {"t": RETIRED, "channel": str(channel), "d": d}


def channel_topic(community_id: int, channel: uuid.UUID | str) -> str:
    return topic_for_channel(community_id, str(channel))


async def publish_committed(community_id: int, items: Sequence[tuple[uuid.UUID, dict[str, Any]]]) -> None:
    """After commit, before OK: publish each (channel, message), retried until Redis takes it.

    Waits up to PUBLISH_WAIT for the confirmation of each; a slower one stays queued and is retried.
    """
    publisher = runtime.publisher()
    for channel, message in items:
        await publisher.publish_confirmed(channel_topic(community_id, channel), message, timeout=PUBLISH_WAIT)


def publish_on_commit(community_id: int, channel: uuid.UUID, message: dict[str, Any]) -> None:
    """ORM side: publish `message` on the channel's topic once the current transaction commits."""
    publish_blocking_on_commit(
        settings.REDIS_URL, channel_topic(community_id, channel), message, prefix=settings.BUZZ_REDIS_PREFIX
    )
