"""URL comparison for NIP-42 relay tags and NIP-98 u tags."""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

_DEFAULT_PORTS: Final = {"http": 80, "ws": 80, "https": 443, "wss": 443}
# urlsplit silently deletes tabs and newlines anywhere in a URL; a signed URL
# with those in it must not compare equal to one without.
_CONTROL_OR_SPACE: Final = re.compile(r"[\x00-\x20\x7f]")


def normalize_url(url: str, *, ignore_trailing_slash: bool) -> str | None:
    """A comparison key for an absolute URL, or None if it is not one we can compare.

    Only equivalences of RFC 3986 section 6.2.3 that no server can tell apart
    are applied:
    - scheme and host are lowercased;
    - the scheme's default port is dropped (80 for http/ws, 443 for https/wss);
    - an empty path is "/".
    Path, query and fragment are otherwise kept byte for byte: no
    percent-decoding, no dot-segment removal, no query reordering.
    With `ignore_trailing_slash`, trailing "/" characters of the path are
    dropped as well ("wss://r.example/" matches "wss://r.example").

    None (never equal to anything) for: a non-string, whitespace or control
    characters anywhere, no scheme or no host, userinfo ("user@host"), or an
    unparsable port.
    """
    if not isinstance(url, str) or _CONTROL_OR_SPACE.search(url):
        return None
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if not scheme or not host or "@" in parts.netloc:
        return None
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        netloc = f"{netloc}:{port}"
    path = parts.path.rstrip("/") if ignore_trailing_slash else parts.path or "/"
    key = f"{scheme}://{netloc}{path}"
    if parts.query:
        key = f"{key}?{parts.query}"
    if parts.fragment:
        key = f"{key}#{parts.fragment}"
    return key
