"""buzz.nostr.strictjson: JSON as json.loads reads it, except that an object naming a key twice is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from buzz.nostr.strictjson import DuplicateKey, loads

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


@given(values)
@settings(max_examples=300)
def test_json_without_duplicate_keys_reads_as_json_loads_reads_it(value: Any) -> None:
    text = json.dumps(value)
    assert loads(text) == json.loads(text)
    assert loads(text.encode()) == json.loads(text)


def _with_duplicate(value: Any, key: str, path: list[int]) -> str:
    """`value` as JSON text with an object `{key: 1, ..., key: 2}` placed at `path` (indexes into lists)."""
    inner = '{"%s": 1, "other": [], "%s": 2}' % (key, key)  # noqa: UP031 - JSON text, not a format
    text = inner
    for i in reversed(path):
        text = "[" + ", ".join(["null"] * (i % 3) + [text]) + "]"
    return json.dumps({"outer": value})[:-1] + ', "x": ' + text + "}"


@given(values, st.text(max_size=10).map(json.dumps).map(lambda s: s[1:-1]), st.lists(st.integers(0, 5), max_size=4))
@settings(max_examples=300)
def test_an_object_that_names_a_key_twice_is_refused_at_any_depth(value: Any, key: str, path: list[int]) -> None:
    text = _with_duplicate(value, key, path)
    json.loads(text)  # the standard decoder reads it (and keeps the last value)
    with pytest.raises(DuplicateKey) as info:
        loads(text)
    assert info.value.key == json.loads(f'"{key}"')
    assert info.value.reason.startswith("invalid: duplicate key")


def test_keys_that_differ_only_in_escaping_are_the_same_key() -> None:
    with pytest.raises(DuplicateKey):
        loads('{"#h": ["a"], "\\u0023h": ["b"]}')
    with pytest.raises(DuplicateKey):
        loads('[{"artifact": "head", "artifact": "current"}]')


def test_other_failures_are_json_loads_own() -> None:
    for text in ("", "{", "[1,]", '{"a" 1}'):
        with pytest.raises(ValueError) as info:
            loads(text)
        assert not isinstance(info.value, DuplicateKey)
