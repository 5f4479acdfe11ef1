"""Operator commands: community, channel, token and ban, through call_command, and their --help."""

from __future__ import annotations

import datetime as dt
import io
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from buzz.models import ApiToken, Ban, Channel, Community, Membership, RelayMember, StoredEvent, Timeout
from buzz.nostr import Signer

BASE_DIR = Path(__file__).resolve().parents[2]
HOST = "ops.test"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def fails(*args: str) -> str:
    with pytest.raises(CommandError) as err:
        run(*args)
    return str(err.value)


def pk() -> str:
    return Signer.generate().pubkey


@pytest.fixture
def host(db: None) -> str:
    run("community", "create", "--host", HOST, "--name", "Ops")
    return HOST


HELP_ARGVS = [
    ["community", "--help"],
    ["community", "create", "--help"],
    ["channel", "--help"],
    ["channel", "create", "--help"],
    ["channel", "archive", "--help"],
    ["token", "--help"],
    ["token", "create", "--help"],
    ["ban", "--help"],
    ["ban", "timeout", "--help"],
]


def test_help_exits_zero_and_describes_each_command() -> None:
    # All at once: each is a separate Python start-up.
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", *argv],
            cwd=BASE_DIR,
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in HELP_ARGVS
    ]
    for argv, proc in zip(HELP_ARGVS, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (argv, err)
        assert "usage:" in out, argv
        if len(argv) == 2:  # the command's own help lists its actions
            assert "ACTION" in out, argv
        else:
            assert "--host" in out, argv


# --- community -------------------------------------------------------------------------


def test_community_create_add_member_and_list(db: None) -> None:
    owner = pk()
    out = run("community", "create", "--host", "Team.Example", "--name", "Team", "--owner", owner)
    c = Community.objects.get(host="team.example")
    assert out.startswith("created community 'Team' at team.example (ws://team.example/)")
    assert RelayMember.objects.get(community=c, pubkey=owner).role == "owner"
    member = pk()
    assert run("community", "add-member", "--host", "team.example", member) == (
        f"added {member} as member of team.example\n"
    )
    assert run("community", "add-member", "--host", "team.example", member, "--role", "admin") == (
        f"updated {member} as admin of team.example\n"
    )
    listing = run("community", "list")
    assert "team.example\tTeam\tws://team.example/\tmembers\t2 members\t" + c.relay_pubkey in listing


def test_community_errors_are_clear(host: str) -> None:
    assert (
        fails("community", "create", "--host", HOST, "--name", "Again") == f"a community for host {HOST} already exists"
    )
    assert fails("community", "create", "--host", "x.test", "--name", "X", "--owner", "nope") == (
        "invalid pubkey 'nope': expected 64 lowercase hex characters"
    )
    for url in ("http://y.test/", "wss://", "wss://user@y.test/"):
        assert fails("community", "create", "--host", "y.test", "--name", "Y", "--public-url", url) == (
            "public URL must be a ws:// or wss:// URL with a host, e.g. wss://relay.example.com/"
        ), url
    assert fails("community", "create", "--host", "bad host!", "--name", "Z").startswith("invalid host 'bad host!'")
    assert fails("community", "add-member", "--host", "nowhere.test", pk()) == "no community for host nowhere.test"
    assert fails("community", "add-member", "--host", HOST, "ABC") == (
        "invalid pubkey 'ABC': expected 64 lowercase hex characters"
    )
    assert "invalid choice: 'king'" in fails("community", "add-member", "--host", HOST, pk(), "--role", "king")
    assert Community.objects.count() == 1


# --- channel ---------------------------------------------------------------------------


def test_channel_create_members_archive_delete_and_list(host: str) -> None:
    owner, member = pk(), pk()
    ch = str(uuid.uuid4())
    out = run(
        "channel",
        "create",
        "--host",
        host,
        "--name",
        "general",
        "--owner",
        owner,
        "--id",
        ch,
        "--visibility",
        "private",
    )
    assert out == f"created stream channel 'general' {ch} (private)\n"
    row = Channel.objects.get(uuid=ch)
    assert run("channel", "add-member", "--host", host, ch, member, "--role", "admin") == f"{member} is admin of {ch}\n"
    assert Membership.objects.get(channel=row, pubkey=member, removed_at__isnull=True).role == "admin"
    # Without --role an existing member keeps their role (as a kind-9000 naming no role does).
    assert run("channel", "add-member", "--host", host, ch, member) == f"{member} is admin of {ch}\n"
    assert run("channel", "remove-member", "--host", host, ch, member) == f"removed {member} from {ch}\n"
    assert Membership.objects.get(channel=row, pubkey=member).removed_at is not None
    assert run("channel", "archive", "--host", host, ch) == f"archived {ch}\n"
    row.refresh_from_db()
    assert row.archived_at is not None
    assert f"{ch}\tgeneral\tstream\tprivate\tarchived\t1 members" in run("channel", "list", "--host", host)
    assert run("channel", "unarchive", "--host", host, ch) == f"unarchived {ch}\n"
    row.refresh_from_db()
    assert row.archived_at is None
    assert run("channel", "delete", "--host", host, ch, "--yes") == f"deleted {ch}\n"
    row.refresh_from_db()
    assert row.deleted_at is not None
    assert f"{ch}\tgeneral\tstream\tprivate\tdeleted" in run("channel", "list", "--host", host)
    # The relay-signed state follows the commands (and goes with the deleted channel).
    assert not StoredEvent.objects.filter(channel_id=ch).exists()


def test_channel_create_makes_a_dm_with_participants(host: str) -> None:
    a, b = pk(), pk()
    out = run("channel", "create", "--host", host, "--name", "chat", "--owner", a, "--type", "dm", "--participant", b)
    row = Channel.objects.get(name="chat")
    assert out == f"created dm channel 'chat' {row.uuid} (private)\n"
    assert set(Membership.objects.filter(channel=row).values_list("pubkey", flat=True)) == {a, b}


def test_channel_errors_are_clear(host: str) -> None:
    owner = pk()
    ch = str(uuid.uuid4())
    run("channel", "create", "--host", host, "--name", "general", "--owner", owner, "--id", ch)
    missing = str(uuid.uuid4())
    assert fails("channel", "list", "--host", "nowhere.test") == "no community for host nowhere.test"
    assert fails("channel", "create", "--host", host, "--name", "x", "--owner", "nope") == (
        "invalid pubkey 'nope': expected 64 lowercase hex characters"
    )
    assert fails("channel", "create", "--host", host, "--name", "x", "--owner", owner, "--id", ch.upper()) == (
        f"invalid channel id {ch.upper()!r}: expected a non-nil lowercase hyphenated UUID"
    )
    assert fails("channel", "create", "--host", host, "--name", "x", "--owner", owner, "--id", ch) == (
        "invalid: that channel id is taken"
    )
    assert (
        fails("channel", "create", "--host", host, "--name", " ", "--owner", owner) == "invalid: channel needs a name"
    )
    assert fails("channel", "add-member", "--host", host, "not-a-uuid", owner) == (
        "invalid channel id 'not-a-uuid': expected a lowercase UUID"
    )
    assert fails("channel", "add-member", "--host", host, ch, "XYZ") == (
        "invalid pubkey 'XYZ': expected 64 lowercase hex characters"
    )
    assert (
        fails("channel", "remove-member", "--host", host, ch, owner)
        == "invalid: the last owner can't leave or be removed"
    )
    assert fails("channel", "remove-member", "--host", host, ch, pk()) == "invalid: that pubkey is not a member"
    assert fails("channel", "add-member", "--host", host, ch, owner, "--role", "member") == (
        "invalid: the last owner can't be demoted"
    )
    assert fails("channel", "delete", "--host", host, ch).startswith("deleting a channel ends its subscriptions")
    assert Channel.objects.get(uuid=ch).deleted_at is None
    # A missing channel is named as such: an operator is not a client to be kept guessing.
    for action in (
        ["add-member", missing, pk()],
        ["remove-member", missing, pk()],
        ["archive", missing],
        ["unarchive", missing],
        ["delete", missing, "--yes"],
    ):
        assert fails("channel", action[0], "--host", host, *action[1:]) == f"no channel {missing} in {host}", action


# --- token -----------------------------------------------------------------------------


def test_token_create_list_and_revoke(host: str) -> None:
    who = pk()
    ch = str(uuid.uuid4())
    out = run(
        "token",
        "create",
        "--host",
        host,
        who,
        "--scope",
        "messages:read",
        "--scope",
        "messages:write",
        "--channel",
        ch,
        "--expires-in",
        "2h",
        "--name",
        "bot",
    )
    lines = out.splitlines()
    assert len(lines) == 2 and lines[1].startswith("buzz_")
    row = ApiToken.objects.get(pubkey=who)
    assert (row.scopes, row.channels, row.name) == (["messages:read", "messages:write"], [ch], "bot")
    assert row.expires_at is not None
    assert timezone.now() + dt.timedelta(minutes=119) < row.expires_at <= timezone.now() + dt.timedelta(hours=2)
    listing = run("token", "list", "--host", host)
    assert f"{row.pk}\t{row.prefix}…\t{who}\tmessages:read,messages:write\t{ch}\t" in listing
    assert lines[1] not in listing and listing.rstrip().endswith("active")
    assert run("token", "revoke", "--host", host, str(row.pk)) == f"revoked token {row.pk} ({row.prefix}…)\n"
    row.refresh_from_db()
    assert row.revoked_at is not None
    assert run("token", "list", "--host", host, "--pubkey", who).rstrip().endswith("revoked")


def test_token_errors_are_clear(host: str) -> None:
    who = pk()
    assert fails("token", "create", "--host", host, who, "--scope", "messages:fly").startswith(
        "unknown scope 'messages:fly'; known: "
    )
    assert fails("token", "create", "--host", host, "nope", "--scope", "messages:read") == (
        "invalid pubkey 'nope': expected 64 lowercase hex characters"
    )
    assert fails("token", "create", "--host", host, who, "--scope", "messages:read", "--channel", "general") == (
        "invalid channel id 'general': expected a lowercase UUID"
    )
    assert fails("token", "create", "--host", host, who, "--scope", "messages:read", "--expires-in", "soon") == (
        "invalid duration 'soon': use a number and s, m, h or d (e.g. 30m, 7d)"
    )
    assert "--scope" in fails("token", "create", "--host", host, who)
    assert fails("token", "revoke", "--host", host, "999999") == "no token with id 999999"
    assert ApiToken.objects.count() == 0


def test_token_revoke_leaves_another_communitys_token_alone(host: str) -> None:
    run("community", "create", "--host", "other.test", "--name", "Other")
    run("token", "create", "--host", "other.test", pk(), "--scope", "messages:read")
    theirs = ApiToken.objects.get()
    assert fails("token", "revoke", "--host", host, str(theirs.pk)) == f"no token with id {theirs.pk} in {host}"
    theirs.refresh_from_db()
    assert theirs.revoked_at is None


# --- ban -------------------------------------------------------------------------------


def test_ban_add_lift_timeout_and_list(host: str) -> None:
    c = Community.objects.get(host=host)
    forever, week, quiet = pk(), pk(), pk()
    assert run("ban", "add", "--host", host, forever, "--reason", "spam") == f"banned {forever}\n"
    assert run("ban", "add", "--host", host, week, "--for", "7d").startswith(f"banned {week} until ")
    ban = Ban.objects.get(pubkey=week)
    assert ban.expires_at is not None and ban.expires_at > timezone.now() + dt.timedelta(days=6)
    listing = run("ban", "list", "--host", host)
    assert f"{forever}\t" in listing and "\tspam" in listing and f"{week}\t" in listing
    assert run("ban", "lift", "--host", host, forever) == f"lifted 1 ban(s) of {forever}\n"
    assert Ban.objects.get(pubkey=forever).lifted_at is not None
    assert f"{forever}\t" not in run("ban", "list", "--host", host)
    assert run("ban", "lift", "--host", host, forever) == f"lifted 0 ban(s) of {forever}\n"
    out = run("ban", "timeout", "--host", host, quiet, "--for", "30m", "--reason", "cool off")
    assert out.startswith(f"timed out {quiet} until ") and out.endswith(" UTC\n")
    t = Timeout.objects.get(community=c, pubkey=quiet)
    assert dt.timedelta(minutes=29) < t.until - timezone.now() <= dt.timedelta(minutes=30)


def test_ban_list_shows_only_bans_in_force(host: str) -> None:
    old = pk()
    run("ban", "add", "--host", host, old, "--for", "1d")
    Ban.objects.filter(pubkey=old).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert old not in run("ban", "list", "--host", host)


def test_ban_errors_are_clear(host: str) -> None:
    assert fails("ban", "add", "--host", host, "nope") == "invalid pubkey 'nope': expected 64 lowercase hex characters"
    assert fails("ban", "add", "--host", "nowhere.test", pk()) == "no community for host nowhere.test"
    assert fails("ban", "add", "--host", host, pk(), "--for", "forever") == (
        "invalid duration 'forever': use a number and s, m, h or d (e.g. 30m, 7d)"
    )
    # A zero-length ban is a mistake, not a ban until lifted.
    assert fails("ban", "add", "--host", host, pk(), "--for", "0d") == "a ban duration must be positive"
    assert fails("ban", "timeout", "--host", host, pk(), "--for", "0m") == "a timeout needs a positive duration"
    assert "--for" in fails("ban", "timeout", "--host", host, pk())
    assert Ban.objects.count() == 0 and Timeout.objects.count() == 0
