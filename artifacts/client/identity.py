"""NIP-AR "Deterministic identity": the standard derivation of d from (home channel, type, key).

    d = UUIDv8(first 16 bytes of SHA-256("nip-ar-artifact\\0" + h + "\\0" + type + "\\0" + key))

The strings are hashed as UTF-8, exactly as given: no Unicode normalisation, no case
folding, so "é" (U+00E9) and "e" + U+0301 name different artifacts.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Final

DOMAIN: Final = b"nip-ar-artifact\0"


def derive_preimage(h: str, type: str, key: str) -> bytes:
    """The bytes that are hashed. h is a UUID and type follows the envelope grammar, so neither
    holds a zero byte and the encoding is unambiguous; key comes last and may hold anything."""
    try:
        return DOMAIN + b"\0".join(part.encode("utf-8") for part in (h, type, key))
    except UnicodeEncodeError:
        raise ValueError("h, type and key must be valid Unicode (no unpaired surrogates)") from None


def derive_d(h: str, type: str, key: str) -> str:
    """The derived d, a lowercase hyphenated UUIDv8 string."""
    raw = bytearray(hashlib.sha256(derive_preimage(h, type, key)).digest()[:16])
    # RFC 9562 section 5.8: version 8 in the high nibble of octet 6, variant 0b10 in octet 8.
    raw[6] = (raw[6] & 0x0F) | 0x80
    raw[8] = (raw[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(raw)))
