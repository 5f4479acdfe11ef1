"""Model-based check of the NIP-AR views: the relay against tests/artifacts/query_model.py.

Hypothesis draws a data set and ten filters per example:
  channels   open listed, open unlisted, private or DM; each reader a member or not; at the end
             some are deleted, archived, switched between open and private or (un)listed, and
             some memberships removed
  artifacts  created with random client tags (multi-value tags, repeated and multi-character
             names), then updated, moved, deleted and restored; some heads redacted (retired)
             and some earlier revisions redacted, as moderation does it
  readers    three NIP-98 signers and a bearer token (messages:read or not, all channels or a
             few), each with their own memberships, and the writer (owner of every channel)
  filters    current (with and without #h, #name predicates over client and envelope tags,
             pages), head (#d, optional #h) and history (#d, #type, #h, pages)

Everything is written through the real write path: WebSocket EVENTs signed by the writer, and
the channel services for channels and memberships. Only redaction is SQL (what moderation's
kind-9005 removal will write). For every filter and reader, POST /query must return exactly the
revisions the model evaluates, in order, and POST /count the model's count; refusals must match.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.identity.tokens import token_create
from buzz.nostr import Signer
from tests.artifacts.query_model import Author, Channel, Denied, Reader, World, count, default_scope, evaluate
from tests.support.factories import nip98
from tests.support.relay import RelayProcess
from tests.support.wire import publish, raw_request
from tests.support.wsclient import RelayClient

KINDS = ("open", "unlisted", "private", "dm")
TYPES = ("buzz.task", "buzz.note", "x.kind-2")
TITLES = ("alpha", "beta")
NAMES = ("status", "x", "y", "priority-level", "a.b_c")
VALUES = ("open", "closed", "a", "b", "")
OPS = ("create", "update", "move", "delete", "restore")
READERS = 4  # r0, r1, r2 sign NIP-98; r3 uses a bearer token
TOKEN_CHANNEL = "restricted: this token does not cover that channel"
_hosts = itertools.count()


# --- plans -----------------------------------------------------------------------------


@dataclass
class ChannelPlan:
    id: str
    kind: str
    members: frozenset[int]
    left: frozenset[int]  # memberships removed at the end
    end: str  # none, deleted, archived, visibility, listed


@dataclass
class Step:
    op: str
    dest: int
    tags: list[list[str]]
    title: str


@dataclass
class ArtifactPlan:
    d: str
    type: str
    home: int
    title: str
    tags: list[list[str]]
    steps: list[Step]
    retire: bool
    redact: int | None  # an earlier revision to redact, by index


@dataclass
class Plan:
    channels: list[ChannelPlan]
    token_reads: bool
    token_channels: frozenset[int] | None
    artifacts: list[ArtifactPlan]
    filters: list[dict[str, Any]]


tag_lists = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(NAMES), st.lists(st.sampled_from(VALUES), min_size=1, max_size=3)).map(
            lambda t: [t[0], *t[1]]
        ),
        st.sampled_from(NAMES).map(lambda n: [n]),  # a tag without a value matches nothing
    ),
    max_size=4,
)


@st.composite
def channel_plans(draw: st.DrawFn, cid: str) -> ChannelPlan:
    kind = draw(st.sampled_from(KINDS))
    members = frozenset(draw(st.sets(st.integers(0, READERS - 1))))
    if kind == "dm":
        members = members or frozenset({0})  # a DM has the writer and at least one more participant
        return ChannelPlan(cid, kind, members, frozenset(), draw(st.sampled_from(("none", "deleted", "archived"))))
    left = frozenset(draw(st.sets(st.sampled_from(sorted(members))))) if members else frozenset()
    end = draw(st.sampled_from(("none", "none", "deleted", "archived", "visibility", "listed")))
    return ChannelPlan(cid, kind, members, left, end)


@st.composite
def filters(draw: st.DrawFn, ids: list[str], ds: list[str], unknown: str) -> dict[str, Any]:
    mode = draw(st.sampled_from(("current", "current", "current", "current", "head", "history")))
    filt: dict[str, Any] = {"artifact": mode}
    # An explicit #h now and then: the only way into an unlisted open channel without membership.
    if draw(st.integers(0, 4)) < 2:
        filt["#h"] = draw(st.lists(st.sampled_from([*ids, unknown]), min_size=1, max_size=2, unique=True))
    some_ds = st.lists(st.sampled_from([*ds, unknown]), min_size=1, max_size=3, unique=True)
    if mode == "head":
        filt["#d"] = draw(some_ds)
        return filt
    if mode == "history":
        if draw(st.booleans()):
            filt["#d"] = draw(some_ds)
        if draw(st.booleans()):
            filt["#type"] = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=2, unique=True))
    else:
        for name in draw(st.lists(st.sampled_from((*NAMES, *NAMES, "op", "title", "type", "d", "ar")), max_size=3)):
            pool = {"op": OPS, "title": TITLES, "type": TYPES, "ar": ("1", "2")}.get(name, VALUES)
            values = draw(some_ds) if name == "d" else draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
            filt["#" + name] = values
    if draw(st.integers(0, 2)) == 0:
        filt["limit"] = draw(st.integers(1, 4))
        filt["offset"] = draw(st.integers(0, 4))
    return filt


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    n_channels = draw(st.integers(2, 4))
    ids = [str(u) for u in draw(st.lists(st.uuids(version=4), min_size=n_channels + 1, max_size=n_channels + 1,
                                         unique=True))]  # fmt: skip
    unknown, ids = ids[-1], ids[:-1]
    chans = [draw(channel_plans(cid)) for cid in ids]
    n = draw(st.integers(2, 8))
    ds = [str(u) for u in draw(st.lists(st.uuids(version=4), min_size=n, max_size=n, unique=True))]
    artifacts = []
    for d in ds:
        steps = draw(
            st.lists(
                st.builds(
                    Step,
                    op=st.sampled_from(("update", "update", "move", "delete", "restore")),
                    dest=st.integers(0, n_channels - 1),
                    tags=tag_lists,
                    title=st.sampled_from(TITLES),
                ),
                max_size=4,
            )
        )
        artifacts.append(
            ArtifactPlan(
                d=d,
                type=draw(st.sampled_from(TYPES)),
                home=draw(st.integers(0, n_channels - 1)),
                title=draw(st.sampled_from(TITLES)),
                tags=draw(tag_lists),
                steps=steps,
                retire=draw(st.integers(0, 6)) == 0,
                redact=draw(st.none() | st.integers(0, 4)),
            )
        )
    token_channels = draw(st.none() | st.sets(st.integers(0, n_channels - 1)).map(frozenset))
    return Plan(
        channels=chans,
        token_reads=draw(st.integers(0, 6)) > 0,
        token_channels=token_channels,
        artifacts=artifacts,
        filters=[draw(filters(ids, ds, unknown)) for _ in range(10)],
    )


# --- building a data set through the relay ---------------------------------------------


@dataclass
class Example:
    host: str
    world: World
    w: Signer
    readers: list[tuple[Reader, Signer | str]]  # the model's reader, and its credential


def _setup(plan: Plan) -> Example:
    host = f"model-{next(_hosts)}-{uuid.uuid4().hex[:6]}.test"
    community = community_create(host=host, name="Model")
    w = Signer.generate()
    signers = [Signer.generate() for _ in range(READERS)]
    for s in (w, *signers):
        member_add(community=community, pubkey=s.pubkey)
    world = World()
    for c in plan.channels:
        cid = uuid.UUID(c.id)
        if c.kind == "dm":
            channels.channel_create(
                community=community, channel_uuid=cid, name="dm", creator=w.pubkey, channel_type="dm",
                participants=[signers[i].pubkey for i in sorted(c.members)],
            )  # fmt: skip
        else:
            channels.channel_create(
                community=community, channel_uuid=cid, name=c.kind, creator=w.pubkey,
                visibility="private" if c.kind == "private" else "open", listed=c.kind != "unlisted",
            )  # fmt: skip
            for i in sorted(c.members):
                channels.member_put(community=community, channel_uuid=cid, actor=None, pubkey=signers[i].pubkey)
        world.channels[c.id] = Channel(
            c.id,
            visibility="private" if c.kind in ("private", "dm") else "open",
            listed=c.kind not in ("unlisted", "dm"),
            dm=c.kind == "dm",
            members={w.pubkey, *(signers[i].pubkey for i in c.members)},
        )
    scopes = ["messages:read"] if plan.token_reads else ["messages:write", "channels:read"]
    token_channels = None if plan.token_channels is None else [plan.channels[i].id for i in sorted(plan.token_channels)]
    token = token_create(community=community, pubkey=signers[3].pubkey, scopes=scopes, channels=token_channels).token
    readers: list[tuple[Reader, Signer | str]] = [(Reader(f"r{i}", signers[i].pubkey), signers[i]) for i in range(3)]
    readers.append(
        (
            Reader(
                "r3 (token)", signers[3].pubkey, scopes=frozenset(scopes),
                channels=None if token_channels is None else frozenset(token_channels),
            ),
            token,
        )
    )  # fmt: skip
    readers.append((Reader("writer", w.pubkey), w))
    return Example(host, world, w, readers)


async def _write(relay: RelayProcess, plan: Plan, ex: Example) -> None:
    author = Author(ex.world, ex.w)
    ids = [c.id for c in plan.channels]
    async with RelayClient.connect(relay.ws_url, host=ex.host) as client:
        assert (await client.auth(ex.w))[2] is True

        async def send(event: dict[str, Any]) -> None:
            reply = await publish(client, event)
            assert reply[2] is True, (reply, event["tags"])
            author.accepted(event)

        for a in plan.artifacts:
            await send(author.revision(a.d, "create", h=ids[a.home], type_name=a.type, title=a.title, tags=a.tags))
            for step in a.steps:
                head = ex.world.artifacts[a.d].head
                deleted = head.op == "delete"
                if step.op == "restore" and deleted:
                    await send(author.revision(a.d, "restore", title=step.title, tags=step.tags))
                elif step.op == "delete" and not deleted:
                    await send(author.revision(a.d, "delete"))
                elif step.op == "update" and not deleted:
                    await send(author.revision(a.d, "update", title=step.title, tags=step.tags))
                elif step.op == "move" and not deleted and ids[step.dest] != head.channel:
                    await send(author.revision(a.d, "move", h=ids[step.dest], title=step.title, tags=step.tags))


def _finish(plan: Plan, ex: Example, community_host: str) -> None:
    """After the writes: moderation's redactions, then the channel changes of the plan."""
    from buzz.models import Community

    community = Community.objects.get(host=community_host)
    with connection.cursor() as cur:
        for a in plan.artifacts:
            revisions = ex.world.artifacts[a.d].revisions
            if a.redact is not None and a.redact < len(revisions) - 1:
                cur.execute("UPDATE artifacts_revision SET redacted_at = now() WHERE id = %s", [revisions[a.redact].id])
                revisions[a.redact].redacted = True
            if a.retire:
                cur.execute("UPDATE artifacts_revision SET redacted_at = now() WHERE id = %s", [revisions[-1].id])
                cur.execute("UPDATE artifacts_artifact SET retired = true WHERE head_id = %s", [revisions[-1].id])
                revisions[-1].redacted = True
    by_name = {r.name: r.pubkey for r, _ in ex.readers}
    for c in plan.channels:
        cid, model = uuid.UUID(c.id), ex.world.channels[c.id]
        for i in sorted(c.left):
            pubkey = by_name["r3 (token)" if i == 3 else f"r{i}"]
            channels.member_remove(community=community, channel_uuid=cid, actor=None, pubkey=pubkey)
            model.members.discard(pubkey)
        if c.end == "deleted":
            channels.channel_delete(community=community, channel_uuid=cid, actor=None)
            model.deleted = True
        elif c.end == "archived":
            channels.channel_edit(community=community, channel_uuid=cid, actor=None, changes={"archived": "true"})
        elif c.end == "visibility":
            model.visibility = "open" if model.visibility == "private" else "private"
            channels.channel_edit(
                community=community, channel_uuid=cid, actor=None, changes={"visibility": model.visibility}
            )
        elif c.end == "listed":
            model.listed = not model.listed
            channels.channel_edit(
                community=community, channel_uuid=cid, actor=None, changes={"listed": str(model.listed).lower()}
            )


