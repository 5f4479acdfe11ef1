"""`manage.py retention ...`: a community's revision-history retention policy, and the cron jobs that apply it.

The work is moderation.services' (the same services the admin calls); this command parses, prints
progress and counts, and exits non-zero on failure. It lives in the moderation app, not beside the
other operator commands in buzz/, because nothing in buzz imports moderation (pyproject.toml's contracts).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import CommandError, CommandParser

from buzz.management.commands._common import actions, community_arg, duration_arg
from moderation.management.commands._actions import ActionCommand, count
from moderation.services import COMMAND, expire, reap_ttl, set_retention, show_retention


def _human(keep: dt.timedelta) -> str:
    seconds = int(keep.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class Command(ActionCommand):
    help = "Revision-history retention: set and show a community's policy, run expiry, reap TTL channels."

    def add_arguments(self, parser: CommandParser) -> None:
        add = actions(parser, host=False)
        put = add("set", "Set how long a community keeps revisions that are no longer current.")
        put.add_argument("--host", required=True, help="the community's host")
        put.add_argument(
            "--keep", required=True, help="a number and s, m, h or d (90d, 12h); 0s keeps only what must stay"
        )
        show = add("show", "Show a community's retention policy.")
        show.add_argument("--host", required=True, help="the community's host")
        run = add("run", "Expire the revision history the policies no longer keep (the cron job).")
        run.add_argument("--host", help="one community (default: every community with a policy)")
        run.add_argument("--dry-run", action="store_true", help="count what would expire; change nothing")
        run.add_argument("--batch-size", type=int, default=1000, help="revisions per transaction (default 1000)")
        run.add_argument("--reason", default="retention policy", help="recorded in the audit log")
        reap = add("reap-ttl", "Archive TTL channels past their deadline; delete them a further TTL later.")
        reap.add_argument("--reason", default="TTL passed", help="recorded in the audit log")

    def _set(self, opts: dict[str, Any]) -> None:
        keep = duration_arg(opts["keep"])
        community = community_arg(opts["host"])
        set_retention(community, keep, actor=COMMAND)
        self.stdout.write(f"{community.host} keeps revision history for {_human(keep)}")

    def _show(self, opts: dict[str, Any]) -> None:
        community = community_arg(opts["host"])
        keep = show_retention(community)
        if keep is None:
            self.stdout.write(f"{community.host} keeps all revision history (no policy)")
        else:
            self.stdout.write(f"{community.host} keeps revision history for {_human(keep)}")

    def _run(self, opts: dict[str, Any]) -> None:
        if opts["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        community = community_arg(opts["host"]) if opts.get("host") else None
        plan = expire(
            community,
            actor=COMMAND,
            reason=opts["reason"],
            batch_size=opts["batch_size"],
            dry_run=opts["dry_run"],
            progress=lambda line: self.stdout.write(line),
        )
        if not plan.communities:
            self.stdout.write("no community has a retention policy: nothing to do")
            return
        verb = "would expire" if plan.dry_run else "expired"
        self.stdout.write(
            f"{verb} {plan.expired} revisions in {count(len(plan.communities), 'community', 'communities')}"
            f" ({', '.join(plan.communities)}); kept {plan.kept} older revisions that must stay"
            f" (current heads, move records)"
        )

    def _reap_ttl(self, opts: dict[str, Any]) -> None:
        plan = reap_ttl(actor=COMMAND, reason=opts["reason"])
        self.stdout.write(f"TTL channels: {plan.detail}")
        for channel in plan.channels:
            self.stdout.write(f"  {channel}")
