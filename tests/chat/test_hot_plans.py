"""The hot write statements read O(1) rows whatever the statistics say (issue 14, "No plan cliff").

psycopg prepares a statement the third time a connection runs it, and PostgreSQL then switches to a
generic plan, which it chooses without the parameters' values. On tables that were never analyzed
such a plan once looked a kind-9 reply's root up through the (community, channel, time) index and
filtered on the id: every message then read every event in the channel.

Method: the tables the statements read and write are created afresh in a schema of their own
(`CREATE TABLE ... (LIKE public.t INCLUDING ALL)`: the same columns, defaults, identities and
indexes, the same foreign keys re-created among them), with autovacuum off, and filled with 20,000
events and revisions in ONE channel, in a community of 1,000 more channels the author is a member of;
they are never analyzed (pinned: reltuples is still -1). Each
statement is prepared with the parameter types psycopg sends, and explained with
`plan_cache_mode = force_generic_plan`, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE`, in a
transaction that is rolled back. The parameters are built by the services' own functions from real
events. The assertions are on actual rows and buffers, never on time: no sequential scan of a hot
table, no index scan that does not search on its index's first column, no node that returns or
filters away more than a handful of rows, and a few hundred buffers at most for the whole statement
(scanning the channel's rows touches thousands). The first-column rule catches what the row counts
can't: an index that holds the looked-up key in a later column is read whole with the key as its
condition, which PostgreSQL counts as no row removed (an artifact's root was looked up through the
covering (community, channel, kind, time, id) index that way: every rooted edit read the index of
every live event in the community).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

from artifacts.envelope import parse_envelope
from artifacts.services import (
    _ADVANCE,
    _CREATE,
    _READ,
    _UPDATE,
    advance_params,
    create_params,
    read_params,
    update_params,
)
from buzz.chat.messages import _POST, post_params
from buzz.identity.actor import Actor
from buzz.nostr import Event, Signer, parse_event
from buzz.runtime import conninfo_from_settings
from buzz.sqlarrays import IntArray, TextArray, UuidArray
from tests.support.factories import make_channel, make_community, message, revision
from tests.support.inprocess import actor_of

HOST = "hot-plans.test"
SCHEMA = "fresh_hot"
ROWS = 20_000  # events in the one channel, and revisions in it
HOT_TABLES = (
    "buzz_storedevent",
    "buzz_eventtag",
    "buzz_threadstats",
    "buzz_mention",
    "artifacts_artifact",
    "artifacts_revision",
    "artifacts_currenttag",
    "artifacts_moveremoval",
    "buzz_channel",
    "buzz_membership",
    "buzz_messagecounter",
    "buzz_relaymember",
)
# Other channels of the community, the author a member of each: a plan that joined the community's
# channels with the author's memberships before the channel asked about read them all, on every write.
OTHER_CHANNELS = 1_000
# A node may return or filter away this many rows at most: an exact lookup returns one.
MAX_NODE_ROWS = 50
# Buffers for a whole statement (index descents and the writes' index entries), far below a scan of
# the channel's 20,000 rows.
MAX_BUFFERS = 400


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()  # noqa: S324 - test data, not security


# What _fill writes, by position: message i, artifact a (its id is a: the fresh identity starts at 1) with
# four revisions, the last its head.
def _message_id(i: int) -> str:
    return _md5(f"e{i}") + _md5(f"f{i}")


def _revision_id(a: int, v: int) -> str:
    return _md5(f"r{a}-{v}") + _md5(f"s{a}-{v}")


ROOT_AT = ROWS // 2
ARTIFACT_AT = ROWS // 8


@dataclass
class Fresh:
    conn: psycopg.Connection[Any]
    actor: Actor
    signer: Signer
    channel: uuid.UUID

    def fill(self) -> None:
        with self.conn.transaction():
            _fill(self.conn, self.actor.community.id, self.channel, self.signer.pubkey)

    def never_analyzed(self) -> bool:
        row = self.conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r' AND c.reltuples < 0",
            (SCHEMA,),
        ).fetchone()
        return row is not None and row[0] == len(HOT_TABLES)


def _fill(conn: psycopg.Connection[Any], community: int, channel: uuid.UUID, author: str) -> None:
    c = {
        "community": community,
        "channel": channel,
        "author": author,
        "rows": ROWS,
        "artifacts": ROWS // 4,
        "others": OTHER_CHANNELS,
    }
    # The community's relay members (the author), then as many more: admission to a members-only community
    # is a lookup of one of them, which a hashed subplan made a read of them all.
    conn.execute(
        "INSERT INTO buzz_relaymember SELECT * FROM public.buzz_relaymember WHERE community_id = %(community)s", c
    )
    conn.execute(
        "INSERT INTO buzz_relaymember (id, pubkey, community_id, role, created_at)"
        " SELECT 1000000 + i, md5('m' || i) || md5('n' || i), %(community)s, 'member', now()"
        " FROM generate_series(1, %(rows)s) AS i",
        c,
    )
    # The channel and its membership as the fixture made them (same ids), then the other channels.
    conn.execute("INSERT INTO buzz_channel SELECT * FROM public.buzz_channel WHERE uuid = %(channel)s", c)
    conn.execute(
        "INSERT INTO buzz_membership SELECT m.* FROM public.buzz_membership m"
        " JOIN public.buzz_channel ch ON ch.id = m.channel_id WHERE ch.uuid = %(channel)s",
        c,
    )
    # Copies of the channel (a private stream the author created) and of the author's membership in it.
    conn.execute(
        """
        INSERT INTO buzz_channel (id, uuid, name, about, topic, purpose, visibility, listed, type, ttl_seconds,
                                  deadline, created_by, created_at, archived_at, deleted_at, community_id,
                                  access_changed_at)
        SELECT 1000000 + i, md5('ch' || i)::uuid, 'other ' || i, about, topic, purpose, visibility, listed, type,
               ttl_seconds, deadline, created_by, created_at, archived_at, deleted_at, community_id,
               access_changed_at
        FROM public.buzz_channel, generate_series(1, %(others)s) AS i WHERE uuid = %(channel)s
        """,
        c,
    )
    conn.execute(
        """
        INSERT INTO buzz_membership (id, pubkey, role, joined_at, removed_at, read_mark, channel_id)
        SELECT 1000000 + i, m.pubkey, m.role, m.joined_at, m.removed_at, m.read_mark, 1000000 + i
        FROM public.buzz_membership m JOIN public.buzz_channel ch ON ch.id = m.channel_id,
             generate_series(1, %(others)s) AS i
        WHERE ch.uuid = %(channel)s AND m.pubkey = %(author)s
        """,
        c,
    )
    conn.execute(
        """
        INSERT INTO buzz_storedevent (id, community_id, pubkey, kind, created_at, channel_id, raw, received_at)
        SELECT md5('e' || i) || md5('f' || i), %(community)s, %(author)s, 9, 1700000000 + i, %(channel)s, '{}', now()
        FROM generate_series(1, %(rows)s) AS i
        """,
        c,
    )
    conn.execute(
        "INSERT INTO buzz_eventtag (event_key, name, value) SELECT key, 'h', channel_id::text FROM buzz_storedevent"
    )
    conn.execute(
        """
        INSERT INTO artifacts_artifact (id, community_id, d, type, head_id, home, root, deleted, retired, p_tags,
                                        created_at, changed_at)
        SELECT a, %(community)s, md5('d' || a)::uuid, 'buzz.task', md5('r' || a || '-4') || md5('s' || a || '-4'),
               %(channel)s, NULL, false, false, '{}', now(), now()
        FROM generate_series(1, %(artifacts)s) AS a
        """,
        c,
    )
    conn.execute(
        """
        INSERT INTO artifacts_revision (id, community_id, artifact_id, op, channel, prev, root, pubkey, created_at,
                                        raw, seq, accepted_at)
        SELECT md5('r' || a || '-' || v) || md5('s' || a || '-' || v), %(community)s, a,
               CASE WHEN v = 1 THEN 'create' ELSE 'update' END, %(channel)s,
               CASE WHEN v = 1 THEN NULL ELSE md5('r' || a || '-' || (v - 1)) || md5('s' || a || '-' || (v - 1)) END,
               NULL, %(author)s, 1700000000 + v, '{}', nextval('artifacts_accept_seq'), now()
        FROM generate_series(1, %(artifacts)s) AS a, generate_series(1, 4) AS v
        """,
        c,
    )
    conn.execute("SELECT setval(pg_get_serial_sequence('artifacts_artifact', 'id'), %(artifacts)s)", c)
    conn.execute(
        "INSERT INTO artifacts_currenttag (artifact_id, name, value)"
        " SELECT id, t, 'x' FROM artifacts_artifact, unnest(ARRAY['type', 'title']) AS t"
    )
    conn.execute(
        "INSERT INTO buzz_mention (community_id, pubkey, event_id, channel_id, kind, created_at)"
        " SELECT community_id, md5(id) || md5(id), id, channel_id, 9, now() FROM buzz_storedevent"
    )


@pytest.fixture
def fresh(transactional_db: None) -> Iterator[Fresh]:
    alice = Signer.generate()
    community = make_community(HOST, members=[alice])
    channel = make_channel(community, alice)
    conn = psycopg.connect(conninfo_from_settings(), autocommit=True)
    try:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
        for table in HOT_TABLES:
            conn.execute(
                sql.SQL("CREATE TABLE {}.{} (LIKE public.{} INCLUDING ALL) WITH (autovacuum_enabled = false)").format(
                    sql.Identifier(SCHEMA), sql.Identifier(table), sql.Identifier(table)
                )
            )
        # The foreign keys among them (and to public's other tables), as the real tables have them.
        keys = conn.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE contype = 'f' AND conrelid::regclass::text = ANY(%s)",
            (list(HOT_TABLES),),
        ).fetchall()
        conn.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(SCHEMA)))
        for table, name, definition in keys:
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} ").format(sql.Identifier(table), sql.Identifier(name))
                + sql.SQL(definition)  # type: ignore[arg-type]  # PostgreSQL's own text of the constraint
            )
        conn.execute("SET plan_cache_mode = force_generic_plan")
        yield Fresh(conn, actor_of(community, alice), alice, channel)
    finally:
        conn.execute("DEALLOCATE ALL")
        conn.execute("RESET search_path")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        conn.close()


class Prepared:
    """Statements prepared on `conn` as psycopg prepares them (their $n text and the parameter types it
    sends), each executed with its generic plan (the session's plan_cache_mode is force_generic_plan)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.literals: dict[str, str] = {}

    def prepare(self, name: str, statement: str, params: dict[str, Any] | list[Any]) -> None:
        """`params` named (`%(name)s`) or positional (`%s`), as the statement takes them."""
        query = PostgresQuery(Transformer(self.conn))
        query.convert(statement, params)
        self.conn.pgconn.prepare(f"hot_{name}".encode(), query.query, [int(t) for t in query.types])
        values = params if isinstance(params, list) else _values(statement, params, len(query.types))
        self.literals[name] = sql.SQL(", ").join(sql.Literal(v) for v in values).as_string(self.conn)

    def explain(self, name: str) -> dict[str, Any]:
        """EXPLAIN (ANALYZE, BUFFERS) of one execution, rolled back. The first execution makes the plan
        that every later one reuses: a plan made on empty tables stays while they grow."""
        with self.conn.transaction(force_rollback=True):
            row = self.conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE hot_{name} ({self.literals[name]})"  # type: ignore[arg-type]
            ).fetchone()
        assert row is not None
        plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
        return dict(plan[0])

    def close(self) -> None:
        self.conn.execute("DEALLOCATE ALL")
        self.literals.clear()


