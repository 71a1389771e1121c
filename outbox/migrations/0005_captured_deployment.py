"""Captured rows carry the identity of their deployment (see outbox.sending.deployment):
a relay pushes only its own deployment's rows and legacy ones (``""``, every row written
before this migration). Idempotency keys are unique per deployment.

The column has a database default (``""``): a process of the previous version, still
running while this one is rolled out, writes legacy rows, which every relay pushes.

Reversible: going back drops the column and restores the unique constraint on
(destination, idempotency_key); that fails while two deployments hold captured rows with
one key (let their relays push them first).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0004_ordered_capture"),
    ]

    operations = [
        migrations.AddField(
            model_name="capturedmessage",
            name="deployment",
            field=models.CharField(blank=True, db_default="", default="", max_length=64),
        ),
        migrations.RemoveConstraint(
            model_name="capturedmessage",
            name="outbox_captured_unique_key",
        ),
        migrations.AddConstraint(
            model_name="capturedmessage",
            constraint=models.UniqueConstraint(
                fields=("deployment", "destination", "idempotency_key"),
                name="outbox_captured_deployment_key",
            ),
        ),
        migrations.AddIndex(
            model_name="capturedmessage",
            index=models.Index(fields=["deployment", "created_at"], name="outbox_captured_relay"),
        ),
    ]
