"""NIP-01 events: strict parsing, the canonical serialization, the event id, verification."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from .bip340 import verify_schnorr

# JavaScript's Number.MAX_SAFE_INTEGER: the largest created_at every client can
# represent exactly. It also fits a signed 64-bit database column.
MAX_CREATED_AT: Final = 2**53 - 1
MAX_KIND: Final = 65535

_FIELDS: Final = ("id", "pubkey", "created_at", "kind", "tags", "content", "sig")
_FIELD_SET: Final = frozenset(_FIELDS)
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_HEX128: Final = re.compile(r"[0-9a-f]{128}")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")

# NIP-01 "Events and signatures": UTF-8, no whitespace, and in strings
# \n \" \\ \r \t \b \f escaped as shown, "all other characters must be included
# verbatim". Python's encoder with ensure_ascii=False emits exactly those seven
# two-character escapes and passes everything else through (U+007F, non-ASCII,
# U+2028/2029) except the other C0 controls U+0000..U+001F, which it writes as
# \u00xx with lowercase hex. Raw C0 bytes would not be JSON (RFC 8259 section 7),
# and \u00xx lowercase is what every major implementation emits (serde_json in
# rust-nostr/nostr-sdk, JSON.stringify in nostr-tools); tests/unit pin ids
# against nostr-sdk for all 32 controls.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False, allow_nan=False)


class ProtocolError(ValueError):
    """A rejection with its full client-facing reason, NIP-01 prefix included.

    `reason` is e.g. "invalid: bad event id"; str(error) is the same string, so
    it can go straight into an OK or CLOSED message.
    """

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason

    @property
    def prefix(self) -> str:
        """The machine-readable word before the colon ("invalid", "auth-required", ...)."""
        return self.reason.partition(":")[0]


@dataclass(frozen=True, slots=True)
class Event:
    """A NIP-01 event as received. Build it with parse_event; it says nothing about validity by itself."""

    id: str
    pubkey: str
    created_at: int
    kind: int
    tags: tuple[tuple[str, ...], ...]
    content: str
    sig: str

    def to_dict(self) -> dict[str, Any]:
        """The NIP-01 JSON object, tags as lists."""
        return {
            "id": self.id,
            "pubkey": self.pubkey,
            "created_at": self.created_at,
            "kind": self.kind,
            "tags": [list(tag) for tag in self.tags],
            "content": self.content,
            "sig": self.sig,
        }

    def to_json(self) -> str:
        """The event as compact JSON text (non-ASCII kept as is)."""
        return _ENCODER.encode(self.to_dict())

    def first_tag(self, name: str) -> tuple[str, ...] | None:
        """The first tag whose name (element 0) is `name`."""
        for tag in self.tags:
            if tag[0] == name:
                return tag
        return None

    def tag_values(self, name: str) -> list[str]:
        """Element 1 of every tag named `name` that has one, in order."""
        return [tag[1] for tag in self.tags if len(tag) >= 2 and tag[0] == name]

    def single_tag_value(self, name: str) -> str | None:
        """Element 1 of the one tag named `name` ("" if that tag has no value).

        None when there is no such tag or more than one: for tags a NIP says an
        event carries once (NIP-42 challenge/relay, NIP-98 u/method/payload).
        """
        found = [tag for tag in self.tags if tag[0] == name]
        if len(found) != 1:
            return None
        return found[0][1] if len(found[0]) >= 2 else ""


def utf8_size(text: str) -> int:
    """The bytes `text` takes as UTF-8 (on the wire, or against a byte limit), without encoding an ASCII text."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def has_surrogate(text: str) -> bool:
    # A decoded JSON string may hold a lone surrogate ("\ud800"); it has no
    # UTF-8 form, so the event could never be hashed.
    return not text.isascii() and _SURROGATE.search(text) is not None


