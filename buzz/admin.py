from django.contrib import admin

from buzz.models import Community, RelayMember, StoredEvent


class RelayMemberInline(admin.TabularInline[RelayMember, Community]):
    model = RelayMember
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

    def has_add_permission(self, request: object) -> bool:
        # Creating a community generates its relay key: use `manage.py community create`.
        return False


@admin.register(RelayMember)
class RelayMemberAdmin(admin.ModelAdmin[RelayMember]):
    list_display = ("pubkey", "community", "role", "created_at")
    list_filter = ("role", "community")
    search_fields = ("pubkey",)


@admin.register(StoredEvent)
class StoredEventAdmin(admin.ModelAdmin[StoredEvent]):
    list_display = ("id", "kind", "pubkey", "channel_id", "created_at", "deleted_at")
    list_filter = ("kind", "community")
    search_fields = ("id", "pubkey")
    readonly_fields = [f.name for f in StoredEvent._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        # Events are removed through moderation (NIP-29 kind 9005), never by a raw delete.
        return False
