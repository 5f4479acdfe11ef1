"""Hostile HTTP bodies get a 400 with an `invalid:` reason, never a 500, from a real relay process.

The cases the probes found (100,000 levels of `[` on POST /events; deep nesting, a lone
surrogate or a NUL in a /query or /count predicate), then hypothesis over hostile bodies:
arbitrary JSON with any code point (escaped surrogates and NULs included), filter-shaped JSON
with hostile names and values, deep nesting and raw bytes, each sent signed (NIP-98 over the
exact body) to /query, /count and /events. Every answer is JSON and below 500.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.models import Community
from buzz.nostr import Signer
from tests.http.http_support import Answer, request_sync
from tests.support.factories import nip98
from tests.support.relay import RelayProcess, relays_key

pytestmark = pytest.mark.django_db

HOST = "hostile-bodies.test"
DEEP = 100_000


class Env:
    def __init__(self, relay: RelayProcess, w: Signer, channel: str) -> None:
        self.relay, self.w, self.channel = relay, w, channel


@pytest.fixture(scope="module")
def env(django_db_setup: None, django_db_blocker: Any) -> Iterator[Env]:
    with django_db_blocker.unblock():
        Community.objects.filter(host=HOST).delete()
        w = Signer.generate()
        community = community_create(host=HOST, name="Hostile bodies")
        member_add(community=community, pubkey=w.pubkey)
        cid = uuid.uuid4()
        channels.channel_create(community=community, channel_uuid=cid, name="main", creator=w.pubkey)
    relay = RelayProcess(env={"BUZZ_WRITES_PER_SECOND": "0"})
    try:
        relay.start()
        yield Env(relay, w, str(cid))
    finally:
        relay.stop()
        with django_db_blocker.unblock():
            Community.objects.filter(host=HOST).delete()


@pytest.fixture(autouse=True)
def _relay_log(request: pytest.FixtureRequest, env: Env) -> None:
    request.node.stash[relays_key] = [env.relay]


def post(env: Env, path: str, body: bytes, *, signed: bool = True) -> Answer:
    headers = {"Host": HOST, "Content-Type": "application/json"}
    if signed:
        headers["Authorization"] = nip98(env.w, HOST, "POST", path, body)
    return request_sync(env.relay, "POST", path, headers=headers, body=body)


def reason_of(answer: Answer, path: str) -> str:
    assert answer.is_json, (path, answer.status, answer.body[:200])
    body = answer.json()
    return str(body["message"] if path == "/events" else body["error"])


def assert_invalid(answer: Answer, path: str, *words: str) -> None:
    assert answer.status == 400, (path, answer.status, answer.body[:300])
    reason = reason_of(answer, path)
    assert reason.startswith("invalid: "), reason
    for w in words:
        assert w in reason, reason


def test_deep_nesting_on_events_is_invalid(env: Env) -> None:
    for signed in (False, True):  # the body is read before the authorization is checked
        answer = post(env, "/events", b"[" * DEEP, signed=signed)
        if signed:
            assert_invalid(answer, "/events", "not JSON")
        else:
            assert answer.status == 401 and reason_of(answer, "/events").startswith("auth-required: ")
    assert_invalid(post(env, "/events", b"{" + b'"a":[' * DEEP), "/events", "not JSON")


@pytest.mark.parametrize("path", ["/query", "/count"])
def test_hostile_predicates_are_invalid(env: Env, path: str) -> None:
    deep = b'[{"artifact":"current","#x":' + b"[" * DEEP + b"]" * DEEP + b"}]"
    assert_invalid(post(env, path, deep), path, "not JSON")
    nested = b'[{"artifact":"current","#x":' + b"[" * 500 + b'"a"' + b"]" * 500 + b"}]"
    assert_invalid(post(env, path, nested), path, "array of strings")
    for filt, words in (
        ({"artifact": "current", "#x": ["\udfff"]}, ("surrogate",)),
        ({"artifact": "current", "#x": ["a\ud800b"]}, ("surrogate",)),
        ({"artifact": "current", "#x": ["a\x00b"]}, ("NUL",)),
        ({"artifact": "current", "#type": ["\x00"]}, ("NUL",)),
        ({"artifact": "current", "#d": ["\x00"]}, ("NUL",)),
        ({"artifact": "history", "#type": ["\ud800"]}, ("surrogate",)),
        ({"artifact": "head", "#d": ["\x00"]}, ("NUL",)),
        ({"artifact": "current", "#\x00": ["a"]}, ("NUL",)),
        ({"artifact": "current", "#\udfff": ["a"]}, ("surrogate",)),
        ({"artifact": "current", "#h": ["\x00"]}, ("NUL",)),
    ):
        # json.dumps escapes both (\u0000, \udfff): the body itself is valid UTF-8.
        assert_invalid(post(env, path, json.dumps([filt]).encode()), path, *words)
    assert_invalid(post(env, path, b"\xff\xfe[]"), path, "not JSON")


@pytest.mark.parametrize("path", ["/query", "/count", "/events"])
def test_an_object_that_names_a_key_twice_is_invalid(env: Env, path: str) -> None:
    # json.loads keeps the last value: {"#status": ["open"], "#status": ["done"]} would be one predicate.
    if path == "/events":
        event = env.w.sign_event(kind=9, tags=[["h", env.channel]], content="once").to_dict()
        body = json.dumps(event)[:-1] + ', "content": "twice"}'
    else:
        body = f'[{{"artifact": "current", "#h": ["{env.channel}"], "#status": ["open"], "#status": ["done"]}}]'
    assert_invalid(post(env, path, body.encode()), path, "duplicate key", "status" if path != "/events" else "content")


def test_a_hostile_thread_root_is_invalid(env: Env) -> None:
    for root in ("%00", "%00" * 64, "x" * 64, "A" * 64):
        path = f"/api/channels/{env.channel}/threads/{root}"
        headers = {"Host": HOST, "Authorization": nip98(env.w, HOST, "GET", path)}
        answer = request_sync(env.relay, "GET", path, headers=headers)
        assert answer.status == 400, (root, answer.status, answer.body[:200])
        assert answer.json()["error"].startswith("invalid: root must be an event id"), answer.body


@pytest.mark.parametrize("path", ["/query", "/count", "/events"])
def test_a_body_past_what_django_reads_is_a_json_413(env: Env, path: str) -> None:
    # Past DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB) Django refuses to read the body at all.
    answer = post(env, path, b"[" + b" " * (3 * 1024 * 1024) + b"]", signed=False)
    assert answer.status == 413, (answer.status, answer.body[:200])
    assert reason_of(answer, path).startswith("invalid: body larger than ")


# --- hypothesis --------------------------------------------------------------------------

# Any code point: lone surrogates and NUL among them (json.dumps escapes them).
hostile_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_text,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)),
    max_leaves=20,
)
filter_keys = st.one_of(
    st.sampled_from(["artifact", "kinds", "limit", "offset", "#d", "#h", "#type", "#x", "#auth", "ids", "#"]),
    hostile_text.map(lambda s: "#" + s),
    hostile_text,
)
filter_values = st.one_of(
    st.sampled_from(["current", "history", "head", [45010], 1, 0, -1, 10**30, 2.5, True]),
    st.lists(hostile_text, max_size=5),
    st.lists(st.uuids().map(str), min_size=1, max_size=3),
    json_values,
)
filters = st.dictionaries(filter_keys, filter_values, max_size=5).map(
    lambda f: {"artifact": "current", **f} if "artifact" not in f else f
)


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode()


bodies = st.one_of(
    st.lists(filters, min_size=0, max_size=2).map(_dump),
    json_values.map(_dump),
    st.builds(lambda depth, open_: open_ * depth, st.integers(1, 3000), st.sampled_from([b"[", b'{"a":', b'[{"#x":'])),
    st.binary(max_size=64),
    st.builds(lambda f, cut: _dump([f])[:cut], filters, st.integers(0, 40)),  # truncated JSON
)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=st.sampled_from(["/query", "/count", "/events"]), body=bodies)
def test_no_hostile_body_gets_a_500(env: Env, path: str, body: bytes) -> None:
    answer = post(env, path, body)
    assert answer.status < 500, (path, body[:200], answer.status, answer.body[:300])
    assert answer.is_json, (path, body[:200], answer.status, answer.body[:300])
    reason = reason_of(answer, path) if answer.status != 200 else ""
    if answer.status == 400:
        assert reason.startswith("invalid: "), (path, body[:200], reason)
