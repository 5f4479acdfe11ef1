"""Who a request acts as: the authenticated pubkey in its community and what its credential allows."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from buzz.identity.communities import CommunityInfo


@dataclass(frozen=True, slots=True)
class Actor:
    """Who is writing or reading: the authenticated pubkey and what its credential allows."""

    community: CommunityInfo
    pubkey: str
    # None: NIP-42 login, which holds every scope and every channel.
    scopes: frozenset[str] | None = None
    channels: frozenset[str] | None = None
    # The ApiToken row behind a bearer credential; the policy re-checks it on every decision.
    token_id: int | None = None
    # When that token expires (None: never). Live subscriptions re-check their standing at that instant.
    token_expires_at: dt.datetime | None = None
