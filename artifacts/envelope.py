"""The NIP-AR envelope of a kind-45010 event, validated strictly. Pure: no Django, no I/O.

Every rejection is a ProtocolError whose reason starts with `invalid:` and names
the rule broken. Client-defined tags are kept as they are; they can never take
an envelope tag's place (each envelope tag occurs exactly once) and never
grant access (access comes from the stored channel only).
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from dataclasses import dataclass
from typing import Final

from buzz.nostr import Event, ProtocolError, utf8_size

KIND_ARTIFACT: Final = 45010
KIND_REMOVAL: Final = 45011
ENVELOPE_VERSION: Final = "1"

OPS: Final = frozenset({"create", "update", "move", "delete", "restore"})
ENVELOPE_TAGS: Final = ("ar", "d", "h", "type", "title", "op", "root", "prev")
REQUIRED_TAGS: Final = ("ar", "d", "h", "type", "op")
AUTH_TAG: Final = "auth"  # NIP-OA owner attestation, verified by buzz.nostr


@dataclass(frozen=True, slots=True)
class EnvelopeLimits:
    """Advertised in NIP-11 under `artifacts` and enforced here."""

    max_tags: int = 256
    max_tag_name_bytes: int = 128
    max_tag_value_bytes: int = 4096
    max_total_tag_bytes: int = 65536
    max_title_bytes: int = 512
    max_type_bytes: int = 128

    def nip11(self) -> dict[str, int]:
        return {
            "max_tags": self.max_tags,
            "max_tag_name_bytes": self.max_tag_name_bytes,
            "max_tag_value_bytes": self.max_tag_value_bytes,
            "max_total_tag_bytes": self.max_total_tag_bytes,
            "max_title_bytes": self.max_title_bytes,
            "max_type_bytes": self.max_type_bytes,
        }


DEFAULT_LIMITS: Final = EnvelopeLimits()

_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# Dot-separated components, each a lowercase ASCII letter then letters, digits, _ or -.
_TYPE: Final = re.compile(r"[a-z][a-z0-9_-]*(?:\.[a-z][a-z0-9_-]*)*")


@dataclass(frozen=True, slots=True)
class Envelope:
    d: uuid.UUID
    h: uuid.UUID
    type: str
    op: str
    title: str | None
    root: str | None
    prev: str | None

    @property
    def is_create(self) -> bool:
        return self.op == "create"


def _bad(reason: str) -> ProtocolError:
    return ProtocolError(f"invalid: {reason}")


def parse_uuid(value: str, name: str) -> uuid.UUID:
    if not _UUID.fullmatch(value):
        raise _bad(f"{name} must be a lowercase hyphenated UUID")
    parsed = uuid.UUID(value)
    if parsed.int == 0:
        raise _bad(f"{name} must not be the nil UUID")
    return parsed


# Characters that show nothing, beside whitespace and format or control characters: the Braille blank, and
# Unicode's default-ignorable code points that are neither (Default_Ignorable_Code_Point in the Unicode
# Character Database's DerivedCoreProperties.txt): the Hangul fillers, which render as an empty cell, the
# combining grapheme joiner, the Khmer inherent vowels, the Mongolian and standard variation selectors, the
# reserved code points among them, and the variation selectors supplement. Inclusive ranges.
_INVISIBLE: Final = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2065, 0x2065),
    (0x2800, 0x2800),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0xE0000, 0xE0FFF),
)


def _shows_nothing(ch: str) -> bool:
    """Whitespace, a format or control character (zero-width space, direction marks, word joiner, BOM...),
    or another character that renders nothing (`_INVISIBLE`: fillers, variation selectors...)."""
    if ch.isspace() or unicodedata.category(ch) in ("Cf", "Cc"):
        return True
    code = ord(ch)
    return any(low <= code <= high for low, high in _INVISIBLE)


def _blank(title: str) -> bool:
    """A title a reader would see as blank: nothing in it shows (NIP-AR: a nonblank display title)."""
    return all(_shows_nothing(ch) for ch in title)


def check_tag_limits(event: Event, limits: EnvelopeLimits = DEFAULT_LIMITS) -> None:
    if len(event.tags) > limits.max_tags:
        raise _bad(f"an artifact carries at most {limits.max_tags} tags")
    total = 0
    for tag in event.tags:
        name_bytes = utf8_size(tag[0])
        if name_bytes > limits.max_tag_name_bytes:
            raise _bad(f"tag names are at most {limits.max_tag_name_bytes} bytes")
        total += name_bytes
        for value in tag[1:]:
            value_bytes = utf8_size(value)
            if value_bytes > limits.max_tag_value_bytes:
                raise _bad(f"tag values are at most {limits.max_tag_value_bytes} bytes")
            total += value_bytes
    if total > limits.max_total_tag_bytes:
        raise _bad(f"an artifact's tags total at most {limits.max_total_tag_bytes} bytes")


def parse_envelope(event: Event, limits: EnvelopeLimits = DEFAULT_LIMITS) -> Envelope:
    """The envelope of a kind-45010 event. Raises ProtocolError('invalid: ...')."""
    if event.kind != KIND_ARTIFACT:
        raise _bad(f"an artifact revision is kind {KIND_ARTIFACT}")
    check_tag_limits(event, limits)
    # The version first: an envelope of another version may be shaped otherwise (other tags, other
    # arities), and its author is told what is wrong with it, not which of today's rules it breaks. (Two
    # version tags are no version: that is answered below, as any envelope tag that occurs twice.)
    versions = [tag for tag in event.tags if tag[0] == "ar"]
    if len(versions) == 1 and len(versions[0]) >= 2 and versions[0][1] != ENVELOPE_VERSION:
        raise _bad(f"unsupported envelope version {versions[0][1][:16]!r} (this relay supports ar=1)")
    found: dict[str, str] = {}
    for tag in event.tags:
        name = tag[0]
        if name not in ENVELOPE_TAGS:
            continue
        if name in found:
            raise _bad(f"envelope tag {name} occurs more than once")
        if len(tag) != 2:
            raise _bad(f"envelope tag {name} must have exactly two elements")
        found[name] = tag[1]
    for name in REQUIRED_TAGS:
        if name not in found:
            raise _bad(f"missing envelope tag {name}")
    d = parse_uuid(found["d"], "d")
    h = parse_uuid(found["h"], "h")
    type_name = found["type"]
    if utf8_size(type_name) > limits.max_type_bytes:
        raise _bad(f"type is at most {limits.max_type_bytes} bytes")
    if not _TYPE.fullmatch(type_name):
        raise _bad("type must be dot-separated lowercase components, each starting with a letter")
    op = found["op"]
    if op not in OPS:
        raise _bad("op must be create, update, move, delete or restore")
    title = found.get("title")
    if op == "delete":
        if title is not None:
            raise _bad("a delete carries no title")
    else:
        if title is None:
            raise _bad("missing envelope tag title")
        if _blank(title):
            raise _bad("title must not be blank")
        if utf8_size(title) > limits.max_title_bytes:
            raise _bad(f"title is at most {limits.max_title_bytes} bytes")
    root = found.get("root")
    if root is not None and not _HEX64.fullmatch(root):
        raise _bad("root must be an event id: 64 lowercase hex characters")
    prev = found.get("prev")
    if prev is not None and not _HEX64.fullmatch(prev):
        raise _bad("prev must be an event id: 64 lowercase hex characters")
    if op == "create" and prev is not None:
        raise _bad("a create has no prev")
    if op != "create" and prev is None:
        raise _bad(f"{op} needs prev, the current revision's id")
    if op == "delete":
        if event.content != "":
            raise _bad("a delete has empty content")
        extra = [t[0] for t in event.tags if t[0] not in ENVELOPE_TAGS and t[0] != AUTH_TAG]
        if extra:
            raise _bad(f"a delete carries only envelope tags and auth tags, not {extra[0][:32]!r}")
    return Envelope(d=d, h=h, type=type_name, op=op, title=title, root=root, prev=prev)


def match_tags(event: Event) -> list[tuple[str, str]]:
    """(name, first value) of every tag, envelope tags included: what current-state predicates match."""
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for tag in event.tags:
        if tag[0] == AUTH_TAG or len(tag) < 2:
            continue
        key = (tag[0], tag[1])
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out
