"""The relay's HTTP side: NIP-11 and NIP-98-signed POST /query (the current, history and head views).

The HTTP address is derived from the relay URL: ws -> http, wss -> https, same host and
port, paths at the root (GET / for NIP-11, POST /query for the views).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import json
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from .events import Event, EventError, Keys

HTTP_AUTH_KIND: Final = 27235
DEFAULT_TIMEOUT: Final = 15.0
MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024


class RelayUrlError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class RelayUrl:
    """A relay's WebSocket URL and the HTTP base derived from it."""

    ws: str
    http: str

    @classmethod
    def parse(cls, url: str) -> RelayUrl:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise RelayUrlError(f"relay URL {url!r} is not a URL") from None
        if parts.scheme not in ("ws", "wss"):
            raise RelayUrlError(f"relay URL {url!r} must start with ws:// or wss://")
        if not parts.hostname or "@" in parts.netloc:
            raise RelayUrlError(f"relay URL {url!r} needs a host (and no user name)")
        if parts.query or parts.fragment or port == 0:
            raise RelayUrlError(f"relay URL {url!r} must have a port above 0 and no query or fragment")
        scheme = "https" if parts.scheme == "wss" else "http"
        return cls(ws=url, http=f"{scheme}://{parts.netloc}")


class HttpError(Exception):
    """A refused or failed request: `status` (0 when no answer came) and the relay's reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}" if status else reason)
        self.status = status
        self.reason = reason


def nip98_header(keys: Keys, url: str, method: str, body: bytes) -> str:
    """`Nostr <base64 kind 27235>` for one request: its exact URL, method and body hash.

    A random nonce tag keeps two identical requests within one second apart: relays accept
    each authorization event once.
    """
    tags = [["u", url], ["method", method], ["payload", hashlib.sha256(body).hexdigest()]]
    tags.append(["nonce", secrets.token_hex(8)])
    event = keys.sign(HTTP_AUTH_KIND, tags, "")
    return "Nostr " + base64.b64encode(json.dumps(event.to_dict(), separators=(",", ":")).encode()).decode()


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: bytes
    headers: dict[str, str]  # names lowercased


def _answer(url: str, status: int, resp: Any) -> _Answer:
    """The answer, read whole: a body cut short (the connection closed before the Content-Length it announced,
    or a chunked body that ended early) is no answer (HttpError 0, retried as an unreachable relay), never a
    short body to parse."""
    headers = {k.lower(): v for k, v in resp.headers.items()}
    body = resp.read(MAX_RESPONSE_BYTES + 1)
    announced = headers.get("content-length", "")
    if announced.isdigit() and len(body) < min(int(announced), MAX_RESPONSE_BYTES + 1):
        raise HttpError(0, f"error: the connection to {url} closed before the whole answer came")
    return _Answer(status, body, headers)


def _request(req: urllib.request.Request, timeout: float) -> _Answer:
    if urlsplit(req.full_url).scheme not in ("http", "https"):
        raise HttpError(0, f"refusing to open {req.full_url!r}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - scheme checked above
            return _answer(req.full_url, int(resp.status), resp)
    except urllib.error.HTTPError as err:
        return _answer(req.full_url, int(err.code), err)
    except http.client.IncompleteRead:
        raise HttpError(0, f"error: the connection to {req.full_url} closed before the whole answer came") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        reason = getattr(err, "reason", err)
        raise HttpError(0, f"error: could not reach {req.full_url}: {reason}") from None


def _reason(status: int, body: bytes) -> str:
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        for key in ("error", "message"):
            if isinstance(decoded.get(key), str):
                return str(decoded[key])
    return body[:200].decode("utf-8", "replace").strip() or f"HTTP {status}"


async def information(url: RelayUrl, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """The NIP-11 relay information document."""
    # RelayUrl.http is http:// or https:// by construction (S310 is about file: and custom schemes).
    req = urllib.request.Request(url.http + "/", headers={"Accept": "application/nostr+json"})  # noqa: S310
    answer = await asyncio.to_thread(_request, req, timeout)
    status, body = answer.status, answer.body
    if status != 200:
        raise HttpError(status, _reason(status, body))
    try:
        doc = json.loads(body)
    except ValueError:
        raise HttpError(status, "error: the NIP-11 document is not JSON") from None
    if not isinstance(doc, dict):
        raise HttpError(status, "error: the NIP-11 document is not a JSON object")
    return doc


async def post_json(
    url: RelayUrl, keys: Keys, path: str, payload: Any, *, timeout: float = DEFAULT_TIMEOUT
) -> tuple[int, Any]:
    """POST JSON with NIP-98: (status, decoded body). Raises HttpError only when no answer came."""
    status, decoded, _ = await _post(url, keys, path, payload, timeout=timeout)
    return status, decoded


async def _post(
    url: RelayUrl, keys: Keys, path: str, payload: Any, *, timeout: float
) -> tuple[int, Any, dict[str, str]]:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    target = url.http + path
    headers = {
        "Content-Type": "application/json",
        "Authorization": nip98_header(keys, target, "POST", body),
    }
    req = urllib.request.Request(target, data=body, headers=headers, method="POST")  # noqa: S310
    answer = await asyncio.to_thread(_request, req, timeout)
    try:
        decoded: Any = json.loads(answer.body)
    except ValueError:
        decoded = answer.body.decode("utf-8", "replace")
    return answer.status, decoded, answer.headers


# How a Buzz relay says that a current or history page stopped at its page size (`limit`, or the relay's
# default): there may be more after it. The body is a plain JSON array either way.
PAGE_FULL_HEADER: Final = "buzz-page-full"
NEXT_OFFSET_HEADER: Final = "buzz-next-offset"


class Page(list[Event]):
    """A /query answer: its events, and `full` when the relay cut it at its page size (a full page may have
    more after it: never take it for the complete set; a sync is the complete-set read), with the offset of
    the next page while the relay serves one (`next_offset`)."""

    full: bool = False
    next_offset: int | None = None


async def query(url: RelayUrl, keys: Keys, flt: dict[str, Any], *, timeout: float = DEFAULT_TIMEOUT) -> Page:
    """POST /query with one filter; the events, id and signature checked, and whether the page is full.
    HttpError on refusal."""
    status, decoded, headers = await _post(url, keys, "/query", [flt], timeout=timeout)
    if status != 200:
        reason = decoded.get("error") if isinstance(decoded, dict) else None
        raise HttpError(status, str(reason) if isinstance(reason, str) else f"unexpected answer {decoded!r:.200}")
    if not isinstance(decoded, list):
        raise HttpError(status, "error: /query did not answer a JSON array")
    out = Page()
    out.full = headers.get(PAGE_FULL_HEADER) == "true"
    offset = headers.get(NEXT_OFFSET_HEADER, "")
    out.next_offset = int(offset) if offset.isdigit() else None
    for raw in decoded:
        try:
            event = Event.from_dict(raw)
            event.verify()
        except EventError as err:
            raise HttpError(status, f"error: /query returned a bad event ({err})") from None
        out.append(event)
    return out


class HeadUnsupported(Exception):
    """The relay's NIP-11 document does not list the head view in `artifacts.modes`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def head_capability(url: RelayUrl, *, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Raise HeadUnsupported unless the relay advertises the head view (NIP-11 `artifacts.modes` lists
    "head"). NIP-AR: relays advertise head only when every backend that can serve the connection runs it;
    a relay that does not may answer a head filter as something else, or refuse it on one backend only."""
    doc = await information(url, timeout=timeout)
    section = doc.get("artifacts")
    modes = section.get("modes") if isinstance(section, dict) else None
    if not isinstance(modes, list) or "head" not in modes:
        raise HeadUnsupported("unsupported: the relay does not advertise the NIP-AR head view (NIP-11 artifacts.modes)")


async def head(
    url: RelayUrl,
    keys: Keys,
    ds: list[str],
    *,
    channels: list[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Event]:
    """The head view: {d: current revision, deletions included} for the named d the reader can read. Without
    `channels` it covers the channels a read without #h covers (joined or listed); `channels` names them
    (#h), which an unlisted open channel needs from a reader who has not joined it. A channel the reader
    can't read is an HttpError (restricted:). It reads what it is sent: check `head_capability` first."""
    flt: dict[str, Any] = {"artifact": "head", "#d": ds}
    if channels is not None:
        flt["#h"] = channels
    events = await query(url, keys, flt, timeout=timeout)
    return {d: e for e in events if (d := e.first("d")) is not None}
