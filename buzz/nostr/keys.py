"""Secret keys: BIP-340 signing of digests and of NIP-01 events."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from coincurve import PrivateKey

from .bip340 import verify_schnorr
from .event import Event, compute_id, parse_event

__all__ = ["Signer", "verify_schnorr"]

_HEX64: Final = re.compile(r"[0-9a-fA-F]{64}")


class Signer:
    """A secp256k1 secret key that signs BIP-340 digests and Nostr events.

    The secret is never part of repr().
    """

    __slots__ = ("_key", "_pubkey")

    def __init__(self, secret_hex: str) -> None:
        if not isinstance(secret_hex, str) or not _HEX64.fullmatch(secret_hex):
            raise ValueError("secret key must be 64 hex characters")
        try:
            self._key = PrivateKey(bytes.fromhex(secret_hex))
        except ValueError:
            raise ValueError("secret key is zero or not below the curve order") from None
        self._pubkey = self._key.public_key_xonly.format().hex()

    @classmethod
    def generate(cls) -> Signer:
        """A fresh key from the operating system's CSPRNG."""
        return cls(PrivateKey().secret.hex())

    @property
    def pubkey(self) -> str:
        """The x-only public key, 64 lowercase hex characters."""
        return self._pubkey

    @property
    def secret_hex(self) -> str:
        """The secret key, 64 lowercase hex characters."""
        return self._key.secret.hex()

    def __repr__(self) -> str:
        return f"Signer(pubkey={self._pubkey!r})"

    def sign_digest(self, msg32: bytes, aux: bytes | None = None) -> str:
        """The BIP-340 signature (128 hex characters) of a 32-byte message.

        `aux` is BIP-340's 32 bytes of auxiliary randomness; None draws fresh
        bytes from os.urandom. A fixed `aux` makes the signature deterministic
        (test vectors).
        """
        if len(msg32) != 32:
            raise ValueError("message must be 32 bytes")
        if aux is None:
            aux = os.urandom(32)
        elif len(aux) != 32:
            raise ValueError("aux must be 32 bytes")
        return self._key.sign_schnorr(msg32, aux).hex()

    def sign_event(
        self,
        *,
        kind: int,
        tags: Sequence[Sequence[str]],
        content: str,
        created_at: int | None = None,
    ) -> Event:
        """A signed event by this key; `created_at` defaults to now.

        Raises ProtocolError if the fields would not make a valid NIP-01 event
        (kind out of range, a tag that is empty or not all strings, ...).
        """
        if created_at is None:
            created_at = int(time.time())
        # Same rules as for received events, checked before hashing; the id and
        # sig are placeholders until they are known.
        draft = parse_event(
            {
                "id": "0" * 64,
                "pubkey": self._pubkey,
                "created_at": created_at,
                "kind": kind,
                "tags": [list(tag) for tag in tags],
                "content": content,
                "sig": "0" * 128,
            }
        )
        event_id = compute_id(draft.pubkey, draft.created_at, draft.kind, draft.tags, draft.content)
        return replace(draft, id=event_id, sig=self.sign_digest(bytes.fromhex(event_id)))
