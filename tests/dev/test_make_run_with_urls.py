"""`make run` with DATABASE_URL / REDIS_URL set: no embedded servers, and the command it prints
carries those URLs, so it still works verbatim in a fresh shell that has none of them."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from buzz.dev.devservices import free_port
from buzz.nostr import Signer
from tests.support.checkout import DevCheckout
from tests.support.relay import with_database_name

# Each starts `make run` in a fresh copy: initdb and every migration, slow on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def scratch_database() -> Iterator[str]:
    """A database of its own on the session's PostgreSQL, for `make run` to migrate; dropped afterwards."""
    name = f"buzz_i9_{secrets.token_hex(4)}"
    admin_url = with_database_name(os.environ["DATABASE_URL"], "postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database_name(os.environ["DATABASE_URL"], name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_printed_command_carries_the_urls_make_run_was_given(scratch_database: str) -> None:
    port = free_port()
    urls = {
        "DATABASE_URL": scratch_database,
        "REDIS_URL": os.environ["REDIS_URL"],
        "BUZZ_REDIS_PREFIX": f"buzztest-{secrets.token_hex(4)}:",
    }
    with DevCheckout.create() as checkout:
        make = checkout.start("make", "run", env={**urls, "PORT": str(port)})
        make.wait_for(r"^Buzz relay: ")
        printed = make.wait_for(r"^  (.*manage\.py community add-member .*)$").group(1)
        assert not (checkout.root / "var" / "redis").exists()  # nothing embedded was started
        assert not (checkout.root / "var" / "postgres").exists()
        for name, value in urls.items():
            assert f"{name}={value}" in printed, printed
        assert "BUZZ_DEV=1" in printed

        signer = Signer.generate()
        result = checkout.shell(printed.replace("<pubkey-hex>", signer.pubkey))
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"added {signer.pubkey} as owner of localhost:{port}"

    with psycopg.connect(scratch_database) as conn:
        row = conn.execute(
            "SELECT m.role FROM buzz_relaymember m JOIN buzz_community c ON c.id = m.community_id "
            "WHERE c.host = %s AND m.pubkey = %s",
            [f"localhost:{port}", signer.pubkey],
        ).fetchone()
    assert row == ("owner",)
