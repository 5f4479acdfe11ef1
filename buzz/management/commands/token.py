"""`manage.py token ...`: issue, revoke and list API tokens."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from buzz.access.policy import KNOWN_SCOPES
from buzz.identity.tokens import token_create, token_revoke
from buzz.management.commands._common import actions, community_arg, duration_arg
from buzz.models import ApiToken


class Command(BaseCommand):
    help = "Issue (printed once), revoke and list API tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        add = actions(parser)

        create = add("create", "Issue a token for a pubkey. The token is printed once and never stored.")
        create.add_argument("pubkey")
        create.add_argument(
            "--scope", action="append", required=True, help=f"repeat; one of: {', '.join(sorted(KNOWN_SCOPES))}"
        )
        create.add_argument("--channel", action="append", help="limit to this channel UUID (repeat)")
        create.add_argument("--name", default="")
        create.add_argument("--expires-in", help="e.g. 30d, 12h")

        revoke = add("revoke", "Revoke a token by its id (see `token list`); it stops working on the next request.")
        revoke.add_argument("token_id", type=int)

        lst = add("list", "List tokens (id, prefix, pubkey, scopes, channels, expiry, state).")
        lst.add_argument("--pubkey")

    def handle(self, *args: Any, **opts: Any) -> None:
        community = community_arg(opts["host"])
        action = opts["action"]
        try:
            if action == "create":
                issued = token_create(
                    community=community,
                    pubkey=opts["pubkey"],
                    scopes=opts["scope"],
                    channels=opts["channel"],
                    name=opts["name"],
                    expires_in=duration_arg(opts["expires_in"]) if opts.get("expires_in") else None,
                )
                self.stdout.write(f"token id {issued.row.pk} for {issued.row.pubkey} (shown once, store it now):")
                self.stdout.write(issued.token)
            elif action == "revoke":
                # Check the community before revoking: a token of another community is not touched.
                found = ApiToken.objects.filter(pk=opts["token_id"]).values_list("community_id", flat=True).first()
                if found is None:
                    raise CommandError(f"no token with id {opts['token_id']}")
                if found != community.pk:
                    raise CommandError(f"no token with id {opts['token_id']} in {community.host}")
                row = token_revoke(token_id=opts["token_id"])
                self.stdout.write(f"revoked token {row.pk} ({row.prefix}…)")
            else:
                rows = ApiToken.objects.filter(community=community).order_by("pk")
                if opts.get("pubkey"):
                    rows = rows.filter(pubkey=opts["pubkey"])
                for t in rows:
                    state = "revoked" if t.revoked_at else "active"
                    channels = ",".join(t.channels) if t.channels is not None else "*"
                    scopes = ",".join(t.scopes)
                    expiry = t.expires_at or "-"
                    self.stdout.write(f"{t.pk}\t{t.prefix}…\t{t.pubkey}\t{scopes}\t{channels}\t{expiry}\t{state}")
        except ValidationError as err:
            raise CommandError("; ".join(err.messages)) from None
