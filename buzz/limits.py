"""The relay's protocol limits: one frozen value, read from settings, enforced and advertised."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

from django.conf import settings


@dataclass(frozen=True, slots=True)
class Limits:
    max_message_length: int
    max_subscriptions: int
    max_filters: int
    max_limit: int
    default_limit: int
    max_subid_length: int
    max_event_tags: int
    max_content_length: int
    created_at_lower_limit: int
    created_at_upper_limit: int
    auth_window: int
    http_auth_window: int
    outbound_max_messages: int
    outbound_max_bytes: int

    def nip11(self) -> dict[str, object]:
        """The NIP-11 `limitation` object: every limit a client can run into that NIP-11 has a field for (the
        authentication windows and the outbound queue bounds have none; the README lists them)."""
        return {
            "max_message_length": self.max_message_length,
            "max_subscriptions": self.max_subscriptions,
            "max_filters": self.max_filters,
            "max_limit": self.max_limit,
            "default_limit": self.default_limit,
            "max_subid_length": self.max_subid_length,
            "max_event_tags": self.max_event_tags,
            "max_content_length": self.max_content_length,
            "created_at_lower_limit": self.created_at_lower_limit,
            "created_at_upper_limit": self.created_at_upper_limit,
            "auth_required": True,
            "restricted_writes": True,
            "payment_required": False,
            "min_pow_difficulty": 0,
        }

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@lru_cache(maxsize=1)
def limits() -> Limits:
    return Limits(**settings.BUZZ_LIMITS)
