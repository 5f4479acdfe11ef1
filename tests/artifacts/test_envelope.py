"""The NIP-AR envelope (artifacts.envelope.parse_envelope): every rule with a failing and a passing case,
each rejection's own `invalid:` text, and Hypothesis properties.

The properties compare parse_envelope with an oracle written here from the spec's "Event format"
and "Moving and deleting" text (not from the implementation): a random envelope is accepted exactly
when the oracle says it is valid, and every rejection is a ProtocolError whose reason starts with
`invalid:`; nothing else is ever raised.
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from artifacts.envelope import Envelope, parse_envelope
from buzz.nostr import Event, ProtocolError, parse_event

D = "04737c81-e5e8-4412-bb47-f446813cfeba"
H = "9b353519-f4fe-4757-aef4-bec6cc0ae54c"
PREV = "ab" * 32
ROOT = "cd" * 32
OWNER = "ef" * 32
OPS = ("create", "update", "move", "delete", "restore")


def event(tags: Sequence[Sequence[str]], content: str = '{"version":1}', kind: int = 45010) -> Event:
    """An unsigned event: parse_envelope reads only kind, tags and content."""
    return Event(
        id="0" * 64,
        pubkey="1" * 64,
        created_at=1_700_000_000,
        kind=kind,
        tags=tuple(tuple(t) for t in tags),
        content=content,
        sig="0" * 128,
    )


def envelope_tags(op: str = "create", /, **override: str | None) -> list[list[str]]:
    """A valid envelope for `op`; override=None drops a tag, a string replaces its value."""
    values: dict[str, str | None] = {
        "ar": "1",
        "d": D,
        "h": H,
        "type": "buzz.task",
        "title": None if op == "delete" else "Fix the payment timeout",
        "op": op,
        "root": None,
        "prev": None if op == "create" else PREV,
    }
    values.update(override)
    return [[name, value] for name, value in values.items() if value is not None]


def content_for(op: str) -> str:
    return "" if op == "delete" else '{"version":1,"status":"open"}'


def parse(tags: Sequence[Sequence[str]], content: str | None = None, kind: int = 45010) -> Envelope:
    op = next((t[1] for t in tags if t[0] == "op" and len(t) > 1), "create")
    return parse_envelope(event(tags, content_for(op) if content is None else content, kind))


def rejection(tags: Sequence[Sequence[str]], content: str | None = None, kind: int = 45010) -> str:
    with pytest.raises(ProtocolError) as info:
        parse(tags, content, kind)
    reason = info.value.reason
    assert reason.startswith("invalid: "), reason
    return reason


# --- the passing envelopes -------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_each_op_passes(op: str) -> None:
    env = parse(envelope_tags(op))
    assert env == Envelope(
        d=uuid.UUID(D),
        h=uuid.UUID(H),
        type="buzz.task",
        op=op,
        title=None if op == "delete" else "Fix the payment timeout",
        root=None,
        prev=None if op == "create" else PREV,
    )


def test_spec_example_with_client_tags_passes() -> None:
    tags = [*envelope_tags("create"), ["assignee", "aa" * 32], ["project", "17cfe3ca-b3d0-4a76-a2a4-4eaf0d3a4109"]]
    assert parse(tags).title == "Fix the payment timeout"


def test_root_passes_on_every_op() -> None:
    for op in OPS:
        assert parse(envelope_tags(op, root=ROOT)).root == ROOT


def test_tag_order_does_not_matter() -> None:
    tags = envelope_tags("update", root=ROOT)
    assert parse(list(reversed(tags))) == parse(tags)


# --- one failing and one passing case per rule ----------------------------------------


def test_kind_must_be_45010() -> None:
    assert rejection(envelope_tags(), kind=9) == "invalid: an artifact revision is kind 45010"


@pytest.mark.parametrize("name", ["ar", "d", "h", "type", "op"])
def test_required_tag_missing(name: str) -> None:
    assert rejection(envelope_tags("update", **{name: None})) == f"invalid: missing envelope tag {name}"


@pytest.mark.parametrize(("value", "shown"), [("2", "'2'"), ("0", "'0'"), ("1.0", "'1.0'"), ("", "''")])
def test_ar_version(value: str, shown: str) -> None:
    want = f"invalid: unsupported envelope version {shown} (this relay supports ar=1)"
    assert rejection(envelope_tags(ar=value)) == want
    assert parse(envelope_tags(ar="1")).d == uuid.UUID(D)


@pytest.mark.parametrize(
    "tags",
    [
        [["ar", "2"], ["d", D], ["h", H]],  # no type, title or op
        [["ar", "2"], *envelope_tags("create")[1:], ["prev", PREV]],  # prev on a create
        [["ar", "2"], ["d", D, "extra"], ["h", H], ["type", "buzz.task"], ["op", "create"]],  # three elements
        [["ar", "2", "extra"], *envelope_tags("create")[1:]],  # the version tag itself shaped otherwise
    ],
)
def test_another_version_is_answered_as_one_whatever_its_shape(tags: list[list[str]]) -> None:
    """An envelope of another version is refused for its version, not for today's rules it breaks."""
    assert rejection(tags) == "invalid: unsupported envelope version '2' (this relay supports ar=1)"


