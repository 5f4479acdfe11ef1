"""Live delivery: the node-level Redis pub/sub hub and the after-commit publisher."""

from .hub import (
    Hub,
    HubUnavailable,
    Listener,
    LossReason,
    Subscription,
    get_hub,
    set_hub,
    topic_for_channel,
    topic_for_community,
)
from .publisher import Publisher, publish_on_commit

__all__ = [
    "Hub",
    "HubUnavailable",
    "Listener",
    "LossReason",
    "Publisher",
    "Subscription",
    "get_hub",
    "publish_on_commit",
    "set_hub",
    "topic_for_channel",
    "topic_for_community",
]
