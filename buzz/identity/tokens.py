"""API tokens: bearer credentials bound to a pubkey, scopes and optionally channels.

Only a SHA-256 of the token is stored; the token itself is shown once, at creation.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from buzz.access.changes import access_changed
from buzz.access.policy import NOT_ADMITTED, admitted_sql
from buzz.errors import Refused
from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo, check_pubkey
from buzz.live import signals
from buzz.models import ApiToken, Community
from buzz.runtime import runtime

TOKEN_PREFIX = "buzz_"  # noqa: S105 - a prefix, not a secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: str  # shown once, never stored
    row: ApiToken


def token_create(
    *,
    community: Community,
    pubkey: str,
    scopes: Iterable[str],
    channels: Iterable[str] | None = None,
    name: str = "",
    expires_in: dt.timedelta | None = None,
) -> IssuedToken:
    from buzz.access.policy import KNOWN_SCOPES, parse_channel_id

    check_pubkey(pubkey)
    if expires_in is not None and expires_in <= dt.timedelta(0):
        # timedelta(0) is falsy: without this check it would silently become a token that never expires.
        raise ValidationError("a token's lifetime must be positive")
    scope_list = sorted(set(scopes))
    if not scope_list:
        raise ValidationError("a token needs at least one scope")
    unknown = [s for s in scope_list if s not in KNOWN_SCOPES]
    if unknown:
        raise ValidationError(f"unknown scope {unknown[0]!r}; known: {', '.join(sorted(KNOWN_SCOPES))}")
    channel_list: list[str] | None = None
    if channels is not None:
        channel_list = []
        for c in channels:
            if parse_channel_id(c) is None:
                raise ValidationError(f"invalid channel id {c!r}: expected a lowercase UUID")
            channel_list.append(c)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(
        community=community,
        pubkey=pubkey,
        name=name,
        token_hash=hash_token(token),
        prefix=token[:12],
        scopes=scope_list,
        channels=channel_list,
        expires_at=timezone.now() + expires_in if expires_in else None,
    )
    return IssuedToken(token=token, row=row)


def token_revoke(*, token_id: int) -> ApiToken:
    """Revoke a token. Live subscriptions of connections authenticated by it end on every node, after commit."""
    with transaction.atomic():
        row = ApiToken.objects.select_for_update().get(pk=token_id)
        if row.revoked_at is None:
            row.revoked_at = timezone.now()
            row.save(update_fields=["revoked_at"])
            signals.publish_standing_on_commit(row.community_id, row.pubkey, signals.WHY_TOKEN_REVOKED, token=row.pk)
            access_changed(row.community_id)
    return row


# The token and its holder's admission in one round trip: a members-only community admits relay members only.
BEARER_LOOKUP = f"""
SELECT k.id, k.pubkey, k.scopes, k.channels, k.expires_at, {admitted_sql("k.community_id", "k.pubkey")}
FROM buzz_apitoken k
WHERE k.token_hash = %(hash)s AND k.community_id = %(community)s AND k.revoked_at IS NULL
  AND (k.expires_at IS NULL OR k.expires_at > now())
"""  # noqa: S608 - composed from code, values are placeholders
# The columns of a row of BEARER_LOOKUP (`bearer_actor` reads them), for a statement that embeds it.
BEARER_LOOKUP_COLUMNS = 6


def bearer_credential(header: str | None) -> str | None:
    """The credential of an `Authorization: Bearer <credential>` header (the scheme in any case: RFC 9110
    section 11.1), or None for another scheme or none."""
    scheme, _, credential = (header or "").strip().partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else None


def bearer_lookup(community: CommunityInfo, header: str | None) -> dict[str, Any] | None:
    """The parameters of `BEARER_LOOKUP` for `Authorization: Bearer <token>`, or None for a header that
    carries no token of ours (no statement needed: authentication fails)."""
    token = bearer_credential(header)
    if token is None or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    return {
        "hash": hash_token(token),
        "community": community.id,
    }


class HolderNotAdmitted(Refused):
    """A live token whose holder the community does not admit (a relay member removed since it was issued):
    refused as NIP-42 and NIP-98 refuse that pubkey, not as an unknown token."""

    def __init__(self) -> None:
        super().__init__(NOT_ADMITTED)


def bearer_actor(community: CommunityInfo, row: Sequence[Any] | None) -> Actor | None:
    """The actor behind a row of `BEARER_LOOKUP`, or None for no such live token. Raises HolderNotAdmitted."""
    if row is None:
        return None
    token_id, pubkey, scopes, channels, expires_at, admitted_now = row
    # A token never admits more than NIP-42 would: members-only communities need a relay member.
    if not admitted_now:
        raise HolderNotAdmitted()
    return Actor(
        community=community,
        pubkey=pubkey,
        scopes=frozenset(scopes),
        channels=frozenset(str(uuid.UUID(c)) for c in channels) if channels is not None else None,
        token_id=token_id,
        token_expires_at=expires_at,
    )


async def authenticate_bearer(community: CommunityInfo, header: str | None) -> Actor | None:
    """The actor behind `Authorization: Bearer <token>`, or None when the token is unknown, revoked or expired;
    HolderNotAdmitted when its holder is not admitted.
    (A caller that has a connection of its own can send `BEARER_LOOKUP` with its first statements instead.)"""
    params = bearer_lookup(community, header)
    if params is None:
        return None
    pool = await runtime.pool()
    async with pool.connection() as conn:
        row = await (await conn.execute(BEARER_LOOKUP, params)).fetchone()
    return bearer_actor(community, row)
