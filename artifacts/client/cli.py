"""`python -m artifacts.client`: derive-d, sync, pull, ensure, head, digest and conformance.

Secrets come from key files only (one hex secret key per file), never from the command
line. Errors are one line on stderr: `error: ...`, exit status 1 (2 for a usage error,
3 for an ensure that ends in a conflict).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sqlite3
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, TextIO

from . import httpapi
from .connection import Relay, RelayError
from .digest import set_digest
from .ensure import EnsureRejected, Outcome, ensure
from .events import Event, Keys
from .filters import CurrentFilter, FilterError, SyncFilter
from .httpapi import HeadUnsupported, HttpError, RelayUrl, RelayUrlError
from .identity import derive_d
from .incremental import (
    MAX_ID_BYTES,
    Confirmed,
    Entry,
    IncrementalRefused,
    Pulled,
    Puller,
    PullReport,
    Reconnecting,
    Store,
    StoreMismatch,
)
from .revisions import json_text
from .sync import Change, Restarting, Sync, Synced
from .text import terminal_safe as _safe

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CONFLICT = 3

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TYPE = re.compile(r"[a-z][a-z0-9_-]*(?:\.[a-z][a-z0-9_-]*)*")


class CliError(Exception):
    """A one-line error for the user."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, and where to look, instead of argparse's usage block.
        self.exit(EXIT_USAGE, f"error: {message} (see {self.prog} --help)\n")


# --- argument values -------------------------------------------------------------------


def _channel(value: str) -> str:
    if not _UUID.fullmatch(value) or value == "00000000-0000-0000-0000-000000000000":
        raise argparse.ArgumentTypeError(f"{value!r} is not a channel id (a lowercase hyphenated non-nil UUID)")
    return value


def _attempts(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of attempts (a whole number, at least 1)")
    return n


def _type(value: str) -> str:
    if not _TYPE.fullmatch(value) or len(value) > 128:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a type name (dot-separated lowercase ASCII components, each starting with a letter)"
        )
    return value


def _tag(value: str) -> tuple[str, str]:
    name, sep, tag_value = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=VALUE")
    return name, tag_value


def _known_id(value: str) -> str:
    if not value or len(value.encode("utf-8")) > MAX_ID_BYTES:
        raise argparse.ArgumentTypeError(f"an artifact id is 1 to {MAX_ID_BYTES} UTF-8 bytes")
    return value


def _relay(value: str) -> RelayUrl:
    try:
        return RelayUrl.parse(value)
    except RelayUrlError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _keys(path: str) -> Keys:
    try:
        return Keys.from_file(path)
    except ValueError as err:
        raise CliError(str(err)) from None


# --- output ----------------------------------------------------------------------------


def _line(event: Event) -> str:
    title = json.dumps(event.first("title"), ensure_ascii=False)
    return _safe(f"{event.first('d')} {event.id} {event.first('type')} {title}")


def _digest_line(items: Mapping[str, Event], digest: str) -> str:
    return f"digest {digest} ({len(items)} artifact{'' if len(items) == 1 else 's'})"


