"""NIP-AR views over POST /query and POST /count, against a real relay process.

One data set for the module, written through the real write path (WebSocket EVENTs, and
one POST /events); only moderation's redaction is done in SQL, as moderation will do it
(redacted_at on the revision, retired on the artifact when it is the head). Channel
deletion uses the channel service. Each test reads it as several readers:

  W      owner of every channel (W writes everything)
  alice  member of P1
  bob    member of P2 and of the unlisted open channel U
  carol  a relay member in no channel
  dave   a bearer token with messages:read limited to channel O (and a member of P1)
  eve    a member of P1, banned from the community

Channels: O open listed, U open unlisted, P1 and P2 private, X open listed then deleted.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connection

from buzz.chat import bans, channels
from buzz.models import Community
from buzz.nostr import Signer
from tests.artifacts.query_model import Author, Channel, World
from tests.support.factories import make_channel, make_community, make_token, nip98, signers
from tests.support.relay import RelayProcess, relays_key
from tests.support.wire import publish, raw_request
from tests.support.wsclient import RelayClient

# The test database must exist (pytest-django sets it up for tests that use it). Each test only reads
# the module's committed data through the relay; its own transaction is rolled back and changes nothing.
pytestmark = pytest.mark.django_db

HOST = "query-views.test"
PAGE_TYPE = "test.page"


@dataclass
class Env:
    relay: RelayProcess
    world: World
    w: Signer
    readers: dict[str, Signer | str]
    ch: dict[str, str]
    # label -> d, and label -> the ids of its revisions in the order written
    d: dict[str, str] = field(default_factory=dict)
    revs: dict[str, list[str]] = field(default_factory=dict)
    seq: dict[str, int] = field(default_factory=dict)
    pages_open: list[str] = field(default_factory=list)
    pages_private: list[str] = field(default_factory=list)

    def label(self, d: str) -> str:
        return next(k for k, v in self.d.items() if v == d)


# --- HTTP ------------------------------------------------------------------------------


async def post_raw(relay: RelayProcess, who: Signer | str, path: str, body: bytes) -> tuple[int, bytes]:
    """POST with NIP-98 (a Signer) or a bearer token (a str). (status, raw body)."""
    headers = {"Host": HOST, "Content-Type": "application/json"}
    if isinstance(who, Signer):
        headers["Authorization"] = nip98(who, HOST, "POST", path, body)
    else:
        headers["Authorization"] = f"Bearer {who}"
    return await asyncio.to_thread(raw_request, relay, "POST", path, headers, body)


async def view(env: Env, who: str, filt: dict[str, Any], path: str = "/query") -> tuple[int, Any]:
    status, raw = await post_raw(env.relay, env.readers[who], path, json.dumps([filt]).encode())
    return status, json.loads(raw)


async def ids(env: Env, who: str, filt: dict[str, Any]) -> list[str]:
    """The event ids of a 200 /query answer, after checking that /count agrees (unpaged)."""
    status, body = await view(env, who, filt)
    assert status == 200, (who, filt, body)
    assert isinstance(body, list)
    unpaged = {k: v for k, v in filt.items() if k not in ("limit", "offset")}
    c_status, c_body = await view(env, who, unpaged, "/count")
    assert c_status == 200, c_body
    if "limit" not in filt and "offset" not in filt:
        assert c_body == {"count": len(body)}, (who, filt, c_body, len(body))
    return [e["id"] for e in body]


async def labels(env: Env, who: str, filt: dict[str, Any]) -> set[str]:
    """Current/head results as artifact labels (each artifact at most once)."""
    status, body = await view(env, who, filt)
    assert status == 200, (who, filt, body)
    found = [env.label(next(t[1] for t in e["tags"] if t[0] == "d")) for e in body]
    assert len(found) == len(set(found)), found
    c_status, c_body = await view(env, who, filt, "/count")
    assert (c_status, c_body) == (200, {"count": len(found)}), (who, filt, c_body)
    return set(found)


# --- the data set ----------------------------------------------------------------------


def _build_people() -> tuple[Env, Community]:
    w, alice, bob, carol, dave, eve = signers(6)
    community = make_community(HOST, "Query views", members=[w, alice, bob, carol, dave, eve])
    world = World()
    ch: dict[str, str] = {}
    spec = {
        "O": ("open", True),
        "U": ("open", False),
        "P1": ("private", True),
        "P2": ("private", True),
        "X": ("open", True),
    }
    for name, (visibility, listed) in spec.items():
        cid = make_channel(community, w, name=name, visibility=visibility, listed=listed)
        ch[name] = str(cid)
        world.channels[str(cid)] = Channel(str(cid), visibility, listed, members={w.pubkey})
    for who, names in ((alice, ["P1"]), (bob, ["P2", "U"]), (dave, ["P1"]), (eve, ["P1"])):
        for n in names:
            channels.member_put(community=community, channel_uuid=uuid.UUID(ch[n]), actor=None, pubkey=who.pubkey)
            world.channels[ch[n]].members.add(who.pubkey)
    token = make_token(community, dave, ["messages:read"], channels=[ch["O"]])
    bans.ban_add(community=community, pubkey=eve.pubkey)
    readers: dict[str, Signer | str] = {"W": w, "alice": alice, "bob": bob, "carol": carol, "dave": token, "eve": eve}
    env = Env(relay=None, world=world, w=w, readers=readers, ch=ch)  # type: ignore[arg-type]
    return env, community


async def _populate(env: Env) -> None:
    author = Author(env.world, env.w)
    ch = env.ch
    async with RelayClient.connect(env.relay.ws_url, host=HOST) as client:
        ok = await client.auth(env.w)
        assert ok[2] is True, ok

        async def put(label: str, op: str, **kw: Any) -> None:
            if op == "create":
                env.d[label] = str(uuid.uuid4())
            event = author.revision(env.d[label], op, **kw)
            reply = await publish(client, event)
            assert reply[2] is True, (label, op, reply)
            author.accepted(event)
            env.revs.setdefault(label, []).append(event["id"])

        task, note = "buzz.task", "buzz.note"
        await put(
            "m1", "create", h=ch["O"], type_name=task, title="first",
            tags=[["status", "open", "closed"], ["x", "a"], ["y", "b"], ["priority-level", "high"],
                  ["component-name.v2", "api"]],
        )  # fmt: skip
        await put("m2", "create", h=ch["O"], type_name=task, tags=[["status", "open"], ["x", "b"]])
        await put("m2", "update", tags=[["status", "done"], ["x", "b"]])
        await put(
            "m3", "create", h=ch["O"], type_name=note, tags=[["status", "closed", "open"], ["x", "a"], ["x", "b"]]
        )
        await put("m4", "create", h=ch["O"], type_name=task, tags=[["status", "open"]])
        await put("m4", "delete")
        await put("m5", "create", h=ch["O"], type_name=task, tags=[["status", "open"]])  # retired below
        await put("m6", "create", h=ch["O"], type_name=task, tags=[["status", "open"]])
        await put("m6", "delete")
        await put("m6", "restore", tags=[["status", "open"]])
        await put("m7", "create", h=ch["O"], type_name=task, tags=[["status", "open"]])
        await put("m7", "move", h=ch["P1"], tags=[["status", "open"]])
        await put("m8", "create", h=ch["X"], type_name=task, tags=[["status", "open"]])  # X is deleted below
        await put("m9", "create", h=ch["U"], type_name=task, tags=[["status", "open"]])
        await put("m10", "create", h=ch["P2"], type_name=task, tags=[["status", "open"]])
        # History: two revisions in P1, a move to P2, two more there (the first of them redacted below).
        await put("hst", "create", h=ch["P1"], type_name="test.history", tags=[["stage", "1"]])
        await put("hst", "update", tags=[["stage", "2"]])
        await put("hst", "move", h=ch["P2"], tags=[["stage", "3"]])
        await put("hst", "update", tags=[["stage", "4"]])
        await put("hst", "update", tags=[["stage", "5"]])
        # Pages: the same type in O and in P2, interleaved in d order.
        for i in range(40):
            label = f"page{i}"
            await put(label, "create", h=ch["O" if i % 2 else "P2"], type_name=PAGE_TYPE, tags=[["n", str(i)]])
            (env.pages_open if i % 2 else env.pages_private).append(env.d[label])

    # One more through POST /events (NIP-98), the HTTP write path.
    env.d["m11"] = str(uuid.uuid4())
    event = author.revision(env.d["m11"], "create", h=ch["O"], type_name="buzz.task", tags=[["status", "open"]])
    status, raw = await post_raw(env.relay, env.w, "/events", json.dumps(event).encode())
    assert status == 200 and json.loads(raw)["accepted"] is True, raw
    author.accepted(event)
    env.revs["m11"] = [event["id"]]


def _redact(revision_id: str, *, head: bool) -> None:
    """What moderation's kind-9005 removal does to a revision (and, for the head, to the artifact)."""
    with connection.cursor() as cur:
        cur.execute("UPDATE artifacts_revision SET redacted_at = now() WHERE id = %s", [revision_id])
        if head:
            cur.execute(
                "UPDATE artifacts_artifact SET retired = true WHERE head_id = %s",
                [revision_id],
            )


