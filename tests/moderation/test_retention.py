"""Retention (NIP-AR "Moderation and retention"): `manage.py retention` and the expiry it runs.

Expiry racing live writes loses no current head and breaks no prev check; an expired revision's
resubmission is still `duplicate:`; what incremental reads need (heads, move records, membership
removals) stays; a dry run changes nothing and a second run changes nothing; bad input is one line.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command

from artifacts.models import Artifact, MoveRemoval, Revision
from buzz.chat.channels import member_remove
from buzz.models import Membership, StoredEvent
from moderation import services
from moderation.models import AuditAction, AuditRecord
from tests.moderation.moderation_support import RELAY_ENV, World, make_world, view
from tests.support.factories import revision
from tests.support.wire import accept, logged_in, publish

HOST = "retention.test"


@pytest.fixture
def world(transactional_db: None) -> World:
    return make_world(HOST)


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command("retention", *args, stdout=out)
    return out.getvalue()


def _snapshot() -> list[tuple[str, Any, Any]]:
    return sorted(Revision.objects.values_list("id", "expired_at", "raw"))


async def test_expiry_racing_live_writes_keeps_heads_prev_and_duplicates(world: World, relay_factory: Any) -> None:
    relay = relay_factory(**RELAY_ENV)
    ch, dest = str(world.ch), str(world.other)
    run = sync_to_async(_run, thread_sensitive=False)
    async with logged_in(relay, world.author, host=HOST) as a:
        chains: dict[str, list[dict[str, Any]]] = {}
        for _ in range(4):
            d = str(uuid.uuid4())
            chains[d] = [revision(world.author, d=d, h=ch)]
            await accept(a, chains[d][0])
            for _ in range(3):
                event = revision(world.author, d=d, h=ch, op="update", prev=chains[d][-1]["id"])
                await accept(a, event)
                chains[d].append(event)
        moved = next(iter(chains))
        move = revision(world.author, d=moved, h=dest, op="move", prev=chains[moved][-1]["id"])
        await accept(a, move)
        chains[moved].append(move)
        assert "keeps all revision history" in await run("show", "--host", HOST)
        assert "keeps revision history for 0s" in await run("set", "--host", HOST, "--keep", "0s")

        # A membership removal: incremental reads replay it, so expiry must keep its row.
        await sync_to_async(
            lambda: member_remove(
                community=world.community, channel_uuid=world.ch, actor=None, pubkey=world.member.pubkey
            ),
            thread_sensitive=False,
        )()
        before = await sync_to_async(_snapshot, thread_sensitive=False)()
        dry = await run("run", "--host", HOST, "--dry-run")
        # 17 revisions: the 4 heads (the move one of them) and the revision the move replaced are kept.
        assert "would expire 12 revisions" in dry and "kept 5" in dry, dry
        assert await sync_to_async(_snapshot, thread_sensitive=False)() == before

        async def writes() -> None:
            for _ in range(3):
                for d, chain in chains.items():
                    h = dest if d == moved else ch
                    event = revision(world.author, d=d, h=h, op="update", prev=chain[-1]["id"])
                    await accept(a, event)
                    chain.append(event)

        output, _ = await asyncio.gather(run("run", "--host", HOST, "--batch-size", "2"), writes())
        assert "expired" in output and "so far" in output, output

        # No current head lost, on any artifact, whatever the interleaving.
        heads = sorted(chain[-1]["id"] for chain in chains.values())
        assert sorted(await view(relay, world, world.author, {"artifact": "current", "#h": [ch, dest]})) == heads
        stored_heads = await sync_to_async(
            lambda: sorted(str(h) for h in Artifact.objects.values_list("head_id", flat=True)), thread_sensitive=False
        )()
        assert stored_heads == heads
        # A second run expires what the racing writes made old, then a third changes nothing.
        await run("run", "--host", HOST)
        settled = await sync_to_async(_snapshot, thread_sensitive=False)()
        assert "expired 0 revisions" in await run("run", "--host", HOST)
        assert await sync_to_async(_snapshot, thread_sensitive=False)() == settled

        expired = {i for i, at, raw in settled if at is not None}
        assert all(raw == "" for i, at, raw in settled if i in expired)
        assert not expired & set(heads)
        first = chains[moved][0]
        assert first["id"] in expired
        # Tombstones keep the accepted-id record: a resubmission is a duplicate, not reapplied.
        again = await publish(a, first)
        assert again[2] is True and again[3].startswith("duplicate:"), again
        # An expired id named as prev is an ordinary conflict; the head still anchors the next edit.
        d = next(d for d in chains if d != moved)
        stale = await publish(a, revision(world.author, d=d, h=ch, op="update", prev=chains[d][1]["id"]))
        assert stale[2] is False and stale[3].startswith("conflict:"), stale
        nxt = revision(world.author, d=d, h=ch, op="update", prev=chains[d][-1]["id"])
        await accept(a, nxt)
        # History shows only what was kept; the stored copies of expired revisions are withheld too.
        history = await view(relay, world, world.author, {"artifact": "history", "#h": [ch], "#d": [d]})
        assert chains[d][1]["id"] not in history and nxt["id"] in history

    def kept() -> None:
        # The move and the revision it replaced stay with the removal (incremental reads of the source).
        removal = MoveRemoval.objects.get()
        assert Revision.objects.filter(id__in=[removal.move_id, removal.replaced], expired_at__isnull=True).count() == 2
        assert StoredEvent.objects.filter(id__in=expired, deleted_at__isnull=True).count() == 0
        assert Membership.objects.filter(pubkey=world.member.pubkey, channel__uuid=world.ch).get().removed_at
        records = AuditRecord.objects.filter(action=AuditAction.EXPIRE)
        assert records.count() >= 3 and all(r.who == services.COMMAND for r in records)

    await sync_to_async(kept, thread_sensitive=False)()


@pytest.mark.parametrize("keep", ["5y", "-3d", "ten", "1.5h", ""])
def test_bad_duration_is_one_line(keep: str) -> None:
    env = {**os.environ, "BUZZ_DEV": "1"}
    proc = subprocess.run(
        [sys.executable, "manage.py", "retention", "set", "--host", "x.test", f"--keep={keep}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "invalid duration" in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_run_without_a_policy_and_a_bad_batch_size_fail(transactional_db: None) -> None:
    world = make_world("retention-none.test")
    with pytest.raises(Exception, match="no retention policy"):
        _run("run", "--host", world.host)
    with pytest.raises(Exception, match="batch-size"):
        _run("run", "--batch-size", "0")
    assert "nothing to do" in _run("run")
    services.set_retention(world.community, dt.timedelta(days=90), actor="test")
    assert "keeps revision history for 90d" in _run("show", "--host", world.host)
    with pytest.raises(Exception, match="at most 36500d"):
        _run("set", "--host", world.host, "--keep", "36501d")
    assert "expired 0 revisions" in _run("run")
