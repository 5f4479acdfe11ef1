"""ensure's update of a live head (artifacts.client.ensure._edit_of), pure logic: the content it sends keeps
every field the caller does not set exactly as it was, or the edit is declined (None: the caller reports a
conflict); and "the same content" is the same JSON values as written, not as Python compares them."""

from __future__ import annotations

import json
import uuid

import pytest

from artifacts.client.ensure import _edit_of
from artifacts.client.events import Event, Keys
from artifacts.client.revisions import revision

KEYS = Keys.generate()
CHANNEL = str(uuid.uuid4())


def head(content: str) -> Event:
    return revision(KEYS, d=str(uuid.uuid4()), h=CHANNEL, type="buzz.config", op="create", title="t", content=content)


@pytest.mark.parametrize(
    ("stored", "wanted"),
    [
        ('{"on":false}', {"on": 0}),
        ('{"on":0}', {"on": False}),
        ('{"enabled":1}', {"enabled": True}),
        ('{"n":1}', {"n": 1.0}),
    ],
)
def test_values_python_thinks_equal_are_other_content(stored: str, wanted: dict[str, object]) -> None:
    edit = _edit_of(head(stored), "t", json.dumps(wanted, separators=(",", ":")), [])
    assert edit is not None and not edit.same
    assert json.loads(edit.content) == wanted and edit.content != stored


def test_the_same_values_are_the_same_content() -> None:
    edit = _edit_of(head('{"a": 1, "on": false}'), "t", '{"on":false}', [])
    assert edit is not None and edit.same


@pytest.mark.parametrize(
    "stored",
    [
        '{"amount":12345678901234567890.5,"mode":"light"}',  # past a float's precision
        '{"ratio":1E2,"mode":"light"}',  # written otherwise by compact JSON (100.0)
        '{"price":1.50,"mode":"light"}',  # 1.5
        '{"zero":-0,"mode":"light"}',  # 0
        '{"big":1e400,"mode":"light"}',  # past a float's range: Infinity, not JSON
        '{"x":NaN,"mode":"light"}',
        '{"mode":"dark","mode":"light"}',  # a key twice: one of them would go
    ],
)
def test_an_update_that_cannot_keep_a_field_as_it_was_is_declined(stored: str) -> None:
    assert _edit_of(head(stored), "t", '{"mode":"dark"}', []) is None


def test_fields_the_caller_does_not_set_are_kept_as_written() -> None:
    stored = '{"big":123456789012345678901234567890,"f":0.1,"mode":"light","n":{"deep":[1,2.5,"x"]}}'
    edit = _edit_of(head(stored), "t", '{"mode":"dark"}', [])
    assert edit is not None and not edit.same
    assert edit.content == '{"big":123456789012345678901234567890,"f":0.1,"mode":"dark","n":{"deep":[1,2.5,"x"]}}'