def _finish(env: Env, community: Community) -> None:
    _redact(env.revs["m5"][-1], head=True)
    _redact(env.revs["hst"][3], head=False)
    for label, index in (("m5", -1), ("hst", 3)):
        rev = next(r for r in env.world.order if r.id == env.revs[label][index])
        rev.redacted = True
    channels.channel_delete(community=community, channel_uuid=uuid.UUID(env.ch["X"]), actor=None)
    env.world.channels[env.ch["X"]].deleted = True
    with connection.cursor() as cur:
        cur.execute("SELECT id, seq FROM artifacts_revision WHERE community_id = %s", [community.id])
        env.seq = {row[0]: row[1] for row in cur.fetchall()}


@pytest.fixture(scope="module")
def env(django_db_setup: None, django_db_blocker: Any) -> Iterator[Env]:
    with django_db_blocker.unblock():
        Community.objects.filter(host=HOST).delete()
        data, community = _build_people()
    relay = RelayProcess(env={"BUZZ_WRITES_PER_SECOND": "0"})
    data.relay = relay
    try:
        relay.start()
        asyncio.run(_populate(data))
        with django_db_blocker.unblock():
            _finish(data, community)
        yield data
    finally:
        relay.stop()
        with django_db_blocker.unblock():
            Community.objects.filter(host=HOST).delete()


