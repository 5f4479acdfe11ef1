"""What manage.py takes from var/ (buzz.dev.devservices.checkout_environment), over real files and processes.

The records are the ones `make run` writes (var/postgres/owner.json, var/redis/state.json);
the owner is this test process (alive) or one that has exited. test_make_run.py covers the
same rules end to end against a running `make run`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil
import pytest

from buzz.dev.devservices import checkout_environment, checkout_hint

PG_PORT, REDIS_PORT = 45432, 46379
FOUND = {
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:{PG_PORT}/buzz",
    "REDIS_URL": f"redis://127.0.0.1:{REDIS_PORT}/0",
    "BUZZ_DEV": "1",
}


def _owner(alive: bool) -> dict[str, float]:
    if alive:
        me = psutil.Process()
        return {"pid": me.pid, "create_time": me.create_time()}
    gone = subprocess.Popen(["true"])
    gone.wait()
    return {"pid": gone.pid, "create_time": 0.0}


def make_checkout(root: Path, *, owner_alive: bool = True, makefile: bool = True) -> Path:
    """A directory laid out like a checkout whose `make run` recorded its servers in var/."""
    (root / "buzz" / "dev").mkdir(parents=True)
    (root / "buzz" / "dev" / "devservices.py").write_text("")
    if makefile:
        (root / "Makefile").write_text("run:\n")
    owner = _owner(owner_alive)
    (root / "var" / "postgres").mkdir(parents=True)
    (root / "var" / "postgres" / "owner.json").write_text(json.dumps({**owner, "server_pid": 1, "port": PG_PORT}))
    (root / "var" / "redis").mkdir(parents=True)
    (root / "var" / "redis" / "state.json").write_text(
        json.dumps({**owner, "server_pid": 1, "server_create_time": 0.0, "port": REDIS_PORT})
    )
    return root


def test_a_running_make_run_supplies_the_unset_urls_and_dev_mode(tmp_path: Path) -> None:
    root = make_checkout(tmp_path)
    assert checkout_environment(root, {}) == FOUND
    assert checkout_environment(root, {"BUZZ_DEV": "1"}) == FOUND
    assert checkout_hint(root, FOUND) is None


def test_a_url_that_is_set_wins(tmp_path: Path) -> None:
    root = make_checkout(tmp_path)
    mine = "postgres://me@db.example/buzz"
    assert checkout_environment(root, {"DATABASE_URL": mine}) == {"REDIS_URL": FOUND["REDIS_URL"], "BUZZ_DEV": "1"}
    # Both set: no dev server is used, so dev mode is not turned on either.
    assert checkout_environment(root, {"DATABASE_URL": mine, "REDIS_URL": "redis://cache.example/0"}) == {}


@pytest.mark.parametrize("value", ["0", "false", "off", "no", ""])
def test_buzz_dev_off_means_no_look_up(tmp_path: Path, value: str) -> None:
    root = make_checkout(tmp_path)
    assert checkout_environment(root, {"BUZZ_DEV": value}) == {}
    assert checkout_hint(root, {"BUZZ_DEV": value}) is None  # settings' own message applies


def test_servers_whose_owner_is_gone_are_not_used(tmp_path: Path) -> None:
    root = make_checkout(tmp_path, owner_alive=False)
    assert checkout_environment(root, {}) == {}
    hint = checkout_hint(root, {})
    assert hint is not None and hint.startswith("DATABASE_URL and REDIS_URL are not set, and no `make run`")


def test_nothing_outside_a_dev_checkout(tmp_path: Path) -> None:
    root = make_checkout(tmp_path, makefile=False)
    assert checkout_environment(root, {}) == {}
    assert checkout_hint(root, {}) is None


def test_a_checkout_that_never_ran_make_run(tmp_path: Path) -> None:
    (tmp_path / "buzz" / "dev").mkdir(parents=True)
    (tmp_path / "buzz" / "dev" / "devservices.py").write_text("")
    (tmp_path / "Makefile").write_text("run:\n")
    assert checkout_environment(tmp_path, {}) == {}
    assert not (tmp_path / "var").exists()  # looking up creates nothing
    assert checkout_hint(tmp_path, {"REDIS_URL": "redis://x/0"}) == (
        f"DATABASE_URL is not set, and no `make run` is serving this checkout ({tmp_path / 'var'}): "
        "start `make run` in another shell, or set DATABASE_URL"
    )
