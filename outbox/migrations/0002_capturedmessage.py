"""The table of messages captured inside database transactions (see outbox.sending.capture)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("outbox", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="CapturedMessage",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("destination", models.CharField(max_length=200)),
                ("idempotency_key", models.CharField(blank=True, max_length=255, null=True)),
                ("fingerprint", models.CharField(default="", max_length=64)),
                ("body", models.BinaryField()),
                ("record", models.TextField()),
                ("created_at", models.FloatField(db_index=True)),
            ],
            options={"verbose_name": "captured message", "default_permissions": ()},
        ),
        migrations.AddConstraint(
            model_name="capturedmessage",
            constraint=models.UniqueConstraint(
                fields=("destination", "idempotency_key"), name="outbox_captured_unique_key"
            ),
        ),
    ]
