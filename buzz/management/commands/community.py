"""`manage.py community ...`: create communities, admit and remove members, list them."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from buzz.identity.communities import (
    community_create,
    community_delete,
    deletion_counts,
    member_add,
    member_remove,
)
from buzz.management.commands._common import actions, community_arg, manage_command
from buzz.models import AdmissionMode, Community, RelayRole


class Command(BaseCommand):
    help = "Manage communities (one per Host) and their relay members."

    def add_arguments(self, parser: CommandParser) -> None:
        # --host is per action here: `list` needs none, `create` documents it differently.
        add = actions(parser, host=False)

        create = add("create", "Create a community served at a host name.")
        create.add_argument("--host", required=True, help="Host header clients send, e.g. relay.example.com")
        create.add_argument("--name", required=True, help="display name")
        create.add_argument("--owner", help="pubkey (64 lowercase hex) to admit as relay owner")
        create.add_argument("--public-url", help="ws:// or wss:// URL clients use (default ws://HOST/)")
        create.add_argument("--admission", choices=AdmissionMode.values, default=AdmissionMode.MEMBERS)
        create.add_argument("--description", default="")

        addm = add("add-member", "Admit a pubkey to a community, or change its role.")
        addm.add_argument("--host", required=True)
        addm.add_argument("pubkey", help="64 lowercase hex")
        addm.add_argument("--role", choices=RelayRole.values, default=RelayRole.MEMBER)

        rm = add(
            "remove-member",
            "Remove a relay member. Its open subscriptions end at once on every node, and its later requests are"
            " refused (restricted:).",
        )
        rm.add_argument("--host", required=True)
        rm.add_argument("pubkey", help="64 lowercase hex")

        members = add("members", "List the relay members of a community (pubkey, role, since).")
        members.add_argument("--host", required=True)

        add("list", "List communities with their public URL, relay pubkey and member count.")

        delete = add(
            "delete",
            "Delete a community and everything in it (channels, messages, artifacts and their history, members,"
            " tokens, bans, audit log). Its connections lose access at once on every node; its host is unknown"
            " to each relay process within seconds. Without --yes, prints what would be deleted.",
        )
        delete.add_argument("--host", required=True)
        delete.add_argument("--yes", action="store_true", help="confirm: delete it")

        local = add("ensure-local", "Make sure a community exists for localhost (used by `make run`).")
        local.add_argument("--port", type=int, default=7777)

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            getattr(self, "_" + opts["action"].replace("-", "_"))(opts)
        except ValidationError as err:
            raise CommandError("; ".join(err.messages)) from None

    def _create(self, opts: dict[str, Any]) -> None:
        c = community_create(
            host=opts["host"],
            name=opts["name"],
            owner=opts.get("owner"),
            public_url=opts.get("public_url"),
            admission=opts["admission"],
            description=opts["description"],
        )
        self.stdout.write(f"created community {c.name!r} at {c.host} ({c.public_url}), relay pubkey {c.relay_pubkey}")

    def _add_member(self, opts: dict[str, Any]) -> None:
        community = community_arg(opts["host"])
        member, created = member_add(community=community, pubkey=opts["pubkey"], role=opts["role"])
        verb = "added" if created else "updated"
        self.stdout.write(f"{verb} {member.pubkey} as {member.role} of {community.host}")

    def _remove_member(self, opts: dict[str, Any]) -> None:
        community = community_arg(opts["host"])
        if not member_remove(community=community, pubkey=opts["pubkey"]):
            raise CommandError(f"{opts['pubkey']} is not a relay member of {community.host}")
        self.stdout.write(f"removed {opts['pubkey']} from {community.host}")

    def _members(self, opts: dict[str, Any]) -> None:
        community = community_arg(opts["host"])
        for m in community.members.order_by("pubkey"):
            self.stdout.write(f"{m.pubkey}\t{m.role}\t{m.created_at:%Y-%m-%d}")

    def _list(self, opts: dict[str, Any]) -> None:
        rows = Community.objects.order_by("host")
        if not rows:
            self.stdout.write("no communities yet: manage.py community create --host H --name N")
        for c in rows:
            self.stdout.write(
                f"{c.host}\t{c.name}\t{c.public_url}\t{c.admission}\t{c.members.count()} members\t{c.relay_pubkey}"
            )

    def _delete(self, opts: dict[str, Any]) -> None:
        community = community_arg(opts["host"])
        if not opts["yes"]:
            counts = deletion_counts(community=community)
            self.stdout.write(f"deleting {community.host} ({community.name!r}) would delete:")
            for table, n in sorted(counts.items()):
                if n:
                    self.stdout.write(f"  {n}\t{table}")
            confirm = manage_command("community", "delete", "--host", community.host, "--yes")
            raise CommandError(f"nothing deleted; to delete it, run:\n  {confirm}")
        host = community.host
        counts = community_delete(community=community)
        self.stdout.write(f"deleted community {host}: {sum(counts.values())} rows")
        for table, n in sorted(counts.items()):
            if n:
                self.stdout.write(f"  {n}\t{table}")

    def _ensure_local(self, opts: dict[str, Any]) -> None:
        port = opts["port"]
        host = f"localhost:{port}"
        if not Community.objects.filter(host=host).exists():
            community_create(host=host, name="Local Buzz", public_url=f"ws://{host}/")
            self.stdout.write(f"created community for {host}")
        admit = manage_command("community", "add-member", "--host", host) + " <pubkey-hex> --role owner"
        # The command gets a line of its own, so that it can be copied whole.
        self.stdout.write(
            f"relay URL: ws://localhost:{port}/ (members only). To admit your pubkey, run in this directory:\n  {admit}"
        )