# --- comparing -------------------------------------------------------------------------


def _post(relay: RelayProcess, host: str, who: Signer | str, path: str, body: bytes) -> tuple[int, Any]:
    authorization = nip98(who, host, "POST", path, body) if isinstance(who, Signer) else f"Bearer {who}"
    headers = {"Host": host, "Content-Type": "application/json", "Authorization": authorization}
    status, raw = raw_request(relay, "POST", path, headers, body, 20)
    return status, json.loads(raw)


def _expected(ex: Example, reader: Reader, filt: dict[str, Any], path: str) -> tuple[int, Any]:
    try:
        if path == "/count":
            return 200, {"count": count(ex.world, reader, filt)}
        return 200, evaluate(ex.world, reader, filt)
    except Denied as denied:
        return denied.status, denied.reason


def _agrees(expected: tuple[int, Any], got: tuple[int, Any], reader: Reader, path: str) -> bool:
    status, body = got
    if status != expected[0]:
        return False
    if status != 200:
        reasons = {expected[1]}
        if reader.channels is not None and expected[1] != "restricted: this token lacks the messages:read scope":
            reasons.add(TOKEN_CHANNEL)  # which of the two a refused #h gets depends on the check order
        return isinstance(body, dict) and body.get("error") in reasons
    if path == "/count":
        return bool(body == expected[1])
    return isinstance(body, list) and [e["id"] for e in body] == expected[1]