@pytest.mark.parametrize("name", ["d", "h"])
@pytest.mark.parametrize(
    "value",
    [
        D.upper(),  # uppercase
        D.replace("-", ""),  # unhyphenated
        "{" + D + "}",  # braces
        D[:-1],  # too short
        D + "0",  # too long
        " " + D,  # padded
        "04737c81e5e8-4412-bb47-f446813cfeba0",  # hyphens in the wrong places, same length
        "urn:uuid:" + D,
    ],
)
def test_uuid_shape(name: str, value: str) -> None:
    assert rejection(envelope_tags(**{name: value})) == f"invalid: {name} must be a lowercase hyphenated UUID"


@pytest.mark.parametrize("name", ["d", "h"])
def test_uuid_nil_and_valid(name: str) -> None:
    assert rejection(envelope_tags(**{name: str(uuid.UUID(int=0))})) == f"invalid: {name} must not be the nil UUID"
    # Any lowercase hyphenated non-nil UUID passes, whatever its version (a derived d is UUIDv8).
    for value in (str(uuid.uuid4()), "018f3c8e-0000-8000-8000-000000000001", "ffffffff-ffff-ffff-ffff-ffffffffffff"):
        env = parse(envelope_tags(**{name: value}))
        assert str(getattr(env, name)) == value


TYPE_GRAMMAR = "invalid: type must be dot-separated lowercase components, each starting with a letter"


@pytest.mark.parametrize(
    "value",
    ["1buzz.task", "buzz.2task", "Buzz.task", "buzz.Task", "buzz..task", ".buzz", "buzz.", "", "_x", "buzz._task",
     "-x", "buzz task", "buzz/task", "bü.task", "buzz.task\n"],
)  # fmt: skip
def test_type_grammar(value: str) -> None:
    assert rejection(envelope_tags(type=value)) == TYPE_GRAMMAR


def test_type_length() -> None:
    at_limit = "a" * 64 + "." + "b" * 63  # 128 bytes
    assert parse(envelope_tags(type=at_limit)).type == at_limit
    assert rejection(envelope_tags(type=at_limit + "c")) == "invalid: type is at most 128 bytes"
    for value in ("a", "buzz.task", "x-y_z.b2", "a.b.c.d-1_"):
        assert parse(envelope_tags(type=value)).type == value


@pytest.mark.parametrize(
    "value",
    [
        "", " ", "\t\n", "\u3000", "\u00a0 ",
        # Nothing in these shows either: zero-width space, direction marks, word joiner, BOM, fillers.
        "\u200b", "\u200e\u200f", "\u2060", "\ufeff", "\u3164", "\u2800", "\u115f\u1160", "\uffa0", " \u200b\u00a0",
        # Default-ignorable code points that are not format characters: variation selectors (standard,
        # Mongolian, supplement), the combining grapheme joiner, the Khmer inherent vowels, reserved ones.
        "\ufe0f", "\ufe00\ufe0e", "\u180b", "\u180f", "\u034f", "\u17b4\u17b5", "\U000e0100", "\U000e01ef",
        "\u2065", "\ufff0", "\U000e0080", " \ufe0f\u200d\ufe0f ",
    ],
)  # fmt: skip
def test_title_blank(value: str) -> None:
    assert rejection(envelope_tags(title=value)) == "invalid: title must not be blank"


