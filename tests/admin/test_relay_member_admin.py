"""Relay members in the admin go through the one service: a removal there tells every node at once.

Deleting a RelayMember (its delete page, the "delete selected" action, or the inline on the
community page) goes through buzz.identity.communities.member_remove, which publishes a
standing signal on the pubkey's topic after commit; the live tests (tests/live/test_revocation.py)
show what the relay does with it. A member's pubkey can't be edited in place, which would
be a removal nobody is told of.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client

from buzz.identity.communities import community_create, member_add
from buzz.live import signals
from buzz.models import Community, RelayMember
from buzz.nostr import Signer

HOST = "members-admin.test"


@pytest.fixture
def admin_client(transactional_db: None) -> Client:
    # transactional_db: the signal is published on commit, which a wrapping test transaction would withhold.
    user = User.objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client = Client(HTTP_HOST=HOST)
    # force_login: django-axes needs the request to authenticate a password login (tests/admin/test_admin_lockout.py).
    client.force_login(user)
    return client


@pytest.fixture
def community(transactional_db: None) -> Community:
    return community_create(host=HOST, name="Members Admin")


class Topic:
    """A raw Redis subscription to one pubkey's standing topic, the way every node listens."""

    def __init__(self, url: str, community: Community, pubkey: str) -> None:
        self._client = redis.Redis.from_url(url)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        self._wire = os.environ["BUZZ_REDIS_PREFIX"] + signals.pubkey_topic(community.pk, pubkey)
        self._pubsub.subscribe(self._wire)

    def received(self) -> list[dict[str, Any]]:
        """Everything published on the topic so far: read up to a sentinel that this publishes now.

        The admin publishes before it answers, and Redis delivers in publish order, so nothing
        published by the request can come after the sentinel.
        """
        sentinel = {"t": "test-sentinel", "n": secrets.token_hex(4)}
        self._client.publish(self._wire, json.dumps(sentinel))
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            m = self._pubsub.get_message(timeout=1.0)  # None also for the (ignored) subscribe confirmation
            if m is None:
                continue
            message = json.loads(m["data"])
            if message == sentinel:
                return out
            out.append(message)
        raise AssertionError(f"the sentinel did not come back; got {out!r}")

    def close(self) -> None:
        self._pubsub.close()
        self._client.close()


@pytest.fixture
def topics(redis_url: str) -> Iterator[Any]:
    opened: list[Topic] = []

    def open_topic(community: Community, pubkey: str) -> Topic:
        t = Topic(redis_url, community, pubkey)
        opened.append(t)
        return t

    yield open_topic
    for t in opened:
        t.close()


def removal(pubkey: str) -> dict[str, Any]:
    return signals.standing_message(pubkey, signals.WHY_RELAY_MEMBER)


def test_delete_page_removes_through_the_service(admin_client: Client, community: Community, topics: Any) -> None:
    pubkey = Signer.generate().pubkey
    member, _ = member_add(community=community, pubkey=pubkey)
    topic = topics(community, pubkey)
    response = admin_client.post(f"/admin/buzz/relaymember/{member.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302, response.content[:500]
    assert not RelayMember.objects.filter(pk=member.pk).exists()
    assert topic.received() == [removal(pubkey)]


def test_delete_selected_action_removes_each_through_the_service(
    admin_client: Client, community: Community, topics: Any
) -> None:
    keys = [Signer.generate().pubkey for _ in range(2)]
    kept = Signer.generate().pubkey
    rows = [member_add(community=community, pubkey=k)[0] for k in [*keys, kept]]
    watched = [topics(community, k) for k in [*keys, kept]]
    response = admin_client.post(
        "/admin/buzz/relaymember/",
        {"action": "delete_selected", "_selected_action": [r.pk for r in rows[:2]], "post": "yes"},
    )
    assert response.status_code == 302, response.content[:500]
    assert list(RelayMember.objects.filter(community=community).values_list("pubkey", flat=True)) == [kept]
    for key, topic in zip(keys, watched[:2], strict=True):
        assert topic.received() == [removal(key)]
    assert watched[2].received() == []


def _inline_form(community: Community, members: list[RelayMember], **changes: str) -> dict[str, str]:
    data = {
        "host": community.host,
        "name": community.name,
        "description": community.description,
        "public_url": community.public_url,
        "admission": community.admission,
        "members-TOTAL_FORMS": str(len(members)),
        "members-INITIAL_FORMS": str(len(members)),
        "members-MIN_NUM_FORMS": "0",
        "members-MAX_NUM_FORMS": "1000",
    }
    for i, m in enumerate(members):
        data.update({f"members-{i}-id": str(m.pk), f"members-{i}-community": str(community.pk)})
        data.update({f"members-{i}-pubkey": m.pubkey, f"members-{i}-role": m.role})
    data.update(changes)
    return data


def test_community_page_inline_removal_goes_through_the_service(
    admin_client: Client, community: Community, topics: Any
) -> None:
    gone, stays = Signer.generate().pubkey, Signer.generate().pubkey
    members = [member_add(community=community, pubkey=k)[0] for k in (gone, stays)]
    topic = topics(community, gone)
    data = _inline_form(community, members, **{"members-0-DELETE": "on", "members-1-role": "admin"})
    response = admin_client.post(f"/admin/buzz/community/{community.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert {m.pubkey: m.role for m in community.members.all()} == {stays: "admin"}
    assert topic.received() == [removal(gone)]


def test_a_members_pubkey_cannot_be_edited_in_place(admin_client: Client, community: Community, topics: Any) -> None:
    pubkey = Signer.generate().pubkey
    member, _ = member_add(community=community, pubkey=pubkey)
    topic = topics(community, pubkey)
    other = Signer.generate().pubkey
    response = admin_client.post(
        f"/admin/buzz/relaymember/{member.pk}/change/",
        {"community": str(community.pk), "pubkey": other, "role": "admin"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    member.refresh_from_db()
    assert (member.pubkey, member.role) == (pubkey, "admin")
    assert not RelayMember.objects.filter(pubkey=other).exists()
    # A role change keeps the pubkey admitted: nothing to tell the nodes.
    assert topic.received() == []


def test_the_community_page_refuses_a_public_url_no_client_could_authenticate_against(
    admin_client: Client, community: Community
) -> None:
    """NIP-42 AUTH names the public URL and NIP-98 its scheme and host: an https:// one (or none) would make
    every correct client's authentication fail, with nothing saying why."""
    before = community.public_url
    for url in ("https://relay.example/", "wss://", "relay.example"):
        response = admin_client.post(
            f"/admin/buzz/community/{community.pk}/change/", _inline_form(community, [], public_url=url)
        )
        assert response.status_code == 200, url  # the form again, with its error
        assert "public URL must be a ws:// or wss:// URL with a host" in response.content.decode(), url
        community.refresh_from_db()
        assert community.public_url == before
    response = admin_client.post(
        f"/admin/buzz/community/{community.pk}/change/", _inline_form(community, [], public_url="wss://relay.example/")
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    community.refresh_from_db()
    assert community.public_url == "wss://relay.example/"