async def _compare(relay: RelayProcess, plan: Plan, ex: Example) -> tuple[list[str], int]:
    jobs = []
    for filt in plan.filters:
        body = json.dumps([filt]).encode()
        for reader, credential in ex.readers:
            for path in ("/query", "/count"):
                jobs.append((filt, reader, path, asyncio.to_thread(_post, relay, ex.host, credential, path, body)))
    answers = await asyncio.gather(*(job[3] for job in jobs))
    mismatches = []
    rows = 0
    for (filt, reader, path, _), got in zip(jobs, answers, strict=True):
        expected = _expected(ex, reader, filt, path)
        rows += len(expected[1]) if path == "/query" and expected[0] == 200 else 0
        if not _agrees(expected, got, reader, path):
            shown = got[1] if path == "/count" or got[0] != 200 else [e["id"][:8] for e in got[1]]
            want = expected[1] if path == "/count" or expected[0] != 200 else [i[:8] for i in expected[1]]
            mismatches.append(f"{reader.name} {path} {filt}: expected {expected[0]} {want}, got {got[0]} {shown}")
    return mismatches, rows


def _describe(ex: Example) -> str:
    names = {r.pubkey: r.name for r, _ in ex.readers}
    lines = []
    for cid, c in ex.world.channels.items():
        who = sorted(names.get(p, p[:8]) for p in c.members)
        lines.append(f"channel {cid[:8]} {c.visibility} listed={c.listed} dm={c.dm} deleted={c.deleted} {who}")
    for d, a in ex.world.artifacts.items():
        revs = [f"{r.op}@{r.channel[:8]}{'(redacted)' if r.redacted else ''}:{r.id[:8]}" for r in a.revisions]
        lines.append(f"artifact {d[:8]} {a.type} {revs} head tags {a.head.tags[4:]}")
    return "\n".join(lines)


