"""`python -m artifacts.client`, run as a subprocess: --help on each command, one-line errors, derive-d and
digest against the published vectors, ensure and head against a real relay, sync against the scripted
fake relay, and no head read where NIP-11 does not advertise the head view. `pull` against a real relay is
in test_client_incremental_relay.py.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from hypothesis import given
from hypothesis import strategies as st

import artifacts.client
from artifacts.client import Keys, Relay, derive_d, revision, set_digest
from artifacts.client.cli import _safe
from artifacts.client.httpapi import HeadUnsupported
from tests.client.client_support import NO_QUOTA, admit, cli, cli_process, make_channel, write_key
from tests.client.fake_relay import FakeConnection, FakeRelay

VECTORS = Path(artifacts.client.__file__).parent / "vectors"
COMMANDS = ["derive-d", "sync", "pull", "ensure", "head", "digest", "conformance"]
H = "11111111-1111-4111-8111-111111111111"
H_LETTERS = "9b353519-f4fe-4757-aef4-bec6cc0ae54c"


async def test_help_on_each_command_and_no_secret_options() -> None:
    results = await asyncio.gather(cli("--help"), *(cli(c, "--help") for c in COMMANDS))
    top = results[0]
    assert top[0] == 0 and all(c in top[1] for c in COMMANDS)
    for command, (code, out, _) in zip(COMMANDS, results[1:], strict=True):
        assert code == 0 and out.startswith(f"usage: python -m artifacts.client {command}"), (command, out)
        # A secret comes from a key file only.
        assert "--secret" not in out and "--nsec" not in out and "--private" not in out, command
        if command in ("sync", "pull", "ensure", "head", "conformance"):
            assert "--key-file FILE" in out and "--relay URL" in out, command


async def test_errors_are_one_line(tmp_path: Path) -> None:
    key = write_key(tmp_path / "k", Keys.generate())
    (tmp_path / "bad").write_text("not a key\n")
    ensure = ["ensure", "--relay", "ws://127.0.0.1:9/", "--key-file", str(key), "--channel", H, "--type", "buzz.x"]
    ensure += ["--key", "k", "--title", "t"]
    cases = [
        (
            ["head", "--relay", "http://x/", "--key-file", str(key), "--d", H],
            2,
            "error: argument --relay: relay URL 'http://x/' must start with ws:// or wss://",
        ),
        (
            ["head", "--relay", "ws://127.0.0.1:9/", "--key-file", str(tmp_path / "nope"), "--d", H],
            1,
            f"error: key file {tmp_path / 'nope'} does not exist",
        ),
        (
            ["head", "--relay", "ws://127.0.0.1:9/", "--key-file", str(tmp_path / "bad"), "--d", H],
            1,
            f"error: key file {tmp_path / 'bad'}: a secret key is 64 hex characters",
        ),
        (
            ["head", "--relay", "ws://127.0.0.1:9/", "--key-file", str(key), "--d", H],
            1,
            "error: could not reach http://127.0.0.1:9/: ",  # the NIP-11 read, before any head read
        ),
        (
            [*ensure, "--content", "{oops"],
            1,
            "error: --content is not JSON",
        ),
        (
            ["derive-d", "--channel", H_LETTERS.upper(), "--type", "buzz.x", "--key", "k"],
            2,
            "error: argument --channel: '" + H_LETTERS.upper() + "' is not a channel id",
        ),
        (["derive-d", "--channel", H, "--type", "Buzz", "--key", "k"], 2, "error: argument --type: 'Buzz' is not"),
        (
            ["sync", "--relay", "ws://127.0.0.1:9/", "--key-file", str(key)],
            2,
            "error: the following arguments are required: --channel",
        ),
        (
            ["conformance", "--relay", "ws://127.0.0.1:9/", "--key-file", str(key)],
            2,
            "error: conformance takes --key-file A --key-file B",
        ),
        (
            ["pull", "--relay", "ws://127.0.0.1:9/", "--key-file", str(key), "--store", "s.db", "--list", "--follow"],
            2,
            "error: --list and --follow don't go together",
        ),
        # Bytes that are not UTF-8 (kept by Python as lone surrogates): nothing could encode or sign them.
        (["derive-d", "--channel", H, "--type", "buzz.x", "--key", "\udcff"], 2, "error: --key is not valid UTF-8"),
        (["frobnicate"], 2, "error: argument COMMAND: invalid choice: 'frobnicate'"),
        (
            [*ensure, "--content", "{}", "--attempts", "0"],
            2,
            "error: argument --attempts: '0' is not a number of attempts",
        ),
        (
            ["sync", "--relay", "ws://127.0.0.1:9/", "--key-file", str(key), "--channel", H, "--attempts", "x"],
            2,
            "error: argument --attempts: 'x' is not a number of attempts",
        ),
    ]
    results = await asyncio.gather(*(cli(*args) for args, _, _ in cases))
    for (args, code, start), (got_code, out, err) in zip(cases, results, strict=True):
        assert (got_code, out) == (code, ""), (args, got_code, out, err)
        assert err.count("\n") == 1 and err.startswith(start), (args, err)


async def test_derive_d_and_digest_match_the_vectors() -> None:
    # The library is checked against every vector (test_client_vectors); here the command line, on a few.
    derived = {v["name"]: v for v in json.loads((VECTORS / "derive_d.json").read_text(encoding="utf-8"))["vectors"]}
    digests = {v["name"]: v for v in json.loads((VECTORS / "set_digest.json").read_text(encoding="utf-8"))["valid"]}
    usable = [
        derived[name]
        for name in (
            "ASCII: a config entry",
            "non-ASCII key, NFC: U+00E9 is two UTF-8 bytes c3 a9",
            "astral-plane key: U+1F680 is four UTF-8 bytes f0 9f 9a 80",
        )
    ]
    sets = [
        digests[name]
        for name in (
            "empty set",
            "the same three, given shuffled: same digest",
            "digits sort before letters: 9fff... before a000...",
        )
    ]
    runs = [cli("derive-d", "--channel", v["h"], "--type", v["type"], "--key", v["key"]) for v in usable]
    for vector in sets:
        runs.append(cli("digest", stdin=json.dumps(vector["heads"])))
        runs.append(cli("digest", stdin=json.dumps({h["d"]: h["id"] for h in vector["heads"]})))
    results = await asyncio.gather(*runs)
    assert [r[1] for r in results[: len(usable)]] == [v["d"] + "\n" for v in usable]
    got = [r[1] for r in results[len(usable) :]]
    assert got == [v["digest"] + "\n" for v in sets for _ in range(2)]
    # The set as `sync --json` prints it, and as a list of events; and a set that is not one.
    keys = Keys.generate()
    events = [
        revision(keys, d=derive_d(H, "buzz.x", str(i)), h=H, type="buzz.x", op="create", title="t").to_dict()
        for i in range(3)
    ]
    expected = set_digest({e["tags"][1][1]: e["id"] for e in events})
    sync_json = {"digest": expected, "count": 3, "artifacts": events}
    assert (await cli("digest", stdin=json.dumps(sync_json)))[1] == expected + "\n"
    assert (await cli("digest", stdin=json.dumps(events)))[1] == expected + "\n"
    code, _, err = await cli("digest", stdin=json.dumps([events[0], events[0]]))
    assert code == 1 and err.endswith("occurs twice: a set holds one head per artifact\n")


async def test_ensure_and_head_against_a_relay(relay_factory: Any, tmp_path: Path, redis_flush: Any) -> None:
    world = await sync_to_async(admit)(relay_factory(**NO_QUOTA), tmp_path)
    common = ["--relay", world.url, "--key-file", str(world.key_files[0])]
    record = ["--channel", world.channel, "--type", "buzz.config", "--key", "theme", "--title", "Theme"]
    d = derive_d(world.channel, "buzz.config", "theme")

    code, out, err = await cli("ensure", *common, *record, "--content", '{"b": 1, "a": [1, 2]}', "--tag", "scope=ui")
    assert (code, err) == (0, "")
    outcome, got_d, head_id = out.split()
    assert (outcome, got_d) == ("created", d)
    await asyncio.sleep(1.1)  # a new second: the same call is a new event, answered with a conflict, then unchanged
    code, out, _ = await cli("ensure", *common, *record, "--content", '{"a":[1,2],"b":1}', "--tag", "scope=ui")
    assert (code, out) == (0, f"unchanged {d} {head_id}\n")  # content is compared as canonical JSON
    code, out, err = await cli("ensure", *common, *record, "--content", '{"a": 2}', "--report-conflict")
    assert (code, out, err) == (3, f"conflict {d} {head_id}\n", "error: conflict: the artifact has other content\n")
    code, out, _ = await cli("ensure", *common, *record, "--content", '{"a": 2}')
    assert code == 0 and out.startswith(f"updated {d} ")
    new_head = out.split()[2]

    code, out, err = await cli("head", *common, "--d", d)
    assert (code, err) == (0, "")
    assert out == f'{d} {new_head} buzz.config "Theme" update {world.channel}\n'
    code, out, _ = await cli("head", *common, "--d", d, "--json")
    event = json.loads(out)
    # The update sets "a" and keeps what it does not set: the field "b" and the tag scope=ui.
    assert (event["id"], event["content"], ["scope", "ui"] in event["tags"]) == (new_head, '{"a":2,"b":1}', True)
    # --content is a JSON value, sent as JSON: a JSON string is sent as one, quotes and all.
    motto = ["--channel", world.channel, "--type", "buzz.config", "--key", "motto", "--title", "Motto"]
    code, out, err = await cli("ensure", *common, *motto, "--content", '"hello"')
    assert (code, err) == (0, "") and out.startswith("created "), (out, err)
    code, out, _ = await cli("head", *common, "--d", derive_d(world.channel, "buzz.config", "motto"), "--json")
    assert json.loads(out)["content"] == '"hello"'
    missing = derive_d(world.channel, "buzz.config", "nothing")
    code, out, err = await cli("head", *common, "--d", d, "--d", missing)
    assert code == 1 and out.startswith(f"{d} {new_head} ")
    assert err == f"error: no head of {missing} that this key can read (unknown, or not readable)\n"
    # --channel reads by #h; a channel the key can't read is the relay's refusal.
    code, out, _ = await cli("head", *common, "--d", d, "--channel", world.channel)
    assert code == 0 and out.startswith(f"{d} {new_head} ")
    outsider_channel = await sync_to_async(make_channel)(world, [world.keys[2]])
    code, out, err = await cli("head", *common, "--d", d, "--channel", outsider_channel)
    assert (code, out) == (1, "") and err.startswith("error: restricted: "), err
    # A key the relay does not admit: one line, the relay's reason.
    code, out, err = await cli(
        "ensure", "--relay", world.url, "--key-file", str(world.outsider_file), *record, "--content", "{}"
    )
    assert (code, out, err) == (1, "", "error: restricted: not a relay member\n")


def a_task(keys: Keys, n: int, **kwargs: Any) -> Any:
    return revision(
        keys,
        d=derive_d(H, "buzz.task", str(n)),
        h=H,
        type="buzz.task",
        op="create",
        title=f"task {n}",
        content={"n": n},
        tags=[["status", "open"]],
        **kwargs,
    )


async def test_sync_prints_the_set_at_eose_and_follows_changes(tmp_path: Path) -> None:
    writer, reader = Keys.generate(), Keys.generate()
    key = write_key(tmp_path / "reader", reader)
    one, two, three = a_task(writer, 1), a_task(writer, 2), a_task(writer, 3)
    done = revision(
        writer,
        d=one.first("d") or "",
        h=H,
        type="buzz.task",
        op="update",
        title="task 1",
        prev=one.id,
        content={"n": 1},
        tags=[["status", "done"]],
    )

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, flt = await conn.req()
        assert flt == {"artifact": "current", "#h": [H], "#type": ["buzz.task"], "#status": ["open"]}
        for event in (one, two):
            await conn.send("EVENT", sub, event.to_dict())
        await conn.send("EOSE", sub)
        if conn.index == 2:  # the --follow run
            await conn.send("EVENT", sub, three.to_dict())
            await conn.send("EVENT", sub, done.to_dict())
            await conn.send("CLOSED", sub, "resync: membership changed")
            sub, _ = await conn.req()
            await conn.send("EVENT", sub, two.to_dict())
            await conn.send("EVENT", sub, three.to_dict())
            await conn.send("EOSE", sub)

    select = ["--channel", H, "--type", "buzz.task", "--tag", "status=open"]
    async with FakeRelay(script) as relay:
        common = ["sync", "--relay", relay.url, "--key-file", str(key), *select]
        code, out, err = await cli(*common)
        assert (code, err) == (0, "")
        digest = set_digest({e.first("d") or "": e.id for e in (one, two)})
        ordered = sorted((one, two), key=lambda e: e.first("d") or "")
        rows = [f'{e.first("d")} {e.id} buzz.task "{e.first("title")}"' for e in ordered]
        assert out.splitlines() == [*rows, f"digest {digest} (2 artifacts)"]
        code, out, _ = await cli(*common, "--json")
        body = json.loads(out)
        assert (body["digest"], body["count"], [a["id"] for a in body["artifacts"]]) == (
            digest,
            2,
            [e.id for e in ordered],
        )
        assert (await cli("digest", stdin=out))[1] == digest + "\n"

        proc = await cli_process(*common, "--json", "--follow")
        assert proc.stdout is not None
        lines: list[dict[str, Any]] = []
        try:
            while sum(line["type"] == "synced" for line in lines) < 2:
                lines.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 30)))
        finally:
            proc.kill()
            await proc.wait()
    assert [(line["type"], line.get("action"), line.get("cause")) for line in lines] == [
        ("synced", None, None),
        ("change", "put", "new"),
        ("change", "remove", "unmatched"),
        ("resync", None, "resync"),
        ("synced", None, None),
    ]
    assert lines[1]["event"]["id"] == three.id and lines[2]["d"] == one.first("d")
    assert lines[2]["digest"] == set_digest({e.first("d") or "": e.id for e in (two, three)})
    assert lines[3]["reason"] == "resync: membership changed" and lines[4]["resyncs"] == 1
    assert lines[4]["digest"] == lines[2]["digest"] and lines[4]["count"] == 2


async def test_sync_gives_up_after_its_attempts_without_follow(tmp_path: Path) -> None:
    key = write_key(tmp_path / "reader", Keys.generate())

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        while True:
            sub, _ = await conn.req()
            await conn.send("CLOSED", sub, "error: the database is down")

    async with FakeRelay(script) as relay:
        code, out, err = await cli(
            "sync", "--relay", relay.url, "--key-file", str(key), "--channel", H, "--attempts", "2"
        )
    lines = err.splitlines()
    assert (code, out) == (1, "")
    assert lines[0].startswith("resync error (again in ") and lines[0].endswith("): error: the database is down")
    assert lines[-1] == "error: no complete set after 2 attempts; last: error: the database is down"


# Characters a terminal acts on: ESC (and a CSI sequence after it), the C1 CSI, and a right-to-left override.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\u009b31m\u202eevil"


async def test_untrusted_text_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """Artifact text and a relay's reasons are untrusted (NIP-AR "Client behavior"): the text output writes each
    control or bidirectional-control character as a \\uXXXX escape, so a title, a type or a CLOSED reason can
    neither clear, retitle or recolor the terminal nor reorder the line."""
    writer = Keys.generate()
    key = write_key(tmp_path / "reader", Keys.generate())
    envelope = [["ar", "1"], ["d", derive_d(H, "buzz.task", "x")], ["h", H], ["type", "buzz.task" + HOSTILE]]
    hostile = writer.sign(45010, [*envelope, ["title", "title " + HOSTILE], ["op", "create"]], '{"n":1}')

    async def script(conn: FakeConnection) -> None:
        await conn.auth()
        sub, _ = await conn.req()
        if conn.index == 0:
            await conn.send("EVENT", sub, hostile.to_dict())
            await conn.send("EOSE", sub)
        else:
            await conn.send("CLOSED", sub, "restricted: " + HOSTILE)

    async with FakeRelay(script) as relay:
        common = ["sync", "--relay", relay.url, "--key-file", str(key), "--channel", H]
        code, out, err = await cli(*common)
        assert code == 0 and err == "", err
        code, out2, err2 = await cli(*common)
        assert code == 1 and out2 == ""
    for text in (out, err2):
        assert not any(ch in text for ch in "\x1b\x07\u009b\u202e"), repr(text)
    assert "\\u001b[2J" in out and "\\u202eevil" in out and "\\u009b31m" in out
    assert err2.startswith("error: restricted: \\u001b[2J") and err2.count("\n") == 1


_TERMINAL_CONTROLS = frozenset(
    [*map(chr, range(0x20)), *map(chr, range(0x7F, 0xA0)), "\u061c", "\u200e", "\u200f"]
    + [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))]
)


@given(st.text(st.characters(exclude_categories=["Cs"])))
def test_escaped_text_holds_no_terminal_control_and_reads_back(text: str) -> None:
    """The text output's escaping (artifacts.client.cli._safe), for any text: no control or bidirectional
    control is left, everything else is as it was, and each escape names the character it replaced."""
    escaped = _safe(text)
    assert not _TERMINAL_CONTROLS & set(escaped)
    restored = re.sub(r"\\u([0-9a-f]{4})", lambda m: chr(int(m.group(1), 16)), escaped)
    if "\\u" not in text:  # a literal backslash-u in the text itself reads back as it is, escaped or not
        assert restored == text
    if not _TERMINAL_CONTROLS & set(text):
        assert escaped == text


async def test_no_head_read_goes_to_a_relay_that_does_not_advertise_the_head_view(tmp_path: Path) -> None:
    """NIP-AR: relays advertise head only when every backend that can serve the connection runs it."""
    key = write_key(tmp_path / "k.hex", Keys.generate())
    d = "22222222-2222-4222-8222-222222222222"

    async def script(conn: FakeConnection) -> None:
        await conn.auth()

    nip11 = {"artifacts": {"modes": ["current", "history"]}}
    async with FakeRelay(script, nip11=nip11) as relay:
        code, out, err = await cli("head", "--relay", relay.url, "--key-file", str(key), "--d", d)
        assert (code, out) == (1, "")
        assert err == "error: unsupported: the relay does not advertise the NIP-AR head view (NIP-11 artifacts.modes)\n"
        async with Relay.connect(relay.url, Keys.generate()) as client:
            with pytest.raises(HeadUnsupported, match=r"^unsupported: "):
                await client.head([d])
        assert relay.nip11_reads == 2
