"""The artifact model's own rules, pinned one by one (tests/artifacts/artifact_model.py)."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from tests.artifacts.artifact_model import (
    ARCHIVED,
    CONFLICT,
    HEAD_UNAVAILABLE,
    IDENTITY_TAKEN,
    INVALID,
    NOT_A_MEMBER,
    PRIVATE,
    ArtifactEvent,
    ArtifactModel,
    Move,
    Outcome,
)

OPEN_C = "11111111-1111-4111-8111-111111111111"
PRIV_C = "22222222-2222-4222-8222-222222222222"
OTHER_C = "33333333-3333-4333-8333-333333333333"
MISSING_C = "44444444-4444-4444-8444-444444444444"
D1 = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
D2 = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"

_ids = itertools.count()


def new_id() -> str:
    return hashlib.sha256(str(next(_ids)).encode()).hexdigest()


_DEFAULT = "default"


def ev(
    actor: str,
    op: str,
    *,
    d: str = D1,
    h: str = OPEN_C,
    type_: str = "buzz.task",
    title: str | None = _DEFAULT,
    root: str | None = None,
    prev: str | None = None,
    content: str = "",
    ar: str = "1",
    client_tags: tuple[str, ...] = (),
) -> ArtifactEvent:
    """A fresh event (new id); the title is there unless it is a delete or given."""
    if title == _DEFAULT:
        title = None if op == "delete" else "A task"
    return ArtifactEvent(
        id=new_id(), pubkey=actor, d=d, h=h, type=type_, op=op, title=title, root=root, prev=prev,
        content=content, ar=ar, client_tags=client_tags,
    )  # fmt: skip


@pytest.fixture
def model() -> ArtifactModel:
    m = ArtifactModel()
    m.add_channel(OPEN_C, members={"alice"})
    m.add_channel(PRIV_C, visibility=PRIVATE, members={"alice", "bob"})
    m.add_channel(OTHER_C, visibility=PRIVATE, members={"alice"})
    m.add_actor("carol")
    return m


def created(model: ArtifactModel, actor: str = "alice", *, h: str = OPEN_C, root: str | None = None) -> ArtifactEvent:
    event = ev(actor, "create", h=h, root=root)
    assert model.apply(actor, event) == Outcome.ok()
    return event


def test_create_then_update_advances_the_head(model: ArtifactModel) -> None:
    first = created(model)
    second = ev("carol", "update", prev=first.id)  # a nonmember may write in an open channel
    assert model.apply("carol", second) == Outcome.ok()
    assert model.heads()[D1] == (second.id, OPEN_C, False, "buzz.task", None)


def test_stale_prev_is_a_conflict_and_a_resubmission_is_a_duplicate(model: ArtifactModel) -> None:
    first = created(model)
    second = ev("alice", "update", prev=first.id)
    assert model.apply("alice", second).accepted
    competing = ev("alice", "update", prev=first.id, content="other")
    assert model.apply("alice", competing).reasons == (CONFLICT,)
    # The earlier accepted events still succeed, without changing the head.
    assert model.apply("alice", first) == Outcome.dup()
    assert model.apply("alice", second) == Outcome.dup()
    assert model.heads()[D1][0] == second.id


def test_identity_is_taken_even_when_unreadable_and_after_delete(model: ArtifactModel) -> None:
    first = created(model, h=PRIV_C)
    assert model.apply("carol", ev("carol", "create", h=OPEN_C)).reasons == (IDENTITY_TAKEN,)
    deletion = ev("alice", "delete", h=PRIV_C, prev=first.id)
    assert model.apply("alice", deletion).accepted
    assert model.apply("alice", ev("alice", "create", h=PRIV_C)).reasons == (IDENTITY_TAKEN,)


def test_create_needs_write_in_h(model: ArtifactModel) -> None:
    assert model.apply("carol", ev("carol", "create", h=PRIV_C)).reasons == (NOT_A_MEMBER,)
    assert model.apply("alice", ev("alice", "create", h=MISSING_C)).reasons == (NOT_A_MEMBER,)
    model.set_archived(PRIV_C, True)
    assert model.apply("bob", ev("bob", "create", h=PRIV_C)).reasons == (ARCHIVED,)
    assert model.apply("carol", ev("carol", "create", h=PRIV_C)).reasons == (NOT_A_MEMBER,)


def test_unreadable_head_answers_like_a_missing_one(model: ArtifactModel) -> None:
    first = created(model, h=PRIV_C)
    for prev in (first.id, new_id()):
        assert model.apply("carol", ev("carol", "update", h=PRIV_C, prev=prev)).reasons == (HEAD_UNAVAILABLE,)
    assert model.apply("carol", ev("carol", "update", d=D2, h=PRIV_C, prev=new_id())).reasons == (HEAD_UNAVAILABLE,)
    # An archived home the sender can read says so; one it can't read stays unavailable.
    model.set_archived(PRIV_C, True)
    assert model.apply("bob", ev("bob", "update", h=PRIV_C, prev=first.id)).reasons == (ARCHIVED,)
    assert model.apply("carol", ev("carol", "update", h=PRIV_C, prev=first.id)).reasons == (HEAD_UNAVAILABLE,)
    # A deleted home channel is like a missing one.
    model.set_archived(PRIV_C, False)
    model.delete_channel(PRIV_C)
    assert model.apply("alice", ev("alice", "update", h=PRIV_C, prev=first.id)).reasons == (HEAD_UNAVAILABLE,)


def test_resubmission_after_losing_access_is_a_duplicate(model: ArtifactModel) -> None:
    first = created(model, "bob", h=PRIV_C)
    model.set_member(PRIV_C, "bob", False)
    assert model.apply("bob", first) == Outcome.dup()
    assert model.apply("bob", ev("bob", "update", h=PRIV_C, prev=first.id)).reasons == (HEAD_UNAVAILABLE,)


def test_update_keeps_h_and_type(model: ArtifactModel) -> None:
    first = created(model)
    assert model.apply("alice", ev("alice", "update", h=PRIV_C, prev=first.id)).reasons == (INVALID,)
    assert model.apply("alice", ev("alice", "update", type_="buzz.note", prev=first.id)).reasons == (INVALID,)
    # Two rules broken: either answer is right.
    both = model.apply("alice", ev("alice", "update", type_="buzz.note", prev=new_id()))
    assert set(both.reasons) == {CONFLICT, INVALID}


def test_move_needs_write_in_both_and_changes_h(model: ArtifactModel) -> None:
    first = created(model)
    assert model.apply("alice", ev("alice", "move", h=OPEN_C, prev=first.id)).reasons == (INVALID,)
    assert model.apply("carol", ev("carol", "move", h=PRIV_C, prev=first.id)).reasons == (NOT_A_MEMBER,)
    model.set_archived(OTHER_C, True)
    assert model.apply("alice", ev("alice", "move", h=OTHER_C, prev=first.id)).reasons == (ARCHIVED,)
    # Permission in both channels is answered first, as a kind-9 message's is: a stale prev or a deleted
    # artifact is not the answer when the destination refuses the write.
    assert model.apply("alice", ev("alice", "move", h=OTHER_C, prev=new_id())).reasons == (ARCHIVED,)
    assert model.apply("carol", ev("carol", "move", h=PRIV_C, prev=new_id(), type_="buzz.note")).reasons == (
        NOT_A_MEMBER,
    )
    model.set_archived(OTHER_C, False)
    move = ev("alice", "move", h=PRIV_C, prev=first.id)
    assert model.apply("alice", move).accepted
    assert model.heads()[D1][:2] == (move.id, PRIV_C)
    assert model.moves == [Move(D1, OPEN_C, first.id)]
    # Now carol can't read it: the source she could write in no longer matters.
    assert model.apply("carol", ev("carol", "update", h=OPEN_C, prev=move.id)).reasons == (HEAD_UNAVAILABLE,)


def test_move_root_is_absent_or_in_the_destination(model: ArtifactModel) -> None:
    here, there = new_id(), new_id()
    assert model.post_message("alice", here, OPEN_C).accepted
    assert model.post_message("alice", there, PRIV_C).accepted
    first = created(model, root=here)
    assert model.apply("alice", ev("alice", "move", h=PRIV_C, prev=first.id, root=here)).reasons == (INVALID,)
    assert model.apply("alice", ev("alice", "move", h=PRIV_C, prev=first.id, root=there)).accepted


def test_delete_shape_and_what_it_keeps(model: ArtifactModel) -> None:
    anchor = new_id()
    model.post_message("alice", anchor, OPEN_C)
    first = created(model, root=anchor)
    bad = [
        ev("alice", "delete", prev=first.id, root=anchor, title="x"),
        ev("alice", "delete", prev=first.id, root=anchor, content="x"),
        ev("alice", "delete", prev=first.id, root=anchor, client_tags=("status",)),
        ev("alice", "delete", prev=first.id, root=None),
        ev("alice", "delete", prev=first.id, root=anchor, h=PRIV_C),
        ev("alice", "delete", prev=first.id, root=anchor, type_="buzz.note"),
    ]
    for event in bad:
        assert model.apply("alice", event).reasons == (INVALID,), event
    deletion = ev("alice", "delete", prev=first.id, root=anchor)
    assert model.apply("alice", deletion).accepted
    assert model.heads()[D1] == (deletion.id, OPEN_C, True, "buzz.task", anchor)


def test_only_restore_after_delete_and_it_names_the_deletion(model: ArtifactModel) -> None:
    first = created(model)
    assert model.apply("alice", ev("alice", "restore", prev=first.id)).reasons == (INVALID,)
    deletion = ev("alice", "delete", prev=first.id)
    assert model.apply("alice", deletion).accepted
    for op in ("update", "delete"):
        assert model.apply("alice", ev("alice", op, prev=deletion.id)).reasons == (INVALID,)
    assert model.apply("alice", ev("alice", "move", h=PRIV_C, prev=deletion.id)).reasons == (INVALID,)
    assert set(model.apply("alice", ev("alice", "restore", prev=first.id)).reasons) == {CONFLICT}
    assert model.apply("alice", ev("alice", "restore", h=PRIV_C, prev=deletion.id)).reasons == (INVALID,)
    restore = ev("alice", "restore", prev=deletion.id)
    assert model.apply("alice", restore).accepted
    assert model.heads()[D1] == (restore.id, OPEN_C, False, "buzz.task", None)


def test_roots_new_and_kept(model: ArtifactModel) -> None:
    here, elsewhere = new_id(), new_id()
    model.post_message("alice", here, OPEN_C)
    model.post_message("alice", elsewhere, PRIV_C)
    assert model.apply("alice", ev("alice", "create", root=elsewhere)).reasons == (INVALID,)
    assert model.apply("alice", ev("alice", "create", root=new_id())).reasons == (INVALID,)
    first = created(model, root=here)
    model.remove_message(here)
    # A kept root needs no anchor any more; a new one must exist, undeleted, in h.
    kept = ev("alice", "update", prev=first.id, root=here)
    assert model.apply("alice", kept).accepted
    later = new_id()
    model.post_message("alice", later, OPEN_C)
    model.remove_message(later)
    assert model.apply("alice", ev("alice", "update", prev=kept.id, root=later)).reasons == (INVALID,)
    detached = ev("alice", "update", prev=kept.id)
    assert model.apply("alice", detached).accepted
    # Going back to the removed anchor is a change again.
    assert model.apply("alice", ev("alice", "update", prev=detached.id, root=here)).reasons == (INVALID,)


def test_envelope_errors(model: ArtifactModel) -> None:
    assert model.apply("alice", ev("alice", "create", prev=new_id())).reasons == (INVALID,)
    assert model.apply("alice", ev("alice", "update")).reasons == (INVALID,)
    assert model.apply("alice", ev("alice", "create", title="  ")).reasons == (INVALID,)
    assert model.apply("alice", ev("alice", "create", title=None)).reasons == (INVALID,)
    assert model.apply("alice", ev("alice", "create", ar="2")).reasons == (INVALID,)
    assert model.apply("alice", ev("alice", "create", type_="Buzz.Task")).reasons == (INVALID,)
    assert D1 not in model.heads()


def test_kind5_is_rejected_with_a_reason(model: ArtifactModel) -> None:
    first = created(model)
    answer = model.deletion_request("alice", [first.id])
    assert not answer.accepted
    assert answer.matches(False, "invalid: no") and not answer.matches(False, "")
    assert model.apply("alice", first) == Outcome.dup()


def test_kind9_anchor_follows_the_write_rules(model: ArtifactModel) -> None:
    assert model.post_message("carol", new_id(), PRIV_C).reasons == (NOT_A_MEMBER,)
    model.set_archived(OPEN_C, True)
    assert model.post_message("carol", new_id(), OPEN_C).reasons == (ARCHIVED,)
    assert model.post_message("carol", new_id(), MISSING_C).reasons == (NOT_A_MEMBER,)


def test_outcome_matching() -> None:
    assert Outcome.ok().matches(True, "")
    assert not Outcome.ok().matches(True, "duplicate: already accepted")
    assert Outcome.dup().matches(True, "duplicate: already accepted")
    assert not Outcome.dup().matches(False, "duplicate: already accepted")
    rejected = Outcome.reject(HEAD_UNAVAILABLE)
    assert rejected.matches(False, HEAD_UNAVAILABLE)
    assert not rejected.matches(False, "conflict: head changed")
    assert not rejected.matches(False, HEAD_UNAVAILABLE + " (in channel 2222)")  # a whole text: nothing added
    assert Outcome.reject(INVALID).matches(False, "invalid: anything")
    assert Outcome.reject(CONFLICT, INVALID).matches(False, "invalid: type is immutable")
