"""The admin's CSS under uvicorn: `manage.py collectstatic` fills STATIC_ROOT, and a relay process
serves it (buzz.web.static, whitenoise) with its content type and caching headers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import django.contrib.admin

from buzz.identity.communities import community_create
from tests.admin.admin_http import AdminBrowser
from tests.http.http_support import request_sync
from tests.support.relay import BASE_DIR, RelayFactory

HOST = "admin-static.test"
BASE_CSS = Path(django.contrib.admin.__file__).parent / "static" / "admin" / "css" / "base.css"


def collectstatic(root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
        cwd=BASE_DIR,
        env={**os.environ, "STATIC_ROOT": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_admin_css_is_served_after_collectstatic(
    transactional_db: None, relay_factory: RelayFactory, tmp_path: Path
) -> None:
    community_create(host=HOST, name="Admin static")
    root = tmp_path / "static"
    collectstatic(root)
    assert (root / "admin" / "css" / "base.css").read_bytes() == BASE_CSS.read_bytes()
    relay = relay_factory(STATIC_ROOT=str(root))
    browser = AdminBrowser(relay, HOST)
    # The login page links the stylesheet, and the stylesheet is there.
    login = browser.get("/admin/login/")
    assert login.status == 200 and b'href="/static/admin/css/base.css"' in login.body
    css = browser.get("/static/admin/css/base.css")
    assert css.status == 200, css.body[:200]
    assert css.body == BASE_CSS.read_bytes()
    assert css.headers["content-type"].startswith("text/css")
    assert "max-age=" in css.headers["cache-control"]
    # Conditional and HEAD requests, as whitenoise answers them.
    again = browser.request("GET", "/static/admin/css/base.css", headers={"If-None-Match": css.headers["etag"]})
    assert again.status == 304 and again.body == b""
    head = browser.request("HEAD", "/static/admin/css/base.css")
    assert head.status == 200 and head.headers["content-length"] == str(len(css.body))
    assert browser.get("/static/admin/css/missing.css").status == 404
    # Static files are behind the Host check like everything else.
    unknown = request_sync(relay, "GET", "/static/admin/css/base.css", headers={"Host": "unknown.test"})
    assert unknown.status == 404 and unknown.body == b"not found\n"


def test_without_collectstatic_there_is_no_css_and_one_log_line(
    transactional_db: None, relay_factory: RelayFactory, tmp_path: Path
) -> None:
    community_create(host=HOST, name="Admin static")
    relay = relay_factory(STATIC_ROOT=str(tmp_path / "never-collected"), LOG_LEVEL="INFO")
    assert AdminBrowser(relay, HOST).get("/static/admin/css/base.css").status == 404
    log = relay.log_text()
    assert "run `manage.py collectstatic`" in log and "Traceback" not in log, log
