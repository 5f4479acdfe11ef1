"""Benchmark: what the front costs a request (buzz.web.front.serve), in-process, no sockets.

A POST /query request is served by the front with a view that answers at once with a --body-bytes JSON
body (default 50,000: an incremental page of 100 artifacts), through Django's request, the inline
middlewares, the disconnect watch and Django's response, as the relay serves every POST /query and
/count. The baseline is the same body sent as bare ASGI messages (http.response.start and body), in the
same run. Printed: microseconds per request (the median of 7 repetitions of --requests requests each)
for both, and their difference and ratio. Every request is checked answered 200 with the whole body.

    python bench/front.py [--requests 3000] [--body-bytes 50000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import inprocess

inprocess.setup()

import uvloop  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402

from buzz.web import front  # noqa: E402

REPEATS = 7
HOST = b"localhost:7777"  # an ALLOWED_HOSTS host of dev mode
REQUEST_BODY = json.dumps(
    [{"artifact": "incremental", "query": {"artifact": "current", "#type": ["buzz.task"]}, "cursor": "c" * 200}]
).encode()


class _Client:
    """The request's side of the ASGI connection: the body, then nothing (no disconnect); counts what is sent."""

    def __init__(self) -> None:
        self.read = False
        self.status = 0
        self.bytes = 0

    async def receive(self) -> dict[str, Any]:
        if not self.read:
            self.read = True
            return {"type": "http.request", "body": REQUEST_BODY, "more_body": False}
        await asyncio.Event().wait()  # the client stays: only the front's listener would wait here
        raise AssertionError("unreachable")

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.bytes += len(message.get("body", b""))


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/query",
        "raw_path": b"/query",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", HOST),
            (b"authorization", b"Bearer buzz_" + b"x" * 40),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(REQUEST_BODY)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 7777),
    }


async def _front(handler: ASGIHandler, route: front.Route, client: _Client) -> None:
    passed_on = await front.serve(handler, route, _scope(), client.receive, client.send)
    if passed_on is not None:
        raise SystemExit("the front handed the request to Django: its middleware list is not the front's")


async def _bare(body: bytes, client: _Client) -> None:
    await client.receive()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await client.send({"type": "http.response.start", "status": 200, "headers": headers})
    await client.send({"type": "http.response.body", "body": body})


async def _measure(requests: int, body_bytes: int) -> tuple[list[float], list[float]]:
    text = '{"changes":[' + "0" * max(0, body_bytes - 14) + "]}"
    body = text.encode()

    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse(text, content_type="application/json")

    route = front.Route(accepts=lambda _: True, view=view, max_body=1 << 20)
    handler = ASGIHandler()
    served: list[float] = []
    bare: list[float] = []
    for _ in range(REPEATS):
        for sample, one in ((served, lambda c: _front(handler, route, c)), (bare, lambda c: _bare(body, c))):
            clients = [_Client() for _ in range(requests)]
            start = time.perf_counter()
            for client in clients:
                await one(client)
            sample.append((time.perf_counter() - start) / requests * 1e6)
            if any(c.status != 200 or c.bytes != len(body) for c in clients):
                raise SystemExit("a request was not answered 200 with the whole body")
    return served, bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--body-bytes", type=int, default=50_000)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    served, bare = uvloop.run(_measure(args.requests, args.body_bytes))
    median, baseline = statistics.median(served), statistics.median(bare)
    print(f"front: {args.requests} requests x {REPEATS} repetitions, a {args.body_bytes}-byte body, in-process")
    print(f"  through buzz.web.front.serve: min {min(served):.1f} us, median {median:.1f} us a request")
    print(f"  baseline, the same body as bare ASGI messages: median {baseline:.1f} us a request")
    print(f"  the front's own cost: {median - baseline:.1f} us a request; ratio {median / baseline:.1f}")
    common.write_json(args.json, {"front_us": median, "bare_us": baseline, "ratio": median / baseline})


if __name__ == "__main__":
    main()