def parse_event(obj: object, *, max_tags: int | None = None, max_content_bytes: int | None = None) -> Event:
    """Check the shape of a decoded JSON value and return it as an Event.

    The value must be an object with exactly the seven NIP-01 keys:
    id (64 lowercase hex), pubkey (64 lowercase hex), sig (128 lowercase hex),
    created_at (an int, not a bool or float, in 0..2**53-1), kind (an int in
    0..65535), tags (an array of non-empty arrays of strings; tuples are taken
    too) and content (a string). No string may contain a lone surrogate.
    `max_tags` bounds the number of tags and `max_content_bytes` the UTF-8
    length of content.

    Raises ProtocolError("invalid: ...") naming the first problem found. The id
    and signature are not checked here: see verify_event.
    """
    if not isinstance(obj, dict):
        raise ProtocolError("invalid: event must be a JSON object")
    if obj.keys() != _FIELD_SET:
        for field in _FIELDS:
            if field not in obj:
                raise ProtocolError(f"invalid: event has no {field} field")
        raise ProtocolError("invalid: event has fields other than the seven NIP-01 ones")

    event_id = obj["id"]
    if type(event_id) is not str or not _HEX64.fullmatch(event_id):
        raise ProtocolError("invalid: id must be 64 lowercase hex characters")
    pubkey = obj["pubkey"]
    if type(pubkey) is not str or not _HEX64.fullmatch(pubkey):
        raise ProtocolError("invalid: pubkey must be 64 lowercase hex characters")
    created_at = obj["created_at"]
    if type(created_at) is not int:
        raise ProtocolError("invalid: created_at must be an integer")
    if not 0 <= created_at <= MAX_CREATED_AT:
        raise ProtocolError(f"invalid: created_at must be between 0 and {MAX_CREATED_AT}")
    kind = obj["kind"]
    if type(kind) is not int or not 0 <= kind <= MAX_KIND:
        raise ProtocolError(f"invalid: kind must be an integer between 0 and {MAX_KIND}")

    raw_tags = obj["tags"]
    if not isinstance(raw_tags, (list, tuple)):
        raise ProtocolError("invalid: tags must be an array")
    if max_tags is not None and len(raw_tags) > max_tags:
        raise ProtocolError(f"invalid: too many tags (max {max_tags})")
    tags: list[tuple[str, ...]] = []
    for raw_tag in raw_tags:
        if not isinstance(raw_tag, (list, tuple)):
            raise ProtocolError("invalid: each tag must be an array of strings")
        if not raw_tag:
            raise ProtocolError("invalid: empty tag")
        for item in raw_tag:
            if type(item) is not str:
                raise ProtocolError("invalid: tag elements must be strings")
            if has_surrogate(item):
                raise ProtocolError("invalid: tag contains an unpaired surrogate")
        tags.append(tuple(raw_tag))

    content = obj["content"]
    if type(content) is not str:
        raise ProtocolError("invalid: content must be a string")
    if has_surrogate(content):
        raise ProtocolError("invalid: content contains an unpaired surrogate")
    # n code points are at most 4n UTF-8 bytes: measure only when the limit could be exceeded.
    if (
        max_content_bytes is not None
        and len(content) * 4 > max_content_bytes
        and utf8_size(content) > max_content_bytes
    ):
        raise ProtocolError(f"invalid: content too long (max {max_content_bytes} bytes)")

    sig = obj["sig"]
    if type(sig) is not str or not _HEX128.fullmatch(sig):
        raise ProtocolError("invalid: sig must be 128 lowercase hex characters")

    return Event(event_id, pubkey, created_at, kind, tuple(tags), content, sig)


def _serialize(pubkey: str, created_at: int, kind: int, tags: object, content: str) -> bytes:
    try:
        return _ENCODER.encode([0, pubkey, created_at, kind, tags, content]).encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError("invalid: event contains an unpaired surrogate") from None


def canonical_json(pubkey: str, created_at: int, kind: int, tags: Sequence[Sequence[str]], content: str) -> bytes:
    """The NIP-01 serialization `[0,pubkey,created_at,kind,tags,content]` as UTF-8 bytes.

    Raises ProtocolError if a string holds a lone surrogate (it has no UTF-8 form).
    """
    return _serialize(pubkey, created_at, kind, [list(tag) for tag in tags], content)


def compute_id(pubkey: str, created_at: int, kind: int, tags: Sequence[Sequence[str]], content: str) -> str:
    """The event id: lowercase hex SHA-256 of canonical_json."""
    return hashlib.sha256(canonical_json(pubkey, created_at, kind, tags, content)).hexdigest()


def verify_event(ev: Event) -> None:
    """Check that `ev.id` is the hash of its content and `ev.sig` a BIP-340 signature of it by `ev.pubkey`.

    Raises ProtocolError("invalid: event id does not match its content") or
    ProtocolError("invalid: bad signature"); a pubkey that is not a valid x-only
    key is a bad signature.
    """
    # ev.tags is already a tuple of tuples, which the encoder writes as arrays;
    # no copy on the hot path.
    digest = hashlib.sha256(_serialize(ev.pubkey, ev.created_at, ev.kind, ev.tags, ev.content)).digest()
    if digest.hex() != ev.id:
        raise ProtocolError("invalid: event id does not match its content")
    if not verify_schnorr(ev.pubkey, digest, ev.sig):
        raise ProtocolError("invalid: bad signature")


def parse_and_verify(obj: object, *, max_tags: int | None = None, max_content_bytes: int | None = None) -> Event:
    """parse_event, then verify_event."""
    ev = parse_event(obj, max_tags=max_tags, max_content_bytes=max_content_bytes)
    verify_event(ev)
    return ev
