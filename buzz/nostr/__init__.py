"""Pure Nostr protocol code: NIP-01 events, BIP-340 keys, NIP-42, NIP-98, NIP-OA.

Nothing here imports Django or the rest of buzz.
"""

from .bip340 import verify_schnorr
from .event import (
    MAX_CREATED_AT,
    Event,
    ProtocolError,
    canonical_json,
    compute_id,
    parse_and_verify,
    parse_event,
    utf8_size,
    verify_event,
)
from .keys import Signer
from .nip42 import AUTH_EVENT_KIND, verify_auth_event
from .nip98 import HTTP_AUTH_KIND, HttpAuth, verify_http_auth
from .nipoa import (
    OwnerAttestation,
    attestation_digest,
    make_auth_tag,
    parse_conditions,
    verify_owner_attestation,
)
from .url import normalize_url

__all__ = [
    "AUTH_EVENT_KIND",
    "HTTP_AUTH_KIND",
    "MAX_CREATED_AT",
    "Event",
    "HttpAuth",
    "OwnerAttestation",
    "ProtocolError",
    "Signer",
    "attestation_digest",
    "canonical_json",
    "compute_id",
    "make_auth_tag",
    "normalize_url",
    "parse_and_verify",
    "parse_conditions",
    "parse_event",
    "utf8_size",
    "verify_auth_event",
    "verify_event",
    "verify_http_auth",
    "verify_owner_attestation",
    "verify_schnorr",
]
