from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from buzz.access.changes import access_changed
from buzz.chat.bans import ban_add
from buzz.chat.channels import ChannelError, channel_edit, member_remove
from buzz.identity import communities
from buzz.identity.tokens import token_revoke
from buzz.live import signals
from buzz.models import ApiToken, Ban, Channel, Community, Membership, RelayMember, StoredEvent, Timeout

# Relay members are added, changed and removed through buzz.identity.communities (member_add,
# member_remove), as by `manage.py community`: a removal ends the pubkey's live subscriptions on every
# node. A member's pubkey can't be edited in place (that would be a removal nobody is told of).


class RelayMemberForm(forms.ModelForm[RelayMember]):
    class Meta:
        model = RelayMember
        fields = ("community", "pubkey", "role")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None and "pubkey" in self.fields:
            self.fields["pubkey"].disabled = True


def _save_member(member: RelayMember) -> RelayMember:
    saved, _ = communities.member_add(community=member.community, pubkey=member.pubkey, role=member.role)
    return saved


def _remove_members(members: QuerySet[RelayMember] | list[RelayMember]) -> int:
    n = 0
    for m in list(members):
        n += communities.member_remove(community=m.community, pubkey=m.pubkey)
    return n


class RelayMemberInline(admin.TabularInline[RelayMember, Community]):
    model = RelayMember
    form = RelayMemberForm
    extra = 0
    fields = ("pubkey", "role", "created_at")
    readonly_fields = ("created_at",)


@admin.register(Community)
class CommunityAdmin(admin.ModelAdmin[Community]):
    list_display = ("host", "name", "public_url", "admission", "relay_pubkey", "created_at")
    search_fields = ("host", "name")
    # The relay secret never shows in the admin.
    exclude = ("relay_secret",)
    readonly_fields = ("relay_pubkey", "created_at")
    inlines = [RelayMemberInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Creating a community generates its relay key: use `manage.py community create`.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Community | None = None) -> bool:
        # Deleting a community would drop every channel, artifact and member under live subscriptions.
        return False

    def save_model(self, request: HttpRequest, obj: Community, form: Any, change: bool) -> None:
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if change and "admission" in form.changed_data:
                access_changed(obj.pk)  # who may read changes (buzz.access.changes)
                # Every open subscription re-checks its reader's admission (a sync resyncs), on every node.
                signals.publish_standing_on_commit(obj.pk, None, signals.WHY_ADMISSION)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        if formset.model is not RelayMember:
            super().save_formset(request, form, formset, change)
            return
        instances = formset.save(commit=False)
        _remove_members(formset.deleted_objects)
        for member in instances:
            member.community = form.instance
            _save_member(member)


