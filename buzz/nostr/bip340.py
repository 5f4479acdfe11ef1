"""BIP-340 Schnorr verification over secp256k1, backed by coincurve (libsecp256k1)."""

from __future__ import annotations

import functools
import re
from typing import Final

from coincurve import PublicKeyXOnly

# Either case: this is the raw primitive. Lowercase-only is a NIP-01 wire rule,
# enforced by parse_event, not by the curve.
_HEX64: Final = re.compile(r"[0-9a-fA-F]{64}")
_HEX128: Final = re.compile(r"[0-9a-fA-F]{128}")


@functools.lru_cache(maxsize=8192)
def _xonly_key(pubkey_hex: str) -> PublicKeyXOnly | None:
    # Parsing an x-only key costs a field square root; the same authors post
    # again and again, so a small cache takes that off the per-event path.
    try:
        return PublicKeyXOnly(bytes.fromhex(pubkey_hex))
    except ValueError:
        return None


def parse_xonly_pubkey(pubkey_hex: str) -> PublicKeyXOnly | None:
    """The x-only public key for 64 hex characters, or None if it is not a point on the curve."""
    if not isinstance(pubkey_hex, str) or not _HEX64.fullmatch(pubkey_hex):
        return None
    return _xonly_key(pubkey_hex)


def verify_schnorr(pubkey_hex: str, msg32: bytes, sig_hex: str) -> bool:
    """BIP-340 verification of `sig_hex` over `msg32` by the x-only key `pubkey_hex`.

    Returns False, and never raises, for anything malformed: a key or signature
    of the wrong length or with non-hex characters, a key that is not on the
    curve or not below the field size, a non-bytes message. Nostr always passes
    a 32-byte message (an event id); other lengths are accepted because BIP-340
    defines verification for messages of any length.
    """
    if not isinstance(sig_hex, str) or not _HEX128.fullmatch(sig_hex):
        return False
    if not isinstance(msg32, bytes):
        return False
    key = parse_xonly_pubkey(pubkey_hex)
    if key is None:
        return False
    try:
        return key.verify(bytes.fromhex(sig_hex), msg32)
    except ValueError:
        return False
