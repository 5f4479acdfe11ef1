"""A reference NIP-AR client: exact sync, incremental reads, set digest, deterministic d, ensure, and a
conformance kit.

Pure Python on websockets and coincurve: it imports nothing from the relay, so it runs
against any NIP-AR relay. `python -m artifacts.client --help` is its command line.
"""

from .connection import AuthFailed, ConnectionLost, Ok, Relay, RelayError, Subscription
from .digest import set_digest
from .ensure import EnsureRejected, EnsureResult, Outcome, ensure
from .events import Event, EventError, Keys
from .filters import CurrentFilter, FilterError, SyncFilter
from .httpapi import HeadUnsupported, HttpError, Page, RelayUrl, nip98_header
from .identity import derive_d
from .incremental import (
    Capability,
    Confirmed,
    Entry,
    FollowRefused,
    FollowUpdate,
    IncrementalProtocolError,
    IncrementalRefused,
    IncrementalUnsupported,
    PassState,
    Pulled,
    Puller,
    PullReport,
    Reconnecting,
    Store,
    StoreMismatch,
    incremental_capability,
)
from .revisions import KIND_ARTIFACT, KIND_REMOVAL, Head, next_revision, revision
from .sync import (
    Backoff,
    Change,
    FetchedSet,
    Restarting,
    Sync,
    SyncClosed,
    Synced,
    SyncRefused,
    SyncSet,
    SyncUnsupported,
    SyncUpdate,
    fetch_set,
    sync_capability,
)

__all__ = [
    "KIND_ARTIFACT",
    "KIND_REMOVAL",
    "AuthFailed",
    "Backoff",
    "Capability",
    "Change",
    "Confirmed",
    "ConnectionLost",
    "CurrentFilter",
    "EnsureRejected",
    "EnsureResult",
    "Entry",
    "Event",
    "EventError",
    "FetchedSet",
    "FilterError",
    "FollowRefused",
    "FollowUpdate",
    "Head",
    "HeadUnsupported",
    "HttpError",
    "IncrementalProtocolError",
    "IncrementalRefused",
    "IncrementalUnsupported",
    "Keys",
    "Ok",
    "Outcome",
    "Page",
    "PassState",
    "PullReport",
    "Pulled",
    "Puller",
    "Reconnecting",
    "Relay",
    "RelayError",
    "RelayUrl",
    "Restarting",
    "Store",
    "StoreMismatch",
    "Subscription",
    "Sync",
    "SyncClosed",
    "SyncFilter",
    "SyncRefused",
    "SyncSet",
    "SyncUnsupported",
    "SyncUpdate",
    "Synced",
    "derive_d",
    "ensure",
    "fetch_set",
    "incremental_capability",
    "next_revision",
    "nip98_header",
    "revision",
    "set_digest",
    "sync_capability",
]