@admin.register(RelayMember)
class RelayMemberAdmin(admin.ModelAdmin[RelayMember]):
    form = RelayMemberForm
    list_display = ("pubkey", "community", "role", "created_at")
    list_filter = ("role", "community")
    search_fields = ("pubkey",)

    def save_model(self, request: HttpRequest, obj: RelayMember, form: Any, change: bool) -> None:
        # The form has validated pubkey and role as the service does.
        obj.pk = _save_member(obj).pk

    def delete_model(self, request: HttpRequest, obj: RelayMember) -> None:
        _remove_members([obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[RelayMember]) -> None:
        _remove_members(queryset.select_related("community"))


@admin.register(StoredEvent)
class StoredEventAdmin(admin.ModelAdmin[StoredEvent]):
    list_display = ("id", "kind", "pubkey", "channel_id", "created_at", "deleted_at")
    list_filter = ("kind", "community")
    search_fields = ("id", "pubkey")
    readonly_fields = [f.name for f in StoredEvent._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: StoredEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: StoredEvent | None = None) -> bool:
        # Events are removed through moderation (NIP-29 kind 9005), never by a raw delete.
        return False


# --- channels, memberships, tokens, bans ---------------------------------------------
# Changes go through the same services as NIP-29 events and the management commands.


class MembershipInline(admin.TabularInline[Membership, Channel]):
    model = Membership
    extra = 0
    fields = ("pubkey", "role", "joined_at", "removed_at")
    readonly_fields = ("pubkey", "role", "joined_at", "removed_at")
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Channel | None = None) -> bool:
        return False


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin[Channel]):
    list_display = ("name", "uuid", "community", "type", "visibility", "listed", "archived_at", "deleted_at")
    list_filter = ("type", "visibility", "community")
    search_fields = ("name", "uuid")
    readonly_fields = [f.name for f in Channel._meta.fields]
    inlines = [MembershipInline]
    actions = ["archive", "unarchive"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Channel | None = None) -> bool:
        # A raw delete would bypass the resync of live subscriptions: delete through the service.
        return False

    @admin.action(description="Archive selected channels (writes refused, reads unchanged)")
    def archive(self, request: HttpRequest, queryset: QuerySet[Channel]) -> None:
        self._edit(request, queryset, {"archived": "true"}, "archived")

    @admin.action(description="Unarchive selected channels")
    def unarchive(self, request: HttpRequest, queryset: QuerySet[Channel]) -> None:
        self._edit(request, queryset, {"archived": "false"}, "unarchived")

    def _edit(self, request: HttpRequest, queryset: QuerySet[Channel], changes: dict[str, str], verb: str) -> None:
        n = 0
        for channel in queryset.filter(deleted_at__isnull=True).select_related("community"):
            channel_edit(community=channel.community, channel_uuid=channel.uuid, actor=None, changes=changes)
            n += 1
        self.message_user(request, f"{verb} {n} channel(s)", messages.SUCCESS)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin[Membership]):
    list_display = ("pubkey", "channel", "role", "joined_at", "removed_at")
    list_filter = ("role",)
    search_fields = ("pubkey", "channel__name", "channel__uuid")
    readonly_fields = ("channel", "pubkey", "role", "joined_at", "removed_at", "read_mark")
    actions = ["remove_members"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Membership | None = None) -> bool:
        return False

    @admin.action(description="Remove selected members (kept as removed rows)")
    def remove_members(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        n = 0
        for m in queryset.filter(removed_at__isnull=True).select_related("channel__community"):
            try:
                member_remove(community=m.channel.community, channel_uuid=m.channel.uuid, actor=None, pubkey=m.pubkey)
                n += 1
            except ChannelError as err:
                self.message_user(request, f"{m.pubkey[:12]}…: {err.reason}", messages.WARNING)
        self.message_user(request, f"removed {n} member(s)", messages.SUCCESS)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    list_display = ("prefix", "pubkey", "community", "name", "scopes", "channels", "expires_at", "revoked_at")
    list_filter = ("community",)
    search_fields = ("pubkey", "prefix", "name")
    exclude = ("token_hash",)
    readonly_fields = ("community", "pubkey", "prefix", "scopes", "channels", "created_at", "expires_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Tokens are shown once at creation: use `manage.py token create`.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            token_revoke(token_id=token.pk)
        self.message_user(request, f"revoked {queryset.count()} token(s)", messages.SUCCESS)


@admin.register(Ban)
class BanAdmin(admin.ModelAdmin[Ban]):
    list_display = ("pubkey", "community", "reason", "created_at", "expires_at", "lifted_at")
    list_filter = ("community",)
    search_fields = ("pubkey",)
    readonly_fields = ("created_at", "lifted_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Ban | None = None) -> Any:
        # A ban is made through ban_add; changing one in place (or deleting it) would change access unseen.
        if obj is not None:
            return ("community", "pubkey", "reason", "created_at", "expires_at", "lifted_at")
        return self.readonly_fields

    def has_delete_permission(self, request: HttpRequest, obj: Ban | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Ban, form: Any, change: bool) -> None:
        if change:
            with transaction.atomic():
                super().save_model(request, obj, form, change)
                access_changed(obj.community_id)  # an edited ban may end sooner or cover someone else
            return
        duration = obj.expires_at - timezone.now() if obj.expires_at else None
        saved = ban_add(community=obj.community, pubkey=obj.pubkey, reason=obj.reason, duration=duration)
        obj.pk = saved.pk


@admin.register(Timeout)
class TimeoutAdmin(admin.ModelAdmin[Timeout]):
    list_display = ("pubkey", "community", "until", "reason", "created_at")
    list_filter = ("community",)
    search_fields = ("pubkey",)
