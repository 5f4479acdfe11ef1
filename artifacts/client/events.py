"""NIP-01 events for the client: canonical serialisation, ids, BIP-340 signatures (coincurve).

The client carries its own copy of these few rules so that it runs against any relay
with only websockets and coincurve installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from coincurve import PrivateKey, PublicKeyXOnly

_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_HEX128: Final = re.compile(r"[0-9a-f]{128}")
_SECRET: Final = re.compile(r"[0-9a-fA-F]{64}")

# NIP-01 "Events and signatures": compact UTF-8 JSON where only \n \" \\ \r \t \b \f get
# two-character escapes and every other character is written as itself. json.dumps with
# ensure_ascii=False does exactly that, and writes the remaining C0 controls as \u00xx,
# the form the common implementations agree on.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class EventError(ValueError):
    """A message that is not a well-formed NIP-01 event, or whose id or signature is wrong."""


def canonical(pubkey: str, created_at: int, kind: int, tags: Sequence[Sequence[str]], content: str) -> bytes:
    """The bytes an event id hashes: `[0,pubkey,created_at,kind,tags,content]`."""
    try:
        return _ENCODER.encode([0, pubkey, created_at, kind, [list(t) for t in tags], content]).encode("utf-8")
    except UnicodeEncodeError:
        raise EventError("event contains an unpaired surrogate") from None


def event_id(pubkey: str, created_at: int, kind: int, tags: Sequence[Sequence[str]], content: str) -> str:
    return hashlib.sha256(canonical(pubkey, created_at, kind, tags, content)).hexdigest()


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    pubkey: str
    created_at: int
    kind: int
    tags: tuple[tuple[str, ...], ...]
    content: str
    sig: str

    @classmethod
    def from_dict(cls, raw: object) -> Event:
        """Parse a received event. Checks its shape only; verify() checks id and signature."""
        if not isinstance(raw, Mapping):
            raise EventError("an event must be a JSON object")
        try:
            eid, pubkey, created_at = raw["id"], raw["pubkey"], raw["created_at"]
            kind, tags, content, sig = raw["kind"], raw["tags"], raw["content"], raw["sig"]
        except KeyError as missing:
            raise EventError(f"event has no {missing.args[0]!r} field") from None
        if not (isinstance(eid, str) and _HEX64.fullmatch(eid)):
            raise EventError("event id must be 64 lowercase hex characters")
        if not (isinstance(pubkey, str) and _HEX64.fullmatch(pubkey)):
            raise EventError("event pubkey must be 64 lowercase hex characters")
        if not (isinstance(sig, str) and _HEX128.fullmatch(sig)):
            raise EventError("event sig must be 128 lowercase hex characters")
        for name, value in (("created_at", created_at), ("kind", kind)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EventError(f"event {name} must be a non-negative integer")
        if not isinstance(content, str):
            raise EventError("event content must be a string")
        if not isinstance(tags, list) or not all(
            isinstance(t, list) and t and all(isinstance(v, str) for v in t) for t in tags
        ):
            raise EventError("event tags must be non-empty arrays of strings")
        return cls(eid, pubkey, created_at, kind, tuple(tuple(t) for t in tags), content, sig)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pubkey": self.pubkey,
            "created_at": self.created_at,
            "kind": self.kind,
            "tags": [list(t) for t in self.tags],
            "content": self.content,
            "sig": self.sig,
        }

    def verify(self) -> None:
        """Raise EventError unless the id hashes the content and sig is the pubkey's BIP-340 signature of it."""
        digest = hashlib.sha256(canonical(self.pubkey, self.created_at, self.kind, self.tags, self.content))
        if digest.hexdigest() != self.id:
            raise EventError("event id does not match its content")
        try:
            ok = PublicKeyXOnly(bytes.fromhex(self.pubkey)).verify(bytes.fromhex(self.sig), digest.digest())
        except ValueError:
            ok = False
        if not ok:
            raise EventError("bad event signature")

    def first(self, name: str) -> str | None:
        """The first value of the first tag called `name`."""
        for tag in self.tags:
            if tag[0] == name and len(tag) >= 2:
                return tag[1]
        return None


class Keys:
    """A secp256k1 secret key. The secret never appears in repr() and is read from files only."""

    __slots__ = ("_key", "pubkey")

    def __init__(self, secret_hex: str) -> None:
        if not _SECRET.fullmatch(secret_hex):
            raise ValueError("a secret key is 64 hex characters")
        try:
            self._key = PrivateKey(bytes.fromhex(secret_hex))
        except ValueError:
            raise ValueError("the secret key is zero or not below the curve order") from None
        self.pubkey: str = self._key.public_key_xonly.format().hex()

    @classmethod
    def generate(cls) -> Keys:
        return cls(PrivateKey().secret.hex())

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keys:
        """A key file holds one hex secret key (surrounding whitespace ignored)."""
        try:
            text = Path(path).read_text(encoding="ascii").strip()
        except FileNotFoundError:
            raise ValueError(f"key file {os.fspath(path)} does not exist") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"key file {os.fspath(path)} is unreadable ({err.__class__.__name__})") from None
        try:
            return cls(text)
        except ValueError as err:
            raise ValueError(f"key file {os.fspath(path)}: {err}") from None

    @property
    def secret_hex(self) -> str:
        return self._key.secret.hex()

    def __repr__(self) -> str:
        return f"Keys(pubkey={self.pubkey!r})"

    def sign(
        self, kind: int, tags: Sequence[Sequence[str]], content: str = "", *, created_at: int | None = None
    ) -> Event:
        when = int(time.time()) if created_at is None else created_at
        frozen = tuple(tuple(t) for t in tags)
        eid = event_id(self.pubkey, when, kind, frozen, content)
        sig = self._key.sign_schnorr(bytes.fromhex(eid), os.urandom(32)).hex()
        return Event(eid, self.pubkey, when, kind, frozen, content, sig)
