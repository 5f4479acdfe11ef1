"""Helpers for the admin tests (test_admin_actions.py, test_admin_browser.py). Not a test module.

Staff users the way an operator makes them (a superuser; a staff user in the "Moderators" group that
migration moderation 0002 creates), blocking NIP-98 requests to a relay process (writes and /query),
and an admin action driven through its confirmation page with Django's test client.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import Group, User
from django.db import connection
from django.db.migrations import RunPython
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from buzz.nostr import Signer
from tests.support.factories import nip98
from tests.support.relay import RelayProcess
from tests.support.wire import request

PASSWORD = "admin-tests-password"  # a test user's password
MODERATORS = "Moderators"


def make_superuser(username: str = "root") -> User:
    return User.objects.create_superuser(username, f"{username}@example.com", PASSWORD)


GROUP_MIGRATION = ("moderation", "0002_moderators_group")


def moderators_group() -> Group:
    """The group migration moderation 0002 made. A transactional test's flush empties every table, the
    migration's rows too; then the migration's own function makes it again, on the migration's model state."""
    group = Group.objects.filter(name=MODERATORS).first()
    if group is not None:
        return group
    executor = MigrationExecutor(connection)
    migration = executor.loader.get_migration(*GROUP_MIGRATION)
    state_apps = executor.loader.project_state(GROUP_MIGRATION).apps
    with connection.schema_editor() as editor:
        for operation in migration.operations:
            assert isinstance(operation, RunPython), operation
            operation.code(state_apps, editor)
    return Group.objects.get(name=MODERATORS)


def make_moderator(username: str = "mod") -> User:
    user = User.objects.create_user(username, f"{username}@example.com", PASSWORD, is_staff=True)
    user.groups.add(moderators_group())
    return user


def client_for(user: User, host: str) -> Client:
    client = Client(HTTP_HOST=host)
    # django-axes refuses authenticate() without a request (Client.login has none): log in directly.
    client.force_login(user)
    return client


def signed_post(relay: RelayProcess, host: str, signer: Signer, path: str, payload: Any) -> tuple[int, Any]:
    body = json.dumps(payload).encode()
    headers = {
        "Host": host,
        "Content-Type": "application/json",
        "Authorization": nip98(signer, host, "POST", path, body),
    }
    return request(relay, "POST", path, headers, body)


def write(relay: RelayProcess, host: str, signer: Signer, event: dict[str, Any]) -> str:
    """POST /events: an event that must be accepted; its id."""
    status, reply = signed_post(relay, host, signer, "/events", event)
    assert status == 200 and reply.get("accepted") is True, (status, reply)
    return str(event["id"])


def view(relay: RelayProcess, host: str, signer: Signer, **flt: Any) -> list[dict[str, Any]]:
    """POST /query with one NIP-AR view filter (artifact=current|history|head ...): the events returned."""
    status, rows = signed_post(relay, host, signer, "/query", [{"limit": 500, **flt}])
    assert status == 200, (status, rows)
    return list(rows)


@dataclass(frozen=True)
class Confirmed:
    """An admin action driven to its end: the confirmation page shown, then the answer to confirming it."""

    url: str
    page: str  # the confirmation page's HTML
    done_status: int
    done: str  # the HTML after confirming (the changelist, or the page again after a dry run)
    messages: list[str]

    @property
    def open_syncs(self) -> int:
        """What the confirmation page said under "Open syncs that get a resync"."""
        found = _OPEN_SYNCS.search(self.page)
        assert found is not None, "the confirmation page shows no open-sync count"
        return int(found.group(1))


_OPEN_SYNCS = re.compile(r'<td id="open-syncs"><span class="count">(\d+)</span>')
_MESSAGE = re.compile(r'<li class="(?:success|info|warning|error)">(.*?)</li>', re.S)


def run_action(
    client: Client,
    changelist: str,
    action: str,
    pks: Sequence[int],
    reason: str,
    *,
    button: str = "_confirm",
) -> Confirmed:
    """Select `pks` on `changelist`, pick `action`, read the confirmation page, and confirm it with `reason`
    (`button` "_dry_run" for expiry's dry run)."""
    chosen = client.post(changelist, {"action": action, "_selected_action": [str(pk) for pk in pks]})
    assert chosen.status_code == 302, (chosen.status_code, chosen.content[:500])
    url = chosen["Location"]
    assert "/confirm/" in url, url
    page = client.get(url)
    assert page.status_code == 200, page.status_code
    done = client.post(url, {"reason": reason, button: "1"}, follow=True)
    html = done.content.decode()
    return Confirmed(url, page.content.decode(), done.status_code, html, [m.strip() for m in _MESSAGE.findall(html)])
