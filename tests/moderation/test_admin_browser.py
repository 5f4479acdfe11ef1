"""The moderation admin in a real browser: Debian's chromium driven by Playwright, against a relay process
serving /admin under uvicorn (its CSS collected as `make run` does).

A relay admin logs in, redacts a revision through its confirmation page and sees it gone through the signed
HTTP API, archives a channel (a write to it is then refused), runs an expiry dry run, and reads the audit
log; a moderator logs in and gets 403 wherever moderators have no business.

Chromium comes from Debian (`apt-get install -y chromium`, which .ci/run does); Playwright's own browser
download is never used. Without /usr/bin/chromium these tests skip, saying so, except where
BUZZ_BROWSER_TESTS=required (CI), where they fail. With ADMIN_SHOTS=<dir> every page a person sees is
saved there as a PNG.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright

from artifacts.models import Revision
from buzz.models import Channel
from buzz.nostr import Signer
from moderation.models import AuditRecord
from tests.moderation.admin_support import PASSWORD, make_moderator, make_superuser, view, write
from tests.support.factories import make_channel, make_community, make_token, message, revision
from tests.support.relay import BASE_DIR, RelayFactory, RelayProcess

CHROMIUM = Path("/usr/bin/chromium")
HOST = "admin-browser.test"  # resolved to the relay by chromium's host rules: the Host header is this name


def _chromium_or_skip() -> None:
    if CHROMIUM.exists():
        return
    why = (
        f"no {CHROMIUM}: the admin's browser tests need Debian's chromium; "
        "install it with `apt-get install -y chromium` (as root), then run them again"
    )
    if os.environ.get("BUZZ_BROWSER_TESTS") == "required":
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def static_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The admin's CSS and scripts, collected once, as `make run` collects them."""
    root = tmp_path_factory.mktemp("admin-static")
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
        cwd=BASE_DIR,
        env={**os.environ, "STATIC_ROOT": str(root), "BUZZ_DEV": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return root


@pytest.fixture
def relay(transactional_db: None, relay_factory: RelayFactory, static_root: Path) -> RelayProcess:
    _chromium_or_skip()
    return relay_factory(STATIC_ROOT=str(static_root), BUZZ_WRITES_PER_SECOND="0")


Shot = Callable[[Page, str], None]


@pytest.fixture
def browser_page(
    relay: RelayProcess, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Callable[[], Page], Shot]]:
    """(new_page, shot): pages of one headless chromium that reaches HOST at the relay; shot(page, name)
    saves a full-page PNG under $ADMIN_SHOTS when it is set."""
    shots = os.environ.get("ADMIN_SHOTS")
    # Playwright's sync API runs its event loop in this thread (greenlets), which Django takes for an async
    # context; the test's own ORM calls never run concurrently with it.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    test_name = request.node.name.removeprefix("test_")[:40]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[f"--host-resolver-rules=MAP {HOST}:80 {relay.host}:{relay.port}"],
        )
        contexts: list[Any] = []

        def new_page() -> Page:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            contexts.append(context)
            page = context.new_page()
            page.set_default_timeout(20_000)
            return page

        def shot(page: Page, name: str) -> None:
            if shots:
                Path(shots).mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(Path(shots) / f"{test_name}-{name}.png"), full_page=True)

        try:
            yield new_page, shot
        finally:
            for context in contexts:
                context.close()
            browser.close()


BASE = f"http://{HOST}"


def log_in(page: Page, username: str, shot: Shot | None = None) -> None:
    page.goto(f"{BASE}/admin/login/?next=/admin/")
    if shot is not None:
        shot(page, "login")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{BASE}/admin/")
    assert page.locator("#site-name").inner_text().strip() != ""
    assert page.get_by_role("button", name="Log out").count() == 1


def root_page(new_page: Callable[[], Page], shot: Shot | None = None) -> Page:
    """A new page logged in as the superuser "root", made for it."""
    make_superuser("root")
    page = new_page()
    log_in(page, "root", shot)
    return page


def choose_action(page: Page, action: str, *row_values: str) -> None:
    """Tick the rows whose checkbox value is in `row_values`, pick `action`, press Go."""
    for value in row_values:
        page.check(f"input[name=_selected_action][value='{value}']")
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")
    page.wait_for_url(re.compile(r".*/confirm/.*"))


def messages_of(page: Page) -> list[str]:
    return [m.strip() for m in page.locator("ul.messagelist li").all_inner_texts()]


