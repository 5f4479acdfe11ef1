from django.db import migrations

# Each community's stamp keeps its value: incremental-read tokens minted before the move stay good.
_COPY = """INSERT INTO buzz_policystamp (community_id, stamp, changed_at)
SELECT community_id, stamp, changed_at FROM artifacts_policystamp"""
_COPY_BACK = """INSERT INTO artifacts_policystamp (community_id, stamp, changed_at)
SELECT community_id, stamp, changed_at FROM buzz_policystamp"""


class Migration(migrations.Migration):
    """The community policy stamp is buzz.PolicyStamp now (buzz 0011): its rows are copied there, then this
    app's table is dropped."""

    dependencies = [
        ("artifacts", "0009_artifact_home_changes"),
        ("buzz", "0011_policy_stamp"),
    ]

    operations = [
        # Reversed (last operation first), the table is created again, then the rows are copied back.
        migrations.RunSQL(_COPY, reverse_sql=_COPY_BACK),
        migrations.DeleteModel(name="PolicyStamp"),
    ]