def _values(statement: str, params: dict[str, Any], n: int) -> list[Any]:
    """The parameters in $n order: psycopg numbers each name at its first occurrence."""
    names: list[str] = []
    at = 0
    while (at := statement.find("%(", at)) >= 0:
        end = statement.index(")s", at)
        name = statement[at + 2 : end]
        if name not in names:
            names.append(name)
        at = end + 2
    assert len(names) == n
    return [params[name] for name in names]


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def _brief(node: dict[str, Any]) -> str:
    keys = ("Node Type", "Relation Name", "Index Name", "Index Cond", "Filter", "Actual Rows", "Actual Loops")
    shown = {k: node[k] for k in (*keys, "Rows Removed by Filter") if k in node}
    return json.dumps(shown)


def first_columns(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """The first column of every index of the fresh schema's tables, by index name."""
    rows = conn.execute(
        "SELECT i.relname, a.attname FROM pg_index x"
        " JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_namespace n ON n.oid = i.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]"
        " WHERE n.nspname = %s",
        (SCHEMA,),
    ).fetchall()
    return dict(rows)


def _searches_on(condition: str, column: str) -> bool:
    # "(id = $1)", "((id)::text = ($1)::text)", "(artifact_id = ANY ($1))"
    return re.search(rf"\b{re.escape(column)}\b\)?(::[a-z ]+)? (=|IS NULL)", condition) is not None


def assert_searched(explained: dict[str, Any], label: str, first: dict[str, str]) -> None:
    """Every index of the fresh schema that the plan runs is searched on its first column."""
    for node in nodes(explained["Plan"]):
        index = node.get("Index Name")
        # A Bitmap Index Scan names no relation; its index is one of the fresh schema's.
        if index is not None and node["Actual Loops"] and index in first:
            condition = node.get("Index Cond", "")
            assert _searches_on(condition, first[index]), (
                f"{label}: {index} is read without a condition on its first column {first[index]}: {_brief(node)}"
            )


def assert_exact(explained: dict[str, Any], label: str, first: dict[str, str]) -> None:
    top = explained["Plan"]
    assert "$1" in json.dumps(explained), f"{label}: not a generic plan"
    assert_searched(explained, label, first)
    for node in nodes(top):
        relation = node.get("Relation Name")
        if relation not in HOT_TABLES or node["Node Type"] == "ModifyTable":
            continue
        assert node["Node Type"] != "Seq Scan", f"{label}: sequential scan: {_brief(node)}"
        returned = node["Actual Rows"] * node["Actual Loops"]
        removed = sum(
            node.get(k, 0)
            for k in ("Rows Removed by Filter", "Rows Removed by Index Recheck", "Rows Removed by Join Filter")
        )
        assert returned <= MAX_NODE_ROWS, f"{label}: {returned} rows: {_brief(node)}"
        assert removed <= MAX_NODE_ROWS, f"{label}: {removed} rows filtered away: {_brief(node)}"
    buffers = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    assert buffers <= MAX_BUFFERS, f"{label}: {buffers} buffers"


def _event(raw: dict[str, Any]) -> Event:
    return parse_event(raw)


def hot_statements(fresh: Fresh) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each hot statement with the parameters its service builds, from real events."""
    actor, alice, channel = fresh.actor, fresh.signer, fresh.channel
    root = _message_id(ROOT_AT)
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    # Kind 9: a message that replies in no thread (the usual case), and a reply to a message.
    for name, parent in (("kind9", None), ("kind9_reply", root)):
        event = _event(message(alice, channel, root=parent, p=[Signer.generate().pubkey]))
        out[name] = (_POST.named, post_params(actor, event, channel))
    # NIP-AR create, without a root and rooted at a message.
    for name, parent in (("create", None), ("create_rooted", root)):
        event = _event(revision(alice, d=uuid.uuid4(), h=channel, root=parent))
        out[name] = (_CREATE.named, create_params(actor, event, parse_envelope(event), None))
    # NIP-AR edit: the read, then the compare-and-set advance (an update keeping the root).
    d = uuid.UUID(_md5(f"d{ARTIFACT_AT}"))
    head = _revision_id(ARTIFACT_AT, 4)
    event = _event(revision(alice, d=d, h=channel, op="update", prev=head, root=root))
    env = parse_envelope(event)
    out["edit_read"] = (_READ, read_params(actor, event, env, None))
    channel_pk = fresh.conn.execute("SELECT id FROM public.buzz_channel WHERE uuid = %s", (channel,)).fetchone()
    assert channel_pk is not None
    advance = advance_params(
        actor, event, env, artifact=ARTIFACT_AT, channel_pk=channel_pk[0], carried=[], removal=None, source=None
    )
    out["edit_advance"] = (_ADVANCE.named, advance)
    # The update in one statement: the read and the guarded compare-and-set (its named text; the service
    # runs the same statement with $n placeholders).
    out["edit_update"] = (_UPDATE.named, update_params(actor, event, env, None))
    # The foreign-key checks a move's commit runs for its removal (PostgreSQL's own lookups): the move
    # revision and the artifact. The other writes' commits check only their community, by its key.
    keys = {"c": actor.community.id, "id": head, "a": ARTIFACT_AT}
    for i, check in enumerate(
        (
            "SELECT 1 FROM ONLY artifacts_revision x WHERE community_id = %(c)s AND id = %(id)s FOR KEY SHARE OF x",
            "SELECT 1 FROM ONLY artifacts_artifact x WHERE id = %(a)s FOR KEY SHARE OF x",
        )
    ):
        out[f"fk{i}"] = (check, keys)
    return out


def test_the_hot_statements_read_a_handful_of_rows_on_never_analyzed_tables(fresh: Fresh) -> None:
    statements = hot_statements(fresh)
    # Planned while the tables are empty, as a relay that starts on a new database plans them; the
    # connection keeps these plans while the channel grows to 20,000 events.
    first = first_columns(fresh.conn)
    early = Prepared(fresh.conn)
    for name, (statement, params) in statements.items():
        early.prepare(name, statement, params)
        early.explain(name)
    fresh.fill()
    assert fresh.never_analyzed(), "a fresh table has statistics"
    for name in statements:
        assert_exact(early.explain(name), f"{name} (planned on empty tables)", first)
    early.close()
    # Planned on the full tables, still never analyzed.
    late = Prepared(fresh.conn)
    for name, (statement, params) in statements.items():
        late.prepare(name, statement, params)
        assert_exact(late.explain(name), f"{name} (planned on 20,000 rows)", first)
    late.close()
    assert fresh.never_analyzed()
    assert len(statements) == 9


def test_the_hot_statements_pass_their_arrays_as_one_pass_literals(fresh: Fresh) -> None:
    # psycopg's generic list dumper costs about 5 µs per list on the event loop (buzz.sqlarrays); every
    # array a hot write sends is typed instead.
    for name, (_, params) in hot_statements(fresh).items():
        for key, value in params.items():
            if isinstance(value, list | tuple):
                assert isinstance(value, TextArray | UuidArray | IntArray), f"{name}: {key} is a plain {type(value)}"