@pytest.fixture
def team(relay: RelayProcess) -> dict[str, Any]:
    """A community at HOST with its owner and a reader, two channels, and an artifact with two revisions."""
    owner, reader = Signer.generate(), Signer.generate()
    community = make_community(HOST, members=[owner, reader])
    plans = make_channel(community, owner, name="plans", visibility="private", members=[reader])
    other = make_channel(community, owner, name="random", visibility="private", members=[reader])
    make_token(community, owner)
    d = uuid.uuid4()
    created = revision(owner, d=d, h=plans, title="Launch plan")
    write(relay, HOST, owner, created)
    updated = revision(owner, d=d, h=plans, op="update", prev=created["id"], title="Launch plan, with secrets")
    write(relay, HOST, owner, updated)
    return {
        "community": community,
        "owner": owner,
        "reader": reader,
        "plans": plans,
        "other": other,
        "d": d,
        "created": created,
        "updated": updated,
    }


def test_relay_admin_redacts_through_the_confirmation_page_and_the_api_shows_the_result(
    relay: RelayProcess, browser_page: tuple[Callable[[], Page], Shot], team: dict[str, Any]
) -> None:
    new_page, shot = browser_page
    page = root_page(new_page, shot)
    index = page.locator("#content-main").inner_text()
    for section in ("Artifacts", "Revisions", "Audit log", "Retention policies", "Channels", "Api tokens", "Bans"):
        assert section in index, section
    shot(page, "index")

    # The artifact, its current head and its revisions inline.
    page.goto(f"{BASE}/admin/artifacts/artifact/")
    assert page.locator(f"#result_list code[title='{team['d']}']").count() == 1
    assert "plans" in page.locator("#result_list").inner_text()
    shot(page, "artifacts")
    page.click("#result_list tbody tr:first-child th a")
    assert team["updated"]["id"] in page.locator("#content-main").inner_text()
    assert page.locator(".inline-group tbody tr.has_original, .inline-group tbody tr.form-row").count() >= 2
    shot(page, "artifact")

    # Revisions: found by id; the head is redacted through the confirmation page.
    head = Revision.objects.get(id=team["updated"]["id"])
    page.goto(f"{BASE}/admin/artifacts/revision/?q={head.id}")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    shot(page, "revisions-search")
    choose_action(page, "redact", str(head.seq))
    confirm = page.locator("#content-main")
    assert head.id in page.locator("#withheld").inner_text()
    assert str(team["d"]) in page.locator("#retiring").inner_text()
    assert page.locator("#open-syncs").inner_text().strip().isdigit()
    assert Revision.objects.get(pk=head.seq).redacted_at is None  # nothing has happened yet
    assert "Yes, redact" in confirm.inner_html()
    shot(page, "redact-confirm")
    page.fill("#id_reason", "a secret in the title")
    page.click("input[name=_confirm]")
    page.wait_for_url(f"{BASE}/admin/artifacts/revision/")
    assert any("Redacted 1 revision(s); 1 artifact(s) retired" in m for m in messages_of(page)), messages_of(page)
    shot(page, "redact-done")

    # The filter shows it as redacted.
    page.goto(f"{BASE}/admin/artifacts/revision/?redacted=yes")
    assert head.id[:16] in page.locator("#result_list").inner_text()
    shot(page, "revisions-redacted")

    # Through the API: the artifact is retired (not current) and the redacted revision is out of its history.
    reader, plans = team["reader"], str(team["plans"])
    assert [e for e in view(relay, HOST, reader, artifact="current", **{"#h": [plans]})] == []
    history = view(relay, HOST, reader, artifact="history", **{"#d": [str(team["d"])]})
    assert [e["id"] for e in history] == [team["created"]["id"]]

    # The audit log has the record, with who and why.
    page.goto(f"{BASE}/admin/moderation/auditrecord/")
    assert page.title().startswith("Audit log")
    assert page.locator("h1").inner_text() == "Audit log"
    listing = page.locator("#result_list").inner_text()
    assert "admin:root" in listing and "redact" in listing and "a secret in the title" in listing
    shot(page, "audit-log")
    page.click("#result_list tbody tr:first-child th a")
    assert head.id in page.locator("#content-main").inner_text()
    shot(page, "audit-record")
    record = AuditRecord.objects.get(action="redact")
    assert record.who == "admin:root" and record.reason == "a secret in the title"


