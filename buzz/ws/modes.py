"""REQ modes that apps register: a REQ whose filter carries the mode's key is served by the app.

NIP-AR sync is one: artifacts registers the key "artifact", so
`["REQ", sub, {"artifact": "current", "#h": [...]}]` reaches its factory with the raw
filters, and the core never imports the app. The factory validates the filters and
builds the subscription, or replies CLOSED itself and returns None.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from buzz.ws.host import Subscription, SubscriptionHost

ReqModeFactory = Callable[[SubscriptionHost, str, tuple[dict[str, Any], ...]], Awaitable[Subscription | None]]

_modes: dict[str, ReqModeFactory] = {}


def register_req_mode(key: str, factory: ReqModeFactory) -> None:
    """Called from AppConfig.ready(); `key` is the filter key that selects the mode."""
    if not key or key.startswith("#") or key in ("ids", "authors", "kinds", "since", "until", "limit"):
        raise ValueError(f"{key!r} can't name a REQ mode")
    if key in _modes and _modes[key] is not factory:
        raise RuntimeError(f"REQ mode {key!r} is registered already")
    _modes[key] = factory


def req_mode_keys() -> frozenset[str]:
    return frozenset(_modes)


def req_mode(key: str) -> ReqModeFactory:
    return _modes[key]
