"""The Django admin for relay admins (superusers) and moderators (staff in the "Moderators" group).

Artifacts and revisions are shown here (artifacts/ has no admin: it must not import moderation), next to
the retention policy and the audit log. Every destructive action goes through a confirmation page that
says what will happen before it does (which revisions are withheld, whether artifacts retire, how many
open syncs get a resync) and asks for a reason; only the confirming POST acts, through the same
moderation service as the NIP-29 event or the `retention` command, with the admin's username as actor.

Nothing here writes a model directly: Django's add, change and delete are turned off wherever they would
change what readers see without the resync the spec requires.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import CommandError
from django.db.models import Model, OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from artifacts.models import Artifact, Revision
from buzz.admin import ChannelAdmin, CommunityAdmin
from buzz.management.commands._common import duration_arg
from buzz.models import Channel, Community
from moderation import services
from moderation.models import AuditRecord, RetentionPolicy

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Model)

# A confirmation page names its objects in its URL (?ids=...): an action on more objects than this is
# refused with a message rather than an unusable page or URL.
MAX_SELECTED = 200
CONFIRM_TEMPLATE = "admin/moderation/confirm_action.html"


def actor_of(request: HttpRequest) -> str:
    """The actor the services record in the audit log for an admin action."""
    return f"admin:{request.user.get_username()}"


def duration_text(value: dt.timedelta) -> str:
    """A retention duration the way `manage.py retention set --keep` spells it: 90d, 12h, 30m, 0s."""
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def short(value: str | None, n: int = 12) -> str:
    return "" if not value else (value if len(value) <= n else f"{value[:n]}…")


# --- confirmation pages --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preview:
    """What a confirmation page says will happen, before it happens."""

    summary: str
    targets: Sequence[str]
    withheld: Sequence[str] = ()
    withheld_label: str = "Revisions withheld"
    # How many in all, when `withheld` lists only the first few (expiry); else len(withheld).
    withheld_total: int | None = None
    retiring: Sequence[str] = ()
    open_syncs: int = 0
    notes: Sequence[str] = ()
    # Set when nothing would happen (every target already in that state): the page says so, no button.
    nothing: str = ""


@dataclass(frozen=True)
class Step(Generic[M]):
    """One confirmed action: who may run it, what its page says, and the service call that does it."""

    name: str
    title: str
    button: str
    allowed: Callable[[HttpRequest], bool]
    preview: Callable[[list[M]], Preview]
    # Runs the service; returns the sentence the admin is shown afterwards.
    perform: Callable[[list[M], str, str], str]
    # An optional second button (expiry's dry run): runs and renders the page again with its result.
    dry_run: Callable[[list[M], str, str], str] | None = None
    dry_run_button: str = ""


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=1000,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80, "placeholder": "Why? Kept in the audit log."}),
        help_text="Required. Recorded in the audit log with your username.",
    )


@dataclass
class ConfirmedActions(Generic[M]):
    """The confirmation-page machinery a ModelAdmin mixes in through `confirm_urls` and `confirm_redirect`."""

    admin: admin.ModelAdmin[M]
    steps: dict[str, Step[M]] = field(default_factory=dict)

    def add(self, step: Step[M]) -> None:
        self.steps[step.name] = step

    def url_name(self) -> str:
        meta = self.admin.model._meta
        return f"{meta.app_label}_{meta.model_name}_confirm"

    def urls(self) -> list[URLPattern]:
        view = self.admin.admin_site.admin_view(self.view)
        return [path("confirm/<str:step>/", view, name=self.url_name())]

    def redirect(self, request: HttpRequest, step: str, queryset: QuerySet[M]) -> HttpResponse | None:
        """The admin action's answer: the confirmation page for the selected objects (the action does nothing)."""
        if not self.steps[step].allowed(request):
            raise PermissionDenied
        ids = list(queryset.values_list("pk", flat=True)[: MAX_SELECTED + 1])
        if len(ids) > MAX_SELECTED:
            self.admin.message_user(request, f"Select at most {MAX_SELECTED} objects for this action.", messages.ERROR)
            return None
        url = reverse(f"{self.admin.admin_site.name}:{self.url_name()}", args=[step])
        return HttpResponseRedirect(f"{url}?ids={','.join(str(i) for i in ids)}")

    def _objects(self, request: HttpRequest) -> list[M]:
        raw = request.GET.get("ids", "")
        try:
            ids = [int(part) for part in raw.split(",") if part]
        except ValueError:
            return []
        if not ids or len(ids) > MAX_SELECTED:
            return []
        # Only what this user can see in the changelist.
        return list(self.admin.get_queryset(request).filter(pk__in=ids).order_by("pk"))

    def view(self, request: HttpRequest, step: str) -> HttpResponse:
        chosen = self.steps.get(step)
        if chosen is None:
            raise PermissionDenied
        if not chosen.allowed(request) or not self.admin.has_view_permission(request):
            raise PermissionDenied
        changelist = reverse(
            f"{self.admin.admin_site.name}:{self.admin.model._meta.app_label}_{self.admin.model._meta.model_name}_changelist"
        )
        objects = self._objects(request)
        if not objects:
            self.admin.message_user(request, "Nothing selected: choose the objects again.", messages.WARNING)
            return HttpResponseRedirect(changelist)
        form = ReasonForm(request.POST or None)
        result = ""
        if request.method == "POST" and form.is_valid():
            reason = form.cleaned_data["reason"]
            actor = actor_of(request)
            if "_dry_run" in request.POST and chosen.dry_run is not None:
                try:
                    result = chosen.dry_run(objects, actor, reason)
                except Exception as err:  # shown, not swallowed: the page says what failed
                    log.exception("admin dry run %s failed", step)
                    self.admin.message_user(request, f"{chosen.title} (dry run) failed: {err}", messages.ERROR)
            elif "_confirm" in request.POST:
                try:
                    done = chosen.perform(objects, actor, reason)
                except Exception as err:
                    log.exception("admin action %s failed", step)
                    self.admin.message_user(request, f"{chosen.title} failed: {err}", messages.ERROR)
                    return HttpResponseRedirect(changelist)
                for obj in objects:
                    self.admin.log_change(request, obj, f"{chosen.title}: {reason}")
                self.admin.message_user(request, done, messages.SUCCESS)
                return HttpResponseRedirect(changelist)
        preview = chosen.preview(objects)
        opts = self.admin.model._meta
        context = {
            **self.admin.admin_site.each_context(request),
            "title": chosen.title,
            "subtitle": None,
            "opts": opts,
            "app_label": opts.app_label,
            "changelist_url": changelist,
            "step": chosen,
            "preview": preview,
            "form": form,
            "dry_run_result": result,
            "has_dry_run": chosen.dry_run is not None,
            "withheld_total": len(preview.withheld) if preview.withheld_total is None else preview.withheld_total,
            "media": self.admin.media,
        }
        request.current_app = self.admin.admin_site.name
        return TemplateResponse(request, CONFIRM_TEMPLATE, context)


