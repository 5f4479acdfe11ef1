"""The NIP-11 relay information document."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings

from buzz.events.ingest import accepted_kinds
from buzz.identity.communities import CommunityInfo
from buzz.limits import limits

# NIPs this relay implements in full. Later features add theirs when they land.
SUPPORTED_NIPS = [1, 10, 11, 29, 42, 45, 98]


# A section returns its value, or None to leave its key out (a capability this relay doesn't run now).
Section = Callable[[CommunityInfo], Any]
_sections: dict[str, Section] = {}


def register_section(name: str, section: Section) -> None:
    """Apps add their own objects (artifacts registers "artifacts") from AppConfig.ready()."""
    _sections[name] = section


def _quota() -> dict[str, Any]:
    """The write quota (NIP-11 has no field of its own for it): per pubkey, shared by all nodes."""
    q = settings.BUZZ_WRITE_QUOTA
    if q["per_second"] <= 0:
        return {}
    return {"write_rate_limit": {"per_second": q["per_second"], "burst": q["burst"], "per": "pubkey"}}


def relay_document(community: CommunityInfo) -> dict[str, Any]:
    return {
        "name": community.name,
        "description": community.description or f"Buzz artifact relay for {community.name}",
        "pubkey": community.relay_pubkey,
        "supported_nips": SUPPORTED_NIPS,
        "software": settings.BUZZ_SOFTWARE,
        "version": settings.BUZZ_VERSION,
        "limitation": {**limits().nip11(), **_quota()},
        "accepted_kinds": accepted_kinds(),
        **{name: value for name, section in sorted(_sections.items()) if (value := section(community)) is not None},
    }