def _json_line(obj: Any, out: TextIO) -> None:
    out.write(json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n")
    out.flush()


def _set_json(items: Mapping[str, Event], digest: str) -> dict[str, Any]:
    return {"digest": digest, "count": len(items), "artifacts": [items[d].to_dict() for d in sorted(items)]}


# --- commands --------------------------------------------------------------------------


def cmd_derive_d(args: argparse.Namespace, out: TextIO) -> int:
    out.write(derive_d(args.channel, args.type, args.key) + "\n")
    return 0


async def cmd_sync(args: argparse.Namespace, out: TextIO) -> int:
    keys = _keys(args.key_file)
    try:
        flt = SyncFilter.of(args.channel, types=args.type or (), tags=args.tag or ())
    except FilterError as err:
        raise CliError(str(err)) from None
    sync = Sync(args.relay, keys, flt)
    async with contextlib.aclosing(sync.updates()) as updates:
        async for update in updates:
            if isinstance(update, Synced):
                if args.json:
                    body = _set_json(update.items, update.digest)
                    _json_line({"type": "synced", "resyncs": update.resyncs, **body} if args.follow else body, out)
                else:
                    for d in sorted(update.items):
                        out.write(_line(update.items[d]) + "\n")
                    out.write(_digest_line(update.items, update.digest) + "\n")
                    out.flush()
                if not args.follow:
                    return 0
            elif isinstance(update, Change):
                if args.json:
                    _json_line(
                        {
                            "type": "change",
                            "action": update.action,
                            "cause": update.cause,
                            "d": update.d,
                            "event": update.event.to_dict(),
                            "digest": sync.digest,
                        },
                        out,
                    )
                else:
                    what = _line(update.event) if update.action == "put" else _safe(update.d)
                    out.write(f"{update.action} {what} ({update.cause})\n{_digest_line(sync.items, sync.digest)}\n")
                    out.flush()
            elif isinstance(update, Restarting):
                if not args.follow and update.failures >= args.attempts:
                    raise CliError(f"no complete set after {update.failures} attempts; last: {update.reason}")
                if args.json and args.follow:
                    _json_line(
                        {
                            "type": "resync",
                            "cause": update.cause,
                            "reason": update.reason,
                            "delay": round(update.delay, 3),
                            "resyncs": sync.resyncs,
                        },
                        out,
                    )
                else:
                    stream = out if args.follow else sys.stderr
                    stream.write(f"resync {update.cause} (again in {update.delay:.2f} s): {_safe(update.reason)}\n")
                    stream.flush()
    return 0


def _count(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def _report_line(report: PullReport) -> str:
    what = "initial read" if report.kind == "initial" else "later read"
    if report.restarted:
        what += " (the relay refused the saved cursor of the pass in progress: started over)"
    elif report.resumed:
        what += " (went on from the saved cursor of the pass in progress)"
    if report.resets:
        what += f" after a reset ({', '.join(_safe(r) for r in report.resets)})"
    line = (
        f"pulled: {what}, {_count(report.pages, 'page')}: {_count(report.upserts, 'upsert')},"
        f" {_count(report.removes, 'remove')}, {_count(report.channel_removals, 'channel removal')}"
    )
    if report.revalidated:
        line += f"; {_count(report.revalidated, 'saved row')} revalidated"
    return line + f"; {_count(report.held, 'artifact')} held, checkpoint saved"


def _report_json(report: PullReport) -> dict[str, Any]:
    return {
        "pass": report.kind,
        "resets": report.resets,
        "pages": report.pages,
        "upserts": report.upserts,
        "removes": report.removes,
        "removeChannels": report.channel_removals,
        "revalidated": report.revalidated,
        "retries": report.retries,
        "held": report.held,
        "resumed": report.resumed,
        "restarted": report.restarted,
    }


def _entries_json(entries: Sequence[Entry]) -> list[dict[str, Any]]:
    return [{"artifactId": c.id, "type": c.type, **({"event": c.event.to_dict()} if c.event else {})} for c in entries]


def _entry_lines(entries: Sequence[Entry]) -> str:
    return "".join(f"confirmed {c.type} {_line(c.event) if c.event is not None else _safe(c.id)}\n" for c in entries)


async def cmd_pull(args: argparse.Namespace, out: TextIO) -> int:
    keys = _keys(args.key_file)
    try:
        query = CurrentFilter.of(args.channel or (), types=args.type or (), tags=args.tag or ())
        store = Store(args.store, relay=args.relay, pubkey=keys.pubkey, query=query)
    except (FilterError, StoreMismatch, sqlite3.Error) as err:
        raise CliError(str(err)) from None
    try:
        if args.recover:
            store.drop_checkpoint()
        puller = Puller(args.relay, keys, query, store, attempts=args.attempts)
        if args.follow:
            return await _follow(puller, args, out)
        try:
            report = await puller.pull()
        except IncrementalRefused as refused:
            if refused.code == "incremental_invalid" and store.checkpoint is not None:
                raise CliError(
                    f"{refused.reason}; the relay refuses this store's checkpoint (after a change of its signing"
                    " key, say): run again with --recover to start the store over"
                ) from None
            raise
        confirmed = await puller.confirm(args.confirm) if args.confirm else []
        rows = store.rows() if args.list else {}
        report.held = len(store)
    finally:
        store.close()
    if args.json:
        body = _report_json(report)
        if args.confirm:
            body["confirmed"] = _entries_json(confirmed)
        if args.list:
            body["artifacts"] = [rows[d].to_dict() for d in sorted(rows)]
        _json_line(body, out)
        return 0
    for d in sorted(rows):
        out.write(_line(rows[d]) + "\n")
    out.write(_entry_lines(confirmed))
    out.write(_report_line(report) + "\n")
    return 0


async def _follow(puller: Puller, args: argparse.Namespace, out: TextIO) -> int:
    """`pull --follow`: a pull, then each live push confirmed, until interrupted (a line, or a JSON line, each)."""
    to_confirm = args.confirm  # --confirm: read once, after the first pull
    async with contextlib.aclosing(puller.follow()) as updates:
        async for update in updates:
            if isinstance(update, Pulled):
                if args.json:
                    _json_line({"type": "pulled", **_report_json(update.report)}, out)
                else:
                    out.write(_report_line(update.report) + "\n")
                if to_confirm:
                    update = Confirmed(await puller.confirm(to_confirm))
                    to_confirm = None
            if isinstance(update, Confirmed):
                if args.json:
                    _json_line({"type": "confirmed", "changes": _entries_json(update.entries)}, out)
                else:
                    out.write(_entry_lines(update.entries))
            elif isinstance(update, Reconnecting):
                if args.json:
                    _json_line({"type": "reconnect", "reason": update.reason, "delay": round(update.delay, 3)}, out)
                else:
                    out.write(f"reconnect (again in {update.delay:.2f} s): {_safe(update.reason)}\n")
            out.flush()
    return 0


async def cmd_ensure(args: argparse.Namespace, out: TextIO) -> int:
    keys = _keys(args.key_file)
    try:
        content = json.loads(args.content)
    except ValueError as err:
        raise CliError(f"--content is not JSON ({err})") from None
    async with Relay.connect(args.relay, keys) as relay:
        result = await ensure(
            relay,
            channel=args.channel,
            type=args.type,
            key=args.key,
            title=args.title,
            # As JSON text, whatever the value: a JSON string is sent as JSON ("\"hello\""), not as its text.
            content=json_text(content),
            tags=[list(t) for t in args.tag or ()],
            on_differs="report" if args.report_conflict else "update",
            attempts=args.attempts,
        )
    out.write(f"{result.outcome.value} {result.d} {result.head_id or '-'}\n")
    if result.outcome is Outcome.CONFLICT:
        sys.stderr.write(f"error: {_safe(result.message)}\n")
        return EXIT_CONFLICT
    return 0


async def cmd_head(args: argparse.Namespace, out: TextIO) -> int:
    keys = _keys(args.key_file)
    await httpapi.head_capability(args.relay)
    heads = await httpapi.head(args.relay, keys, list(args.d), channels=args.channel)
    missing = [d for d in args.d if d not in heads]
    for d in args.d:
        if d in heads:
            event = heads[d]
            if args.json:
                _json_line(event.to_dict(), out)
            else:
                out.write(f"{_line(event)} {_safe(event.first('op'))} {_safe(event.first('h'))}\n")
    for d in missing:
        sys.stderr.write(f"error: no head of {_safe(d)} that this key can read (unknown, or not readable)\n")
    return EXIT_ERROR if missing else 0


def _pairs(doc: Any) -> list[tuple[str, str]]:
    """The (d, head id) pairs of a set given on stdin, in any of the shapes `digest --help` lists."""
    if isinstance(doc, dict) and isinstance(doc.get("artifacts"), list):
        doc = doc["artifacts"]
    if isinstance(doc, dict):
        return [(str(d), str(i)) if isinstance(i, str) else _bad_entry(d) for d, i in doc.items()]
    if not isinstance(doc, list):
        raise CliError("the set must be a JSON object or array (see digest --help)")
    pairs = []
    for item in doc:
        if isinstance(item, dict) and isinstance(item.get("d"), str) and isinstance(item.get("id"), str):
            pairs.append((item["d"], item["id"]))
        elif isinstance(item, dict) and isinstance(item.get("tags"), list) and isinstance(item.get("id"), str):
            d = next((t[1] for t in item["tags"] if isinstance(t, list) and len(t) >= 2 and t[0] == "d"), None)
            if not isinstance(d, str):
                raise CliError(f"event {item['id']} has no d tag")
            pairs.append((d, item["id"]))
        else:
            raise CliError(f"set entry {json.dumps(item)[:80]} has neither d and id nor an event's tags and id")
    return pairs


def _bad_entry(d: object) -> NoReturn:
    raise CliError(f"the head of {d!s:.80} must be an event id string")


def cmd_digest(args: argparse.Namespace, out: TextIO) -> int:
    try:
        doc = json.load(sys.stdin)
    except ValueError as err:
        raise CliError(f"stdin is not JSON ({err})") from None
    try:
        out.write(set_digest(_pairs(doc)) + "\n")
    except ValueError as err:
        raise CliError(str(err)) from None
    return 0


async def cmd_conformance(args: argparse.Namespace, out: TextIO) -> int:
    from .conformance import run_suite

    keys = [_keys(path) for path in args.key_file]
    if len({k.pubkey for k in keys}) != len(keys):
        raise CliError("the key files must hold different keys")
    report = await run_suite(args.relay, keys, out=out, only=args.only)
    return 0 if report.failed == 0 else EXIT_ERROR


# --- the parser ------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog="python -m artifacts.client",
        description="A NIP-AR client: deterministic d, exact sync, incremental pull, ensure, head lookup, set digest,"
        " conformance.",
    )
    commands = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    def relay_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--relay", required=True, type=_relay, metavar="URL", help="ws:// or wss:// relay URL")
        p.add_argument("--key-file", required=True, metavar="FILE", help="file holding a hex secret key")

    def attempts_arg(p: argparse.ArgumentParser, text: str) -> None:
        p.add_argument("--attempts", type=_attempts, default=5, metavar="N", help=text)

    def match_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--type", action="append", type=_type, metavar="T", help="only this type; repeat to OR types")
        p.add_argument(
            "--tag",
            action="append",
            type=_tag,
            metavar="NAME=VALUE",
            help="only artifacts with a tag NAME whose first value is VALUE; one NAME repeated ORs"
            " its values, different NAMEs AND",
        )

    p = commands.add_parser(
        "derive-d",
        help="print the NIP-AR derived d of (channel, type, key)",
        description="Print d = UUIDv8(SHA-256('nip-ar-artifact\\0' + channel + '\\0' + type"
        " + '\\0' + key)), the strings as UTF-8.",
    )
    p.add_argument("--channel", required=True, type=_channel, metavar="H", help="home channel id")
    p.add_argument("--type", required=True, type=_type, metavar="T", help="artifact type, e.g. buzz.config")
    p.add_argument("--key", required=True, metavar="K", help="the record's name within channel and type")

    p = commands.add_parser(
        "sync",
        help="print the exact set at EOSE and its digest (--follow: stay live)",
        description="Sync the artifacts of one or more channels. Prints one line per artifact"
        " (d, head id, type, title) and the set digest, once the relay's EOSE proves the set complete."
        " With --follow it stays live and prints each change and each resync.",
    )
    relay_args(p)
    p.add_argument(
        "--channel",
        required=True,
        action="append",
        type=_channel,
        metavar="H",
        help="channel id (#h); repeat for more channels",
    )
    match_args(p)
    p.add_argument("--json", action="store_true", help="JSON output (JSON lines with --follow)")
    p.add_argument("--follow", action="store_true", help="stay live: print each change and each resync")
    attempts_arg(p, "without --follow, give up after N failed syncs in a row (default 5)")

    p = commands.add_parser(
        "pull",
        help="bring a local store up to date with incremental reads (signed POST /query)",
        description="NIP-AR incremental reads into a local SQLite store: the first pull is an initial read,"
        " each later one reads the changes since the saved checkpoint. After a reset (HTTP 409, the access"
        " policy changed or the checkpoint expired) it runs a new initial read and revalidates the saved"
        " rows. Rows go only when the relay says so. Prints a summary line; --list also prints the saved"
        " artifacts (d, head id, type, title). The store is bound to the relay, the key and the query.",
    )
    relay_args(p)
    p.add_argument("--store", required=True, metavar="FILE", help="the local store (SQLite; created if missing)")
    p.add_argument(
        "--channel",
        action="append",
        type=_channel,
        metavar="H",
        help="only this channel (#h; repeatable): needed for an unlisted open channel this key has not joined",
    )
    match_args(p)
    p.add_argument(
        "--confirm",
        action="append",
        type=_known_id,
        metavar="D",
        help="after the pull, read this artifact's current state on the writer and save it (a current-ID read;"
        " what a live revision push asks for); repeatable",
    )
    p.add_argument(
        "--recover",
        action="store_true",
        help="drop the saved checkpoint first: a new initial read that revalidates every saved row",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="then stay connected: confirm each live revision push with a current-ID read and print it;"
        " after a lost connection, pull again (until interrupted)",
    )
    p.add_argument("--list", action="store_true", help="also print the saved artifacts")
    p.add_argument("--json", action="store_true", help="print the summary (and --list's events) as one JSON object")
    attempts_arg(p, "tries per request while the relay answers 503 or can't be reached (default 5)")

    p = commands.add_parser(
        "ensure",
        help="make 'this record exists with this content' true (create, restore or update)",
        description="The NIP-AR ensure flow with a derived d: create; on conflict read the head and restore"
        " a deletion, accept a head that already holds this title, these content fields and tags, or update a"
        " different one, keeping its other content fields and tags (ensure sets, never removes). Prints"
        " '<outcome> <d> <head id>', outcome one of created, duplicate, restored, unchanged, updated,"
        " conflict (exit status 3).",
    )
    relay_args(p)
    p.add_argument("--channel", required=True, type=_channel, metavar="H", help="home channel id")
    p.add_argument("--type", required=True, type=_type, metavar="T", help="artifact type")
    p.add_argument("--key", required=True, metavar="K", help="the record's name within channel and type")
    p.add_argument("--title", required=True, help="display title (visible to every reader of the channel)")
    p.add_argument(
        "--content", required=True, metavar="JSON", help="the content, a JSON value (sent compact, with sorted keys)"
    )
    p.add_argument("--tag", action="append", type=_tag, metavar="NAME=VALUE", help="a client tag; repeatable")
    p.add_argument(
        "--report-conflict",
        action="store_true",
        help="report a head with other content as a conflict instead of updating it",
    )
    p.add_argument("--attempts", type=_attempts, default=5, metavar="N", help="head reads before giving up (default 5)")

    p = commands.add_parser(
        "head",
        help="print the current revision of an artifact, deletions included",
        description="The NIP-AR head view over NIP-98-signed POST /query. Prints d, head id, type, title,"
        " op and channel (--json: the event). Exit status 1 when a d has no head this key can read.",
    )
    relay_args(p)
    p.add_argument("--d", required=True, action="append", metavar="D", help="artifact id; repeatable")
    p.add_argument(
        "--channel",
        action="append",
        metavar="H",
        help="read in this channel (#h; repeatable): needed for an unlisted open channel this key has not joined",
    )
    p.add_argument("--json", action="store_true", help="print each head event as JSON")

    p = commands.add_parser(
        "digest",
        help="print the nip-ar-set-v1 digest of a set read as JSON on stdin",
        description='Reads a set on stdin: an object {d: head id}, an array of {"d", "id"} objects,'
        " an array of kind-45010 events, or the output of `sync --json`; prints its nip-ar-set-v1 digest.",
    )

    p = commands.add_parser(
        "conformance",
        help="run the black-box NIP-AR conformance suite against a relay",
        description="Runs NIP-AR checks against any relay: envelope rules, compare-and-set, moves and 45011,"
        " delete and restore, the views and their limits, sync rules, incremental reads, head lookup and"
        " ensure. Key A creates channels and adds key B to them (NIP-29 kind 9000); key C, if given, stays"
        " outside them. Checks"
        " of what the relay's NIP-11 does not advertise are skipped, saying so. The last line is"
        " 'N passed, N failed'; the exit status is 1 on any failure.",
    )
    p.add_argument("--relay", required=True, type=_relay, metavar="URL", help="ws:// or wss:// relay URL")
    p.add_argument(
        "--key-file",
        required=True,
        action="append",
        metavar="FILE",
        help="key A, then key B, then optionally key C; each admitted by the relay",
    )
    p.add_argument("--only", action="append", metavar="PREFIX", help="run only checks whose name starts so")
    return top


def _undecodable(value: object) -> bool:
    """Does `value` (an argument: a string, or lists of them) hold bytes that were not UTF-8? Python keeps them as
    lone surrogates, which nothing can encode, sign or send."""
    if isinstance(value, str):
        return any("\ud800" <= ch <= "\udfff" for ch in value)
    return isinstance(value, (list, tuple)) and any(_undecodable(v) for v in value)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    top = parser()
    args = top.parse_args(argv)
    for name, value in vars(args).items():
        if _undecodable(value):
            top.error(f"--{name.replace('_', '-')} is not valid UTF-8")
    # Usage errors argparse can't see (exit status 2, as its own).
    if args.command == "pull" and args.follow and args.list:
        top.error("--list and --follow don't go together (--follow prints each change instead)")
    if args.command == "conformance" and not 2 <= len(args.key_file) <= 3:
        top.error("conformance takes --key-file A --key-file B and optionally --key-file C")
    stream = out or sys.stdout
    try:
        if args.command == "derive-d":
            return cmd_derive_d(args, stream)
        if args.command == "digest":
            return cmd_digest(args, stream)
        runner = {
            "sync": cmd_sync,
            "pull": cmd_pull,
            "ensure": cmd_ensure,
            "head": cmd_head,
            "conformance": cmd_conformance,
        }
        return asyncio.run(runner[args.command](args, stream))
    except (CliError, RelayError, HttpError, HeadUnsupported, EnsureRejected) as err:
        reason = getattr(err, "reason", None) or str(err)
        sys.stderr.write(f"error: {_safe(reason.removeprefix('error: '))}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