@pytest.fixture(autouse=True)
def _relay_log(request: pytest.FixtureRequest, env: Env) -> None:
    # A failing test shows the module relay's log (tests/conftest.py reads this stash).
    request.node.stash[relays_key] = [env.relay]


# --- current ---------------------------------------------------------------------------

OPEN = {"artifact": "current", "#status": ["open"]}


async def test_current_omits_deleted_retired_moved_and_deleted_channels(env: Env) -> None:
    # m2 was open before its update, m4 is deleted, m5 retired, m7 moved out of O, m8's channel deleted.
    assert await labels(env, "carol", OPEN) == {"m1", "m6", "m11"}
    assert await labels(env, "alice", OPEN) == {"m1", "m6", "m7", "m11"}
    assert await labels(env, "bob", OPEN) == {"m1", "m6", "m9", "m10", "m11"}
    assert await labels(env, "W", OPEN) == {"m1", "m6", "m7", "m9", "m10", "m11"}
    # dave's token covers O only.
    assert await labels(env, "dave", OPEN) == {"m1", "m6", "m11"}
    # A restored artifact is current again (its revision is op=restore); a deleted one never is.
    assert await labels(env, "W", {"artifact": "current", "#op": ["restore"]}) == {"m6"}
    assert await labels(env, "W", {"artifact": "current", "#op": ["delete"]}) == set()
    # Moving into P1 makes the current revision readable there; the old home no longer lists it.
    assert await labels(env, "W", {**OPEN, "#h": [env.ch["O"]]}) == {"m1", "m6", "m11"}
    assert await labels(env, "alice", {**OPEN, "#h": [env.ch["P1"]]}) == {"m7"}