def test_relay_admin_archives_a_channel_and_runs_an_expiry_dry_run(
    relay: RelayProcess, browser_page: tuple[Callable[[], Page], Shot], team: dict[str, Any]
) -> None:
    new_page, shot = browser_page
    page = root_page(new_page)
    channel = Channel.objects.get(uuid=team["plans"])

    page.goto(f"{BASE}/admin/buzz/channel/")
    shot(page, "channels")
    choose_action(page, "archive_channels", str(channel.pk))
    assert "plans" in page.locator("#targets").inner_text()
    assert page.locator("#open-syncs").inner_text().strip() == "0"
    shot(page, "archive-confirm")
    page.fill("#id_reason", "the launch is over")
    page.click("input[name=_confirm]")
    page.wait_for_url(f"{BASE}/admin/buzz/channel/")
    assert any("Archived 1 channel(s)" in m for m in messages_of(page)), messages_of(page)
    shot(page, "archive-done")
    channel.refresh_from_db()
    assert channel.archived_at is not None
    # A write to the archived channel is refused; reads are unchanged.
    body_status, reply = _post_message(relay, team["owner"], team["plans"])
    assert reply["accepted"] is False and "archived" in reply["message"], (body_status, reply)
    assert [e["id"] for e in view(relay, HOST, team["reader"], artifact="current", **{"#h": [str(team["plans"])]})] == [
        team["updated"]["id"]
    ]

    # A retention policy (keep 0: only what must stay), then expire now: its dry run changes nothing.
    page.goto(f"{BASE}/admin/moderation/retentionpolicy/add/")
    page.select_option("#id_community", str(team["community"].pk))
    page.fill("#id_keep", "0s")
    shot(page, "retention-add")
    page.click("input[name=_save]")
    page.wait_for_url(f"{BASE}/admin/moderation/retentionpolicy/")
    shot(page, "retention-policies")
    policy_pk = page.locator("input[name=_selected_action]").first.get_attribute("value")
    assert policy_pk is not None
    choose_action(page, "expire_now", policy_pk)
    assert team["created"]["id"] in page.locator("#withheld").inner_text()
    shot(page, "expire-confirm")
    page.fill("#id_reason", "first run")
    page.click("input[name=_dry_run]")
    page.wait_for_selector("#dry-run-result")
    assert "Dry run: 1 revision(s) would expire. Nothing was changed." in page.locator("#dry-run-result").inner_text()
    shot(page, "expire-dry-run")
    assert not Revision.objects.filter(expired_at__isnull=False).exists()

    page.goto(f"{BASE}/admin/moderation/auditrecord/")
    listing = page.locator("#result_list").inner_text()
    assert "archive" in listing and "the launch is over" in listing and "retention set" in listing
    shot(page, "audit-log")


def _post_message(relay: RelayProcess, signer: Signer, channel: uuid.UUID) -> tuple[int, Any]:
    from tests.moderation.admin_support import signed_post

    return signed_post(relay, HOST, signer, "/events", message(signer, channel))


def test_a_moderator_logs_in_and_gets_403_where_moderators_have_no_business(
    relay: RelayProcess, browser_page: tuple[Callable[[], Page], Shot], team: dict[str, Any]
) -> None:
    new_page, shot = browser_page
    make_moderator("mod")
    page = new_page()
    log_in(page, "mod")
    index = page.locator("#content-main").inner_text()
    for section in ("Artifacts", "Revisions", "Audit log", "Channels"):
        assert section in index, section
    for hidden in ("Api tokens", "Communities", "Relay members", "Retention policies", "Bans"):
        assert hidden not in index, hidden
    shot(page, "index")
    channel = Channel.objects.get(uuid=team["plans"])
    page.goto(f"{BASE}/admin/buzz/channel/")
    actions = page.locator("select[name=action] option").all_inner_texts()
    assert any("Archive" in a for a in actions) and not any("Delete" in a for a in actions), actions
    shot(page, "channels")
    page.goto(f"{BASE}/admin/artifacts/revision/")
    assert any("Redact" in a for a in page.locator("select[name=action] option").all_inner_texts())
    shot(page, "revisions")
    # What a moderator may do, they can: redact the older revision (the head stays current).
    old = Revision.objects.get(id=team["created"]["id"])
    choose_action(page, "redact", str(old.seq))
    assert old.id in page.locator("#withheld").inner_text()
    assert "none" in page.locator("#retiring").inner_text()
    page.fill("#id_reason", "personal data")
    page.click("input[name=_confirm]")
    page.wait_for_url(f"{BASE}/admin/artifacts/revision/")
    assert any("Redacted 1 revision(s); 0 artifact(s) retired" in m for m in messages_of(page)), messages_of(page)
    current = view(relay, HOST, team["reader"], artifact="current", **{"#h": [str(team["plans"])]})
    assert [e["id"] for e in current] == [team["updated"]["id"]]
    page.goto(f"{BASE}/admin/moderation/auditrecord/")
    assert "admin:mod" in page.locator("#result_list").inner_text()
    for path in (
        "/admin/buzz/apitoken/",
        "/admin/buzz/community/",
        "/admin/buzz/relaymember/",
        "/admin/moderation/retentionpolicy/",
        f"/admin/buzz/channel/confirm/delete/?ids={channel.pk}",
        f"/admin/buzz/channel/{channel.pk}/delete/",
    ):
        response = page.goto(f"{BASE}{path}")
        assert response is not None and response.status == 403, (path, response and response.status)
    shot(page, "forbidden")
    channel.refresh_from_db()
    assert channel.deleted_at is None


