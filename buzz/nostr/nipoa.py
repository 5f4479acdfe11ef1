"""NIP-OA: an owner key's attestation ("auth" tag) that it authorized an agent key.

Spec: block/buzz docs/nips/NIP-OA.md. A valid tag is evidence only: the event
stays authored by event.pubkey.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

from .bip340 import parse_xonly_pubkey, verify_schnorr
from .event import Event, ProtocolError, verify_event
from .keys import Signer

AUTH_TAG: Final = "auth"
_DOMAIN: Final = b"nostr:agent-auth:"
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_HEX128: Final = re.compile(r"[0-9a-f]{128}")
# One clause: a name+operator spelled exactly, then canonical base-10 (no
# leading zero except "0"). [0-9], not \d, which also matches non-ASCII digits.
_CLAUSE: Final = re.compile(r"(kind=|created_at<|created_at>)(0|[1-9][0-9]*)")
_MAX_VALUE: Final = {"kind=": 65535, "created_at<": 4294967295, "created_at>": 4294967295}


@dataclass(frozen=True, slots=True)
class OwnerAttestation:
    """A verified auth tag: `owner` authorized the event's pubkey under `conditions`."""

    owner: str
    conditions: str


def parse_conditions(conditions: str) -> list[tuple[str, int]]:
    """The clauses of a conditions string as (operator, value) pairs, in order.

    "" has no clauses. Raises ProtocolError("invalid: ...") for anything the
    grammar refuses: empty clauses (leading, trailing or doubled "&"), unknown
    or differently cased names, whitespace, non-canonical or out-of-range numbers.
    """
    if conditions == "":
        return []
    clauses: list[tuple[str, int]] = []
    for clause in conditions.split("&"):
        match = _CLAUSE.fullmatch(clause)
        if match is None:
            raise ProtocolError("invalid: auth tag conditions are malformed")
        operator, digits = match.groups()
        value = int(digits)
        if value > _MAX_VALUE[operator]:
            raise ProtocolError(f"invalid: auth tag condition {operator} value out of range")
        clauses.append((operator, value))
    return clauses


def attestation_digest(agent_pubkey: str, conditions: str) -> bytes:
    """The 32-byte message the owner signs: SHA256("nostr:agent-auth:" || agent pubkey || ":" || conditions)."""
    preimage = _DOMAIN + agent_pubkey.encode("utf-8") + b":" + conditions.encode("utf-8")
    return hashlib.sha256(preimage).digest()


def make_auth_tag(
    owner: Signer, agent_pubkey: str, conditions: str, *, aux: bytes | None = None
) -> tuple[str, str, str, str]:
    """The auth tag by which `owner` authorizes `agent_pubkey` under `conditions`."""
    parse_conditions(conditions)
    if agent_pubkey == owner.pubkey:
        raise ProtocolError("invalid: auth tag owner must not be the event pubkey")
    sig = owner.sign_digest(attestation_digest(agent_pubkey, conditions), aux)
    return (AUTH_TAG, owner.pubkey, conditions, sig)


def _satisfied(ev: Event, operator: str, value: int) -> bool:
    if operator == "kind=":
        return ev.kind == value
    if operator == "created_at<":
        return ev.created_at < value
    return ev.created_at > value


def verify_owner_attestation(ev: Event) -> OwnerAttestation | None:
    """The event's verified owner attestation, or None if it has no auth tag.

    Raises ProtocolError("invalid: ...") for more than one auth tag, a tag that
    is not ["auth", owner-hex, conditions, sig-hex], malformed conditions, an
    owner equal to the event pubkey, an invalid event id or signature (checked
    here again: an attestation on an unauthenticated event proves nothing), an
    owner signature that does not verify, or a condition the event does not
    satisfy. Conditions are judged against the event's own kind and created_at,
    never the local clock (NIP-OA, Security Properties).
    """
    found = [tag for tag in ev.tags if tag[0] == AUTH_TAG]
    if not found:
        return None
    if len(found) > 1:
        raise ProtocolError("invalid: event has more than one auth tag")
    tag = found[0]
    if len(tag) != 4:
        raise ProtocolError("invalid: auth tag must have exactly 4 elements")
    _, owner, conditions, sig = tag
    if not _HEX64.fullmatch(owner):
        raise ProtocolError("invalid: auth tag owner must be 64 lowercase hex characters")
    if not _HEX128.fullmatch(sig):
        raise ProtocolError("invalid: auth tag signature must be 128 lowercase hex characters")
    if owner == ev.pubkey:
        raise ProtocolError("invalid: auth tag owner must not be the event pubkey")
    if parse_xonly_pubkey(owner) is None:
        raise ProtocolError("invalid: auth tag owner is not a valid public key")
    clauses = parse_conditions(conditions)

    verify_event(ev)
    # The exact conditions string from the tag is hashed: never re-serialized
    # from the parsed clauses (NIP-OA: no reordering or normalization).
    if not verify_schnorr(owner, attestation_digest(ev.pubkey, conditions), sig):
        raise ProtocolError("invalid: auth tag signature does not verify")
    for operator, value in clauses:
        if not _satisfied(ev, operator, value):
            raise ProtocolError(f"invalid: event does not satisfy auth condition {operator}{value}")
    return OwnerAttestation(owner=owner, conditions=conditions)
