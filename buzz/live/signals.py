"""Live signals: the messages the relay publishes after a commit, and the one place that publishes them.

A signal goes to the topic of the channel it concerns (buzz.live.hub.topic_for_channel)
and is published only after the transaction that made it true has committed:

* `publish_committed` for the async write paths: after commit and before OK, queued on
  the process's publisher and retried until Redis takes it (NIP-AR sync rule 5).
* `publish_on_commit` for the synchronous ORM services (NIP-29 channel changes, the
  admin, management commands): registered with `transaction.on_commit`.

Message types are the constants below; a listener dispatches on the `t` field.

A change to one pubkey's standing in the whole community (a ban, its removal from the
relay members, a revoked token) goes to that pubkey's topic instead (`pubkey_topic`):
every subscription of an authenticated pubkey listens on it beside its channel topics,
so it reaches each of that pubkey's subscriptions on every node, whatever channels they
read, and a node subscribes to one topic per distinct pubkey it serves. A change to every
pubkey's standing (the community's admission mode) goes to the community's standing topic,
on which every subscription listens too (`standing_topics`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Final

from django.conf import settings

from buzz.live.hub import topic_for_channel, topic_for_community
from buzz.live.publisher import publish_blocking_on_commit
from buzz.nostr import Event
from buzz.runtime import runtime

# A stored event of the channel, for live NIP-01 delivery: {"t": "event", "event": {...}, "epoch": n}. `epoch`
# is the channel's effective access epoch (buzz.access.policy.ChannelAccess.epoch: Channel.access_epoch plus
# the community's PolicyStamp) as the write that stored the event read it, or later: a live REQ whose reader's
# access was decided at a lower epoch decides it again before it delivers the event (buzz.ws.req), whatever
# order the access change's own signal arrives in.
EVENT: Final = "event"
# Read access to the channel may have changed; subscribers re-check: {"t": "access", "channel", "why"}.
ACCESS: Final = "access"

# The standing of one pubkey in the community may have changed; that pubkey's subscribers re-check it
# (buzz.access.policy.check_reader): {"t": "standing", "pubkey", "why", "token"}. `token` is the id of
# the one API token concerned (a revocation: only connections authenticated by it re-check), or null
# (every connection of the pubkey re-checks). Published on `pubkey_topic`; with `pubkey` null on the community's
# standing topic, when every reader's standing may have changed (every subscription re-checks).
STANDING: Final = "standing"
# Something a channel's subscribers may hold left its current state without a new event (a moderation
# redaction retiring an artifact's head): {"t": "retired", "channel", "d"}. Syncs holding it resync.
RETIRED: Final = "retired"

# Why an access or standing signal was sent (the `why` field).
WHY_CREATED: Final = "created"
WHY_MEMBERSHIP: Final = "membership"
WHY_VISIBILITY: Final = "visibility"
WHY_DELETED: Final = "deleted"
WHY_BAN: Final = "ban"
WHY_RELAY_MEMBER: Final = "relay-member"  # removed from the community's relay members
WHY_TOKEN_REVOKED: Final = "token-revoked"  # noqa: S105 - a reason, not a secret
WHY_ADMISSION: Final = "admission"  # the community's admission mode (every pubkey)
WHY_COMMUNITY_DELETED: Final = "community-deleted"  # the community and everything in it (every pubkey)
# A token's expiry sends no signal: a subscription of a connection whose token expires re-checks its
# standing at that instant by itself (buzz.ws.req), as it would on a standing signal.

# Seconds an OK waits for its signal to be published; past that it stays queued and is retried.
PUBLISH_WAIT: Final = 1.0


def event_message(event: Event, epoch: int) -> dict[str, Any]:
    return {"t": EVENT, "event": event.to_dict(), "epoch": epoch}


def access_message(channel: uuid.UUID, why: str, *, pubkey: str | None = None) -> dict[str, Any]:
    """`pubkey`: whose membership changed (a membership signal); None when the change concerns every reader."""
    message: dict[str, Any] = {"t": ACCESS, "channel": str(channel), "why": why}
    if pubkey is not None:
        message["pubkey"] = pubkey
    return message


def retired_message(channel: uuid.UUID, d: str) -> dict[str, Any]:
    return {"t": RETIRED, "channel": str(channel), "d": d}


def standing_message(pubkey: str | None, why: str, *, token: int | None = None) -> dict[str, Any]:
    """`pubkey` None: every pubkey of the community."""
    return {"t": STANDING, "pubkey": pubkey, "why": why, "token": token}


def standing_concerns(message: dict[str, Any], *, pubkey: str, token_id: int | None) -> bool:
    """Whether a standing message is about a connection of `pubkey` authenticated by `token_id` (None: NIP-42)."""
    if message.get("pubkey") is None:
        return True  # every pubkey's
    if message.get("pubkey") != pubkey:
        return False
    token = message.get("token")
    return token is None or token == token_id


def channel_topic(community_id: int, channel: uuid.UUID | str) -> str:
    return topic_for_channel(community_id, str(channel))


def pubkey_topic(community_id: int, pubkey: str) -> str:
    """The topic of standing signals about one pubkey (a segment of its own: no channel topic is like it)."""
    return f"{topic_for_community(community_id)}:pubkey:{pubkey}"


def community_standing_topic(community_id: int) -> str:
    """The topic of standing signals about every pubkey of the community."""
    return f"{topic_for_community(community_id)}:standing"


def standing_topics(community_id: int, pubkey: str) -> list[str]:
    """What a subscription of `pubkey` listens on for its reader's standing, beside its channel topics."""
    return [pubkey_topic(community_id, pubkey), community_standing_topic(community_id)]


async def publish_committed(community_id: int, items: Sequence[tuple[uuid.UUID, dict[str, Any]]]) -> None:
    """After commit, before OK: publish each (channel, message), retried until Redis takes it.

    All are queued at once, before any wait (a caller cancelled while it waits, an HTTP client that went
    away, leaves none of them out); then waits up to PUBLISH_WAIT for their confirmation; a slower one
    stays queued and is retried.
    """
    await runtime.publisher().publish_all_confirmed(
        [(channel_topic(community_id, channel), message) for channel, message in items], timeout=PUBLISH_WAIT
    )


def publish_on_commit(community_id: int, channel: uuid.UUID, message: dict[str, Any]) -> None:
    """ORM side: publish `message` on the channel's topic once the current transaction commits."""
    publish_blocking_on_commit(
        settings.REDIS_URL, channel_topic(community_id, channel), message, prefix=settings.BUZZ_REDIS_PREFIX
    )


def publish_standing_on_commit(community_id: int, pubkey: str | None, why: str, *, token: int | None = None) -> None:
    """ORM side: once the current transaction commits, tell every node that `pubkey`'s standing changed (None:
    every pubkey's)."""
    publish_blocking_on_commit(
        settings.REDIS_URL,
        pubkey_topic(community_id, pubkey) if pubkey is not None else community_standing_topic(community_id),
        standing_message(pubkey, why, token=token),
        prefix=settings.BUZZ_REDIS_PREFIX,
    )
