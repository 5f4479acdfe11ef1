"""Checks of the write path: envelope rules, identity and compare-and-set, access, moves and 45011,
delete and restore. Each check names the NIP-AR rule it tests."""

from __future__ import annotations

import asyncio
import json
import secrets

from ..events import Event
from ..revisions import KIND_ARTIFACT, KIND_REMOVAL, next_revision, revision
from .runner import check, expect, short
from .world import Actor, World

# --- helpers ---------------------------------------------------------------------------


def envelope(
    world: World,
    *,
    d: str | None = None,
    h: str | None = None,
    type: str | None = None,
    title: str | None = "conformance item",
    op: str = "create",
    prev: str | None = None,
) -> list[list[str]]:
    tags = [
        ["ar", "1"],
        ["d", world.new_d() if d is None else d],
        ["h", world.channels.p if h is None else h],
        ["type", world.type if type is None else type],
    ]
    if title is not None:
        tags.append(["title", title])
    tags.append(["op", op])
    if prev is not None:
        tags.append(["prev", prev])
    return tags


def content() -> str:
    return json.dumps({"version": 1, "n": secrets.token_hex(4)})


async def refused(
    world: World,
    tags: list[list[str]],
    what: str,
    *,
    body: str | None = None,
    actor: Actor | None = None,
    prefix: str | None = "invalid",
) -> str:
    """Send a kind 45010 with these tags; it must be refused (with `prefix`). Returns the message."""
    who = actor or world.a
    event = who.keys.sign(KIND_ARTIFACT, tags, content() if body is None else body)
    ok = await who.send(event)
    expect(not ok.accepted, f"{what}: the relay accepted it ({ok.message!r})")
    if prefix is not None:
        expect(ok.message.startswith(prefix + ":"), f"{what}: refused with {ok.message!r}, not an {prefix}: reason")
    return ok.message


def tag_value(tags: list[list[str]], name: str) -> str:
    return next(t[1] for t in tags if t[0] == name)


async def stored_nothing(world: World, d: str, what: str) -> None:
    if world.has("head"):
        head = await world.a.head(d)
        expect(head is None, f"{what}: refused, yet the head view returns {short(head)}")


def replace_tag(tags: list[list[str]], name: str, value: str) -> list[list[str]]:
    return [[name, value] if t[0] == name else t for t in tags]


def without(tags: list[list[str]], name: str) -> list[list[str]]:
    return [t for t in tags if t[0] != name]


# --- envelope ---------------------------------------------------------------------------


@check("envelope: ar is required")
async def _ar_required(world: World) -> None:
    tags = without(envelope(world), "ar")
    await refused(world, tags, "a create without ar")
    await stored_nothing(world, tag_value(tags, "d"), "a create without ar")


@check("envelope: an unsupported envelope version is rejected")
async def _ar_version(world: World) -> None:
    tags = replace_tag(envelope(world), "ar", "2")
    await refused(world, tags, "a create with ar=2")
    await stored_nothing(world, tag_value(tags, "d"), "a create with ar=2")


@check("envelope: d is a lowercase hyphenated non-nil UUID")
async def _d_format(world: World) -> None:
    d = world.new_d()
    for bad, what in (
        (d.upper(), "an uppercase d"),
        (d.replace("-", ""), "an unhyphenated d"),
        ("00000000-0000-0000-0000-000000000000", "the nil UUID as d"),
        ("task-1", "a non-UUID d"),
    ):
        await refused(world, envelope(world, d=bad), what)


@check("envelope: h is a lowercase hyphenated UUID")
async def _h_format(world: World) -> None:
    await refused(world, envelope(world, h=world.channels.p.upper()), "an uppercase h")


@check("envelope: type follows the grammar (dot-separated lowercase ASCII components)")
async def _type_grammar(world: World) -> None:
    for bad in (
        "Conformance.Item",
        "1conformance.item",
        "conformance..item",
        "conformance.item!",
        ".x",
        "x.",
        "conformance.it\u00e9m",
        "",
    ):
        await refused(world, envelope(world, type=bad), f"type {bad!r}")