async def test_current_returns_only_the_head_revision(env: Env) -> None:
    status, body = await view(env, "W", {"artifact": "current", "#d": [env.d["m2"]]})
    assert status == 200 and [e["id"] for e in body] == [env.revs["m2"][-1]]
    # Older revisions never match: m2 was "open" before its update.
    assert await labels(env, "W", {"artifact": "current", "#d": [env.d["m2"]], "#status": ["open"]}) == set()
    assert await labels(env, "W", {"artifact": "current", "#d": [env.d["m2"]], "#status": ["done"]}) == {"m2"}
    # The moved artifact's head is the move revision; the create never shows.
    status, body = await view(env, "W", {"artifact": "current", "#d": [env.d["m7"], env.d["m4"], env.d["m5"]]})
    assert status == 200 and [e["id"] for e in body] == [env.revs["m7"][-1]]


async def test_tag_name_and_first_value_in_the_same_tag(env: Env) -> None:
    scope = {"artifact": "current", "#h": [env.ch["O"]]}
    # ["status","open","closed"] matches open, not closed; m3's ["status","closed","open"] the other way.
    assert await labels(env, "W", {**scope, "#status": ["closed"]}) == {"m3"}
    # ["x","a"] and ["y","b"] don't make #x:["b"] match m1; m3 has a tag ["x","b"] of its own.
    assert await labels(env, "W", {**scope, "#x": ["b"]}) == {"m2", "m3"}
    assert await labels(env, "W", {**scope, "#y": ["a"]}) == set()
    assert await labels(env, "W", {**scope, "#x": ["a"]}) == {"m1", "m3"}
    # Multi-character names, with punctuation.
    assert await labels(env, "W", {**scope, "#priority-level": ["high"]}) == {"m1"}
    assert await labels(env, "W", {**scope, "#component-name.v2": ["api"]}) == {"m1"}
    assert await labels(env, "W", {**scope, "#priority-level": ["HIGH"]}) == set()  # exact values
    assert await labels(env, "W", {**scope, "#priority": ["high"]}) == set()  # exact names
    # Envelope tags are tags too.
    assert await labels(env, "W", {**scope, "#title": ["first"]}) == {"m1"}
    assert await labels(env, "W", {**scope, "#type": ["buzz.note"]}) == {"m3"}


async def test_names_and_values_or(env: Env) -> None:
    scope = {"artifact": "current", "#h": [env.ch["O"]]}
    assert await labels(env, "W", {**scope, "#x": ["a"], "#y": ["b"]}) == {"m1"}
    assert await labels(env, "W", {**scope, "#x": ["a"], "#y": ["c"]}) == set()
    assert await labels(env, "W", {**scope, "#x": ["a", "b"]}) == {"m1", "m2", "m3"}
    assert await labels(env, "W", {**scope, "#status": ["done", "closed"]}) == {"m2", "m3"}
    assert await labels(env, "W", {**scope, "#status": ["done", "closed"], "#type": ["buzz.task"]}) == {"m2"}
    assert await labels(env, "W", {**scope, "#status": ["open"], "#x": ["a", "zzz"], "#y": ["b", "q"]}) == {"m1"}
    # Every name must match: a name no head carries empties the result.
    assert await labels(env, "W", {**scope, "#status": ["open"], "#nope": ["a"]}) == set()


async def test_unlisted_open_channel_needs_membership_or_explicit_h(env: Env) -> None:
    m9 = env.d["m9"]
    # carol is no member of the unlisted open channel U: a known-ID read doesn't reach it ...
    assert await labels(env, "carol", {"artifact": "current", "#d": [m9]}) == set()
    assert await labels(env, "carol", {"artifact": "head", "#d": [m9]}) == set()
    assert await ids(env, "carol", {"artifact": "history", "#d": [m9]}) == []
    # ... an explicit #h does.
    assert await labels(env, "carol", {"artifact": "current", "#d": [m9], "#h": [env.ch["U"]]}) == {"m9"}
    assert await labels(env, "carol", {"artifact": "head", "#d": [m9], "#h": [env.ch["U"]]}) == {"m9"}
    assert await ids(env, "carol", {"artifact": "history", "#h": [env.ch["U"]]}) == env.revs["m9"]
    # bob is a member: no #h needed.
    assert await labels(env, "bob", {"artifact": "current", "#d": [m9]}) == {"m9"}
    assert await labels(env, "bob", {"artifact": "head", "#d": [m9]}) == {"m9"}


