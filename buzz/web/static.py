"""Static files (the admin's CSS and JavaScript) under ASGI, with whitenoise.

`manage.py collectstatic` copies them to STATIC_ROOT (`make run` does it before serving);
this middleware answers STATIC_URL from there with whitenoise's file index and headers
(content type, caching, ETag / Last-Modified, ranges, pre-compressed variants).

WhiteNoiseMiddleware itself is sync-only. In Django's async handler one sync middleware puts
every HTTP request, /query and /events included, through a hop to a worker thread and back;
this subclass is async-only instead: it answers a static path from the event loop and reads
the file in a worker thread, and passes every other request straight on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from typing import Any

from asgiref.sync import markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from whitenoise.middleware import WhiteNoiseMiddleware  # type: ignore[import-untyped]

log = logging.getLogger(__name__)


def _read(static_file: Any, method: str, meta: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
    response = static_file.get_response(method, meta)
    body = b""
    if response.file is not None:
        with response.file as f:
            body = f.read()
    return int(response.status), list(response.headers), body


class StaticFilesMiddleware(WhiteNoiseMiddleware):  # type: ignore[misc]
    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        root = settings.STATIC_ROOT
        if root and not os.path.isdir(root):
            # One line instead of whitenoise's warning: the relay runs, the admin has no CSS.
            log.warning("no static files at %s: run `manage.py collectstatic` for the admin's CSS", root)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No directory at")
            super().__init__(get_response)
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponse:  # type: ignore[override]
        path = request.path_info
        static_file = self.find_file(path) if self.autorefresh else self.files.get(path)
        if static_file is None:
            response: HttpResponse = await self.get_response(request)
            return response
        status, headers, body = await asyncio.to_thread(_read, static_file, request.method or "GET", request.META)
        answer = HttpResponse(body, status=status)
        del answer["Content-Type"]  # whitenoise's headers carry the file's own
        for name, value in headers:
            answer[name] = value
        return answer
