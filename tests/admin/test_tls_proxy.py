"""The admin behind a TLS-terminating proxy, on a relay process in production mode (BUZZ_DEV off).

The proxy speaks plain HTTP to the relay and marks each request `X-Forwarded-Proto: https`.
With SECURE_PROXY_SSL_HEADER naming that header the relay treats the request as HTTPS: its
cookies are Secure and a login form posted from https://HOST passes the CSRF origin check;
CSRF_TRUSTED_ORIGINS admits one other origin. Without the header the same post is refused.
"""

from __future__ import annotations

import os

from django.contrib.auth.models import User

from buzz.identity.communities import community_create
from tests.admin.admin_http import AdminBrowser
from tests.support.relay import RelayFactory

HOST = "tls-proxy.test"
HTTPS = {"X-Forwarded-Proto": "https"}


def test_admin_login_behind_a_tls_proxy(transactional_db: None, relay_factory: RelayFactory) -> None:
    community_create(host=HOST, name="TLS proxy", public_url=f"wss://{HOST}/")
    User.objects.create_superuser("root", "root@example.com", "right-password")
    relay = relay_factory(
        BUZZ_DEV="0",
        SECRET_KEY=os.environ["SECRET_KEY"],
        ALLOWED_HOSTS=HOST,
        SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https",
        CSRF_TRUSTED_ORIGINS="https://admin.tls-proxy.test",
    )
    # Through the proxy: Secure cookies, and a login posted from the relay's own https origin.
    browser = AdminBrowser(relay, HOST, headers=HTTPS)
    ok = browser.login("root", "right-password", {"Origin": f"https://{HOST}", "Referer": f"https://{HOST}/"})
    assert ok.status == 302 and ok.headers["location"] == "/admin/", (ok.status, ok.body[:300])
    cookies = {raw.split("=", 1)[0]: raw for raw in browser.set_cookies}
    assert {"csrftoken", "sessionid"} <= set(cookies)
    assert all("; Secure" in raw for raw in cookies.values()), cookies
    assert browser.get("/admin/").status == 200
    # A trusted origin of another name is admitted; an untrusted one is not.
    trusted = AdminBrowser(relay, HOST, headers=HTTPS).login(
        "root", "right-password", {"Origin": "https://admin.tls-proxy.test", "Referer": "https://admin.tls-proxy.test/"}
    )
    assert trusted.status == 302, trusted.body[:300]
    other = AdminBrowser(relay, HOST, headers=HTTPS).login(
        "root", "right-password", {"Origin": "https://evil.test", "Referer": "https://evil.test/"}
    )
    assert other.status == 403
    # Without the proxy's header the request is plain http: the https origin doesn't match it.
    plain = AdminBrowser(relay, HOST).login("root", "right-password", {"Origin": f"https://{HOST}"})
    assert plain.status == 403
