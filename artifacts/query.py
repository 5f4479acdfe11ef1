"""NIP-AR query filters ({"artifact": "current" | "history" | "head", ...}), parsed strictly. Pure.

Nothing is ignored: an unknown key, an over-limit request or a malformed value is
a QueryError with an `invalid:` reason (HTTP 400). Limits are advertised in NIP-11.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from artifacts.envelope import AUTH_TAG, DEFAULT_LIMITS, KIND_ARTIFACT
from buzz.errors import Refused

MODES: Final = ("current", "history", "head")


@dataclass(frozen=True, slots=True)
class QueryLimits:
    max_predicates: int = 32
    max_values: int = 256
    max_name_bytes: int = DEFAULT_LIMITS.max_tag_name_bytes
    max_value_bytes: int = DEFAULT_LIMITS.max_tag_value_bytes
    max_total_bytes: int = 65536
    default_limit: int = 100
    max_limit: int = 1000
    max_offset: int = 10000

    def nip11(self) -> dict[str, int]:
        return {
            "max_predicates": self.max_predicates,
            "max_values": self.max_values,
            "max_predicate_name_bytes": self.max_name_bytes,
            "max_predicate_value_bytes": self.max_value_bytes,
            "max_predicate_bytes": self.max_total_bytes,
            "default_limit": self.default_limit,
            "max_limit": self.max_limit,
            "max_offset": self.max_offset,
        }


QUERY_LIMITS: Final = QueryLimits()


class QueryError(Refused):
    """A query the relay can't serve; `reason` says why (invalid: for a malformed filter)."""


@dataclass(frozen=True, slots=True)
class ArtifactQuery:
    mode: str
    # (tag name, accepted values): names AND together, values of one name OR.
    predicates: tuple[tuple[str, tuple[str, ...]], ...]
    limit: int
    offset: int
    paged: bool  # a limit or offset was given (sync forbids both)

    def values(self, name: str) -> tuple[str, ...] | None:
        for n, values in self.predicates:
            if n == name:
                return values
        return None

    def channels(self) -> list[uuid.UUID] | None:
        """#h as channel ids (None when absent). Matching is exact: a value that isn't a channel id as
        tags spell it (a lowercase hyphenated UUID) can't name any channel, whatever uuid.UUID would accept."""
        values = self.values("h")
        if values is None:
            return None
        out: list[uuid.UUID] = []
        for v in values:
            try:
                parsed = uuid.UUID(v)
            except ValueError:
                continue
            if str(parsed) == v:
                out.append(parsed)
        return out


def _utf8(value: str, what: str) -> int:
    """The UTF-8 size of a name or value; a NUL or a lone surrogate (JSON may escape either) is refused:
    neither can be a tag value the relay stored, and PostgreSQL text can hold neither."""
    if "\x00" in value:
        raise QueryError(f"invalid: {what} must not contain NUL")
    if value.isascii():
        return len(value)
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise QueryError(f"invalid: {what} must be valid Unicode text (no lone surrogates)") from None


