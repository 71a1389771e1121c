"""The ``outbox.manage_destination`` permission (pause, resume, disable and enable a
destination from the console)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("outbox", "0002_capturedmessage")]

    operations = [
        migrations.AlterModelOptions(
            name="message",
            options={
                "default_permissions": ("view",),
                "managed": False,
                "permissions": (
                    ("requeue_message", "Can requeue messages"),
                    ("cancel_message", "Can cancel messages"),
                    ("delete_message", "Can delete messages"),
                    ("manage_destination", "Can pause, resume, disable and enable destinations"),
                ),
                "verbose_name": "message",
                "verbose_name_plural": "messages",
            },
        ),
    ]
