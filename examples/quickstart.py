#!/usr/bin/env python
"""Buzz relay quickstart: a key, a channel, a message, an artifact, and its current view.

Run it from the checkout while `make run` is going (in another shell):

    .venv/bin/python examples/quickstart.py                 # ws://localhost:7777/
    .venv/bin/python examples/quickstart.py ws://localhost:8000/
    PORT=8000 .venv/bin/python examples/quickstart.py       # the same, as `make run PORT=8000`

It generates a key and admits it as a relay member with this checkout's
`manage.py community add-member` (which finds the servers `make run` keeps under var/).
Then, as that key:
1. authenticates over the WebSocket (NIP-42 AUTH);
2. creates an open channel (NIP-29 kind 9007) and posts a message in it (kind 9);
3. creates a NIP-AR artifact (kind 45010, op=create) and updates it (op=update, with prev
   naming the revision it replaces: the relay's compare-and-set);
4. reads the channel's current artifacts over HTTP POST /query, signed with NIP-98.
It prints each step and exits 0, or prints the relay's refusal and exits 1.

With --secret-key HEX it uses a key that is already a member and admits nothing.
Only the relay's own dependencies are used: websockets, coincurve (through buzz.nostr),
and the standard library.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))

from websockets.exceptions import WebSocketException  # noqa: E402
from websockets.sync.client import ClientConnection, connect  # noqa: E402

from buzz.nostr import Signer  # noqa: E402

ARTIFACT_TYPE = "quickstart.note"  # clients name their own types; buzz.* is reserved for Buzz's


class Refused(Exception):
    """The relay said no (the message carries its NIP-01 reason)."""


def step(label: str, text: str) -> None:
    print(f"{label:<9} {text}", flush=True)


def admit(pubkey: str, host: str) -> None:
    """`manage.py community add-member --host HOST PUBKEY`, with this checkout's manage.py."""
    manage = CHECKOUT / "manage.py"
    command = [sys.executable, str(manage), "community", "add-member", "--host", host, pubkey]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)  # noqa: S603
    if result.returncode != 0:
        raise Refused(f"admitting the key failed: {(result.stderr or result.stdout).strip()}")
    step("admitted", result.stdout.strip())


class Relay:
    """One WebSocket connection: send a frame, wait for the reply that answers it."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    def send(self, frame: list[Any]) -> None:
        self.ws.send(json.dumps(frame))

    def expect(self, kind: str, timeout: float = 15.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.0, deadline - time.monotonic())))
            if message[0] == kind:
                return list(message)
            if message[0] == "NOTICE":
                step("notice", str(message[1:]))

    def publish(self, signer: Signer, kind: int, tags: list[list[str]], content: str) -> str:
        """EVENT, then its OK. Returns the event id, or raises Refused with the relay's reason."""
        event = signer.sign_event(kind=kind, tags=tags, content=content).to_dict()
        self.send(["EVENT", event])
        while True:
            ok = self.expect("OK")
            if ok[1] == event["id"]:
                break
        if not ok[2]:
            raise Refused(f"kind {kind} refused: {ok[3]}")
        return str(event["id"])


def authenticate(relay: Relay, signer: Signer, url: str) -> None:
    """NIP-42: the relay sends a challenge; answer with a signed kind-22242 event naming it and this relay."""
    challenge = relay.expect("AUTH")[1]
    event = signer.sign_event(kind=22242, tags=[["relay", url], ["challenge", challenge]], content="").to_dict()
    relay.send(["AUTH", event])
    ok = relay.expect("OK")
    if not ok[2]:
        raise Refused(f"AUTH refused: {ok[3]}")
    step("auth", f"NIP-42 AUTH accepted for {signer.pubkey}")


def artifact_tags(*, d: str, channel: str, title: str, op: str, prev: str | None = None) -> list[list[str]]:
    """The NIP-AR envelope: ar, d, h, type, title, op, and prev on every revision after the create."""
    tags = [["ar", "1"], ["d", d], ["h", channel], ["type", ARTIFACT_TYPE], ["title", title], ["op", op]]
    if prev is not None:
        tags.append(["prev", prev])
    return tags


