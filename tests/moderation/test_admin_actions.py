"""The moderation admin with Django's test client: who may do what, Django's delete turned off where it would
bypass resync, and every action run through its confirmation page into the moderation service, with a real
relay holding an open sync: the sync that must get a resync gets one, the others stay open.

What shows that the service ran: its effects (the revision withheld, the channel archived, the stamp
advanced) and the audit record only moderation.services writes, with the admin's name and reason.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib import admin as django_admin
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from artifacts.models import Artifact, Revision
from buzz.models import ApiToken, Ban, Channel, Community, Membership, PolicyStamp, RelayMember, StoredEvent, Timeout
from moderation import services
from moderation.models import AuditRecord, RetentionPolicy
from tests.moderation.admin_support import (
    client_for,
    make_moderator,
    make_superuser,
    moderators_group,
    run_action,
)
from tests.moderation.admin_support import write as write_http
from tests.moderation.moderation_support import open_syncs_counted
from tests.support.factories import make_token
from tests.support.wsclient import RelayClient
from tests.sync.support import RELAY_ENV, SyncState, World, follow, make_world, open_sync, revision, write

HOST = "mod-admin.test"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


def _resynced(state: SyncState) -> bool:
    return state.closed is not None and state.closed.startswith("resync:")


def audit(action: str) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(action=action).order_by("id"))


# --- rights ----------------------------------------------------------------------------------------------


def test_the_moderators_group_holds_exactly_the_moderation_rights(db: None) -> None:
    group = moderators_group()
    held = {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}
    assert held == {
        "buzz.view_channel",
        "artifacts.view_artifact",
        "artifacts.view_revision",
        "moderation.view_auditrecord",
        "moderation.redact_revision",
        "moderation.archive_channel",
    }


def test_a_moderator_sees_channels_artifacts_revisions_and_the_audit_log(world: World) -> None:
    client = client_for(make_moderator(), HOST)
    channel = Channel.objects.get(uuid=world.a)
    for page in (
        "/admin/",
        "/admin/buzz/channel/",
        f"/admin/buzz/channel/{channel.pk}/change/",
        "/admin/artifacts/artifact/",
        "/admin/artifacts/revision/",
        "/admin/moderation/auditrecord/",
    ):
        assert client.get(page).status_code == 200, page
    index = client.get("/admin/").content.decode()
    assert "Audit log" in index and "Revisions" in index and "Channels" in index
    # Nothing else is listed for a moderator.
    for hidden in ("Api tokens", "Communities", "Relay members", "Retention policies", "Bans"):
        assert hidden not in index, hidden
    # The channel actions a moderator has: archive and unarchive, not delete (redaction: the relay tests below).
    channels = client.get("/admin/buzz/channel/").content.decode()
    assert 'value="archive_channels"' in channels and 'value="unarchive_channels"' in channels
    assert 'value="delete_channels"' not in channels and 'value="delete_selected"' not in channels


def test_a_moderator_gets_403_on_tokens_communities_members_retention_and_channel_deletion(world: World) -> None:
    make_token(world.community, world.owner)
    channel = Channel.objects.get(uuid=world.a)
    member = RelayMember.objects.filter(community=world.community).first()
    assert member is not None
    policy = RetentionPolicy.objects.create(community=world.community, keep="1 00:00:00")
    client = client_for(make_moderator(), HOST)
    forbidden = [
        "/admin/buzz/apitoken/",
        f"/admin/buzz/apitoken/{ApiToken.objects.get(community=world.community).pk}/change/",
        "/admin/buzz/community/",
        f"/admin/buzz/community/{world.community.pk}/change/",
        "/admin/buzz/relaymember/",
        f"/admin/buzz/relaymember/{member.pk}/change/",
        "/admin/moderation/retentionpolicy/",
        f"/admin/moderation/retentionpolicy/{policy.pk}/change/",
        f"/admin/moderation/retentionpolicy/confirm/expire/?ids={policy.pk}",
        f"/admin/buzz/channel/confirm/delete/?ids={channel.pk}",
        f"/admin/buzz/channel/{channel.pk}/delete/",
        f"/admin/buzz/community/confirm/reset_policy/?ids={world.community.pk}",
    ]
    for page in forbidden:
        assert client.get(page).status_code == 403, page
    # Posting the delete-channel action itself does nothing: the action is not the moderator's.
    client.post("/admin/buzz/channel/", {"action": "delete_channels", "_selected_action": [str(channel.pk)]})
    channel.refresh_from_db()
    assert channel.deleted_at is None
    assert (
        client.post(
            f"/admin/buzz/channel/confirm/delete/?ids={channel.pk}", {"reason": "x", "_confirm": "1"}
        ).status_code
        == 403
    )
    channel.refresh_from_db()
    assert channel.deleted_at is None and not AuditRecord.objects.exists()


MODELS_WITHOUT_DELETE = [
    Artifact,
    Revision,
    Channel,
    Membership,
    Ban,
    ApiToken,
    Community,
    StoredEvent,
    RetentionPolicy,
    AuditRecord,
]


@pytest.mark.parametrize("model", MODELS_WITHOUT_DELETE, ids=lambda m: m.__name__)
def test_django_delete_is_off_where_it_would_bypass_resync(db: None, rf: Any, model: Any) -> None:
    user = make_superuser()
    request = rf.get("/admin/")
    request.user = user
    model_admin = django_admin.site._registry[model]
    assert model_admin.has_delete_permission(request) is False
    assert "delete_selected" not in model_admin.get_actions(request)


def test_relay_members_are_still_removed_through_their_service(db: None, rf: Any) -> None:
    # buzz/admin.py routes a relay member's deletion through communities.member_remove (which ends the
    # member's subscriptions): that one stays.
    request = rf.get("/admin/")
    request.user = make_superuser()
    model_admin = django_admin.site._registry[RelayMember]
    assert type(model_admin).delete_queryset is not django_admin.ModelAdmin.delete_queryset
    assert type(model_admin).delete_model is not django_admin.ModelAdmin.delete_model
    assert Timeout in django_admin.site._registry  # timeouts only limit writes: no resync to bypass


def test_artifacts_and_revisions_are_view_only_and_the_audit_log_is_titled(world: World) -> None:
    client = client_for(make_superuser(), HOST)
    for page in (
        "/admin/artifacts/artifact/add/",
        "/admin/artifacts/revision/add/",
        "/admin/moderation/auditrecord/add/",
    ):
        assert client.get(page).status_code == 403, page
    log = client.get("/admin/moderation/auditrecord/").content.decode()
    assert "<title>Audit log |" in log and "<h1>Audit log</h1>" in log


# --- actions, with a relay and open syncs -----------------------------------------------------------------


async def _two_revisions(
    w: RelayClient, world: World, h: uuid.UUID
) -> tuple[uuid.UUID, dict[str, Any], dict[str, Any]]:
    d = uuid.uuid4()
    created = revision(world.owner, d, h, "create")
    await write(w, created)
    updated = revision(world.owner, d, h, "update", prev=created["id"])
    await write(w, updated)
    return d, created, updated


async def _marker_arrives(
    w: RelayClient, r: RelayClient, sub: str, state: SyncState, world: World, h: uuid.UUID
) -> None:
    """A new revision in `h` reaches the sync: it is still open after whatever came before."""
    marker = revision(world.owner, uuid.uuid4(), h, "create")
    await write(w, marker)
    await follow(r, sub, state, lambda s: marker["id"] in {e["id"] for e in s.heads.values()})
    assert state.closed is None, state.closed


async def test_redacting_the_current_revision_in_the_admin_retires_it_and_resyncs_the_sync_on_both_nodes(
    world: World, relay_factory: Any
) -> None:
    node1, node2 = relay_factory(**RELAY_ENV), relay_factory(**RELAY_ENV)
    client = await sync_to_async(client_for)(await sync_to_async(make_moderator)(), HOST)
    async with (
        RelayClient.connect(node1.ws_url, host=HOST) as w,
        RelayClient.connect(node1.ws_url, host=HOST) as r1,
        RelayClient.connect(node2.ws_url, host=HOST) as r2,
    ):
        assert (await w.auth(world.owner))[2] is True
        assert (await r1.auth(world.reader))[2] is True
        assert (await r2.auth(world.reader))[2] is True
        d, created, updated = await _two_revisions(w, world, world.a)
        holds1 = await open_sync(r1, "holds", {"artifact": "current", "#h": [str(world.a)]})
        holds2 = await open_sync(r2, "holds", {"artifact": "current", "#h": [str(world.a)]})
        other = await open_sync(r2, "other", {"artifact": "current", "#h": [str(world.b)]})
        assert holds1.heads[str(d)]["id"] == updated["id"] == holds2.heads[str(d)]["id"]
        await open_syncs_counted(world.community, [world.a], 2)  # one on each node
        head = await Revision.objects.aget(id=updated["id"])
        done = await sync_to_async(run_action)(
            client, "/admin/artifacts/revision/", "redact", [head.seq], "spam in the title"
        )
        # The page said what would happen: this id withheld, this artifact retiring.
        assert updated["id"] in done.page and str(d) in done.page and "Artifacts that retire" in done.page
        assert done.open_syncs == 2  # the syncs over its channel on both nodes; not the one over b
        assert any("Redacted 1 revision(s); 1 artifact(s) retired; 2 open sync(s)" in m for m in done.messages), (
            done.messages
        )
        for r, held in ((r1, holds1), (r2, holds2)):
            await follow(r, "holds", held, lambda s: False)
            assert _resynced(held), held.closed
        await _marker_arrives(w, r2, "other", other, world, world.b)
    head = await Revision.objects.aget(id=updated["id"])
    assert head.redacted_at is not None
    assert (await Revision.objects.aget(id=created["id"])).redacted_at is None
    assert (await Artifact.objects.aget(community=world.community, d=d)).retired
    records = await sync_to_async(audit)("redact")
    assert len(records) == 1 and records[0].who == "admin:mod" and records[0].reason == "spam in the title"


def test_revisions_are_searchable_by_id_d_channel_and_author_and_filterable(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    d1 = uuid.uuid4()
    c1 = revision(world.owner, d1, world.a, "create")
    u1 = revision(world.owner, d1, world.a, "update", prev=c1["id"])
    c2 = revision(world.reader, uuid.uuid4(), world.b, "create")
    for signer, event in ((world.owner, c1), (world.owner, u1), (world.reader, c2)):
        write_http(relay, HOST, signer, event)
    services.redact(world.community, [c1["id"]], actor="test", reason="filter check")
    client = client_for(make_superuser(), HOST)

    def listed(query: str) -> set[str]:
        page = client.get(f"/admin/artifacts/revision/?{query}")
        assert page.status_code == 200, (query, page.status_code)
        html = page.content.decode()
        return {e["id"] for e in (c1, u1, c2) if e["id"] in html}

    everything = {c1["id"], u1["id"], c2["id"]}
    assert listed("") == everything
    assert listed(f"q={u1['id']}") == {u1["id"]}
    assert listed(f"q={u1['id'][:20]}") == {u1["id"]}
    assert listed(f"q={d1}") == {c1["id"], u1["id"]}
    assert listed(f"q={world.b}") == {c2["id"]}
    name_b = Channel.objects.get(uuid=world.b).name
    assert listed(f"q={name_b}") == {c2["id"]}
    assert listed(f"q={world.reader.pubkey}") == {c2["id"]}
    assert listed(f"channel={world.a}") == {c1["id"], u1["id"]}
    assert listed("op=update") == {u1["id"]}
    assert listed("op=create") == {c1["id"], c2["id"]}
    assert listed("redacted=yes") == {c1["id"]}
    assert listed("redacted=no") == {u1["id"], c2["id"]}
    assert listed("expired=yes") == set()
    assert listed("expired=no") == everything

    # A page costs the same queries whatever its number of rows (channel names and heads are annotated).
    def queries(page: str) -> int:
        with CaptureQueriesContext(connection) as seen:
            assert client.get(page).status_code == 200
        return len(seen.captured_queries)

    pages = ("/admin/artifacts/revision/", "/admin/artifacts/artifact/")
    before = [queries(page) for page in pages]
    for _ in range(4):
        write_http(relay, HOST, world.owner, revision(world.owner, uuid.uuid4(), world.a, "create"))
    assert [queries(page) for page in pages] == before


async def test_redacting_an_old_revision_keeps_the_head_and_the_sync(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    client = await sync_to_async(client_for)(await sync_to_async(make_superuser)(), HOST)
    async with RelayClient.connect(relay.ws_url, host=HOST) as w, RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await w.auth(world.owner))[2] is True
        assert (await r.auth(world.reader))[2] is True
        d, created, updated = await _two_revisions(w, world, world.a)
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
        old = await Revision.objects.aget(id=created["id"])
        done = await sync_to_async(run_action)(client, "/admin/artifacts/revision/", "redact", [old.seq], "leaked")
        assert created["id"] in done.page and "none: every artifact keeps its current revision" in done.page
        await _marker_arrives(w, r, "s", state, world, world.a)
        assert state.heads[str(d)]["id"] == updated["id"]
    assert (await Revision.objects.aget(id=created["id"])).redacted_at is not None
    assert not (await Artifact.objects.aget(community=world.community, d=d)).retired


async def test_archive_and_unarchive_in_the_admin_leave_open_syncs_open(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    client = await sync_to_async(client_for)(await sync_to_async(make_moderator)(), HOST)
    channel = await Channel.objects.aget(uuid=world.a)
    async with RelayClient.connect(relay.ws_url, host=HOST) as w, RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await w.auth(world.owner))[2] is True
        assert (await r.auth(world.reader))[2] is True
        d, _, _ = await _two_revisions(w, world, world.a)
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a), str(world.b)]})
        archived = await sync_to_async(run_action)(
            client, "/admin/buzz/channel/", "archive_channels", [channel.pk], "project finished"
        )
        assert "Open syncs that get a resync" in archived.page and channel.name in archived.page
        assert archived.open_syncs == 0  # archive ends no sync, open or not
        assert (await Channel.objects.aget(pk=channel.pk)).archived_at is not None
        await _marker_arrives(w, r, "s", state, world, world.b)
        assert str(d) in state.heads  # reads unchanged
        unarchived = await sync_to_async(run_action)(
            client, "/admin/buzz/channel/", "unarchive_channels", [channel.pk], "reopened"
        )
        assert any("Unarchived 1 channel" in m for m in unarchived.messages), unarchived.messages
        assert (await Channel.objects.aget(pk=channel.pk)).archived_at is None
        await _marker_arrives(w, r, "s", state, world, world.a)  # writes allowed again, sync still open
    assert [a.reason for a in await sync_to_async(audit)("archive")] == ["project finished"]
    assert [a.reason for a in await sync_to_async(audit)("unarchive")] == ["reopened"]


async def test_deleting_a_channel_in_the_admin_resyncs_the_syncs_that_cover_it(
    world: World, relay_factory: Any
) -> None:
    relay = relay_factory(**RELAY_ENV)
    client = await sync_to_async(client_for)(await sync_to_async(make_superuser)(), HOST)
    channel = await Channel.objects.aget(uuid=world.a)
    async with RelayClient.connect(relay.ws_url, host=HOST) as w, RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await w.auth(world.owner))[2] is True
        assert (await r.auth(world.reader))[2] is True
        d, _, _ = await _two_revisions(w, world, world.a)
        covers = await open_sync(r, "covers", {"artifact": "current", "#h": [str(world.a), str(world.b)]})
        other = await open_sync(r, "other", {"artifact": "current", "#h": [str(world.b)]})
        await open_syncs_counted(world.community, [world.a, world.b], 2)
        done = await sync_to_async(run_action)(client, "/admin/buzz/channel/", "delete_channels", [channel.pk], "abuse")
        assert str(d) in done.page and "This cannot be undone" in done.page
        assert done.open_syncs == 1  # the sync that covers the channel; not the one over b only
        await follow(r, "covers", covers, lambda s: False)
        assert _resynced(covers), covers.closed
        await _marker_arrives(w, r, "other", other, world, world.b)
    assert (await Channel.objects.aget(pk=channel.pk)).deleted_at is not None
    assert [a.reason for a in await sync_to_async(audit)("delete_channel")] == ["abuse"]


async def test_expire_now_previews_dry_runs_and_expires_without_touching_heads_or_syncs(
    world: World, relay_factory: Any
) -> None:
    relay = relay_factory(**RELAY_ENV)
    client = await sync_to_async(client_for)(await sync_to_async(make_superuser)(), HOST)
    # The policy is set through the admin's form, which calls set_retention.
    added = await sync_to_async(client.post)(
        "/admin/moderation/retentionpolicy/add/", {"community": world.community.pk, "keep": "0s"}
    )
    assert added.status_code == 302, added.content[:500]
    policy = await RetentionPolicy.objects.aget(community=world.community)
    assert policy.keep.total_seconds() == 0
    assert len(await sync_to_async(audit)("retention_set")) == 1
    async with RelayClient.connect(relay.ws_url, host=HOST) as w, RelayClient.connect(relay.ws_url, host=HOST) as r:
        assert (await w.auth(world.owner))[2] is True
        assert (await r.auth(world.reader))[2] is True
        d, created, updated = await _two_revisions(w, world, world.a)
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
        dry = await sync_to_async(run_action)(
            client, "/admin/moderation/retentionpolicy/", "expire_now", [policy.pk], "monthly", button="_dry_run"
        )
        assert "Dry run: 1 revision(s) would expire. Nothing was changed." in dry.done, dry.done
        assert await Revision.objects.filter(community=world.community, expired_at__isnull=False).acount() == 0
        done = await sync_to_async(run_action)(
            client, "/admin/moderation/retentionpolicy/", "expire_now", [policy.pk], "monthly"
        )
        assert created["id"] in done.page  # the preview listed what expires
        assert any("Expired" in m for m in done.messages), done.messages
        await _marker_arrives(w, r, "s", state, world, world.a)
        assert state.heads[str(d)]["id"] == updated["id"]
    assert (await Revision.objects.aget(id=created["id"])).expired_at is not None
    assert (await Revision.objects.aget(id=updated["id"])).expired_at is None
    assert len(await sync_to_async(audit)("expire")) >= 1


async def test_policy_reset_in_the_admin_advances_the_stamp_and_resyncs_every_sync(
    world: World, relay_factory: Any
) -> None:
    relay = relay_factory(**RELAY_ENV)
    client = await sync_to_async(client_for)(await sync_to_async(make_superuser)(), HOST)
    before = await PolicyStamp.objects.filter(community=world.community).values_list("stamp", flat=True).afirst() or 0
    # One connection per sync: following one sync skips the other's messages on a shared connection.
    async with RelayClient.connect(relay.ws_url, host=HOST) as r, RelayClient.connect(relay.ws_url, host=HOST) as r2:
        assert (await r.auth(world.reader))[2] is True
        assert (await r2.auth(world.owner))[2] is True
        state = await open_sync(r, "s", {"artifact": "current", "#h": [str(world.a)]})
        other = await open_sync(r2, "other", {"artifact": "current", "#h": [str(world.private)]})
        await open_syncs_counted(world.community, [world.a, world.private], 2)
        done = await sync_to_async(run_action)(
            client, "/admin/buzz/community/", "reset_policies", [world.community.pk], "purge recovery rows"
        )
        assert done.open_syncs == 2  # every sync of the community
        assert HOST in done.page and any("Reset the access policy" in m for m in done.messages), done.messages
        for conn, sub, held in ((r, "s", state), (r2, "other", other)):
            await follow(conn, sub, held, lambda s: False)
            assert _resynced(held), held.closed
    after = await PolicyStamp.objects.filter(community=world.community).values_list("stamp", flat=True).afirst()
    assert after is not None and after > before
    assert [a.reason for a in await sync_to_async(audit)("policy_reset")] == ["purge recovery rows"]


def test_a_confirmation_without_a_reason_does_nothing(world: World) -> None:
    client: Client = client_for(make_superuser(), HOST)
    channel = Channel.objects.get(uuid=world.a)
    chosen = client.post("/admin/buzz/channel/", {"action": "archive_channels", "_selected_action": [str(channel.pk)]})
    page = client.post(chosen["Location"], {"reason": "", "_confirm": "1"})
    assert page.status_code == 200 and "This field is required" in page.content.decode()
    channel.refresh_from_db()
    assert channel.archived_at is None and not AuditRecord.objects.exists()


def test_the_retention_form_takes_the_commands_durations_and_saves_through_set_retention(world: World) -> None:
    client = client_for(make_superuser(), HOST)
    bad = client.post("/admin/moderation/retentionpolicy/add/", {"community": world.community.pk, "keep": "90 days"})
    assert bad.status_code == 200 and "invalid duration" in bad.content.decode()
    for too_long in ("36501d", "99999999999999999999d"):
        refused = client.post(
            "/admin/moderation/retentionpolicy/add/", {"community": world.community.pk, "keep": too_long}
        )
        text = refused.content.decode()
        assert refused.status_code == 200 and ("at most 36500d" in text or "too long" in text), too_long
    assert not RetentionPolicy.objects.exists() and not AuditRecord.objects.exists()
    added = client.post("/admin/moderation/retentionpolicy/add/", {"community": world.community.pk, "keep": "12h"})
    assert added.status_code == 302
    policy = RetentionPolicy.objects.get(community=world.community)
    assert policy.keep.total_seconds() == 12 * 3600
    page = client.get(f"/admin/moderation/retentionpolicy/{policy.pk}/change/").content.decode()
    assert 'value="12h"' in page
    changed = client.post(f"/admin/moderation/retentionpolicy/{policy.pk}/change/", {"keep": "90d"})
    assert changed.status_code == 302
    policy.refresh_from_db()
    assert policy.keep.days == 90
    records = audit("retention_set")
    assert [r.who for r in records] == ["admin:root", "admin:root"]


def test_a_confirmation_page_with_bad_or_no_ids_goes_back_and_an_unknown_step_is_403(world: World) -> None:
    client = client_for(make_superuser(), HOST)
    for ids in ("", "abc", "999999", ",".join(str(n) for n in range(1, 300))):
        page = client.get(f"/admin/buzz/channel/confirm/archive/?ids={ids}")
        assert page.status_code == 302 and page["Location"] == "/admin/buzz/channel/", ids
        posted = client.post(f"/admin/buzz/channel/confirm/archive/?ids={ids}", {"reason": "x", "_confirm": "1"})
        assert posted.status_code == 302, ids
    assert client.get("/admin/buzz/channel/confirm/nothing/?ids=1").status_code == 403
    assert not AuditRecord.objects.exists()
    assert not Channel.objects.filter(archived_at__isnull=False).exists()
