"""A community's public URL is validated as a ws:// or wss:// URL with a host (buzz.models.validate_public_url),
in the admin's form as in `community create`. Validators change no column."""

from django.db import migrations, models

import buzz.models


class Migration(migrations.Migration):
    dependencies = [
        ("buzz", "0014_channel_ttl_zero_is_permanent"),
    ]

    operations = [
        migrations.AlterField(
            model_name="community",
            name="public_url",
            field=models.CharField(
                help_text="The ws:// or wss:// URL clients use; NIP-42 AUTH must name it",
                max_length=300,
                validators=[buzz.models.validate_public_url],
            ),
        ),
    ]