@check("envelope: type is at most 128 bytes")
async def _type_length(world: World) -> None:
    ok_type = "a" * 64 + "." + "b" * 63  # 128 bytes
    await world.create(type=ok_type)
    await refused(world, envelope(world, type=ok_type + "c"), "a 129-byte type")


@check("envelope: title is required except on delete, and never blank")
async def _title_required(world: World) -> None:
    await refused(world, envelope(world, title=None), "a create without title")
    await refused(world, envelope(world, title=" \t "), "a blank title")


@check("envelope: title is at most 512 UTF-8 bytes")
async def _title_length(world: World) -> None:
    euro = "\u20ac"  # three UTF-8 bytes
    await world.create(title=euro * 170 + "ab")  # 512 bytes
    await refused(world, envelope(world, title=euro * 171), "a title of 513 UTF-8 bytes (171 characters)")


@check("envelope: op is one of create, update, move, delete, restore")
async def _op_known(world: World) -> None:
    await refused(world, envelope(world, op="upsert"), "op=upsert")


@check("envelope: each envelope tag occurs once (client tags cannot override it)")
async def _envelope_once(world: World) -> None:
    for name, value in (("type", world.type + "x"), ("d", world.new_d()), ("op", "update"), ("ar", "1")):
        await refused(world, [*envelope(world), [name, value]], f"a second {name} tag")


@check("envelope: envelope tags have exactly two elements")
async def _envelope_two(world: World) -> None:
    tags = envelope(world)
    tags = [[*t, "extra"] if t[0] == "type" else t for t in tags]
    await refused(world, tags, "a three-element type tag")


@check("envelope: a create has no prev; every later op needs one, as an event id")
async def _prev_rules(world: World) -> None:
    await refused(world, envelope(world, prev="0" * 64), "a create with prev")
    head = await world.create()
    d = head.first("d") or ""
    await refused(world, envelope(world, d=d, op="update"), "an update without prev")
    await refused(world, envelope(world, d=d, op="update", prev=head.id.upper()), "an uppercase prev")
    await refused(world, envelope(world, d=d, op="update", prev=head.id[:63]), "a 63-character prev")


@check("envelope: more than 256 tags are rejected")
async def _too_many_tags(world: World) -> None:
    tags = envelope(world)
    tags += [["x", str(i)] for i in range(257 - len(tags))]
    await refused(world, tags, "an event with 257 tags")


@check("envelope: a delete has no title, empty content and only envelope (and auth) tags")
async def _delete_shape(world: World) -> None:
    head = await world.create(tags=[["status", "open"]])
    d = head.first("d") or ""
    base = envelope(world, d=d, op="delete", prev=head.id, title=None)
    await refused(world, envelope(world, d=d, op="delete", prev=head.id), "a delete with a title", body="")
    await refused(world, base, "a delete with content", body="{}")
    await refused(world, [*base, ["status", "open"]], "a delete with a client tag", body="")


