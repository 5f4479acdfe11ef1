"""The write pool's sessions plan each hot write statement once, generically (buzz.runtime.WRITE_SESSION_OPTIONS).

Left to PostgreSQL's default (plan_cache_mode = auto), a prepared kind-9 statement was planned again on
every execution: its custom plans fold the parameters in and always look cheaper than the generic one,
and planning the statement cost the server more than running it. The generic plans themselves are
checked by tests/chat/test_hot_plans.py (no scan proportional to a channel on never-analyzed tables).

Method: real writes (kind-9 messages, an artifact create, updates, a delete and a restore) go through
buzz.events.ingest on buzz.runtime's pools against the test database, each sent several times over so
that psycopg prepares its statements. Then every connection of the write pool is asked for its prepared
statements (pg_prepared_statements, PostgreSQL 14+): each has generic plans only, never a custom one.
The operator's PGOPTIONS is kept: a setting given there reaches the write sessions too.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from buzz.events.ingest import ingest
from buzz.models import Community
from buzz.nostr import Signer
from buzz.runtime import runtime
from tests.support.factories import make_channel, make_community, message, revision
from tests.support.inprocess import actor_of, every_connection

HOST = "write-plans.test"
SENDS = 6  # past psycopg's prepare threshold, and past PostgreSQL's five custom plans under auto


@pytest.fixture
def room(transactional_db: None, settings: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Community, Signer, str]:
    settings.BUZZ_WRITE_QUOTA = {"per_second": 0.0, "burst": 0.0}
    # An operator's own session setting, which must survive the write pool's options.
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=4321")
    alice = Signer.generate()
    community = make_community(HOST, members=[alice])
    return community, alice, str(make_channel(community, alice, visibility="private"))


async def _write_everything(community: Community, alice: Signer, channel: str) -> None:
    actor = actor_of(community, alice)
    for _ in range(SENDS):
        result = await ingest(actor, message(alice, channel))
        assert result[1].ok, result
    d = uuid.uuid4()
    head = revision(alice, d=d, h=channel)
    assert (await ingest(actor, head))[1].ok
    for _ in range(SENDS):
        head = revision(alice, d=d, h=channel, op="update", prev=head["id"])
        assert (await ingest(actor, head))[1].ok
    for op in ("delete", "restore") * SENDS:
        head = revision(alice, d=d, h=channel, op=op, prev=head["id"])
        result = await ingest(actor, head)
        assert result[1].ok, result
    for _ in range(SENDS):
        assert (await ingest(actor, revision(alice, d=uuid.uuid4(), h=channel)))[1].ok


async def test_write_sessions_use_generic_plans_only(room: tuple[Community, Signer, str]) -> None:
    try:
        await _write_everything(*room)
        statements = await _write_sessions()
    finally:
        # The pools and Redis clients belong to this test's event loop: closed with it.
        await runtime.aclose()
    texts = " ".join(statement for _, _, statement in statements)
    # The kind-9 statement and the revision statements were prepared, so the check is not vacuous.
    assert "buzz_messagecounter" in texts and "artifacts_revision" in texts, texts[:500]
    assert all(generic > 0 and custom == 0 for generic, custom, _ in statements), [
        (generic, custom, statement[:80]) for generic, custom, statement in statements
    ]


async def _write_sessions() -> list[tuple[int, int, str]]:
    """The prepared statements of every write-pool connection, each checked for its session settings."""
    statements: list[tuple[int, int, str]] = []
    async with every_connection(await runtime.write_pool()) as connections:
        for conn in connections:
            settings_row = await (
                await conn.execute("SELECT current_setting('plan_cache_mode'), current_setting('lock_timeout')")
            ).fetchone()
            assert settings_row == ("force_generic_plan", "4321ms")
            rows = await (
                await conn.execute("SELECT generic_plans, custom_plans, statement FROM pg_prepared_statements")
            ).fetchall()
            statements.extend(rows)
    return statements


async def test_the_read_pool_keeps_the_servers_choice(room: tuple[Community, Signer, str]) -> None:
    # Reads choose per statement (some force custom plans in their own transaction): not forced here.
    try:
        pool = await runtime.pool()
        async with pool.connection() as conn:
            row = await (
                await conn.execute("SELECT current_setting('plan_cache_mode'), current_setting('lock_timeout')")
            ).fetchone()
    finally:
        await runtime.aclose()
    assert row == ("auto", "4321ms")