def test_relay_admin_reads_what_a_channel_deletion_does_backs_out_then_deletes_and_resets_the_policy(
    relay: RelayProcess, browser_page: tuple[Callable[[], Page], Shot], team: dict[str, Any]
) -> None:
    new_page, shot = browser_page
    page = root_page(new_page)
    channel = Channel.objects.get(uuid=team["plans"])

    # A revision's own page shows its event.
    head = Revision.objects.get(id=team["updated"]["id"])
    page.goto(f"{BASE}/admin/artifacts/revision/{head.seq}/change/")
    assert "Launch plan, with secrets" in page.locator("#content-main").inner_text()
    shot(page, "revision")

    # The deletion's page names the artifact that leaves current state; backing out changes nothing.
    page.goto(f"{BASE}/admin/buzz/channel/")
    choose_action(page, "delete_channels", str(channel.pk))
    assert str(team["d"]) in page.locator("#retiring").inner_text()
    assert "This cannot be undone" in page.locator("#content-main").inner_text()
    shot(page, "delete-confirm")
    page.click("a.cancel-link")
    page.wait_for_url(f"{BASE}/admin/buzz/channel/")
    channel.refresh_from_db()
    assert channel.deleted_at is None and not AuditRecord.objects.exists()
    assert view(relay, HOST, team["reader"], artifact="current", **{"#h": [str(team["plans"])]}) != []

    choose_action(page, "delete_channels", str(channel.pk))
    page.fill("#id_reason", "spam channel")
    page.click("input[name=_confirm]")
    page.wait_for_url(f"{BASE}/admin/buzz/channel/")
    assert any("Deleted 1 channel(s)" in m for m in messages_of(page)), messages_of(page)
    shot(page, "delete-done")
    channel.refresh_from_db()
    assert channel.deleted_at is not None

    # The access-policy reset, from the communities page.
    page.goto(f"{BASE}/admin/buzz/community/")
    shot(page, "communities")
    choose_action(page, "reset_policies", str(team["community"].pk))
    assert HOST in page.locator("#targets").inner_text()
    shot(page, "reset-confirm")
    page.fill("#id_reason", "purge recovery history")
    page.click("input[name=_confirm]")
    page.wait_for_url(f"{BASE}/admin/buzz/community/")
    assert any("Reset the access policy of 1 community" in m for m in messages_of(page)), messages_of(page)
    actions = sorted(AuditRecord.objects.values_list("action", "who", "reason"))
    assert actions == [
        ("delete_channel", "admin:root", "spam channel"),
        ("policy_reset", "admin:root", "purge recovery history"),
    ]


def test_relay_admin_is_told_why_a_public_url_is_refused_and_the_community_keeps_its_own(
    relay: RelayProcess, browser_page: tuple[Callable[[], Page], Shot], team: dict[str, Any]
) -> None:
    new_page, shot = browser_page
    page = root_page(new_page)
    community = team["community"]
    page.goto(f"{BASE}/admin/buzz/community/{community.pk}/change/")
    before = page.input_value("#id_public_url")
    page.fill("#id_public_url", "https://relay.example/")
    page.click("input[name=_save]")
    error = page.locator(".field-public_url .errorlist").inner_text()
    assert "public URL must be a ws:// or wss:// URL with a host" in error, error
    shot(page, "public-url-refused")
    community.refresh_from_db()
    assert community.public_url == before
