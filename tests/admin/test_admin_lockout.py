"""Admin login throttling (django-axes) on a relay process: repeated failed logins lock the
(username, address) pair out with a 429, even for the right password, and a good login after
the lockout window works.

The window is an hour, so that no delay of a loaded machine can end it during the checks; the
test then moves the recorded attempts (the rows the relay consults) back past it, which is what
an hour passing does to them.
"""

from __future__ import annotations

from datetime import timedelta

from axes.models import AccessAttempt  # type: ignore[import-untyped]
from django.contrib.auth.models import User
from django.db.models import F

from buzz.identity.communities import community_create
from tests.admin.admin_http import AdminBrowser
from tests.support.relay import RelayFactory

HOST = "admin-lockout.test"
FAILURES = 3
LOCKOUT_SECONDS = 3600


def test_repeated_failures_lock_out_until_the_window_passes(
    transactional_db: None, relay_factory: RelayFactory
) -> None:
    community_create(host=HOST, name="Admin lockout")
    User.objects.create_superuser("root", "root@example.com", "right-password")
    User.objects.create_superuser("other", "other@example.com", "other-password")
    relay = relay_factory(BUZZ_ADMIN_LOGIN_FAILURES=str(FAILURES), BUZZ_ADMIN_LOCKOUT_SECONDS=str(LOCKOUT_SECONDS))
    browser = AdminBrowser(relay, HOST)
    for _ in range(FAILURES - 1):
        answer = browser.login("root", "wrong")
        assert answer.status == 200 and b"Please enter the correct username and password" in answer.body
    # The failure that reaches the limit is answered with the lockout, and so is the right password now.
    assert browser.login("root", "wrong").status == 429
    locked = browser.login("root", "right-password")
    assert locked.status == 429 and "sessionid" not in browser.cookies
    # The lockout is of that username from that address: another account still logs in.
    other = AdminBrowser(relay, HOST)
    assert other.login("other", "other-password").status == 302
    # The window runs from the last refused attempt: once it has passed, the right password works.
    assert AccessAttempt.objects.filter(username="root").count() == 1
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(seconds=LOCKOUT_SECONDS + 60))
    ok = browser.login("root", "right-password")
    assert ok.status == 302 and ok.headers["location"] == "/admin/", (ok.status, ok.body[:300])
    index = browser.get("/admin/")
    assert index.status == 200 and b"Site administration" in index.body