@pytest.mark.parametrize(
    "value", ["x", "\u200bx", "a\u2800", "\u00e9", "\U0001f600", "\u3164\u4e00", "\u2764\ufe0f", "\u0301", "\ufe10"]
)
def test_a_title_with_something_visible_is_not_blank(value: str) -> None:
    assert parse(envelope_tags(title=value)).title == value


# Characters that show nothing: whitespace, format characters and the default-ignorable code points (the Unicode
# Character Database's Default_Ignorable_Code_Point ranges, and the Braille blank).
_NOTHING = st.one_of(
    st.characters(categories=["Zs", "Cf"]),
    st.sampled_from(" \t\n\u00a0\u2800"),
    st.integers(0xFE00, 0xFE0F).map(chr),
    st.integers(0xE0100, 0xE01EF).map(chr),
    st.integers(0x180B, 0x180F).map(chr),
    st.sampled_from("\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0\u2065\ufff0"),
)


@given(
    nothing=st.text(_NOTHING, min_size=1, max_size=40),
    letter=st.characters(categories=["L"]).filter(lambda c: c not in "\u115f\u1160\u3164\uffa0"),
    at=st.integers(),
)
def test_a_title_is_blank_exactly_when_nothing_in_it_shows(nothing: str, letter: str, at: int) -> None:
    assert rejection(envelope_tags(title=nothing)) == "invalid: title must not be blank"
    at %= len(nothing) + 1
    shown = nothing[:at] + letter + nothing[at:]
    assert parse(envelope_tags(title=shown)).title == shown


def test_title_length_in_utf8_bytes() -> None:
    assert parse(envelope_tags(title="é" * 256)).title == "é" * 256  # 512 bytes, 256 characters
    assert rejection(envelope_tags(title="é" * 257)) == "invalid: title is at most 512 bytes"  # 514 bytes
    assert rejection(envelope_tags(title="😀" * 128 + "x")) == "invalid: title is at most 512 bytes"  # 513 bytes
    assert parse(envelope_tags(title="x" * 512)).title == "x" * 512
    assert rejection(envelope_tags(title="x" * 513)) == "invalid: title is at most 512 bytes"
    assert parse(envelope_tags(title=" padded ")).title == " padded "


@pytest.mark.parametrize("op", ["create", "update", "move", "restore"])
def test_title_required_except_on_delete(op: str) -> None:
    assert rejection(envelope_tags(op, title=None)) == "invalid: missing envelope tag title"


def test_title_absent_on_delete() -> None:
    assert rejection(envelope_tags("delete", title="Gone")) == "invalid: a delete carries no title"
    assert parse(envelope_tags("delete")).title is None


@pytest.mark.parametrize("value", ["edit", "Create", "CREATE", "", "create ", "remove", "upsert"])
def test_op_values(value: str) -> None:
    tags = envelope_tags("update", op=value)
    assert rejection(tags, content="{}") == "invalid: op must be create, update, move, delete or restore"


@pytest.mark.parametrize("name", ["root", "prev"])
@pytest.mark.parametrize("value", ["AB" * 32, "ab" * 31 + "a", "ab" * 32 + "a", "g" * 64, "", "0x" + "ab" * 31])
def test_event_id_shape(name: str, value: str) -> None:
    tags = envelope_tags("update", **{name: value})
    assert rejection(tags) == f"invalid: {name} must be an event id: 64 lowercase hex characters"


def test_prev_iff_not_create() -> None:
    assert rejection(envelope_tags("create", prev=PREV)) == "invalid: a create has no prev"
    for op in ("update", "move", "delete", "restore"):
        assert rejection(envelope_tags(op, prev=None)) == f"invalid: {op} needs prev, the current revision's id"
        assert parse(envelope_tags(op)).prev == PREV
    assert parse(envelope_tags("create")).prev is None


@pytest.mark.parametrize("name", ["ar", "d", "h", "type", "title", "op", "prev", "root"])
def test_envelope_tag_with_one_or_three_elements(name: str) -> None:
    base = envelope_tags("update", root=ROOT)
    for shape in ("one", "three"):
        tags = [([t[0]] if shape == "one" else [t[0], t[1], "extra"]) if t[0] == name else t for t in base]
        assert rejection(tags) == f"invalid: envelope tag {name} must have exactly two elements", shape