def _int(key: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueryError(f"invalid: {key} must be an integer")
    if not lo <= value <= hi:
        raise QueryError(f"invalid: {key} must be from {lo} to {hi}")
    return value


def parse_query(raw: object, limits: QueryLimits = QUERY_LIMITS) -> ArtifactQuery:
    if not isinstance(raw, dict):
        raise QueryError("invalid: a query filter must be a JSON object")
    mode = raw.get("artifact")
    if mode not in MODES:
        raise QueryError(f"invalid: artifact must be one of {', '.join(MODES)}")
    predicates: list[tuple[str, tuple[str, ...]]] = []
    total_values = 0
    total_bytes = 0
    limit: int | None = None
    offset = 0
    paged = False
    for key, value in raw.items():
        if key == "artifact":
            continue
        if key == "kinds":
            if value != [KIND_ARTIFACT]:
                raise QueryError(f"invalid: kinds must be exactly [{KIND_ARTIFACT}]")
        elif key == "limit":
            limit = _int("limit", value, 1, limits.max_limit)
            paged = True
        elif key == "offset":
            offset = _int("offset", value, 0, limits.max_offset)
            paged = True
        elif isinstance(key, str) and key.startswith("#") and len(key) > 1:
            name = key[1:]
            if name == AUTH_TAG:
                # NIP-OA attestations are not content: they are never indexed, so #auth could never match.
                raise QueryError("invalid: #auth is not a queryable tag")
            name_bytes = _utf8(name, "predicate names")  # first: the reasons below quote the name
            if name_bytes > limits.max_name_bytes:
                raise QueryError(f"invalid: predicate names are at most {limits.max_name_bytes} bytes")
            if not isinstance(value, list) or not value:
                raise QueryError(f"invalid: {key[:64]} must be a non-empty array of strings")
            if not all(isinstance(v, str) for v in value):
                raise QueryError(f"invalid: {key[:64]} must be a non-empty array of strings")
            for v in value:
                size = _utf8(v, "predicate values")
                if size > limits.max_value_bytes:
                    raise QueryError(f"invalid: predicate values are at most {limits.max_value_bytes} bytes")
                total_bytes += size
            total_bytes += name_bytes
            total_values += len(value)
            predicates.append((name, tuple(dict.fromkeys(value))))
        else:
            raise QueryError(f"invalid: unsupported query key {str(key)[:64]!r}")
    if len(predicates) > limits.max_predicates:
        raise QueryError(f"invalid: at most {limits.max_predicates} predicates per query")
    if total_values > limits.max_values:
        raise QueryError(f"invalid: at most {limits.max_values} predicate values per query")
    if total_bytes > limits.max_total_bytes:
        raise QueryError(f"invalid: predicates total at most {limits.max_total_bytes} bytes")
    names = {n for n, _ in predicates}
    if mode == "head":
        if "d" not in names:
            raise QueryError("invalid: the head view needs #d")
        # #h is the explicit scope an unlisted open channel needs (known-ID reads don't bypass it).
        if names - {"d", "h"}:
            raise QueryError("invalid: the head view takes only #d and #h")
        # A head query answers for every artifact it names (NIP-AR: no incomplete result presented as
        # complete): its page is the #d values, and a smaller limit or any offset would cut it.
        named = len(next(v for n, v in predicates if n == "d"))
        if limit is not None and limit < named:
            raise QueryError(f"invalid: the head view returns every named artifact: limit must be at least {named}")
        if offset:
            raise QueryError("invalid: the head view returns every named artifact: it takes no offset")
        limit = named
    query = ArtifactQuery(
        mode=mode,
        predicates=tuple(predicates),
        limit=limits.default_limit if limit is None else limit,
        offset=offset,
        paged=paged,
    )
    if mode == "history" and names - {"d", "h", "type"}:
        extra = sorted(names - {"d", "h", "type"})[0]
        raise QueryError(f"invalid: the history view matches #d, #h and #type only, not #{extra[:64]}")
    return query


def parse_query_body(body: Any, limits: QueryLimits = QUERY_LIMITS) -> ArtifactQuery:
    """POST /query and /count take a JSON array holding one filter (NIP-01 style); nothing else."""
    if not isinstance(body, list) or len(body) != 1:
        raise QueryError("invalid: the body must be a JSON array with exactly one filter")
    return parse_query(body[0], limits)


def parse_sync_filter(raw: object, limits: QueryLimits = QUERY_LIMITS) -> ArtifactQuery:
    """The filter of a NIP-AR sync REQ: the current-state filter, with #h required and no paging.

    It is the current view's filter (same predicates, same limits, `kinds: [45010]` allowed), so the
    sync's scope is what `current` returns to the reader for it. Raises QueryError.
    """
    if isinstance(raw, dict) and raw.get("artifact") in ("history", "head"):
        raise QueryError(f"invalid: the {raw['artifact']} view has no REQ form; use POST /query")
    query = parse_query(raw, limits)
    if query.mode != "current":
        raise QueryError('invalid: a sync filter has "artifact": "current"')
    if query.paged:
        raise QueryError("invalid: a sync takes no limit or offset; it streams the whole set")
    if query.values("h") is None:
        raise QueryError("invalid: a sync filter needs #h with one or more channels")
    return query


def matches(query: ArtifactQuery, tags: Iterable[tuple[str, str]]) -> bool:
    """NIP-AR's match rule on a head's (tag name, first value) pairs (artifacts.envelope.match_tags): every
    predicate name has a tag whose first value is one of the requested values. Names AND, values OR.

    The same rule the current view applies in SQL (artifacts.selectors), for a head in memory.
    """
    have: dict[str, set[str]] = {}
    for name, value in tags:
        have.setdefault(name, set()).add(value)
    return all(not have.get(name, set()).isdisjoint(values) for name, values in query.predicates)
