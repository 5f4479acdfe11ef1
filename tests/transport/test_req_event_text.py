"""The text of a live event is made once per process and shared by every REQ that gets it (buzz.ws.req): the
shared text is the event's own serialization, an entry never outlives its event's identity, and the texts kept
stay within their bounds (count and size) whatever events go through."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from buzz.ws import req


@pytest.fixture
def empty_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(req, "_texts", {})
    monkeypatch.setattr(req, "_texts_chars", 0)
    yield


def _event(content: str) -> dict[str, Any]:
    return {"id": "0" * 64, "kind": 9, "tags": [["h", "x"]], "content": content}


@pytest.mark.usefixtures("empty_cache")
def test_each_event_gets_its_own_serialization_once() -> None:
    first, second = _event("one"), _event("two ✓ \ud800")
    assert req._event_text(first) == req.dumps(first)
    assert req._event_text(second) == req.dumps(second)
    cached = req._texts[id(first)][1]
    assert req._event_text(first) is cached  # the same text object: not serialized again
    # An equal but distinct decoded event is serialized for itself.
    copy = dict(first)
    assert req._event_text(copy) == req.dumps(first) and id(copy) in req._texts


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=60))
def test_the_texts_kept_stay_within_their_bounds(sizes: list[int]) -> None:
    events = [_event("x" * size) for size in sizes]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(req, "_texts", {})
        patch.setattr(req, "_texts_chars", 0)
        patch.setattr(req, "_TEXTS_MAX", 8)
        patch.setattr(req, "_TEXTS_MAX_CHARS", 6000)
        for event in events:
            assert req._event_text(event) == req.dumps(event)
            assert len(req._texts) <= 8
            assert req._texts_chars == sum(len(text) for _, text in req._texts.values()) <= 6000
            assert all(req._texts[id(kept)][0] is kept for kept, _ in req._texts.values())
        # The newest event is kept unless its text alone is over the bound.
        last = events[-1]
        assert (id(last) in req._texts) == (len(req.dumps(last)) <= 6000)
