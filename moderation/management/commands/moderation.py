"""`manage.py moderation ...`: what the admin's moderation actions do, for an operator without a browser.

`redact` withholds artifact revisions (or 45011 move removals) as a relay admin, and `reset-policy`
advances a community's access-policy stamp. Each calls the moderation service the admin action calls
(moderation.services.redact, reset_policy), with the actor `command`, so the same NIP-29 kind-9005 path,
resyncs and audit records follow. Like the admin's confirmation page, a run without --yes only says what
would happen and prints the command that does it.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import CommandError, CommandParser

from buzz.management.commands._common import actions, community_arg, manage_command
from moderation.management.commands._actions import ActionCommand, count
from moderation.services import COMMAND, preview_redact, preview_reset_policy, redact, reset_policy

_EVENT_ID = re.compile(r"^[0-9a-f]{64}\Z")


class Command(ActionCommand):
    help = "Moderation without the admin: redact artifact revisions, reset a community's access policy."

    def add_arguments(self, parser: CommandParser) -> None:
        add = actions(parser)
        red = add(
            "redact",
            "Withhold revisions (or 45011 move removals) everywhere, by their event ids; a current revision retires"
            " its artifact, and the open syncs holding it get a resync. Without --yes, prints what would happen.",
        )
        red.add_argument("ids", nargs="+", metavar="ID", help="event id: 64 lowercase hex")
        red.add_argument("--reason", required=True, help="recorded in the audit log and sent as the 9005's content")
        red.add_argument("--yes", action="store_true", help="confirm: redact them")
        reset = add(
            "reset-policy",
            "Advance the community's policy stamp (incremental-read checkpoints start over) and resync every open"
            " sync. Without --yes, prints what would happen.",
        )
        reset.add_argument("--reason", required=True, help="recorded in the audit log")
        reset.add_argument("--yes", action="store_true", help="confirm: reset it")

    def _redact(self, opts: dict[str, Any]) -> None:
        bad = [i for i in opts["ids"] if not _EVENT_ID.match(i)]
        if bad:
            raise CommandError(f"invalid event id {bad[0]!r}: expected 64 lowercase hex characters")
        if not opts["reason"].strip():
            raise CommandError("--reason must say why (it is recorded in the audit log)")
        community = community_arg(opts["host"])
        ids = list(dict.fromkeys(opts["ids"]))
        if not opts["yes"]:
            plan = preview_redact(community, ids)
            if not plan.withheld:
                self._unknown(plan.unknown)
                raise CommandError("nothing to redact")
            withheld = count(len(plan.withheld), "event", "events")
            self.stdout.write(f"redacting in {community.host} would withhold {withheld}:")
            for i in plan.withheld:
                self.stdout.write(f"  {i}")
            self.stdout.write(f"and retire {count(len(plan.retiring), 'artifact', 'artifacts')}:")
            for d in plan.retiring:
                self.stdout.write(f"  d {d}")
            self._unknown(plan.unknown)
            self.stdout.write(
                f"{count(plan.open_syncs, 'open sync', 'open syncs')} over their channels"
                " (each one holding a retiring artifact gets a resync)"
            )
            confirm = manage_command("moderation", "redact", "--host", community.host, "--reason", opts["reason"],
                                     "--yes", *ids)  # fmt: skip
            raise CommandError(f"nothing redacted; to redact, run:\n  {confirm}")
        done = redact(community, ids, actor=COMMAND, reason=opts["reason"])
        self.stdout.write(
            f"redacted {count(len(done.withheld), 'event', 'events')} in {community.host};"
            f" {count(len(done.retiring), 'artifact', 'artifacts')} retired;"
            f" {count(done.open_syncs, 'open sync', 'open syncs')} over their channels"
        )
        for d in done.retiring:
            self.stdout.write(f"  retired d {d}")
        self._unknown(done.unknown)

    def _unknown(self, unknown: tuple[str, ...]) -> None:
        if unknown:
            self.stdout.write(
                f"left out {count(len(unknown), 'id', 'ids')}: no revision or move removal of this community,"
                " already withheld, or in a deleted channel:"
            )
            for i in unknown:
                self.stdout.write(f"  {i}")

    def _reset_policy(self, opts: dict[str, Any]) -> None:
        if not opts["reason"].strip():
            raise CommandError("--reason must say why (it is recorded in the audit log)")
        community = community_arg(opts["host"])
        if not opts["yes"]:
            plan = preview_reset_policy(community)
            self.stdout.write(
                f"resetting the access policy of {community.host} would refuse every incremental-read checkpoint"
                f" (409 incremental_reset) and resync {count(plan.open_syncs, 'open sync', 'open syncs')}"
                f" over its {count(len(plan.channels), 'channel', 'channels')}"
            )
            confirm = manage_command("moderation", "reset-policy", "--host", community.host, "--reason",
                                     opts["reason"], "--yes")  # fmt: skip
            raise CommandError(f"nothing reset; to reset it, run:\n  {confirm}")
        done = reset_policy(community, actor=COMMAND, reason=opts["reason"])
        self.stdout.write(
            f"reset the access policy of {community.host}: {done.detail};"
            f" {count(done.open_syncs, 'open sync', 'open syncs')} resync"
        )
