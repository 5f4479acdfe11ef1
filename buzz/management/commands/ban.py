"""`manage.py ban ...`: relay-level bans and timeouts."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.utils import timezone

from buzz.chat.bans import ban_add, ban_lift, timeout_add
from buzz.management.commands._common import actions, community_arg, duration_arg
from buzz.models import Ban


class Command(BaseCommand):
    help = "Ban or time out a pubkey in a community, lift a ban, list bans."

    def add_arguments(self, parser: CommandParser) -> None:
        add = actions(parser)

        b = add("add", "Ban a pubkey: its writes are blocked and its reads refused.")
        b.add_argument("pubkey")
        b.add_argument("--reason", default="")
        b.add_argument("--for", dest="duration", help="e.g. 7d; default: until lifted")
        lift = add("lift", "Lift every active ban of a pubkey.")
        lift.add_argument("pubkey")
        t = add("timeout", "Time out a pubkey: writes are refused until the time runs out; reads go on.")
        t.add_argument("pubkey")
        t.add_argument("--for", dest="duration", required=True, help="e.g. 30m")
        t.add_argument("--reason", default="")
        add("list", "List active bans.")

    def handle(self, *args: Any, **opts: Any) -> None:
        community = community_arg(opts["host"])
        action = opts["action"]
        try:
            if action == "add":
                duration = duration_arg(opts["duration"]) if opts.get("duration") else None
                ban = ban_add(community=community, pubkey=opts["pubkey"], reason=opts["reason"], duration=duration)
                until = f" until {ban.expires_at:%Y-%m-%d %H:%M}" if ban.expires_at else ""
                self.stdout.write(f"banned {ban.pubkey}{until}")
            elif action == "lift":
                n = ban_lift(community=community, pubkey=opts["pubkey"])
                self.stdout.write(f"lifted {n} ban(s) of {opts['pubkey']}")
            elif action == "timeout":
                t = timeout_add(
                    community=community,
                    pubkey=opts["pubkey"],
                    duration=duration_arg(opts["duration"]),
                    reason=opts["reason"],
                )
                self.stdout.write(f"timed out {t.pubkey} until {t.until:%Y-%m-%d %H:%M:%S} UTC")
            else:
                in_force = Ban.objects.filter(community=community, lifted_at__isnull=True).filter(
                    Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
                )
                for ban in in_force.order_by("created_at"):
                    self.stdout.write(f"{ban.pubkey}\t{ban.created_at:%Y-%m-%d}\t{ban.expires_at or '-'}\t{ban.reason}")
        except (ValidationError, ValueError) as err:
            text = "; ".join(err.messages) if isinstance(err, ValidationError) else str(err)
            raise CommandError(text) from None
