"""The NIP-11 relay information document."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from buzz.communities import CommunityInfo
from buzz.ingest import accepted_kinds
from buzz.limits import limits

# NIPs this relay implements in full. Later features add theirs when they land.
SUPPORTED_NIPS = [1, 11, 42, 45, 98]


def relay_document(community: CommunityInfo) -> dict[str, Any]:
    return {
        "name": community.name,
        "description": community.description or f"Buzz artifact relay for {community.name}",
        "pubkey": community.relay_pubkey,
        "supported_nips": SUPPORTED_NIPS,
        "software": settings.BUZZ_SOFTWARE,
        "version": settings.BUZZ_VERSION,
        "limitation": limits().nip11(),
        "accepted_kinds": accepted_kinds(),
    }