def perm(codename: str) -> Callable[[HttpRequest], bool]:
    def check(request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff and request.user.has_perm(codename))

    return check


# --- artifacts and revisions -----------------------------------------------------------------------------


class ReadOnly:
    """No add, change or delete through Django's own views: these tables change only through services."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _title_of(raw: str) -> str:
    try:
        event = json.loads(raw)
    except ValueError:
        return ""
    for tag in event.get("tags", []):
        if isinstance(tag, list) and len(tag) >= 2 and tag[0] == "title":
            return str(tag[1])
    return ""


def channel_name_of(community: str, uuid_field: str) -> Subquery:
    """The name of the channel (community, uuid) a row names: annotated, so a changelist page costs one query."""
    rows = Channel.objects.filter(community=OuterRef(community), uuid=OuterRef(uuid_field)).values("name")[:1]
    return Subquery(rows)


def _label(obj: Any, attribute: str, uuid: Any) -> SafeString:
    name = getattr(obj, attribute, None)
    return format_html('<span title="{}">{}</span>', uuid, name or uuid)


def event_text(raw: str) -> str:
    """A stored event for reading: one field a line, one tag a line."""
    try:
        event = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(event, dict):
        return raw
    lines = []
    for key, value in event.items():
        if key == "tags" and isinstance(value, list) and value:
            tags = ",\n".join(f"    {json.dumps(tag, ensure_ascii=False)}" for tag in value)
            lines.append(f'  "tags": [\n{tags}\n  ]')
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n" + ",\n".join(lines) + "\n}"


def revision_state(rev: Revision) -> str:
    if rev.redacted_at is not None:
        return "redacted"
    if rev.expired_at is not None:
        return "expired"
    return "visible"


class RevisionInline(ReadOnly, admin.TabularInline[Revision, Artifact]):
    model = Revision
    extra = 0
    can_delete = False
    ordering = ("-seq",)
    fields = ("revision_link", "op", "channel_name", "author", "accepted_at", "state")
    readonly_fields = fields
    verbose_name_plural = "revisions (newest first)"

    @admin.display(description="channel")
    def channel_name(self, rev: Revision) -> SafeString:
        return _label(rev, "channel_label", rev.channel)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Revision]:
        return super().get_queryset(request).annotate(channel_label=channel_name_of("community", "channel"))

    @admin.display(description="revision")
    def revision_link(self, rev: Revision) -> SafeString:
        url = reverse("admin:artifacts_revision_change", args=[rev.pk])
        return format_html('<a href="{}"><code>{}</code></a>', url, short(rev.id, 16))

    @admin.display(description="author")
    def author(self, rev: Revision) -> SafeString:
        return format_html('<code title="{}">{}</code>', rev.pubkey, short(rev.pubkey))

    @admin.display(description="state")
    def state(self, rev: Revision) -> str:
        return revision_state(rev)


class ArtifactStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "current"), ("deleted", "deleted"), ("retired", "retired (head redacted)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "live":
            return queryset.filter(deleted=False, retired=False)
        if value == "deleted":
            return queryset.filter(deleted=True)
        if value == "retired":
            return queryset.filter(retired=True)
        return queryset


@admin.register(Artifact)
class ArtifactAdmin(ReadOnly, admin.ModelAdmin[Artifact]):
    list_display = ("d_short", "type", "community_host", "home_name", "head", "head_title", "state", "changed")
    list_filter = (ArtifactStateFilter, "type", "community")
    search_fields = ("d", "head_id", "type")
    ordering = ("-changed_at",)
    list_select_related = ("community",)
    fields = ("community", "d", "type", "home_channel", "state", "head_revision", "root", "created_at", "changed_at")
    readonly_fields = fields
    inlines = [RevisionInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Artifact]:
        head = Revision.objects.filter(community=OuterRef("community"), id=OuterRef("head_id"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                home_label=channel_name_of("community", "home"),
                head_raw=Subquery(head.values("raw")[:1]),
                head_expired=Subquery(head.values("expired_at")[:1]),
            )
        )

    class Media:
        css = {"all": ("moderation/admin.css",)}

    # Channel names and the head's title are annotated (get_queryset): a page is one query, whatever its size.
    list_per_page = 50

    @admin.display(description="d", ordering="d")
    def d_short(self, artifact: Artifact) -> SafeString:
        return format_html('<code title="{}">{}</code>', artifact.d, short(str(artifact.d), 13))

    @admin.display(description="community", ordering="community__host")
    def community_host(self, artifact: Artifact) -> str:
        return artifact.community.host

    @admin.display(description="home channel")
    def home_name(self, artifact: Artifact) -> SafeString:
        return _label(artifact, "home_label", artifact.home)

    @admin.display(description="changed", ordering="changed_at")
    def changed(self, artifact: Artifact) -> str:
        return f"{artifact.changed_at:%Y-%m-%d %H:%M:%S}"

    @admin.display(description="home channel")
    def home_channel(self, artifact: Artifact) -> str:
        name = getattr(artifact, "home_label", None)
        return f"{name} ({artifact.home})" if name else str(artifact.home)

    @admin.display(description="head")
    def head(self, artifact: Artifact) -> SafeString:
        return format_html("<code>{}</code>", short(artifact.head_id))

    def _head_row(self, artifact: Artifact) -> Revision | None:
        if artifact.head_id is None:
            return None
        return Revision.objects.filter(community_id=artifact.community_id, id=artifact.head_id).first()

    @admin.display(description="title")
    def head_title(self, artifact: Artifact) -> SafeString:
        raw = getattr(artifact, "head_raw", None)
        text = _title_of(raw) if raw and getattr(artifact, "head_expired", None) is None else ""
        return format_html('<span title="{}">{}</span>', text, short(text, 32))

    @admin.display(description="state")
    def state(self, artifact: Artifact) -> str:
        if artifact.retired:
            return "retired (head redacted)"
        if artifact.deleted:
            return "deleted"
        return "current"

    @admin.display(description="current head")
    def head_revision(self, artifact: Artifact) -> SafeString:
        row = self._head_row(artifact)
        if row is None:
            return format_html("<em>none</em>")
        url = reverse("admin:artifacts_revision_change", args=[row.pk])
        return format_html(
            '<a href="{}"><code>{}</code></a> op={} · {} · <span title="title tag">{}</span>',
            url,
            row.id,
            row.op,
            revision_state(row),
            _title_of(row.raw) or "—",
        )


class ChannelFilter(admin.SimpleListFilter):
    title = "channel"
    parameter_name = "channel"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        rows = Channel.objects.filter(deleted_at__isnull=True).select_related("community").order_by("name")[:200]
        return [(str(c.uuid), f"{c.name} ({c.community.host})") for c in rows]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        try:
            return queryset.filter(channel=value)
        except ValueError:
            return queryset.none()


class _TimestampFilter(admin.SimpleListFilter):
    column = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "yes"), ("no", "no")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(**{f"{self.column}__isnull": False})
        if self.value() == "no":
            return queryset.filter(**{f"{self.column}__isnull": True})
        return queryset


class RedactedFilter(_TimestampFilter):
    title = "redacted"
    parameter_name = "redacted"
    column = "redacted_at"


class ExpiredFilter(_TimestampFilter):
    title = "expired"
    parameter_name = "expired"
    column = "expired_at"


class OpFilter(admin.SimpleListFilter):
    title = "kind of op"
    parameter_name = "op"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(op, op) for op in ("create", "update", "move", "delete", "restore")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(op=self.value()) if self.value() else queryset


@admin.register(Revision)
class RevisionAdmin(ReadOnly, admin.ModelAdmin[Revision]):
    list_display = ("short_id", "d", "op", "channel_name", "author", "title", "accepted", "state")
    list_filter = (ChannelFilter, OpFilter, RedactedFilter, ExpiredFilter, "community")
    # id, d, channel (uuid, or its name: get_search_results) and author.
    search_fields = ("id", "artifact__d", "channel", "pubkey")
    search_help_text = "Search by revision id, d, channel (id or name) or author pubkey."
    ordering = ("-seq",)
    list_select_related = ("artifact", "community")
    list_per_page = 50
    fields = (
        "community",
        "id",
        "artifact_link",
        "op",
        "channel_detail",
        "prev",
        "root",
        "pubkey",
        "created_at",
        "accepted_at",
        "state",
        "redacted_at",
        "expired_at",
        "event",
    )
    readonly_fields = fields
    actions = ["redact"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.confirm: ConfirmedActions[Revision] = ConfirmedActions(self)
        self.confirm.add(
            Step(
                name="redact",
                title="Redact revisions",
                button="Yes, redact",
                allowed=perm("moderation.redact_revision"),
                preview=self._preview_redact,
                perform=self._perform_redact,
            )
        )

    def get_urls(self) -> list[URLPattern]:
        return self.confirm.urls() + super().get_urls()

    def get_queryset(self, request: HttpRequest) -> QuerySet[Revision]:
        return super().get_queryset(request).annotate(channel_label=channel_name_of("community", "channel"))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Revision], search_term: str
    ) -> tuple[QuerySet[Revision], bool]:
        found, duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if term:
            by_name = Channel.objects.filter(name__icontains=term).values_list("uuid", flat=True)[:100]
            found = found | queryset.filter(Q(channel__in=list(by_name)))
        return found, duplicates

    def has_redact_permission(self, request: HttpRequest) -> bool:
        return perm("moderation.redact_revision")(request)

    @admin.action(description="Redact selected revisions…", permissions=["redact"])
    def redact(self, request: HttpRequest, queryset: QuerySet[Revision]) -> HttpResponse | None:
        return self.confirm.redirect(request, "redact", queryset)

    @staticmethod
    def _by_community(revisions: list[Revision]) -> dict[int, tuple[Community, list[str]]]:
        groups: dict[int, tuple[Community, list[str]]] = {}
        for rev in revisions:
            groups.setdefault(rev.community_id, (rev.community, []))[1].append(rev.id)
        return groups

    def _preview_redact(self, revisions: list[Revision]) -> Preview:
        withheld: list[str] = []
        retiring: list[str] = []
        syncs = 0
        for community, ids in self._by_community(revisions).values():
            plan = services.preview_redact(community, ids)
            withheld += plan.withheld
            retiring += plan.retiring
            syncs += plan.open_syncs
        already = [r.id for r in revisions if r.redacted_at is not None]
        notes = [
            "Redacted revisions stay accepted: a resubmission is a duplicate, and their ids stay valid as prev.",
            "Redaction never changes which revision is current.",
        ]
        if already:
            notes.append(f"{len(already)} selected revision(s) are already redacted and are left as they are.")
        if retiring:
            notes.append(
                "A retired artifact leaves current-state queries and the head view; only an edit naming the "
                "redacted head as prev brings it back."
            )
            notes.append(
                "The open syncs counted are those over the retiring artifacts' channels; the ones whose set "
                "holds a retiring artifact get the resync."
            )
        return Preview(
            summary="Withhold these revisions from every surface (current, head, history, count, REQ, sync, "
            "mentions). The relay keeps a relay-signed removal (kind 9005) in each revision's channel, withheld "
            "from readers: it names the revision.",
            targets=[f"{r.id} ({r.op}, d={r.artifact.d})" for r in revisions],
            withheld=withheld,
            retiring=retiring,
            open_syncs=syncs,
            notes=notes,
            nothing="" if withheld else "Every selected revision is already redacted: nothing to do.",
        )

    def _perform_redact(self, revisions: list[Revision], actor: str, reason: str) -> str:
        withheld = retired = syncs = 0
        for community, ids in self._by_community(revisions).values():
            plan = services.redact(community, ids, actor=actor, reason=reason)
            withheld += len(plan.withheld)
            retired += len(plan.retiring)
            syncs += plan.open_syncs
        return (
            f"Redacted {withheld} revision(s); {retired} artifact(s) retired; {syncs} open sync(s) over their"
            " channels (each one holding a retired artifact gets a resync)."
        )

    @admin.display(description="revision", ordering="id")
    def short_id(self, rev: Revision) -> SafeString:
        return format_html('<code title="{}">{}</code>', rev.id, short(rev.id, 16))

    @admin.display(description="d", ordering="artifact__d")
    def d(self, rev: Revision) -> SafeString:
        d = str(rev.artifact.d)
        return format_html('<code title="{}">{}</code>', d, short(d, 8))

    @admin.display(description="channel")
    def channel_name(self, rev: Revision) -> SafeString:
        return _label(rev, "channel_label", rev.channel)

    @admin.display(description="author")
    def author(self, rev: Revision) -> SafeString:
        return format_html('<code title="{}">{}</code>', rev.pubkey, short(rev.pubkey))

    @admin.display(description="title")
    def title(self, rev: Revision) -> SafeString:
        text = "" if rev.expired_at is not None else _title_of(rev.raw)
        return format_html('<span title="{}">{}</span>', text, short(text, 32))

    @admin.display(description="accepted", ordering="seq")
    def accepted(self, rev: Revision) -> str:
        return f"{rev.accepted_at:%Y-%m-%d %H:%M:%S}"

    @admin.display(description="state")
    def state(self, rev: Revision) -> str:
        return revision_state(rev)

    @admin.display(description="artifact")
    def artifact_link(self, rev: Revision) -> SafeString:
        url = reverse("admin:artifacts_artifact_change", args=[rev.artifact_id])
        return format_html('<a href="{}">{}</a>', url, rev.artifact)

    @admin.display(description="channel (h)")
    def channel_detail(self, rev: Revision) -> str:
        name = getattr(rev, "channel_label", None)
        return f"{name} ({rev.channel})" if name else str(rev.channel)

    @admin.display(description="event")
    def event(self, rev: Revision) -> SafeString:
        return format_html(
            '<pre style="white-space: pre-wrap; overflow-wrap: anywhere; margin: 0">{}</pre>', event_text(rev.raw)
        )


# --- channels: archive, unarchive, delete ---------------------------------------------------------------


class LifecycleFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("open", "open for writes"), ("archived", "archived"), ("deleted", "deleted")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "open":
            return queryset.filter(archived_at__isnull=True, deleted_at__isnull=True)
        if self.value() == "archived":
            return queryset.filter(archived_at__isnull=False, deleted_at__isnull=True)
        if self.value() == "deleted":
            return queryset.filter(deleted_at__isnull=False)
        return queryset


admin.site.unregister(Channel)


@admin.register(Channel)
class ModeratedChannelAdmin(ChannelAdmin):
    """buzz's channel pages, with the lifecycle actions of moderation.services behind confirmation pages."""

    actions = ["archive_channels", "unarchive_channels", "delete_channels"]

    def get_list_display(self, request: HttpRequest) -> tuple[str, ...]:
        # One screen wide: a short id, and the lifecycle in one column.
        return ("name", "uuid_short", "community", "type", "visibility", "listed", "lifecycle")

    def get_list_filter(self, request: HttpRequest) -> tuple[Any, ...]:
        return ("type", "visibility", LifecycleFilter, "community")

    @admin.display(description="id", ordering="uuid")
    def uuid_short(self, channel: Channel) -> SafeString:
        return format_html('<code title="{}">{}</code>', channel.uuid, short(str(channel.uuid), 8))

    @admin.display(description="state")
    def lifecycle(self, channel: Channel) -> str:
        if channel.deleted_at is not None:
            return f"deleted {channel.deleted_at:%Y-%m-%d %H:%M}"
        if channel.archived_at is not None:
            return f"archived {channel.archived_at:%Y-%m-%d %H:%M}"
        return "open for writes"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.confirm: ConfirmedActions[Channel] = ConfirmedActions(self)
        self.confirm.add(
            Step(
                name="archive",
                title="Archive channels",
                button="Yes, archive",
                allowed=perm("moderation.archive_channel"),
                preview=self._preview_archive,
                perform=self._perform_archive,
            )
        )
        self.confirm.add(
            Step(
                name="unarchive",
                title="Unarchive channels",
                button="Yes, unarchive",
                allowed=perm("moderation.archive_channel"),
                preview=self._preview_unarchive,
                perform=self._perform_unarchive,
            )
        )
        self.confirm.add(
            Step(
                name="delete",
                title="Delete channels",
                button="Yes, delete",
                allowed=perm("moderation.delete_channel"),
                preview=self._preview_delete,
                perform=self._perform_delete,
            )
        )

    def get_urls(self) -> list[URLPattern]:
        return self.confirm.urls() + super().get_urls()

    def has_archive_permission(self, request: HttpRequest) -> bool:
        return perm("moderation.archive_channel")(request)

    def has_delete_channel_permission(self, request: HttpRequest) -> bool:
        return perm("moderation.delete_channel")(request)

    @admin.action(description="Archive selected channels…", permissions=["archive"])
    def archive_channels(self, request: HttpRequest, queryset: QuerySet[Channel]) -> HttpResponse | None:
        return self.confirm.redirect(request, "archive", queryset)

    @admin.action(description="Unarchive selected channels…", permissions=["archive"])
    def unarchive_channels(self, request: HttpRequest, queryset: QuerySet[Channel]) -> HttpResponse | None:
        return self.confirm.redirect(request, "unarchive", queryset)

    @admin.action(description="Delete selected channels…", permissions=["delete_channel"])
    def delete_channels(self, request: HttpRequest, queryset: QuerySet[Channel]) -> HttpResponse | None:
        return self.confirm.redirect(request, "delete", queryset)

    @staticmethod
    def _label(channel: Channel) -> str:
        return f"{channel.name} ({channel.uuid}, {channel.community.host})"

    def _preview_archive(self, channels: list[Channel]) -> Preview:
        todo = [c for c in channels if c.archived_at is None and c.deleted_at is None]
        notes = [
            "No revision is withheld and no artifact retires; no open sync gets a resync.",
            "To keep editing their artifacts, unarchive the channel or move the artifacts out first.",
        ]
        if len(todo) < len(channels):
            notes.append(
                f"{len(channels) - len(todo)} selected channel(s) are already archived or deleted: left as is."
            )
        return Preview(
            summary="Writes to these channels are refused with the archive reason. Reads and syncs are "
            "unchanged: readers keep reading.",
            targets=[self._label(c) for c in channels],
            notes=notes,
            nothing="" if todo else "Every selected channel is already archived or deleted: nothing to do.",
        )

    def _perform_archive(self, channels: list[Channel], actor: str, reason: str) -> str:
        done = [
            services.archive_channel(c, actor=actor, reason=reason)
            for c in channels
            if c.archived_at is None and c.deleted_at is None
        ]
        return f"Archived {len(done)} channel(s); writes are refused, reads unchanged."

    def _preview_unarchive(self, channels: list[Channel]) -> Preview:
        todo = [c for c in channels if c.archived_at is not None and c.deleted_at is None]
        return Preview(
            summary="Writes to these channels are allowed again. Reads and syncs are unchanged.",
            targets=[self._label(c) for c in channels],
            notes=["No revision is withheld and no artifact retires; no open sync gets a resync."],
            nothing="" if todo else "None of the selected channels is archived: nothing to do.",
        )

    def _perform_unarchive(self, channels: list[Channel], actor: str, reason: str) -> str:
        done = [
            services.unarchive_channel(c, actor=actor, reason=reason)
            for c in channels
            if c.archived_at is not None and c.deleted_at is None
        ]
        return f"Unarchived {len(done)} channel(s); writes are allowed again."

    def _preview_delete(self, channels: list[Channel]) -> Preview:
        retiring: list[str] = []
        syncs = artifacts = 0
        skipped = 0
        for c in channels:
            plan = services.preview_delete_channel(c)
            if plan.already_deleted:
                skipped += 1
                continue
            retiring += plan.retiring
            syncs += plan.open_syncs
            artifacts += plan.artifacts
        notes = [
            "Writes are refused. Nobody reads these channels any more: their artifacts leave every current-state "
            "result and the head view, the revisions published in them leave history too, and a read naming "
            "them is refused. Revisions that moved to another channel stay readable there.",
            "A later channel with another id inherits nothing. This cannot be undone.",
            f"{artifacts} artifact(s) are homed in these channels.",
        ]
        if skipped:
            notes.append(f"{skipped} selected channel(s) are already deleted: left as they are.")
        return Preview(
            summary="Delete these channels: every open sync that covers them ends with resync.",
            targets=[self._label(c) for c in channels],
            retiring=retiring,
            open_syncs=syncs,
            notes=notes,
            nothing="" if skipped < len(channels) else "Every selected channel is already deleted: nothing to do.",
        )

    def _perform_delete(self, channels: list[Channel], actor: str, reason: str) -> str:
        syncs = deleted = 0
        for c in channels:
            if c.deleted_at is not None:
                continue
            plan = services.delete_channel(c, actor=actor, reason=reason)
            syncs += plan.open_syncs
            deleted += 1
        return f"Deleted {deleted} channel(s); {syncs} open sync(s) resynced."