def test_client_tags_may_have_any_arity() -> None:
    tags = [*envelope_tags(), ["flag"], ["p", "aa" * 32, "wss://relay", "mention"], ["e", ROOT, ""]]
    assert parse(tags).op == "create"


@pytest.mark.parametrize("name", ["ar", "d", "h", "type", "title", "op", "prev", "root"])
def test_envelope_tag_twice(name: str) -> None:
    base = envelope_tags("update", root=ROOT)
    same = next(t for t in base if t[0] == name)
    assert rejection([*base, list(same)]) == f"invalid: envelope tag {name} occurs more than once"


def test_two_version_tags_are_a_tag_twice_whatever_their_values() -> None:
    tags = [["ar", "1"], *envelope_tags("create")[1:], ["ar", "2"]]
    assert rejection(tags) == "invalid: envelope tag ar occurs more than once"


def test_tag_count_limit() -> None:
    base = envelope_tags()
    filler = [["x", str(i)] for i in range(256 - len(base))]
    assert parse([*base, *filler]).op == "create"  # 256 tags
    assert rejection([*base, *filler, ["x", "one more"]]) == "invalid: an artifact carries at most 256 tags"


def test_tag_name_limit() -> None:
    assert parse([*envelope_tags(), ["n" * 128, "v"]]).op == "create"
    assert rejection([*envelope_tags(), ["n" * 129, "v"]]) == "invalid: tag names are at most 128 bytes"
    assert rejection([*envelope_tags(), ["é" * 65, "v"]]) == "invalid: tag names are at most 128 bytes"  # 130 bytes


def test_tag_value_limit() -> None:
    assert parse([*envelope_tags(), ["v", "x" * 4096]]).op == "create"
    assert rejection([*envelope_tags(), ["v", "x" * 4097]]) == "invalid: tag values are at most 4096 bytes"
    assert rejection([*envelope_tags(), ["v", "é" * 2049]]) == "invalid: tag values are at most 4096 bytes"
    # Every value of a tag counts, not only the first.
    assert rejection([*envelope_tags(), ["v", "ok", "x" * 4097]]) == "invalid: tag values are at most 4096 bytes"


def utf8(tags: Sequence[Sequence[str]]) -> int:
    return sum(len(part.encode()) for tag in tags for part in tag)


def test_total_tag_bytes_limit() -> None:
    base = envelope_tags()
    tags = [*base, *(["v", "x" * 4000] for _ in range(16))]
    room = 65536 - utf8(tags)
    exactly = [*tags, ["w", "y" * (room - 1)]]
    assert utf8(exactly) == 65536
    assert parse(exactly).op == "create"
    over = [*tags, ["w", "y" * room]]
    assert utf8(over) == 65537
    assert rejection(over) == "invalid: an artifact's tags total at most 65536 bytes"


def test_delete_content_and_tags() -> None:
    assert rejection(envelope_tags("delete"), content="{}") == "invalid: a delete has empty content"
    assert rejection(envelope_tags("delete"), content=" ") == "invalid: a delete has empty content"
    assert (
        rejection([*envelope_tags("delete"), ["p", "aa" * 32]])
        == "invalid: a delete carries only envelope tags and auth tags, not 'p'"
    )
    assert (
        rejection([*envelope_tags("delete"), ["status", "done"]])
        == "invalid: a delete carries only envelope tags and auth tags, not 'status'"
    )
    # An NIP-OA auth tag is allowed (buzz.nostr verifies it before anything is stored), and root is kept.
    auth = ["auth", OWNER, "kind=45010", "00" * 64]
    assert parse([*envelope_tags("delete", root=ROOT), auth], content="").op == "delete"


