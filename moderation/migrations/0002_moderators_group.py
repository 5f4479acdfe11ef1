"""The "Moderators" group: exactly the rights a channel moderator needs in the admin.

View channels, artifacts, revisions and the audit log; redact revisions; archive and unarchive channels.
Nothing else: no tokens, communities, relay members, retention policy or channel deletion.

Permissions are made by a post_migrate signal, after every migration has run, so on a fresh database
they don't exist yet here: the migration creates them first (django.contrib.auth.management's
create_permissions, as Django's docs describe for data migrations).
"""

from __future__ import annotations

from django.apps.registry import Apps
from django.contrib.auth.management import create_permissions
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

GROUP = "Moderators"
# (app label, codename): the whole grant, and nothing more.
PERMISSIONS = (
    ("buzz", "view_channel"),
    ("artifacts", "view_artifact"),
    ("artifacts", "view_revision"),
    ("moderation", "view_auditrecord"),
    ("moderation", "redact_revision"),
    ("moderation", "archive_channel"),
)


def create_group(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    for label in sorted({label for label, _ in PERMISSIONS}):
        app_config = apps.get_app_config(label)
        # create_permissions skips an app whose models module is unset, as it is in migration state.
        app_config.models_module = True  # type: ignore[assignment]
        create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.using(schema_editor.connection.alias).get_or_create(name=GROUP)
    grants = []
    for label, codename in PERMISSIONS:
        grants.append(
            Permission.objects.using(schema_editor.connection.alias).get(
                content_type__app_label=label, codename=codename
            )
        )
    group.permissions.set(grants)


def remove_group(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    apps.get_model("auth", "Group").objects.using(schema_editor.connection.alias).filter(name=GROUP).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("moderation", "0001_initial"),
        ("buzz", "0003_community_event_keys"),
        ("artifacts", "0004_community_revision_keys"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_group, remove_group)]