@check("envelope: advertised tag limits are enforced", needs=("limit:max_tag_value_bytes", "limit:max_total_tag_bytes"))
async def _tag_limits(world: World) -> None:
    value_limit = world.limit("max_tag_value_bytes")
    total_limit = world.limit("max_total_tag_bytes")
    await world.create(tags=[["big", "v" * (value_limit - 64)]])
    await refused(
        world, [*envelope(world), ["big", "v" * (value_limit + 1)]], f"a tag value of {value_limit + 1} bytes"
    )
    chunk = max(1, min(value_limit, total_limit // 8))
    count = total_limit // chunk + 1
    if count + 6 > 256:
        return  # the 256-tag rule would refuse it first; nothing more to learn here
    many = [["big", "v" * chunk] for _ in range(count)]
    await refused(world, [*envelope(world), *many], f"tags totalling over {total_limit} bytes")


@check("moderation: a kind-5 deletion of a revision is rejected with a reason, and deletes nothing")
async def _kind5(world: World) -> None:
    head = await world.create()
    ok = await world.a.send(world.a.keys.sign(5, [["e", head.id], ["k", str(KIND_ARTIFACT)]], ""))
    expect(not ok.accepted, "a kind 5 aimed at a revision was accepted")
    expect(ok.message.strip(), "a kind 5 aimed at a revision was rejected without a reason")
    current = await world.current(world.a, d=[head.first("d") or ""], h=[world.channels.p])
    expect(head.first("d") in current, "the artifact left current state after a rejected kind 5")


# --- identity and compare-and-set -------------------------------------------------------------


@check("identity: resubmitting an accepted event succeeds without applying it again")
async def _resubmit(world: World) -> None:
    head = await world.create()
    ok = await world.a.send(head)
    expect(ok.accepted, f"the resubmitted create was refused: {ok.message!r}")
    if world.has("history"):
        revs = await world.a.view({"artifact": "history", "#d": [head.first("d") or ""]})
        expect([e.id for e in revs] == [head.id], f"history after a resubmission: {[e.id for e in revs]}")


@check("cas: an update naming the current revision in prev is accepted and becomes current")
async def _cas_ok(world: World) -> None:
    head = await world.create()
    new = await world.revise(head, "update")
    current = await world.current(world.a, d=[head.first("d") or ""], h=[world.channels.p])
    expect(current.get(head.first("d") or "") == new, "the accepted update is not the current revision")


@check("cas: an update whose prev is not the current revision is a conflict: and changes nothing")
async def _cas_conflict(world: World) -> None:
    first = await world.create()
    second = await world.revise(first, "update")
    stale = next_revision(world.a.keys, first, "update", content={"version": 1, "stale": True})
    ok = await world.a.send(stale)
    expect(not ok.accepted, "an update naming a replaced revision was accepted")
    expect(ok.message.startswith("conflict:"), f"a stale prev was refused with {ok.message!r}, not conflict:")
    current = await world.current(world.a, d=[first.first("d") or ""], h=[world.channels.p])
    expect(current.get(first.first("d") or "") == second, "the current revision changed after a conflict")


@check("cas: resubmitting an older accepted revision succeeds and is not a false conflict")
async def _cas_resubmit_old(world: World) -> None:
    first = await world.create()
    second = await world.revise(first, "update")
    third = await world.revise(second, "update")
    for old in (first, second):
        ok = await world.a.send(old)
        expect(ok.accepted, f"resubmitting an accepted older revision was refused: {ok.message!r}")
    current = await world.current(world.a, d=[first.first("d") or ""], h=[world.channels.p])
    expect(current.get(first.first("d") or "") == third, "a resubmitted older revision became current again")


@check("cas: of competing edits naming the same prev, exactly one succeeds")
async def _cas_race(world: World) -> None:
    head = await world.create()
    edits = [
        next_revision(actor.keys, head, "update", content={"version": 1, "writer": i})
        for i, actor in enumerate([world.a, world.b] * 4)
    ]
    oks = await asyncio.gather(*(actor.send(e) for actor, e in zip([world.a, world.b] * 4, edits, strict=True)))
    winners = [e for e, ok in zip(edits, oks, strict=True) if ok.accepted]
    expect(len(winners) == 1, f"{len(winners)} of {len(edits)} competing edits were accepted")
    losers = [ok.message for ok in oks if not ok.accepted]
    expect(all(m.startswith("conflict:") for m in losers), f"losing edits were refused with {short(losers)}")
    current = await world.current(world.a, d=[head.first("d") or ""], h=[world.channels.p])
    expect(current.get(head.first("d") or "") == winners[0], "the accepted edit is not current")


@check("identity: a create whose d is in use fails, disclosing nothing of an unreadable artifact")
async def _d_taken(world: World) -> None:
    secret_title = f"secret title {world.run}"
    hidden = await world.create(h=world.channels.r, title=secret_title, tags=[["codename", "bluebird"]])
    d = hidden.first("d") or ""
    again = revision(world.b.keys, d=d, h=world.channels.p, type=world.type, op="create", title="mine", content="{}")
    ok = await world.b.send(again)
    expect(not ok.accepted, "B created an artifact whose d is already in use")
    for secret in (world.channels.r, secret_title, hidden.id, "bluebird", world.type):
        expect(secret not in ok.message, f"the refusal {ok.message!r} discloses {secret!r}")
    own = await world.a.send(
        revision(world.a.keys, d=d, h=world.channels.p, type=world.type, op="create", title="again", content="{}")
    )
    expect(not own.accepted, "a second create of a used d was accepted")


@check("identity: type is immutable and an update keeps h")
async def _immutable(world: World) -> None:
    head = await world.create()
    d = head.first("d") or ""
    other_type = revision(
        world.a.keys,
        d=d,
        h=world.channels.p,
        type=world.type + ".other",
        op="update",
        title="t",
        prev=head.id,
        content="{}",
    )
    ok = await world.a.send(other_type)
    expect(not ok.accepted, "an update that changes type was accepted")
    other_h = revision(
        world.a.keys, d=d, h=world.channels.q, type=world.type, op="update", title="t", prev=head.id, content="{}"
    )
    ok = await world.a.send(other_h)
    expect(not ok.accepted, "an update that changes h was accepted (that is a move)")


# --- access -------------------------------------------------------------------------------


@check("access: writing needs write permission in the home channel")
async def _write_permission(world: World) -> None:
    ok = await world.b.send(
        revision(
            world.b.keys,
            d=world.new_d(),
            h=world.channels.r,
            type=world.type,
            op="create",
            title="intruder",
            content="{}",
        )
    )
    expect(not ok.accepted, "B created an artifact in channel R, where it is not a member")
    head = await world.create(h=world.channels.r)
    ok = await world.b.send(next_revision(world.b.keys, head, "update", content={"version": 1}))
    expect(not ok.accepted, "B updated an artifact in channel R, where it is not a member")


@check("access: an edit of an unreadable artifact is answered like one of a missing artifact")
async def _edit_nondisclosure(world: World) -> None:
    hidden = await world.create(h=world.channels.r)
    prev = secrets.token_hex(32)
    hidden_edit = revision(
        world.b.keys,
        d=hidden.first("d") or "",
        h=world.channels.p,
        type=world.type,
        op="update",
        title="x",
        prev=prev,
        content="{}",
    )
    missing_edit = revision(
        world.b.keys,
        d=world.new_d(),
        h=world.channels.p,
        type=world.type,
        op="update",
        title="x",
        prev=prev,
        content="{}",
    )
    a, b = await world.b.send(hidden_edit), await world.b.send(missing_edit)
    expect(not a.accepted and not b.accepted, "an edit without a readable current revision was accepted")
    expect(a.message == b.message, f"unreadable: {a.message!r} but missing: {b.message!r}")


@check("access: a relay member outside the channels reads and writes none of them", needs=("C",))
async def _outsider(world: World) -> None:
    head = await world.create()
    status, body = await world.c.post({"artifact": "current", "#h": [world.channels.p]})
    expect(status != 200 or body == [], f"C read channel P: {status} {short(body)}")
    if world.has("head"):
        expect(await world.c.head(head.first("d") or "") is None, "C read a head in channel P")
    ok = await world.c.send(next_revision(world.c.keys, head, "update", content={"version": 1}))
    expect(not ok.accepted, "C updated an artifact in channel P")


# --- moves and 45011 ------------------------------------------------------------------------


async def removals_in(world: World, actor: Actor, channel: str, d: str) -> list[Event]:
    events = await world.replay(actor, {"kinds": [KIND_REMOVAL], "#h": [channel]})
    return [e for e in events if e.first("d") == d]


@check("move: a move publishes the snapshot into the destination under the same d")
async def _move_lands(world: World) -> None:
    head = await world.create(tags=[["status", "open"]])
    d = head.first("d") or ""
    moved = await world.revise(head, "move", h=world.channels.q)
    expect(d not in await world.current(world.b, h=[world.channels.p]), "the moved artifact is still current in P")
    in_q = await world.current(world.b, h=[world.channels.q])
    expect(in_q.get(d) == moved, "the moved artifact is not current in Q")


@check("move: the source gets a relay-signed 45011 naming d, source and replaced revision, nothing more")
async def _move_removal(world: World) -> None:
    head = await world.create(title="to be moved away")
    d = head.first("d") or ""
    await world.revise(head, "move", h=world.channels.r)
    found = await removals_in(world, world.b, world.channels.p, d)
    expect(len(found) == 1, f"B's replay of P holds {len(found)} kind-45011 removals for {d}")
    removal = found[0]
    expect(removal.first("h") == world.channels.p, f"the removal's h is {removal.first('h')}, not the source")
    expect(removal.first("prev") == head.id, "the removal does not name the replaced revision in prev")
    text = json.dumps(removal.to_dict())
    expect(world.channels.r not in text, "the removal discloses the destination channel")
    expect("to be moved away" not in text and removal.content == "", "the removal carries content or title")
    expect(removal.pubkey != world.a.pubkey, "the removal is signed by the mover, not by the relay")
    relay_pubkey = world.nip11.get("pubkey")
    if isinstance(relay_pubkey, str) and relay_pubkey:
        expect(removal.pubkey == relay_pubkey, "the removal is not signed by the relay's NIP-11 pubkey")


@check("move: a reader of the source only learns nothing of the destination")
async def _move_hidden(world: World) -> None:
    head = await world.create()
    d = head.first("d") or ""
    await world.revise(head, "move", h=world.channels.r)
    expect(d not in await world.current(world.b, h=[world.channels.p]), "the artifact is still current in P")
    if world.has("head"):
        expect(await world.b.head(d) is None, "B's head view returns the artifact moved to R")
    if world.has("history"):
        revs = await world.b.view({"artifact": "history", "#d": [d]})
        expect(all(e.first("h") != world.channels.r for e in revs), "B's history shows the revision in R")


@check("move: the destination reads current state but none of the source's revisions", needs=("history",))
async def _move_history(world: World) -> None:
    head = await world.create(h=world.channels.r)
    updated = await world.revise(head, "update")
    moved = await world.revise(updated, "move", h=world.channels.p)
    d = head.first("d") or ""
    expect((await world.current(world.b, h=[world.channels.p])).get(d) == moved, "B does not read the moved head")
    revs = await world.b.view({"artifact": "history", "#d": [d]})
    expect([e.id for e in revs] == [moved.id], f"B's history of {d} holds {len(revs)} revisions, not only the move")


@check("move: a move needs write permission in source and destination")
async def _move_permission(world: World) -> None:
    head = await world.create()
    ok = await world.b.send(next_revision(world.b.keys, head, "move", h=world.channels.r))
    expect(not ok.accepted, "B moved an artifact into R, where it cannot write")
    hidden = await world.create(h=world.channels.r)
    ok = await world.b.send(next_revision(world.b.keys, hidden, "move", h=world.channels.p))
    expect(not ok.accepted, "B moved an artifact out of R, where it cannot write")


@check("move: a move changes h, and its root is absent or in the destination")
async def _move_root(world: World) -> None:
    anchor = await world.chat(world.a, world.channels.p)
    head = await world.create(root=anchor.id)
    same_h = next_revision(world.a.keys, head, "move", h=world.channels.p)
    ok = await world.a.send(same_h)
    expect(not ok.accepted, "a move that keeps h was accepted")
    tags = [list(t) for t in next_revision(world.a.keys, head, "move", h=world.channels.q).tags]
    tags.insert(5, ["root", anchor.id])
    ok = await world.a.send(world.a.keys.sign(KIND_ARTIFACT, tags, "{}"))
    expect(not ok.accepted, "a move whose root is in the source was accepted")
    await world.revise(head, "move", h=world.channels.q)


@check("move: a client-signed 45011 removes nothing")
async def _forged_removal(world: World) -> None:
    head = await world.create()
    d = head.first("d") or ""
    forged = world.b.keys.sign(
        KIND_REMOVAL, [["ar", "1"], ["d", d], ["h", world.channels.p], ["reason", "moved"], ["prev", head.id]], ""
    )
    await world.b.send(forged)
    expect(d in await world.current(world.a, h=[world.channels.p]), "a client's 45011 removed the artifact")


# --- delete and restore ---------------------------------------------------------------------


@check("delete: a deletion leaves current state and only restore is accepted after it")
async def _delete(world: World) -> None:
    head = await world.create()
    d = head.first("d") or ""
    deletion = await world.revise(head, "delete")
    expect(d not in await world.current(world.a, h=[world.channels.p]), "a deleted artifact is still current")
    ok = await world.a.send(next_revision(world.a.keys, deletion, "update", title="t", content="{}"))
    expect(not ok.accepted, "an update after a deletion was accepted")
    if world.has("head"):
        expect((await world.a.head(d)) == deletion, "the head view does not return the deletion")


@check("delete: a deleted d stays reserved")
async def _delete_reserved(world: World) -> None:
    head = await world.create()
    await world.revise(head, "delete")
    again = revision(
        world.a.keys,
        d=head.first("d") or "",
        h=world.channels.p,
        type=world.type,
        op="create",
        title="reuse",
        content="{}",
    )
    ok = await world.a.send(again)
    expect(not ok.accepted, "a create reusing a deleted d was accepted")


@check("delete: a delete keeps h and type")
async def _delete_keeps(world: World) -> None:
    head = await world.create()
    d = head.first("d") or ""
    await refused(
        world,
        envelope(world, d=d, op="delete", prev=head.id, title=None, h=world.channels.q),
        "a delete that changes h",
        body="",
        prefix=None,
    )
    await refused(
        world,
        envelope(world, d=d, op="delete", prev=head.id, title=None, type=world.type + ".x"),
        "a delete that changes type",
        body="",
        prefix=None,
    )


@check("delete: restore names the deletion and brings a full snapshot back")
async def _restore(world: World) -> None:
    head = await world.create(tags=[["status", "open"]])
    d = head.first("d") or ""
    deletion = await world.revise(head, "delete")
    restored = await world.revise(
        deletion, "restore", title="back", content={"version": 1, "back": True}, tags=[["status", "open"]]
    )
    current = await world.current(world.a, h=[world.channels.p], status=["open"])
    expect(current.get(d) == restored, "the restored snapshot is not current")


@check("delete: restore of a live artifact is rejected")
async def _restore_live(world: World) -> None:
    head = await world.create()
    ok = await world.a.send(next_revision(world.a.keys, head, "restore", title="t", content="{}"))
    expect(not ok.accepted, "a restore of an undeleted artifact was accepted")


@check("delete: revisions stay readable in history after deletion", needs=("history",))
async def _delete_history(world: World) -> None:
    head = await world.create()
    updated = await world.revise(head, "update")
    deletion = await world.revise(updated, "delete")
    revs = await world.a.view({"artifact": "history", "#d": [head.first("d") or ""]})
    # NIP-AR defines no public acceptance order: compare the revisions, not their order.
    expect(
        sorted(e.id for e in revs) == sorted([head.id, updated.id, deletion.id]),
        f"history after deletion holds {[e.id[:8] for e in revs]}",
    )
