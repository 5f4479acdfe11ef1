"""`manage.py channel ...`: channels and memberships without a browser (same services as NIP-29 events)."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from buzz.chat import channels as services
from buzz.chat.channels import ChannelError
from buzz.identity.communities import check_pubkey
from buzz.management.commands._common import actions, channel_arg, community_arg
from buzz.models import Channel, ChannelRole, ChannelType, Visibility


def existing_channel(community: Any, value: str) -> uuid.UUID:
    """The channel id argument of a channel that exists (not deleted) in the community, else CommandError.

    The services answer a missing channel like an unreadable one (no existence oracle for
    clients); an operator gets the plain fact instead.
    """
    channel_uuid = channel_arg(value)
    if not Channel.objects.filter(community=community, uuid=channel_uuid, deleted_at__isnull=True).exists():
        raise CommandError(f"no channel {value} in {community.host}")
    return channel_uuid


class Command(BaseCommand):
    help = "Create channels, add or remove members, archive, unarchive, delete and list channels."

    def add_arguments(self, parser: CommandParser) -> None:
        add = actions(parser)

        create = add("create", "Create a channel; the owner pubkey becomes its owner.")
        create.add_argument("--name", required=True)
        create.add_argument("--owner", required=True, help="pubkey (64 lowercase hex)")
        create.add_argument("--id", dest="channel_id", help="channel UUID (default: a new random one)")
        create.add_argument("--visibility", choices=Visibility.values, default=Visibility.OPEN)
        create.add_argument("--type", dest="channel_type", choices=ChannelType.values, default=ChannelType.STREAM)
        create.add_argument("--about", default="")
        create.add_argument("--unlisted", action="store_true")
        create.add_argument("--participant", action="append", default=[], help="DM participant (repeat)")

        addm = add("add-member", "Add a member to a channel, or change its role.")
        addm.add_argument("channel_id")
        addm.add_argument("pubkey")
        addm.add_argument(
            "--role",
            choices=ChannelRole.values,
            default=None,
            help="the member's role (default: member for a new member; an existing member keeps theirs)",
        )

        rm = add("remove-member", "Remove a member (the membership row is kept with its removal time).")
        rm.add_argument("channel_id")
        rm.add_argument("pubkey")

        for name, text in (("archive", "Archive a channel."), ("unarchive", "Unarchive a channel.")):
            p = add(name, text)
            p.add_argument("channel_id")
        delete = add("delete", "Delete a channel: its subscriptions end and its content leaves every read.")
        delete.add_argument("channel_id")
        delete.add_argument("--yes", action="store_true", help="confirm")

        add("list", "List channels with visibility, type, state and member count.")

    def handle(self, *args: Any, **opts: Any) -> None:
        community = community_arg(opts["host"])
        try:
            getattr(self, "_" + opts["action"].replace("-", "_"))(community, opts)
        except (ChannelError, ValidationError) as err:
            text = err.reason if isinstance(err, ChannelError) else "; ".join(err.messages)
            raise CommandError(text) from None

    def _create(self, community: Any, opts: dict[str, Any]) -> None:
        check_pubkey(opts["owner"])
        for p in opts["participant"]:
            check_pubkey(p)
        channel_uuid = channel_arg(opts["channel_id"]) if opts.get("channel_id") else uuid.uuid4()
        channel = services.channel_create(
            community=community,
            channel_uuid=channel_uuid,
            name=opts["name"],
            creator=opts["owner"],
            visibility=opts["visibility"],
            channel_type=opts["channel_type"],
            about=opts["about"],
            listed=not opts["unlisted"],
            participants=opts["participant"],
        )
        self.stdout.write(f"created {channel.type} channel {channel.name!r} {channel.uuid} ({channel.visibility})")

    def _add_member(self, community: Any, opts: dict[str, Any]) -> None:
        check_pubkey(opts["pubkey"])
        m = services.member_put(
            community=community,
            channel_uuid=existing_channel(community, opts["channel_id"]),
            actor=None,
            pubkey=opts["pubkey"],
            role=opts["role"],
        )
        self.stdout.write(f"{m.pubkey} is {m.role} of {opts['channel_id']}")

    def _remove_member(self, community: Any, opts: dict[str, Any]) -> None:
        services.member_remove(
            community=community,
            channel_uuid=existing_channel(community, opts["channel_id"]),
            actor=None,
            pubkey=opts["pubkey"],
        )
        self.stdout.write(f"removed {opts['pubkey']} from {opts['channel_id']}")

    def _archive(self, community: Any, opts: dict[str, Any]) -> None:
        services.channel_edit(
            community=community,
            channel_uuid=existing_channel(community, opts["channel_id"]),
            actor=None,
            changes={"archived": "true"},
            operator="command",
        )
        self.stdout.write(f"archived {opts['channel_id']}")

    def _unarchive(self, community: Any, opts: dict[str, Any]) -> None:
        services.channel_edit(
            community=community,
            channel_uuid=existing_channel(community, opts["channel_id"]),
            actor=None,
            changes={"archived": "false"},
            operator="command",
        )
        self.stdout.write(f"unarchived {opts['channel_id']}")

    def _delete(self, community: Any, opts: dict[str, Any]) -> None:
        channel_uuid = existing_channel(community, opts["channel_id"])
        if not opts["yes"]:
            raise CommandError("deleting a channel ends its subscriptions and hides its content: add --yes to confirm")
        services.channel_delete(community=community, channel_uuid=channel_uuid, actor=None, operator="command")
        self.stdout.write(f"deleted {opts['channel_id']}")

    def _list(self, community: Any, opts: dict[str, Any]) -> None:
        rows = Channel.objects.filter(community=community).order_by("name")
        if not rows:
            self.stdout.write("no channels")
        for c in rows:
            state = "deleted" if c.deleted_at else "archived" if c.archived_at else "active"
            members = c.memberships.filter(removed_at__isnull=True).count()
            self.stdout.write(f"{c.uuid}\t{c.name}\t{c.type}\t{c.visibility}\t{state}\t{members} members")
