"""The outbox's Django models.

* :class:`Message`: unmanaged and table-less; it puts "Outbox" in the admin index and
  carries the console's permissions. Messages live in Redis (see :mod:`outbox.store`).
* :class:`CapturedMessage`: messages sent inside a database transaction, written in the
  same transaction so they are as durable as the caller's own rows; a row lives only
  until Redis has the message (see :mod:`outbox.sending.capture`).
* :class:`OrderingSequence`: per (destination, ordering key), the sequence that orders
  the key's captured messages by commit order (see :mod:`outbox.sending.sequences`).

:class:`Message`'s migration exists so that Django creates its content type and
permissions. Its name is kept (renaming it would change the admin's URLs and these
permission codenames), so two classes are named ``Message``: the message record,
:class:`outbox.records.Message`, imported by name everywhere, and this model, always
written ``models.Message`` or imported under another name (``MessageModel``); a test in
tests/structure holds it so:

==========================  =====================================================
permission                  lets a staff user
==========================  =====================================================
``outbox.view_message``     open the dashboard, the message list and details
``outbox.requeue_message``  requeue failed, cancelled or succeeded messages
``outbox.cancel_message``   cancel pending or retrying messages
``outbox.delete_message``   delete messages and their attempt history
``outbox.manage_destination``  pause, resume, disable and enable destinations
==========================  =====================================================
"""

from __future__ import annotations

from django.db import models


class Message(models.Model):
    """Admin anchor for outbox messages (no table; never query it)."""

    class Meta:
        managed = False
        default_permissions = ("view",)
        permissions = (
            ("requeue_message", "Can requeue messages"),
            ("cancel_message", "Can cancel messages"),
            ("delete_message", "Can delete messages"),
            ("manage_destination", "Can pause, resume, disable and enable destinations"),
        )
        verbose_name = "message"
        verbose_name_plural = "messages"


class CapturedMessage(models.Model):
    """A message sent inside a transaction that Redis may not have yet.

    Written with the caller's rows, in the caller's transaction; deleted once the
    message is in Redis (by the on-commit fast path or the relay). Never edit by hand.

    Fields:
        id: the message id.
        destination, idempotency_key, fingerprint: for idempotency inside transactions
            (the unique constraint makes a concurrent transaction with the same key wait
            for the first and then find its message).
        body: the message body (bytes).
        record: the rest of the message as JSON (see :meth:`outbox.records.Message.capture_json`).
        created_at: epoch seconds.
        ordering_key, order_seq: for an ordered message, its key and its place among the
            key's captured messages (1, 2, ... from :class:`OrderingSequence`: commit
            order); None otherwise. A push writes the key's rows to Redis in this order.
        deployment: the identity of the deployment (its Redis and key prefix) that
            captured the row (:mod:`outbox.sending.deployment`); a relay pushes only rows
            of its own, and ``""`` (rows written before the column existed: any relay
            pushes them). Idempotency keys are unique per deployment.
    """

    id = models.CharField(primary_key=True, max_length=64)
    destination = models.CharField(max_length=200)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    fingerprint = models.CharField(max_length=64, default="")
    body = models.BinaryField()
    record = models.TextField()
    created_at = models.FloatField(db_index=True)
    ordering_key = models.CharField(max_length=200, null=True, blank=True)
    order_seq = models.BigIntegerField(null=True, blank=True)
    deployment = models.CharField(max_length=64, default="", db_default="", blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "destination", "idempotency_key"],
                name="outbox_captured_deployment_key",
            ),
        ]
        indexes = [
            models.Index(
                fields=["destination", "ordering_key", "order_seq"], name="outbox_captured_key_order"
            ),
            # the relay's query: its deployment's rows (and legacy ones) older than a cutoff
            models.Index(fields=["deployment", "created_at"], name="outbox_captured_relay"),
        ]
        verbose_name = "captured message"
        default_permissions = ()

    def __str__(self) -> str:
        return self.id


class OrderingSequence(models.Model):
    """The last sequence number given to a captured message of one (destination,
    ordering key) in this database.

    :func:`outbox.sending.sequences.take` increments ``last`` inside the sending
    transaction; the row stays locked until that transaction ends, so a concurrent
    transaction sending to the same key waits for it, and the numbers follow commit
    order with no gap (a rollback undoes its increment). A row whose key has no captured
    message left is deleted by the relay (:func:`outbox.sending.sequences.prune`); the
    key's next transaction starts again at 1. Never edit by hand.
    """

    id = models.BigAutoField(primary_key=True)  # keys come and go (pruned, created again)
    destination = models.CharField(max_length=200)
    ordering_key = models.CharField(max_length=200)
    last = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["destination", "ordering_key"], name="outbox_sequence_unique_key"
            ),
        ]
        verbose_name = "ordering sequence"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.destination}:{self.ordering_key}={self.last}"