async def test_h_scope_names_only_readable_channels(env: Env) -> None:
    # A private channel, a deleted one, an unknown id and a non-canonical spelling of a readable id:
    # one answer, which does not say which.
    answers = set()
    for h in (env.ch["P2"], env.ch["X"], str(uuid.uuid4()), env.ch["O"].upper(), "not-a-uuid"):
        for path in ("/query", "/count"):
            status, body = await view(env, "carol", {"artifact": "current", "#h": [h]}, path)
            answers.add((status, json.dumps(body)))
    assert answers == {(403, json.dumps({"error": "restricted: not a channel member"}))}
    # One unreadable channel refuses the whole query.
    status, _ = await view(env, "carol", {"artifact": "current", "#h": [env.ch["O"], env.ch["P2"]]})
    assert status == 403
    # dave's token doesn't cover P1 although dave is a member.
    for mode in ("current", "history"):
        status, body = await view(env, "dave", {"artifact": mode, "#h": [env.ch["P1"]]})
        assert status == 403, body
    assert await labels(env, "dave", {"artifact": "head", "#d": [env.d["m7"], env.d["m1"]]}) == {"m1"}
    # A banned reader reads nothing, with or without #h, in every view.
    for filt in (
        {"artifact": "current"},
        {"artifact": "current", "#h": [env.ch["P1"]]},
        {"artifact": "history", "#d": [env.d["m7"]]},
        {"artifact": "head", "#d": [env.d["m7"]]},
    ):
        for path in ("/query", "/count"):
            status, body = await view(env, "eve", filt, path)
            assert (status, body) == (403, {"error": "blocked: this pubkey is banned from the community"}), filt


# --- pages -----------------------------------------------------------------------------


async def _pages(env: Env, who: str, size: int) -> list[str]:
    got: list[str] = []
    offset = 0
    while True:
        page = await ids(env, who, {"artifact": "current", "#type": [PAGE_TYPE], "limit": size, "offset": offset})
        got += page
        if len(page) < size:
            return got
        offset += size


async def test_offset_pages_cover_the_set_once_after_access_checks(env: Env) -> None:
    heads = {env.d[f"page{i}"]: env.revs[f"page{i}"][0] for i in range(40)}
    readable_by_carol = [heads[d] for d in sorted(env.pages_open)]
    everything = [heads[d] for d in sorted(heads)]
    for size in (1, 3, 4, 7):
        # Access checks come first: carol's pages are full, and hold only O's artifacts.
        assert await _pages(env, "carol", size) == readable_by_carol
        assert await _pages(env, "W", size) == everything
    first = await ids(env, "carol", {"artifact": "current", "#type": [PAGE_TYPE], "limit": 4})
    assert len(first) == 4
    # Counts are after access checks too, and ignore paging.
    for who, n in (("carol", 20), ("bob", 40), ("alice", 20), ("W", 40)):
        _, body = await view(env, who, {"artifact": "current", "#type": [PAGE_TYPE], "limit": 1}, "/count")
        assert body == {"count": n}, who
    # Past the end: an empty page, not an error.
    assert await ids(env, "carol", {"artifact": "current", "#type": [PAGE_TYPE], "offset": 20}) == []


# --- history ---------------------------------------------------------------------------


