"""`post_allowed_sql` (the condition kind 9 and the NIP-AR create write under, in their one statement) says
yes exactly when `decide_post` does, on every combination of facts and credentials.

The write statements decide in SQL and answer with `decide_post`'s reason on the facts they return; if
the two ever disagreed, a refused event would be stored (the services raise rather than answer then).
Every combination of the facts that `decide_post` reads is evaluated by PostgreSQL in one query.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from typing import Any

import pytest
from django.db import connection

from buzz.access.policy import (
    SCOPE_READ,
    SCOPE_WRITE,
    WRITER_ROLES,
    ChannelAccess,
    access_params,
    decide_post,
    post_allowed_sql,
)
from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo
from buzz.nostr import Signer

CHANNEL = uuid.UUID("7d1e6f55-3f3c-4c1b-9a53-0c9a3f6b2a10")
OTHER = uuid.UUID("0b6c2c59-1d57-4a55-8d0e-5a4f0c2d9e31")
ROLES = (None, *sorted(WRITER_ROLES), "viewer")
UNTIL = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def _actors(community: CommunityInfo) -> list[Actor]:
    pubkey = Signer.generate().pubkey
    return [
        Actor(community, pubkey),  # NIP-42: every scope, every channel
        Actor(community, pubkey, frozenset({SCOPE_READ}), None, 7),  # no write scope
        Actor(community, pubkey, frozenset({SCOPE_WRITE}), frozenset({str(CHANNEL)}), 7),  # covers the channel
        Actor(community, pubkey, frozenset({SCOPE_WRITE}), frozenset({str(OTHER), "junk"}), 7),  # covers another
    ]


def _facts() -> list[ChannelAccess]:
    out = []
    for exists, deleted, archived, role, visibility, ctype, banned, timeout, token_ok, admitted in itertools.product(
        (True, False),
        (False, True),
        (False, True),
        ROLES,
        ("open", "private"),
        ("stream", "dm"),
        (False, True),
        (None, UNTIL),
        (True, False),
        (True, False),
    ):
        out.append(
            ChannelAccess(
                channel_pk=1 if exists else None,
                visibility=visibility if exists else None,
                type=ctype if exists else None,
                archived=archived and exists,
                deleted=deleted and exists,
                role=role if exists else None,
                banned=banned,
                timeout_until=timeout,
                token_ok=token_ok,
                admitted=admitted,
            )
        )
    return out


@pytest.mark.django_db
def test_the_sql_condition_is_decide_post_on_every_combination() -> None:
    community = CommunityInfo(
        id=1,
        host="policy-sql.test",
        name="",
        description="",
        public_url="",
        relay_pubkey="",
        relay_secret="",
        admission="open",
    )
    facts = _facts()
    columns = (
        "i, channel, banned, timeout_until, channel_pk, visibility, ctype, archived, deleted, role, token_ok, admitted"
    )
    values = ", ".join(["(%s, %s::uuid, %s, %s::timestamptz, %s::bigint, %s, %s, %s, %s, %s, %s, %s)"] * len(facts))
    flat: list[Any] = []
    for i, a in enumerate(facts):
        flat += [i, CHANNEL, a.banned, a.timeout_until, a.channel_pk, a.visibility, a.type, a.archived, a.deleted]
        flat += [a.role, a.token_ok, a.admitted]
    compared = 0
    outcomes: set[bool] = set()
    for actor in _actors(community):
        params = access_params(actor, [CHANNEL])
        # Positional parameters here (the VALUES list): the condition's named ones become %s, in order.
        named = post_allowed_sql("f")
        order = [params[m[2:-2]] for m in _placeholders(named)]
        condition = named
        for m in set(_placeholders(named)):
            condition = condition.replace(m, "%s")
        with connection.cursor() as cur:
            cur.execute(
                f"SELECT i, {condition} FROM (VALUES {values}) AS f({columns}) ORDER BY i",  # noqa: S608
                [*order, *flat],
            )
            got = dict(cur.fetchall())
        for i, access in enumerate(facts):
            expected = decide_post(actor, CHANNEL, access).ok
            assert got[i] is expected, (actor, access, decide_post(actor, CHANNEL, access))
            compared += 1
            outcomes.add(expected)
    assert compared == 4 * len(facts) and outcomes == {True, False}


def _placeholders(sql: str) -> list[str]:
    out = []
    at = 0
    while (at := sql.find("%(", at)) >= 0:
        end = sql.index(")s", at) + 2
        out.append(sql[at:end])
        at = end
    return out
