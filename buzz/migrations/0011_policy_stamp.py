import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """The community policy stamp moves into buzz (its values are copied by artifacts' 0010, which drops
    artifacts_policystamp): buzz's own access decisions read it now, and buzz reads no app's table."""

    dependencies = [
        ("buzz", "0010_channel_access_epoch"),
    ]

    operations = [
        migrations.CreateModel(
            name="PolicyStamp",
            fields=[
                (
                    "community",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        serialize=False,
                        to="buzz.community",
                    ),
                ),
                ("stamp", models.BigIntegerField(default=0)),
                ("changed_at", models.DateTimeField(auto_now=True)),
            ],
        ),
    ]