async def test_history_scoped_by_each_revisions_channel(env: Env) -> None:
    r = env.revs["hst"]  # create, update in P1; move, update (redacted), update in P2
    d = {"#d": [env.d["hst"]]}
    assert await ids(env, "alice", {"artifact": "history", **d}) == [r[0], r[1]]
    # The move into P2 never lets P2's readers read the P1 revisions; the redacted one is withheld.
    assert await ids(env, "bob", {"artifact": "history", **d}) == [r[2], r[4]]
    assert await ids(env, "W", {"artifact": "history", **d}) == [r[0], r[1], r[2], r[4]]
    assert await ids(env, "carol", {"artifact": "history", **d}) == []
    assert await ids(env, "alice", {"artifact": "history", **d, "#h": [env.ch["P1"]]}) == [r[0], r[1]]
    assert await ids(env, "W", {"artifact": "history", **d, "#h": [env.ch["P2"]]}) == [r[2], r[4]]
    status, _ = await view(env, "alice", {"artifact": "history", **d, "#h": [env.ch["P2"]]})
    assert status == 403
    # The current state of hst is in P2 only.
    assert await labels(env, "alice", {"artifact": "current", **d}) == set()
    assert await labels(env, "bob", {"artifact": "current", **d}) == {"hst"}
    # A retired artifact's redacted head is withheld from history too; deletions are history.
    assert await ids(env, "W", {"artifact": "history", "#d": [env.d["m5"]]}) == []
    assert await ids(env, "carol", {"artifact": "history", "#d": [env.d["m4"]]}) == env.revs["m4"]
    assert await ids(env, "carol", {"artifact": "history", "#d": [env.d["m6"]]}) == env.revs["m6"]


async def test_history_in_relay_acceptance_order(env: Env) -> None:
    got = await ids(env, "W", {"artifact": "history", "#type": ["buzz.task", "buzz.note", "test.history"]})
    seqs = [env.seq[i] for i in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    type_of = {r.id: a.type for a in env.world.artifacts.values() for r in a.revisions}
    wanted = ("buzz.task", "buzz.note", "test.history")
    expected = [
        r.id for r in env.world.order if not r.redacted and r.channel != env.ch["X"] and type_of[r.id] in wanted
    ]
    assert got == sorted(expected, key=lambda i: env.seq[i])
    # Paging over history follows the same order.
    paged = []
    for offset in range(0, len(got), 5):
        paged += await ids(
            env, "W", {"artifact": "history", "#type": ["buzz.task", "buzz.note", "test.history"],
                       "limit": 5, "offset": offset},
        )  # fmt: skip
    assert paged == got


# --- head ------------------------------------------------------------------------------


async def test_head_view(env: Env) -> None:
    # A deletion is a head.
    status, body = await view(env, "carol", {"artifact": "head", "#d": [env.d["m4"]]})
    assert status == 200 and [e["id"] for e in body] == [env.revs["m4"][-1]]
    assert body[0]["content"] == "" and ["op", "delete"] in body[0]["tags"]
    # The latest revision, not an older one; several d at once, only the readable ones.
    status, body = await view(env, "bob", {"artifact": "head", "#d": [env.d["m2"], env.d["m10"], env.d["m7"]]})
    assert status == 200 and {e["id"] for e in body} == {env.revs["m2"][-1], env.revs["m10"][-1]}
    assert await labels(env, "W", {"artifact": "head", "#d": [env.d["m6"], env.d["m7"], env.d["hst"]]}) == {
        "m6", "m7", "hst",
    }  # fmt: skip
    # A redacted head is withheld; an artifact in a deleted channel is gone.
    assert await labels(env, "W", {"artifact": "head", "#d": [env.d["m5"], env.d["m8"]]}) == set()
    # head needs #d.
    status, body = await view(env, "W", {"artifact": "head"})
    assert status == 400 and "#d" in body["error"]


async def test_head_unknown_and_unreadable_look_the_same(env: Env) -> None:
    answers = set()
    for d in (str(uuid.uuid4()), env.d["m10"], env.d["m7"], env.d["m5"], env.d["m8"], env.d["m9"]):
        for path in ("/query", "/count"):
            status, raw = await post_raw(
                env.relay, env.readers["carol"], path, json.dumps([{"artifact": "head", "#d": [d]}]).encode()
            )
            answers.add((path, status, raw))
    assert answers == {("/query", 200, b"[]"), ("/count", 200, b'{"count": 0}')}
