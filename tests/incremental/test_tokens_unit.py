"""artifacts.incremental's tokens and pass rules as pure logic, with an injected database clock: the
30-day checkpoint lifetime to the microsecond, the policy stamp, the bindings, and the request parser.
No database."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core import signing
from django.test import override_settings

from artifacts import incremental
from buzz.identity.actor import Actor
from buzz.identity.communities import CommunityInfo

QUERY = {"artifact": "current", "#type": ["buzz.task"]}
SIGNING_KEY = "unit-" + "k" * 40
KEY = {"enabled": True, "signing_key": SIGNING_KEY, "page_rows": 100, "response_bytes": 8 * 1024 * 1024}
T0 = dt.datetime(2026, 10, 21, 12, 0, 0, 123456, tzinfo=dt.UTC)


def _actor(pubkey: str = "a" * 64, token: int | None = None, community: int = 1) -> Actor:
    info = CommunityInfo(community, "h.test", "h", "", "ws://h.test/", "b" * 64, "c" * 64, "members")
    return Actor(community=info, pubkey=pubkey, token_id=token)


def _request(**extra: Any) -> incremental.Request:
    return incremental.parse_request([{"artifact": "incremental", "query": QUERY, **extra}])


@pytest.fixture(autouse=True)
def _key() -> Any:
    with override_settings(BUZZ_INCREMENTAL=KEY):
        yield


def _checkpoint(stamp: int = 3, start: dt.datetime = T0, actor: Actor | None = None) -> str:
    return incremental.mint_checkpoint(actor or _actor(), _request(), stamp=stamp, start=incremental.micros(start))


def _error(fn: Any) -> incremental.IncrementalError:
    with pytest.raises(incremental.IncrementalError) as err:
        fn()
    return err.value


def test_rfc3339_has_microseconds_and_z() -> None:
    assert incremental.rfc3339(T0) == "2026-10-21T12:00:00.123456Z"
    assert incremental.from_micros(incremental.micros(T0)) == T0


def test_a_checkpoint_lives_exactly_30_days() -> None:
    lifetime = dt.timedelta(seconds=incremental.CHECKPOINT_LIFETIME_SECONDS)
    request = _request(checkpoint=_checkpoint())
    run = incremental.resume(_actor(), request, now=T0 + lifetime, stamp=3)
    assert run.since == incremental.micros(T0) and run.start == incremental.micros(T0 + lifetime)
    late = _error(
        lambda: incremental.resume(_actor(), request, now=T0 + lifetime + dt.timedelta(microseconds=1), stamp=3)
    )
    assert (late.status, late.code, late.reason) == (409, "incremental_reset", "checkpoint_expired")


def test_a_cursor_lives_as_long_as_its_pass_start_would_as_a_checkpoint() -> None:
    lifetime = dt.timedelta(seconds=incremental.CHECKPOINT_LIFETIME_SECONDS)
    at = incremental.Position(incremental.micros(T0), 0, "x")
    for since in (None, incremental.micros(T0 - lifetime + dt.timedelta(seconds=1))):
        # An initial pass (no window start) or a later one whose window began almost 30 days before it.
        run = incremental.Pass(start=incremental.micros(T0), since=since, stamp=3)
        cursor = incremental._mint_cursor(_actor(), _request(), run, at)
        request = _request(cursor=cursor)
        # Its window start ages past 30 days while the pass runs: the pass goes on.
        later = incremental.resume(_actor(), request, now=T0 + dt.timedelta(hours=1), stamp=3)
        assert (later.start, later.since) == (run.start, since)
        assert incremental.resume(_actor(), request, now=T0 + lifetime, stamp=3).after == at
        # Its own start past 30 days: the checkpoint it would end with is refused already, so the cursor is.
        late = _error(
            lambda r=request: incremental.resume(_actor(), r, now=T0 + lifetime + dt.timedelta(microseconds=1), stamp=3)
        )
        assert (late.status, late.code, late.reason) == (409, "incremental_reset", "checkpoint_expired")


def test_a_null_checkpoint_or_cursor_is_invalid_not_absent() -> None:
    for name in ("checkpoint", "cursor"):
        err = _error(lambda n=name: _request(**{n: None}))
        assert (err.status, err.code, err.reason) == (400, "incremental_invalid", "token"), name
    # A current-ID read takes none, null included.
    ids = ["0b7f1f9e-3c57-4c0e-9d44-4f1d2f3a5b6c"]
    assert _request(action="current", artifactIds=ids).ids is not None
    err = _error(lambda: _request(action="current", artifactIds=ids, cursor=None))
    assert (err.status, err.code, err.reason) == (400, "incremental_invalid", "token")


def test_another_stamp_is_policy_changed() -> None:
    err = _error(lambda: incremental.resume(_actor(), _request(checkpoint=_checkpoint()), now=T0, stamp=4))
    assert (err.status, err.code, err.reason) == (409, "incremental_reset", "policy_changed")


def test_bindings() -> None:
    checkpoint = _checkpoint()
    for actor in (_actor(pubkey="d" * 64), _actor(token=7), _actor(community=2)):
        err = _error(lambda a=actor: incremental.resume(a, _request(checkpoint=checkpoint), now=T0, stamp=3))
        assert (err.status, err.code) == (400, "incremental_invalid")
    other_query = incremental.parse_request(
        [{"artifact": "incremental", "query": {**QUERY, "#status": ["open"]}, "checkpoint": checkpoint}]
    )
    assert _error(lambda: incremental.resume(_actor(), other_query, now=T0, stamp=3)).code == "incremental_invalid"
    with override_settings(BUZZ_INCREMENTAL={**KEY, "signing_key": "another-" + "k" * 40}):
        err = _error(lambda: incremental.resume(_actor(), _request(checkpoint=checkpoint), now=T0, stamp=3))
    assert err.code == "incremental_invalid"


def test_the_query_digest_is_fixed_size_and_exact() -> None:
    a = incremental.query_digest(QUERY)
    assert len(a) == 64 and a == incremental.query_digest({"#type": ["buzz.task"], "artifact": "current"})
    assert a != incremental.query_digest({"artifact": "current", "#type": ["buzz.task", "buzz.note"]})
    assert len(incremental.query_digest({"artifact": "current", "#type": ["x" * 4000]})) == 64


def test_canonical_uuids_only() -> None:
    assert incremental.canonical_uuid("22222222-2222-4222-8222-222222222222") is not None
    for value in ("22222222-2222-4222-8222-22222222222A", "{22222222-2222-4222-8222-222222222222}", "x", ""):
        assert incremental.canonical_uuid(value) is None


def test_an_opened_token_vouches_for_no_other_string() -> None:
    """open_token keeps the payloads of tokens it verified: an altered copy of one, and the same token
    under another key, are still checked (and refused), and the kept payloads are bounded."""
    checkpoint = _checkpoint()
    assert incremental.open_token("checkpoint", checkpoint)["s"] == incremental.micros(T0)
    flipped = checkpoint[:-1] + ("A" if checkpoint[-1] != "A" else "B")
    assert _error(lambda: incremental.open_token("checkpoint", flipped)).code == "incremental_invalid"
    assert _error(lambda: incremental.open_token("cursor", checkpoint)).code == "incremental_invalid"
    with override_settings(BUZZ_INCREMENTAL={**KEY, "signing_key": "another-" + "k" * 40}):
        assert _error(lambda: incremental.open_token("checkpoint", checkpoint)).code == "incremental_invalid"
    for i in range(incremental._OPENED_MAX + 10):
        incremental.open_token("checkpoint", _checkpoint(start=T0 + dt.timedelta(microseconds=i)))
    assert incremental._verified.cache_info().currsize == incremental._OPENED_MAX


def test_only_the_incremental_signing_key_signs() -> None:
    """A token is verified with BUZZ_INCREMENTAL_SIGNING_KEY alone: Django's SECRET_KEY and its rotation
    fallbacks (SECRET_KEY_FALLBACKS) are another identity, and a token they signed is refused."""
    retired = "retired-django-secret-" + "s" * 40
    payload = incremental.open_token("checkpoint", _checkpoint())
    with override_settings(SECRET_KEY_FALLBACKS=[retired]):
        forged = signing.dumps(payload, key=retired, salt=incremental._SALTS["checkpoint"], compress=True)
        err = _error(lambda: incremental.open_token("checkpoint", forged))
        assert (err.status, err.code) == (400, "incremental_invalid")
        assert _error(lambda: incremental.resume(_actor(), _request(checkpoint=forged), now=T0, stamp=3)).code == (
            "incremental_invalid"
        )
    # The same payload under the incremental key is a good token: only the key differs.
    good = signing.dumps(payload, key=SIGNING_KEY, salt=incremental._SALTS["checkpoint"], compress=True)
    assert incremental.open_token("checkpoint", good)["s"] == incremental.micros(T0)
