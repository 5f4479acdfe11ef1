"""An edit of an artifact the sender can't read sends the database exactly what an edit of a missing one
sends (issue 9, item 12: "Timing tells an unreadable artifact from a missing one").

Non-disclosure (NIP-AR "Errors MUST NOT disclose inaccessible artifact details") covers the time an
answer takes, not only its text: a path with one statement more was told apart 99.7% of the time
from a median of 11 tries. This test records, with libpq's protocol trace, every statement the whole
write entry point (`buzz.events.ingest.ingest`) sends for each guess, and pins that the two sequences
are identical, statement for statement, in order (values aside). It also pins that a refused edit
locks nothing: a row lock would give the unreadable path a transaction id and a WAL flush at commit.
bench/artifact_timing.py measures the same thing from outside, against a real relay.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from psycopg import AsyncConnection, pq

from buzz.chat import channels
from buzz.events.ingest import ingest
from buzz.identity.actor import Actor
from buzz.identity.communities import community_create, directory, member_add
from buzz.identity.tokens import token_create
from buzz.nostr import Signer
from buzz.runtime import runtime
from tests.artifacts.write_support import HEAD_UNAVAILABLE, revision

HOST = "statement-parity.test"

# One traced protocol message: direction, length, type, the rest (which may span lines: libpq does not
# escape newlines inside a query string).
_MESSAGE = re.compile(r"^([FB])\t(\d+)\t(\w+)\t?(.*?)(?=^[FB]\t\d+\t|\Z)", re.S | re.M)
_PARSE = re.compile(r'^ "([^"]*)" "(.*)" \d+(?: \S+)*\s*$', re.S)
_BIND = re.compile(r'^ "[^"]*" "([^"]*)"')
_QUERY = re.compile(r'^ "(.*)"\s*$', re.S)


def statements(trace: str, texts: dict[str, str] | None = None) -> list[str]:
    """The statements a trace shows the client executing, in order: a simple Query's text, or the text
    of the statement each extended-protocol Bind names (prepared or unnamed). `texts` holds the
    connection's prepared statements, from earlier traces of it; this trace's Parse messages add to it."""
    texts = {} if texts is None else texts
    out: list[str] = []
    for direction, _, kind, rest in _MESSAGE.findall(trace):
        if direction != "F":
            continue
        if kind == "Parse":
            m = _PARSE.match(rest)
            assert m is not None, rest
            texts[m.group(1)] = m.group(2)
        elif kind == "Bind":
            m = _BIND.match(rest)
            assert m is not None, rest
            out.append(texts[m.group(1)])
        elif kind == "Query":
            m = _QUERY.match(rest)
            assert m is not None, rest
            out.append(m.group(1))
    return [" ".join(s.split()) for s in out]


class TracingPool:
    """The runtime's pool, with libpq's trace on for every connection it lends.

    Each loan is traced into a file of its own and parsed when it ends, with the statements that
    connection prepared before (psycopg prepares a statement on its second use, per connection).
    """

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._prepared: dict[int, dict[str, str]] = {}
        self._recorded: list[str] = []

    @contextlib.asynccontextmanager
    async def connection(self, *args: Any, **kwargs: Any) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._pool.connection(*args, **kwargs) as conn:
            with tempfile.TemporaryFile() as trace:
                conn.pgconn.trace(trace.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
                try:
                    yield conn
                finally:
                    conn.pgconn.untrace()
                    trace.seek(0)
                    text = trace.read().decode("utf-8", errors="replace")
                    texts = self._prepared.setdefault(conn.pgconn.backend_pid, {})
                    self._recorded.extend(statements(text, texts))

    def take(self) -> list[str]:
        """The statements recorded since the last take()."""
        out, self._recorded = self._recorded, []
        return out


@dataclass
class World:
    alice: Signer
    mallory: Signer  # a relay member who is not in alice's private channel
    token: tuple[int, list[str], list[str]]  # mallory's token covering only the open channel: id, scopes, channels
    secret: uuid.UUID
    open: uuid.UUID

    async def actors(self) -> tuple[Actor, Actor, Actor]:
        """alice, mallory (NIP-42) and mallory with the channel-limited token."""
        info = await directory.lookup(HOST)
        assert info is not None
        token_id, scopes, limited_to = self.token
        limited = Actor(info, self.mallory.pubkey, frozenset(scopes), frozenset(limited_to), token_id)
        return Actor(info, self.alice.pubkey), Actor(info, self.mallory.pubkey), limited


@pytest.fixture
def world(transactional_db: None) -> World:
    community = community_create(host=HOST, name="Statement parity")
    alice, mallory = Signer.generate(), Signer.generate()
    for s in (alice, mallory):
        member_add(community=community, pubkey=s.pubkey)
    secret, open_ch = uuid.uuid4(), uuid.uuid4()
    channels.channel_create(
        community=community, channel_uuid=secret, name="secret", creator=alice.pubkey, visibility="private"
    )
    channels.channel_create(community=community, channel_uuid=open_ch, name="open", creator=alice.pubkey)
    channels.member_put(community=community, channel_uuid=open_ch, actor=None, pubkey=mallory.pubkey)
    rw = ["messages:read", "messages:write"]
    token = token_create(community=community, pubkey=mallory.pubkey, scopes=rw, channels=[str(open_ch)]).row
    return World(alice, mallory, (token.pk, rw, [str(open_ch)]), secret, open_ch)


@pytest.fixture
async def tracing(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TracingPool]:
    traced = TracingPool(await runtime.pool())

    async def pool() -> TracingPool:
        return traced

    # Both pools lend the one traced pool: the statements are compared, not the plans.
    monkeypatch.setattr(runtime, "pool", pool)
    monkeypatch.setattr(runtime, "write_pool", pool)
    try:
        yield traced
    finally:
        monkeypatch.undo()
        await runtime.aclose()


async def accept(actor: Actor, event: dict[str, Any]) -> str:
    _, result = await ingest(actor, event)
    assert result.ok and result.message == "", result
    return str(event["id"])


async def test_an_unreadable_artifact_and_a_missing_one_send_the_same_statements(
    world: World, tracing: TracingPool
) -> None:
    alice, mallory, limited = await world.actors()
    # alice's artifacts in her private channel: one live, one deleted.
    live, deleted = uuid.uuid4(), uuid.uuid4()
    live_head = await accept(alice, revision(world.alice, d=live, h=world.secret, op="create"))
    head = await accept(alice, revision(world.alice, d=deleted, h=world.secret, op="create"))
    deleted_head = await accept(alice, revision(world.alice, d=deleted, h=world.secret, op="delete", prev=head))
    tracing.take()

    compared = 0
    for sender in (mallory, limited):
        for op in ("update", "delete", "restore", "move"):
            for h in (world.secret, world.open):
                for guess in ("random", "real"):
                    sequences: dict[str, list[str]] = {}
                    for name, d, real in (
                        ("missing", uuid.uuid4(), secrets.token_hex(32)),
                        ("unreadable", live, live_head),
                        ("unreadable deleted", deleted, deleted_head),
                    ):
                        prev = real if guess == "real" else secrets.token_hex(32)
                        event = revision(world.mallory, d=d, h=h, op=op, prev=prev)
                        _, result = await ingest(sender, event)
                        assert not result.ok and result.message == HEAD_UNAVAILABLE, (name, op, result)
                        sequences[name] = tracing.take()
                    label = (sender.token_id is not None, op, h == world.secret, guess)
                    assert sequences["unreadable"] == sequences["missing"], label
                    assert sequences["unreadable deleted"] == sequences["missing"], label
                    assert not any("FOR UPDATE" in s for s in sequences["missing"]), sequences["missing"]
                    compared += 1
    assert compared == 32
    # The trace recorded real work: the one read of an edit (the artifact, the policy's facts, the anchor and
    # the resubmission check in one statement).
    assert len(sequences["missing"]) == 1, sequences["missing"]
    assert "artifacts_artifact" in sequences["missing"][0] and "buzz_membership" in sequences["missing"][0]


def test_the_trace_parser_reads_simple_and_extended_queries() -> None:
    trace = (
        'F\t10\tQuery\t "BEGIN"\nB\t10\tCommandComplete\t "BEGIN"\n'
        'F\t34\tParse\t "" "SELECT $1::int,\n \'a\tb\'" 1 NNNN\nF\t22\tBind\t "" "" 1 1 1 2 \'\\x00\\x00\' 1 0\n'
        'F\t40\tParse\t "_pg3_0" "SELECT 2" 0\nF\t28\tBind\t "" "_pg3_0" 0 0 1 0\n'
        'F\t28\tBind\t "" "_pg3_0" 0 0 1 0\nF\t11\tQuery\t "COMMIT"\n'
    )
    assert statements(trace) == ["BEGIN", "SELECT $1::int, 'a b'", "SELECT 2", "SELECT 2", "COMMIT"]