# --- communities: policy reset ---------------------------------------------------------------------------

admin.site.unregister(Community)


@admin.register(Community)
class ModeratedCommunityAdmin(CommunityAdmin):
    """buzz's community pages, with the access-policy reset behind a confirmation page."""

    actions = ["reset_policies"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.confirm: ConfirmedActions[Community] = ConfirmedActions(self)
        self.confirm.add(
            Step(
                name="reset_policy",
                title="Reset the access policy",
                button="Yes, reset",
                allowed=perm("moderation.reset_policy"),
                preview=self._preview_reset,
                perform=self._perform_reset,
            )
        )

    def get_urls(self) -> list[URLPattern]:
        return self.confirm.urls() + super().get_urls()

    def has_reset_policy_permission(self, request: HttpRequest) -> bool:
        return perm("moderation.reset_policy")(request)

    @admin.action(description="Reset the access policy of selected communities…", permissions=["reset_policy"])
    def reset_policies(self, request: HttpRequest, queryset: QuerySet[Community]) -> HttpResponse | None:
        return self.confirm.redirect(request, "reset_policy", queryset)

    def _preview_reset(self, communities: list[Community]) -> Preview:
        syncs = sum(services.preview_reset_policy(c).open_syncs for c in communities)
        return Preview(
            summary="Advance each community's access-policy stamp: every incremental-read checkpoint its "
            "clients hold is refused (409 incremental_reset, policy_changed), and every open sync in the "
            "community ends with resync, so clients read their sets again.",
            targets=[c.host for c in communities],
            open_syncs=syncs,
            notes=[
                "Recovery history (membership-removal rows, move-source records) may be removed only after this.",
                "No revision is withheld and no artifact retires.",
            ],
        )

    def _perform_reset(self, communities: list[Community], actor: str, reason: str) -> str:
        syncs = sum(services.reset_policy(c, actor=actor, reason=reason).open_syncs for c in communities)
        return f"Reset the access policy of {len(communities)} community(ies); {syncs} open sync(s) resynced."


# --- retention -------------------------------------------------------------------------------------------


class KeepField(forms.Field):
    """A retention duration written as `manage.py retention set --keep` takes it: 90d, 12h, 30m, 0s."""

    def prepare_value(self, value: Any) -> Any:
        return duration_text(value) if isinstance(value, dt.timedelta) else value

    def to_python(self, value: Any) -> Any:
        text = "" if value is None else str(value).strip()
        if not text:
            return None
        try:
            keep = duration_arg(text)
        except CommandError as err:
            raise ValidationError(str(err)) from None
        if keep > services.MAX_KEEP:
            # set_retention refuses it too; the form says so instead of failing the save.
            raise ValidationError(f"the retention period is at most {services.MAX_KEEP.days}d")
        return keep


class RetentionPolicyForm(forms.ModelForm[RetentionPolicy]):
    keep = KeepField(
        widget=forms.TextInput(attrs={"size": 10, "placeholder": "90d"}),
        help_text="How long non-current revisions are kept: a number and s, m, h or d (90d, 12h); 0s keeps "
        "only what must stay. Applied by `manage.py retention run` or the “Expire now” action.",
    )

    class Meta:
        model = RetentionPolicy
        fields = ("community", "keep")


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin[RetentionPolicy]):
    form = RetentionPolicyForm
    list_display = ("community", "keep_text", "updated_at")
    list_select_related = ("community",)
    actions = ["expire_now"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.confirm: ConfirmedActions[RetentionPolicy] = ConfirmedActions(self)
        self.confirm.add(
            Step(
                name="expire",
                title="Expire revisions now",
                button="Yes, expire now",
                allowed=perm("moderation.expire_revisions"),
                preview=self._preview_expire,
                perform=self._perform_expire,
                dry_run=self._dry_run_expire,
                dry_run_button="Dry run (changes nothing)",
            )
        )

    def get_urls(self) -> list[URLPattern]:
        return self.confirm.urls() + super().get_urls()

    def get_readonly_fields(self, request: HttpRequest, obj: RetentionPolicy | None = None) -> tuple[str, ...]:
        return ("community", "updated_at") if obj is not None else ("updated_at",)

    def has_delete_permission(self, request: HttpRequest, obj: RetentionPolicy | None = None) -> bool:
        # Set `keep` instead: every change goes through set_retention, which leaves an audit record.
        return False

    def save_model(self, request: HttpRequest, obj: RetentionPolicy, form: Any, change: bool) -> None:
        services.set_retention(obj.community, obj.keep, actor=actor_of(request))
        saved = RetentionPolicy.objects.filter(community=obj.community).first()
        if saved is not None:
            obj.pk = saved.pk

    @admin.display(description="keep", ordering="keep")
    def keep_text(self, policy: RetentionPolicy) -> str:
        return duration_text(policy.keep)

    def has_expire_permission(self, request: HttpRequest) -> bool:
        return perm("moderation.expire_revisions")(request)

    @admin.action(description="Expire now (with a dry-run preview)…", permissions=["expire"])
    def expire_now(self, request: HttpRequest, queryset: QuerySet[RetentionPolicy]) -> HttpResponse | None:
        return self.confirm.redirect(request, "expire", queryset)

    def _preview_expire(self, policies: list[RetentionPolicy]) -> Preview:
        count = kept = 0
        sample: list[str] = []
        for p in policies:
            plan = services.preview_expire(p.community)
            count += plan.expired
            kept += plan.kept
            sample += plan.sample
        return Preview(
            summary=f"Expire {count} non-current revision(s) older than each community's policy: their content "
            "is tombstoned, the rows stay.",
            targets=[f"{p.community.host}: keep {duration_text(p.keep)}" for p in policies],
            withheld=sample,
            withheld_label="Revisions that expire",
            withheld_total=count,
            notes=[
                f"{kept} old revision(s) are kept: current heads and what prev checks and incremental reads need.",
                "An expired id named as prev is an ordinary conflict; resubmitting it is still a duplicate.",
                "No artifact retires and no open sync gets a resync.",
            ],
            nothing="" if count else "No revision is old enough to expire: nothing to do.",
        )

    def _expire(self, policies: list[RetentionPolicy], actor: str, reason: str, *, dry_run: bool) -> str:
        expired = batches = 0
        for p in policies:
            plan = services.expire(p.community, actor=actor, reason=reason, dry_run=dry_run)
            expired += plan.expired
            batches += plan.batches
        if dry_run:
            return f"Dry run: {expired} revision(s) would expire. Nothing was changed."
        return f"Expired {expired} revision(s) in {batches} batch(es)."

    def _dry_run_expire(self, policies: list[RetentionPolicy], actor: str, reason: str) -> str:
        return self._expire(policies, actor, reason, dry_run=True)

    def _perform_expire(self, policies: list[RetentionPolicy], actor: str, reason: str) -> str:
        return self._expire(policies, actor, reason, dry_run=False)


# --- the audit log ---------------------------------------------------------------------------------------


@admin.register(AuditRecord)
class AuditRecordAdmin(ReadOnly, admin.ModelAdmin[AuditRecord]):
    list_display = ("created_at", "who", "action", "target_short", "reason_short", "community_host")
    list_filter = ("action", "community")
    search_fields = ("who", "target", "reason")
    date_hierarchy = "created_at"
    list_select_related = ("community",)
    fields = ("created_at", "who", "action", "community", "target", "reason", "details")
    readonly_fields = fields
    actions = None

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {**(extra_context or {}), "title": "Audit log"})

    @admin.display(description="target")
    def target_short(self, record: AuditRecord) -> SafeString:
        return format_html('<span title="{}">{}</span>', record.target, short(record.target, 24))

    @admin.display(description="reason")
    def reason_short(self, record: AuditRecord) -> SafeString:
        return format_html('<span title="{}">{}</span>', record.reason, short(record.reason, 60))

    @admin.display(description="community", ordering="community__host")
    def community_host(self, record: AuditRecord) -> str:
        return record.community.host if record.community is not None else "—"

    @admin.display(description="detail")
    def details(self, record: AuditRecord) -> SafeString:
        if not record.detail:
            return format_html("<em>none</em>")
        if isinstance(record.detail, dict):
            return format_html(
                "<dl>{}</dl>",
                format_html_join(
                    "",
                    "<dt>{}</dt><dd><code>{}</code></dd>",
                    ((k, json.dumps(v, ensure_ascii=False)) for k, v in record.detail.items()),
                ),
            )
        return format_html("<code>{}</code>", json.dumps(record.detail, ensure_ascii=False))