def test_views_match_the_model(relay_factory: Any) -> None:
    relay = relay_factory(BUZZ_WRITES_PER_SECOND="0")
    checked = {"examples": 0, "rows": 0}

    # No shrinking: every example costs a round of writes, and a mismatch is reported in full below.
    @settings(
        max_examples=10,
        deadline=None,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(plans())
    def check(plan: Plan) -> None:
        ex = _setup(plan)
        asyncio.run(_write(relay, plan, ex))
        _finish(plan, ex, ex.host)
        mismatches, rows = asyncio.run(_compare(relay, plan, ex))
        assert not mismatches, "\n".join([*mismatches[:20], "", _describe(ex)])
        checked["examples"] += 1
        checked["rows"] += rows

    check()
    assert checked["examples"] == 10
    assert checked["rows"] > 0  # the filters matched something


def test_model_denies_what_the_rules_deny() -> None:
    """The evaluator itself, on a hand-made world (no relay): the rules the relay is held to."""
    world = World()
    a, b, u, p, gone = (str(uuid.uuid4()) for _ in range(5))
    world.channels = {
        a: Channel(a, members={"m"}),
        b: Channel(b, visibility="private", members={"m"}),
        u: Channel(u, listed=False),
        p: Channel(p, visibility="private"),
        gone: Channel(gone, deleted=True, members={"m"}),
    }
    member, outsider = Reader("member", "m"), Reader("outsider", "o")
    token = Reader("token", "m", scopes=frozenset({"messages:read"}), channels=frozenset({a}))
    assert default_scope(world, outsider) == {a}
    assert default_scope(world, member) == {a, b}
    assert default_scope(world, token) == {a}
    for reader, h, ok in (
        (outsider, u, True), (outsider, p, False), (outsider, gone, False), (member, b, True), (token, b, False),
        (outsider, a.upper(), False),
    ):  # fmt: skip
        try:
            evaluate(world, reader, {"artifact": "current", "#h": [h]})
            assert ok, (reader, h)
        except Denied:
            assert not ok, (reader, h)
