"""The unmanaged Message model: no table, only its content type and permissions."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Message",
            fields=[
                (
                    "id",
                    models.AutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID"),
                ),
            ],
            options={
                "verbose_name": "message",
                "verbose_name_plural": "messages",
                "permissions": (
                    ("requeue_message", "Can requeue messages"),
                    ("cancel_message", "Can cancel messages"),
                    ("delete_message", "Can delete messages"),
                ),
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