def signed_post(signer: Signer, url: str, body: bytes) -> Any:
    """POST with a NIP-98 Authorization header: a kind-27235 event over this URL, method and body hash.

    The relay accepts each authorization event once. Two identical requests in the same second
    would sign the same event, so vary the request (this one is only sent once) or wait a second.
    """
    tags = [["u", url], ["method", "POST"], ["payload", hashlib.sha256(body).hexdigest()]]
    auth = signer.sign_event(kind=27235, tags=tags, content="").to_dict()
    request = urllib.request.Request(  # noqa: S310  (the URL is the relay's own http(s) address)
        url,
        data=body,
        method="POST",
        headers={
            "Authorization": "Nostr " + base64.b64encode(json.dumps(auth).encode()).decode(),
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:  # noqa: S310
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")
        raise Refused(f"POST {url} answered {err.code}: {detail}") from None


def run(url: str, secret_key: str | None) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        raise SystemExit(f"quickstart: {url!r} is not a ws:// or wss:// relay URL")
    host = parts.netloc  # the community is chosen by the Host header, e.g. localhost:7777
    http_base = ("https" if parts.scheme == "wss" else "http") + "://" + host

    signer = Signer(secret_key) if secret_key else Signer.generate()
    step("relay", f"{url} (community {host})")
    step("key", f"pubkey {signer.pubkey} (secret key {signer.secret_hex}; keep it to reuse it)")
    if secret_key is None:
        admit(signer.pubkey, host)

    with connect(url, open_timeout=15, close_timeout=5) as ws:
        relay = Relay(ws)
        authenticate(relay, signer, url)

        channel = str(uuid.uuid4())
        relay.publish(signer, 9007, [["h", channel], ["name", "quickstart"]], "")
        step("channel", f"created open channel {channel} (kind 9007)")
        message = relay.publish(signer, 9, [["h", channel]], "Hello from examples/quickstart.py")
        step("message", f"posted {message} (kind 9)")

        d = str(uuid.uuid4())
        body = {"version": 1, "text": "Write the quickstart"}
        first = relay.publish(
            signer, 45010, artifact_tags(d=d, channel=channel, title="Quickstart note", op="create"), json.dumps(body)
        )
        step("artifact", f"created {d}: revision {first} (kind 45010, op=create)")
        body["text"] = "Write the quickstart, then run it"
        second = relay.publish(
            signer,
            45010,
            artifact_tags(d=d, channel=channel, title="Quickstart note, edited", op="update", prev=first),
            json.dumps(body),
        )
        step("artifact", f"updated {d}: revision {second} (op=update, prev={first})")

    query = json.dumps([{"artifact": "current", "#h": [channel]}]).encode()
    current = signed_post(signer, http_base + "/query", query)
    step("query", f"POST /query current #h={channel}: {len(current)} artifact(s)")
    for event in current:
        tags = {tag[0]: tag[1] for tag in event["tags"] if len(tag) > 1}
        step("current", f"d={tags.get('d')} title={tags.get('title')!r} revision {event['id']}")
    if [event["id"] for event in current] != [second]:
        raise Refused(f"expected the current view to hold revision {second} only")
    step("done", "the current view holds the update; see README.md for the protocol surface")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # PORT as `make run` reads it, so `make run PORT=8000` pairs with `PORT=8000 ... quickstart.py`.
    default_url = f"ws://localhost:{os.environ.get('PORT') or 7777}/"
    parser.add_argument("url", nargs="?", default=default_url, help="relay URL (default %(default)s)")
    parser.add_argument("--secret-key", help="64-hex secret key of a key that is already a member (admits nothing)")
    args = parser.parse_args(argv)
    try:
        run(args.url, args.secret_key)
    except Refused as err:
        print(f"quickstart: {err}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError, WebSocketException) as err:
        print(f"quickstart: cannot talk to {args.url}: {err} (is `make run` going?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
