"""Ordered messages inside transactions (see outbox.sending.sequences): the per-key sequence
table, and each captured row's ordering key and place in its key."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0003_manage_destination"),
    ]

    operations = [
        migrations.CreateModel(
            name="OrderingSequence",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("destination", models.CharField(max_length=200)),
                ("ordering_key", models.CharField(max_length=200)),
                ("last", models.BigIntegerField(default=0)),
            ],
            options={
                "verbose_name": "ordering sequence",
                "default_permissions": (),
            },
        ),
        migrations.AddField(
            model_name="capturedmessage",
            name="order_seq",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="capturedmessage",
            name="ordering_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddIndex(
            model_name="capturedmessage",
            index=models.Index(
                fields=["destination", "ordering_key", "order_seq"], name="outbox_captured_key_order"
            ),
        ),
        migrations.AddConstraint(
            model_name="orderingsequence",
            constraint=models.UniqueConstraint(
                fields=("destination", "ordering_key"), name="outbox_sequence_unique_key"
            ),
        ),
    ]