def test_every_rule_has_its_own_text() -> None:
    cases: list[tuple[list[list[str]], str | None]] = [
        (envelope_tags(ar="2"), None),
        (envelope_tags(d=D.upper()), None),
        (envelope_tags(h=H.upper()), None),
        (envelope_tags(d=str(uuid.UUID(int=0))), None),
        (envelope_tags(type="1x"), None),
        (envelope_tags(type="a" * 129), None),
        (envelope_tags(title=" "), None),
        (envelope_tags(title="x" * 513), None),
        (envelope_tags(title=None), None),
        (envelope_tags("delete", title="t"), None),
        (envelope_tags(op="nope"), "{}"),
        (envelope_tags(root="x"), None),
        (envelope_tags("update", prev="x"), None),
        (envelope_tags(prev=PREV), None),
        (envelope_tags("update", prev=None), None),
        ([*envelope_tags(), ["op", "create"]], None),
        ([*envelope_tags(), ["n" * 129, "v"]], None),
        ([*envelope_tags(), ["v", "x" * 4097]], None),
        (envelope_tags("delete"), "{}"),
        ([*envelope_tags("delete"), ["x", "y"]], None),
    ]
    reasons = [rejection(tags, content) for tags, content in cases]
    assert len(set(reasons)) == len(reasons), reasons


# --- Hypothesis ------------------------------------------------------------------------

_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")
_COMPONENT = re.compile(r"[a-z][a-z0-9_-]*")
ENVELOPE_NAMES = ("ar", "d", "h", "type", "title", "op", "root", "prev")


def _bytes(value: str) -> int:
    return len(value.encode("utf-8"))


# Code points a reader sees nothing of, besides whitespace, control and format characters: the Braille blank and
# the default-ignorable code points of other categories (Unicode's Default_Ignorable_Code_Point property).
_SHOW_NOTHING = frozenset(
    chr(c)
    for low, high in (
        (0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2065, 0x2065),
        (0x2800, 0x2800), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
        (0xE0000, 0xE0FFF),
    )
    for c in range(low, high + 1)
)  # fmt: skip


