"""The outbox's Django models.

* :class:`Message`: unmanaged and table-less; it puts "Outbox" in the admin index and
  carries the console's permissions. Messages live in Redis (see :mod:`outbox.store`).
* :class:`CapturedMessage`: messages sent inside a database transaction, written in the
  same transaction so they are as durable as the caller's own rows; a row lives only
  until Redis has the message (see :mod:`outbox.sending.capture`).
* :class:`OrderingSequence`: per (destination, ordering key), the sequence that orders
  the key's captured messages by commit order (see :mod:`outbox.sending.sequences`).
* :class:`Application`, :class:`Endpoint`, :class:`EventType`: webhooks for a project's
  customers (``docs/webhooks.md``): an application is one consumer of webhooks (usually
  one of the project's customers), an endpoint one of its receivers (a destination
  registered at runtime), an event type one name in the catalogue events are published
  under. Change them through :mod:`outbox.webhooks` (it validates, encrypts secrets and
  tells the workers), the admin, or the ORM inside a transaction followed by
  :func:`outbox.webhooks.changed`.

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

import uuid

from django.db import models

from outbox.endpoint_names import endpoint_destination


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


class Application(models.Model):
    """One consumer of webhooks: usually one of the project's customers (Svix's
    "application", Outpost's "tenant").

    Fields:
        uid: the project's own identifier of it (its customer id): 1 to 200 printable
            characters, unique; what :func:`outbox.publish` takes as ``application``.
        name: a human name.
        metadata: free JSON for the project (never sent).
        max_endpoints: most endpoints it may register (None: no cap).
    """

    uid = models.CharField(max_length=200, unique=True)
    name = models.CharField(max_length=200, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    max_endpoints = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "application"
        ordering = ("uid",)

    def __str__(self) -> str:
        return self.name or self.uid


class EventType(models.Model):
    """A name events are published under (``order.paid``): the catalogue endpoints
    subscribe from.

    A type's payload changes compatibly (fields added) under its name; an incompatible
    change is a new name (``order.paid.v2``), published beside the old one until every
    endpoint moved, then the old one archived. Archived types are refused by
    :func:`outbox.publish` and by new subscriptions (``OUTBOX["ENDPOINTS"]
    ["ALLOW_UNKNOWN_EVENT_TYPES"]`` lifts both).

    Fields:
        name: 1 to 200 characters of letters, digits and ``._-:``, unique.
        description: for the people who subscribe.
        schema: an optional JSON Schema of the payload (documentation; not enforced).
        example: an optional example payload (what "send a test event" sends).
        archived: no longer published or subscribable.
    """

    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True, default="")
    schema = models.JSONField(null=True, blank=True)
    example = models.JSONField(null=True, blank=True)
    archived = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "event type"
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name


class Endpoint(models.Model):
    """One receiver of an application's webhooks: a destination registered at runtime
    (Svix's ``EndpointIn``/``EndpointOut``).

    Its destination name is ``endpoint:<id hex>`` (:attr:`destination`): every message
    of it, and its state in Redis (breaker, pause, limits, health), go by that name.

    Fields:
        id: a random UUID (never reused, so a deleted endpoint's state can never be
            mistaken for a new one's).
        application: whose endpoint it is.
        uid: an optional identifier of the application's own, unique within it.
        url: where deliveries are POSTed (checked when registered: scheme, length, no
            credentials, and a public address unless private networks are allowed).
        description: for people.
        filter_types: the event type names it subscribes to; empty: every type.
        channels: its channels; empty: it gets events whatever their channels, else only
            events carrying at least one of them (as Svix's channels).
        disabled, disabled_reason: a disabled endpoint gets no new deliveries and its
            pending ones wait (parked) until it is enabled.
        rate_limit: ``"100/s"``-style limit across all workers, or "" for none.
        max_concurrency: most attempts in flight across all workers, or None.
        headers: fixed extra headers of every request.
        metadata: free JSON for the project (never sent).
        secrets: the signing secrets, encrypted (:mod:`outbox.destinations.secrets`):
            never read this directly; never shown.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    application = models.ForeignKey(Application, on_delete=models.CASCADE, related_name="endpoints")
    uid = models.CharField(max_length=200, null=True, blank=True)
    url = models.CharField(max_length=2048)
    description = models.TextField(blank=True, default="")
    filter_types = models.JSONField(default=list, blank=True)
    channels = models.JSONField(default=list, blank=True)
    disabled = models.BooleanField(default=False, db_index=True)
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    rate_limit = models.CharField(max_length=40, blank=True, default="")
    max_concurrency = models.PositiveIntegerField(null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    secrets = models.TextField(editable=False, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "endpoint"
        ordering = ("application", "created_at")
        constraints = [
            models.UniqueConstraint(fields=["application", "uid"], name="outbox_endpoint_app_uid"),
        ]
        permissions = (("view_endpoint_secret", "Can see an endpoint's signing secret"),)

    def __str__(self) -> str:
        return self.uid or str(self.id)

    def __repr__(self) -> str:  # never the secrets
        return f"<Endpoint {self.id} {self.url!r}>"

    @property
    def destination(self) -> str:
        """The endpoint's destination name, ``endpoint:<id hex>``: its messages and its
        state in Redis go by it."""
        return endpoint_destination(self.id)
