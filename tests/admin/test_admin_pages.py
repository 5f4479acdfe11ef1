"""The Django admin lists communities, members, channels, memberships, tokens and bans, and never shows secrets."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.identity.tokens import token_create
from buzz.models import Channel, Membership
from buzz.nostr import Signer

HOST = "admin.test"


@pytest.fixture
def admin_client(db: None) -> Client:
    user = User.objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client = Client(HTTP_HOST=HOST)
    # django-axes refuses authenticate() without a request (Client.login has none): log the user in directly.
    client.force_login(user)
    return client


@pytest.fixture
def data(db: None) -> dict[str, str]:
    owner = Signer.generate()
    community = community_create(host=HOST, name="Admin Test", owner=owner.pubkey)
    member_add(community=community, pubkey=Signer.generate().pubkey)
    cid = uuid.uuid4()
    channels.channel_create(community=community, channel_uuid=cid, name="general", creator=owner.pubkey)
    issued = token_create(community=community, pubkey=owner.pubkey, scopes=["messages:read"])
    return {"secret": community.relay_secret, "token": issued.token, "channel": str(cid), "owner": owner.pubkey}


def get(client: Client, path: str) -> str:
    # The admin is plain Django: the test client goes through Django directly, with the community's Host.
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return response.content.decode()


@pytest.mark.parametrize(
    "page", ["community", "relaymember", "channel", "membership", "apitoken", "ban", "timeout", "storedevent"]
)
def test_changelists_render(admin_client: Client, data: dict[str, str], page: str) -> None:
    get(admin_client, f"/admin/buzz/{page}/")


def test_lists_show_the_objects_and_hide_secrets(admin_client: Client, data: dict[str, str]) -> None:
    communities = get(admin_client, "/admin/buzz/community/")
    assert HOST in communities
    channel = Channel.objects.get(uuid=data["channel"])
    assert "general" in get(admin_client, "/admin/buzz/channel/")
    assert data["owner"] in get(admin_client, "/admin/buzz/membership/")
    community_page = get(admin_client, f"/admin/buzz/community/{channel.community_id}/change/")
    tokens = get(admin_client, "/admin/buzz/apitoken/")
    for page in (communities, community_page, tokens):
        assert data["secret"] not in page
        assert data["token"] not in page


def test_membership_removal_action_keeps_the_row(admin_client: Client, data: dict[str, str]) -> None:
    channel = Channel.objects.get(uuid=data["channel"])
    extra = Signer.generate().pubkey
    channels.member_put(community=channel.community, channel_uuid=channel.uuid, actor=None, pubkey=extra)
    m = Membership.objects.get(channel=channel, pubkey=extra)
    response = admin_client.post(
        "/admin/buzz/membership/", {"action": "remove_members", "_selected_action": [m.pk]}, follow=True
    )
    assert response.status_code == 200
    m.refresh_from_db()
    assert m.removed_at is not None
