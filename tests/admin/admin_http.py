"""A browser-like client of the admin on a relay process: cookies, the login form's CSRF token.

Not a test module. Requests go to the relay's address with the community's Host header;
cookies are kept by name, whatever their flags (the tests read the flags from `set_cookies`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from urllib.parse import urlencode

from tests.http.http_support import Answer, request_sync
from tests.support.relay import RelayProcess

_CSRF_INPUT = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@dataclass
class AdminBrowser:
    relay: RelayProcess
    host: str
    headers: dict[str, str] = field(default_factory=dict)  # sent on every request (X-Forwarded-Proto...)
    cookies: dict[str, str] = field(default_factory=dict)
    set_cookies: list[str] = field(default_factory=list)  # every Set-Cookie header seen, raw

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Answer:
        all_headers = {"Host": self.host, **self.headers, **(headers or {})}
        if self.cookies:
            all_headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        answer = request_sync(self.relay, method, path, headers=all_headers, body=body)
        for raw in answer.set_cookie:
            self.set_cookies.append(raw)
            for name, morsel in SimpleCookie(raw).items():
                self.cookies[name] = morsel.value
        return answer

    def get(self, path: str) -> Answer:
        return self.request("GET", path)

    def login(self, username: str, password: str, headers: dict[str, str] | None = None) -> Answer:
        """GET the login form, then POST it; the answer to the POST (302 on success)."""
        form = self.get("/admin/login/?next=/admin/")
        assert form.status == 200, form.status
        match = _CSRF_INPUT.search(form.body.decode())
        assert match, "no CSRF token in the login form"
        body = urlencode(
            {"csrfmiddlewaretoken": match.group(1), "username": username, "password": password, "next": "/admin/"}
        ).encode()
        return self.request(
            "POST",
            "/admin/login/?next=/admin/",
            body,
            {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})},
        )
