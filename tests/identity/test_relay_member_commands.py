"""`manage.py community remove-member` and `community members`, and the service behind them.

What a removal does to open connections is tested against real relays in
tests/live/test_revocation.py; here: the command's answers and errors.
"""

from __future__ import annotations

import io

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from buzz.identity.communities import community_create, member_add, member_remove
from buzz.models import Community, RelayMember
from buzz.nostr import Signer

HOST = "members-cli.test"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def fails(*args: str) -> str:
    with pytest.raises(CommandError) as err:
        run(*args)
    return str(err.value)


@pytest.fixture
def community(db: None) -> Community:
    return community_create(host=HOST, name="Members CLI")


def test_remove_member_removes_only_that_member(community: Community) -> None:
    gone, stays = Signer.generate().pubkey, Signer.generate().pubkey
    member_add(community=community, pubkey=gone)
    member_add(community=community, pubkey=stays, role="admin")
    other = community_create(host="elsewhere.test", name="Elsewhere")
    member_add(community=other, pubkey=gone)

    assert run("community", "remove-member", "--host", HOST, gone) == f"removed {gone} from {HOST}\n"
    assert list(community.members.values_list("pubkey", flat=True)) == [stays]
    assert RelayMember.objects.filter(community=other, pubkey=gone).exists(), "another community keeps it"
    listing = run("community", "members", "--host", HOST)
    assert listing.startswith(f"{stays}\tadmin\t") and gone not in listing


def test_remove_member_errors_say_what_is_wrong(community: Community) -> None:
    stranger = Signer.generate().pubkey
    assert fails("community", "remove-member", "--host", HOST, stranger) == (
        f"{stranger} is not a relay member of {HOST}"
    )
    assert fails("community", "remove-member", "--host", "nowhere.test", stranger) == (
        "no community for host nowhere.test"
    )
    assert "expected 64 lowercase hex" in fails("community", "remove-member", "--host", HOST, "ABC")


def test_member_remove_service(community: Community) -> None:
    pubkey = Signer.generate().pubkey
    member_add(community=community, pubkey=pubkey)
    assert member_remove(community=community, pubkey=pubkey) is True
    assert member_remove(community=community, pubkey=pubkey) is False
    with pytest.raises(ValidationError):
        member_remove(community=community, pubkey="not-a-key")


@pytest.mark.parametrize("action", ["remove-member", "members"])
def test_help(action: str) -> None:
    with pytest.raises(SystemExit) as done:
        run("community", action, "--help")
    assert done.value.code == 0