def _oracle_blank(title: str) -> bool:
    """A "nonblank display title" shows something."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf") or ch in _SHOW_NOTHING for ch in title)


def oracle_valid(tags: Sequence[Sequence[str]], content: str) -> bool:
    """Validity from the spec text, independently of artifacts.envelope."""
    if len(tags) > 256:
        return False
    if any(_bytes(t[0]) > 128 for t in tags) or any(_bytes(v) > 4096 for t in tags for v in t[1:]):
        return False
    if sum(_bytes(v) for t in tags for v in t) > 65536:
        return False
    env: dict[str, str] = {}
    for tag in tags:
        if tag[0] in ENVELOPE_NAMES:
            if tag[0] in env or len(tag) != 2:
                return False
            env[tag[0]] = tag[1]
    if any(name not in env for name in ("ar", "d", "h", "type", "op")) or env["ar"] != "1":
        return False
    for name in ("d", "h"):
        if not _UUID_RE.fullmatch(env[name]) or uuid.UUID(env[name]).int == 0:
            return False
    kind_name = env["type"]
    if _bytes(kind_name) > 128 or not all(_COMPONENT.fullmatch(c) for c in kind_name.split(".")):
        return False
    op = env["op"]
    if op not in OPS:
        return False
    title = env.get("title")
    if op == "delete":
        if title is not None or content != "":
            return False
        if any(t[0] not in ENVELOPE_NAMES and t[0] != "auth" for t in tags):
            return False
    elif title is None or _oracle_blank(title) or _bytes(title) > 512:
        return False
    for name in ("root", "prev"):
        if name in env and not _HEX64_RE.fullmatch(env[name]):
            return False
    return ("prev" in env) == (op != "create")


# Values that sit on either side of the rules, plus arbitrary text.
text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
interesting = st.sampled_from(
    [
        "1", "2", "", " ", D, D.upper(), D.replace("-", ""), str(uuid.UUID(int=0)), H, PREV, PREV.upper(), ROOT[:-1],
        "buzz.task", "buzz..task", "Buzz", "9lives", "a" * 129, "x" * 513, "é" * 257, "é" * 256, *OPS, "edit",
    ]
)  # fmt: skip
values = interesting | text | st.uuids().map(str) | st.binary(min_size=32, max_size=32).map(bytes.hex)
names = st.sampled_from([*ENVELOPE_NAMES, "auth", "p", "t", "x", "n" * 129]) | text.filter(bool)
# Replacement values aimed at the rule of the tag being replaced (each on both sides of it).
uuid_values = st.uuids().flatmap(
    lambda u: st.sampled_from([str(u), str(u).upper(), u.hex, str(uuid.UUID(int=0)), str(u)[:-1], f"{u}0"])
)
hex_values = st.binary(min_size=32, max_size=32).flatmap(
    lambda b: st.sampled_from([b.hex(), b.hex().upper(), b.hex()[:-1], b.hex() + "0"])
)
title_values = text | st.sampled_from(
    ["é" * 256, "é" * 257, "x" * 512, "x" * 513, "😀" * 128, "😀" * 129, " ", "\u3000"]
)
type_values = st.from_regex(r"[a-z][a-z0-9_-]{0,8}(\.[a-zA-Z0-9_.-]{0,8}){0,3}", fullmatch=True) | st.sampled_from(
    ["a" * 128, "a" * 129, "a." + "b" * 126, "a." + "b" * 127, "9lives", "a.9b", "a._b", "a..b", "A.b", "a-b.c_d"]
)
FIELD_VALUES = {
    "ar": st.sampled_from(["1", "2", "", "01", " 1"]),
    "d": uuid_values,
    "h": uuid_values,
    "prev": hex_values,
    "root": hex_values,
    "title": title_values,
    "type": type_values,
    "op": st.sampled_from([*OPS, "edit", "Create"]),
}
named_tag = st.tuples(names, st.lists(values, max_size=2)).map(lambda nv: [nv[0], *nv[1]])
tags_strategy = st.lists(named_tag | st.lists(values, max_size=3), max_size=10)


def _mutate(base: list[list[str]], data: st.DataObject) -> list[list[str]]:
    tags = [list(t) for t in base]
    action = data.draw(st.sampled_from(["replace"] * 5 + ["drop", "duplicate", "add", "arity", "rename"]))
    index = data.draw(st.integers(0, len(tags) - 1))
    if action == "replace":
        aimed = FIELD_VALUES.get(tags[index][0])
        tags[index][1:2] = [data.draw(values if aimed is None or data.draw(st.integers(0, 4)) == 0 else aimed)]
    elif action == "drop":
        del tags[index]
    elif action == "duplicate":
        tags.insert(data.draw(st.integers(0, len(tags))), list(tags[index]))
    elif action == "add":
        tags.insert(data.draw(st.integers(0, len(tags))), [data.draw(names), *data.draw(st.lists(values, max_size=2))])
    elif action == "arity":
        tags[index] = tags[index][:1] if data.draw(st.booleans()) else [*tags[index], data.draw(values)]
    else:
        tags[index][0] = data.draw(names)
    return tags


def _check(tags: list[list[str]], content: str) -> None:
    raw: dict[str, Any] = {
        "id": "0" * 64, "pubkey": "1" * 64, "created_at": 1, "kind": 45010, "tags": tags, "content": content,
        "sig": "0" * 128,
    }  # fmt: skip
    try:
        ev = parse_event(raw)
    except ProtocolError:
        return  # not an event at all: never reaches the envelope
    try:
        parse_envelope(ev)
    except ProtocolError as err:
        assert err.reason.startswith("invalid: "), err.reason
        assert not oracle_valid(tags, content), (tags, content, err.reason)
    else:
        assert oracle_valid(tags, content), (tags, content)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tags=tags_strategy, content=text)
def test_random_tags_raise_only_protocol_errors(tags: list[list[str]], content: str) -> None:
    _check(tags, content)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(OPS), with_root=st.booleans(), steps=st.integers(1, 3), data=st.data())
def test_mutated_envelope_stays_valid_or_fails_with_invalid(op: str, with_root: bool, steps: int, data: Any) -> None:
    tags = envelope_tags(op, root=ROOT if with_root else None)
    if op != "delete":
        tags.append(["status", "open"])
    content = content_for(op)
    for _ in range(steps):
        tags = _mutate(tags, data)
    if data.draw(st.booleans()):
        content = data.draw(st.sampled_from(["", "{}", content]))
    _check(tags, content)


def test_oracle_agrees_on_the_fixed_cases() -> None:
    """The oracle itself is checked against the hand-written cases above, so the properties mean something."""
    for op in OPS:
        assert oracle_valid(envelope_tags(op), content_for(op))
        assert oracle_valid(envelope_tags(op, root=ROOT), content_for(op))
    assert not oracle_valid(envelope_tags(type="buzz..task"), "{}")
    assert not oracle_valid(envelope_tags("delete"), "{}")
    assert not oracle_valid(envelope_tags(title="é" * 257), "{}")
