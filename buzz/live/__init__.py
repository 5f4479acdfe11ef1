"""Live delivery: the node-level Redis pub/sub hub, the after-commit publisher, and the signals (signals.py)."""

from .hub import (
    Hub,
    HubUnavailable,
    Listener,
    LossReason,
    Subscription,
    topic_for_channel,
    topic_for_community,
)
from .publisher import Publisher, publish_blocking_on_commit

__all__ = [
    "Hub",
    "HubUnavailable",
    "Listener",
    "LossReason",
    "Publisher",
    "Subscription",
    "publish_blocking_on_commit",
    "topic_for_channel",
    "topic_for_community",
]
