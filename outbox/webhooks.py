"""Webhooks for a project's customers: applications, endpoints, event types, and
:func:`publish` (``docs/webhooks.md``).

An *application* is one consumer of webhooks (usually one of the project's customers,
named by the project's own ``uid``); it registers *endpoints* (a URL, secrets, the
*event types* it subscribes to, *channels*); :func:`publish` fans one event out to
every enabled endpoint of the application that subscribed to its type and channels:
one *delivery* per endpoint, an ordinary outbox message from then on (retries,
backoff, dead letters, requeue, breaker, pause, limits, health, ordering, the console).
The names follow Svix's API models (``ApplicationIn``, ``EndpointIn`` with
``filterTypes``, ``channels``, ``rateLimit``, ``uid``, ``metadata``; ``MessageIn`` with
``eventType``).

Every function here writes inside the caller's transaction when there is one (on the
database ``using``), and tells the workers and Redis of the change when it commits
(nothing on a rollback). Changing the models through the ORM directly is fine inside a
transaction followed by :func:`changed`; the workers otherwise learn of it within
``OUTBOX["ENDPOINTS"]["CACHE_TTL"]`` seconds.

Quick use::

    import outbox
    from outbox import webhooks

    webhooks.create_event_type("order.paid", description="An order was paid")
    app = webhooks.create_application("customer-42", name="ACME")
    created = webhooks.create_endpoint(app, "https://acme.example/hooks", filter_types=["order.paid"])
    created.secret                        # "whsec_...": show it to the customer once
    event = outbox.publish("order.paid", {"order": 7}, application="customer-42")
    event.id, [d.message.id for d in event.deliveries]
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, transaction
from redis.exceptions import RedisClusterException, RedisError

from outbox import api
from outbox.conf import endpoint_setting, outbox_settings
from outbox.destinations import controls
from outbox.destinations import endpoints as registry
from outbox.destinations import secrets as secret_store
from outbox.destinations.config import endpoint_cache, endpoint_template
from outbox.endpoint_names import endpoint_id
from outbox.exceptions import (
    IdempotencyConflict,
    InvalidEndpoint,
    InvalidMessage,
    MessageTooLarge,
    OutboxUnavailable,
)
from outbox.models import Application, CapturedMessage, Endpoint, EventType, OrderingSequence
from outbox.operations.operation import DELETE, Selection, execute
from outbox.records import Message, new_message_id
from outbox.sending.validation import (
    SendArguments,
    build_message,
    clean_idempotency_key,
    clean_ordering_key,
    encode_body,
    message_partition,
)
from outbox.store import endpoint_versions, get_repository
from outbox.store.keys import random_partition
from outbox.store.reads.queries import MessageFilter
from outbox.transports.endpoint import EVENT_ID_HEADER, EVENT_TYPE_HEADER

logger = logging.getLogger("outbox")

#: The event type of :func:`send_test_event` when the catalogue has no example to send.
TEST_EVENT_TYPE = "outbox.test"


@dataclass(frozen=True)
class Delivery:
    """One delivery of a published event: the message to one endpoint.

    Attributes:
        endpoint_id: the endpoint's id (a UUID).
        destination: its destination name (``endpoint:<id hex>``).
        message: the delivery's :class:`~outbox.records.Message` as stored (its ``id`` is
            the delivery id; with an idempotency key used before, the earlier one).
    """

    endpoint_id: uuid.UUID
    destination: str
    message: Message

    @property
    def id(self) -> str:
        """The delivery's message id."""
        return self.message.id


@dataclass(frozen=True)
class PublishedEvent:
    """What :func:`publish` returns.

    Attributes:
        id: the event id, ``evt_`` + 26 base32 characters: the ``webhook-id`` every
            endpoint's receiver sees for this event (the same for every endpoint and
            every retry). With an idempotency key it is derived from (application, key),
            so publishing again gives the same id.
        event_type: its type.
        application: its application's uid.
        deliveries: one per endpoint it went to, in the endpoints' creation order
            (empty: no endpoint subscribed; nothing was stored).
    """

    id: str
    event_type: str
    application: str
    deliveries: tuple[Delivery, ...]


@dataclass(frozen=True)
class CreatedEndpoint:
    """What :func:`create_endpoint` returns: the endpoint and its secret, shown once
    (afterwards only :func:`endpoint_secret` reads it, for a user with the permission
    ``outbox.view_endpoint_secret``)."""

    endpoint: Endpoint
    secret: str

    def __repr__(self) -> str:  # never the secret
        return f"CreatedEndpoint(endpoint={self.endpoint!r}, secret='whsec_***')"


# -- applications ------------------------------------------------------------------------


def create_application(
    uid: str,
    *,
    name: str = "",
    metadata: dict[str, Any] | None = None,
    max_endpoints: int | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Application:
    """Register an application (Svix ``ApplicationIn``).

    Args:
        uid: the project's own id of it (its customer id), 1 to 200 printable characters,
            unique: what :func:`publish` takes as ``application``.
        name: a human name. metadata: free JSON (a dict), never sent.
        max_endpoints: most endpoints it may register (None: no cap).

    Raises:
        InvalidEndpoint: a bad field, or the uid is taken.
    """
    return registry.save_application(
        None, uid=uid, name=name, metadata=metadata, max_endpoints=max_endpoints, using=using
    )


def update_application(
    application: Application | str, *, using: str = DEFAULT_DB_ALIAS, **changes: Any
) -> Application:
    """Change an application's ``uid``, ``name``, ``metadata`` or ``max_endpoints``.

    Raises:
        UnknownApplication: no such application. InvalidEndpoint: a bad field.
    """
    app = registry.get_application(application, using)
    unknown = set(changes) - {"uid", "name", "metadata", "max_endpoints"}
    if unknown:
        raise InvalidEndpoint(
            f"unknown application field(s) {', '.join(sorted(unknown))}", field=sorted(unknown)[0]
        )
    return registry.save_application(app, using=using, **changes)


def delete_application(application: Application | str, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Delete an application and everything of it (the erasure path, ``docs/webhooks.md``):
    in one transaction its endpoints, their deliveries captured in transactions and not
    yet relayed, their ordering sequences, and the application's row; on commit, per
    endpoint (:func:`delete_endpoint`), its deliveries in Redis (deleted, not failed:
    pending, retrying, parked, dead letters and delivered ones, with their attempt
    records, which hold the receivers' answers) and its state. Redis unreachable then:
    logged, and :func:`sweep_deleted_endpoints` finishes it later.

    Raises:
        UnknownApplication: no such application.
    """
    app = registry.get_application(application, using)
    with transaction.atomic(using=using):
        for endpoint in list(app.endpoints.using(using).all()):
            delete_endpoint(endpoint, using=using)
        app.delete(using=using)


# -- event types -------------------------------------------------------------------------


def create_event_type(
    name: str,
    *,
    description: str = "",
    schema: dict[str, Any] | None = None,
    example: Any = None,
    using: str = DEFAULT_DB_ALIAS,
) -> EventType:
    """Add ``name`` (``order.paid``: letters, digits, ``._-:``) to the catalogue.

    Args:
        description: for the people who subscribe.
        schema: a JSON Schema of the payload (documentation; not enforced).
        example: an example payload (what :func:`send_test_event` sends).

    Raises:
        InvalidEndpoint: a bad name or field, or the name exists.
    """
    return registry.save_event_type(
        name, description=description, schema=schema, example=example, create=True, using=using
    )


def update_event_type(name: str, /, *, using: str = DEFAULT_DB_ALIAS, **changes: Any) -> EventType:
    """Change an event type's ``description``, ``schema``, ``example`` or ``archived``
    (an archived type is refused by :func:`publish` and by new subscriptions; endpoints
    subscribed to it keep their subscription).

    Raises:
        UnknownEventType: no such type. InvalidEndpoint: a bad field.
    """
    if "name" in changes:
        raise InvalidEndpoint(
            "an event type's name does not change (endpoints subscribe by it): create the new name, "
            "archive the old one",
            field="name",
        )
    unknown = set(changes) - {"description", "schema", "example", "archived"}
    if unknown:
        raise InvalidEndpoint(
            f"unknown event type field(s) {', '.join(sorted(unknown))}", field=sorted(unknown)[0]
        )
    return registry.save_event_type(name, create=False, using=using, **changes)


# -- endpoints ---------------------------------------------------------------------------


def create_endpoint(
    application: Application | str,
    url: str,
    *,
    secret: str | None = None,
    uid: str | None = None,
    description: str = "",
    filter_types: Sequence[str] | None = None,
    channels: Sequence[str] | None = None,
    rate_limit: str = "",
    max_concurrency: int | None = None,
    headers: Mapping[str, str] | None = None,
    metadata: dict[str, Any] | None = None,
    disabled: bool = False,
    using: str = DEFAULT_DB_ALIAS,
) -> CreatedEndpoint:
    """Register an endpoint of ``application`` (Svix ``EndpointIn``).

    Args:
        url: ``https://`` (or ``http://``) URL; checked now (:func:`outbox.destinations.
            endpoints.clean_url`: no credentials, at most 2,048 characters, a public
            address unless ``OUTBOX["ENDPOINTS"]["ALLOW_PRIVATE_NETWORKS"]``).
        secret: ``whsec_`` + base64 of 24 to 64 bytes; None: one is generated (32 bytes).
        uid: the application's own id of it, unique within the application.
        filter_types: event types it subscribes to (in the catalogue, not archived);
            None or empty: every type.
        channels: up to 10; empty: events whatever their channels, else only events
            carrying one of them.
        rate_limit: ``"100/s"``, ``"6000/m"``... across all workers ("" none).
        max_concurrency: attempts in flight across all workers at most (None: no cap).
        headers: fixed extra headers of every request (ASCII; not ``Content-Type``,
            ``webhook-*``, ``Outbox-Event-*``).
        metadata: free JSON (a dict), never sent.
        disabled: registered disabled.

    Returns:
        :class:`CreatedEndpoint`: the endpoint and its secret (show it once).

    Raises:
        UnknownApplication, InvalidEndpoint, UnknownEventType: bad input; nothing saved.
        SecretUnreadable: ``OUTBOX["ENDPOINTS"]["SECRET_KEYS"]`` has no usable key.
    """
    app = registry.get_application(application, using)
    try:
        chosen = secret_store.generate_secret() if secret is None else secret_store.check_secret(secret)
    except ValueError as exc:
        raise InvalidEndpoint(str(exc), field="secret") from None
    endpoint = Endpoint(application=app)
    changes = {
        "url": url,
        "uid": uid,
        "description": description,
        "filter_types": filter_types,
        "channels": channels,
        "rate_limit": rate_limit,
        "max_concurrency": max_concurrency,
        "headers": headers,
        "metadata": metadata,
    }
    if registry.clean_flag(disabled, "disabled"):
        changes["disabled"] = True
    with transaction.atomic(using=using):
        registry.save_endpoint(endpoint, changes, secrets=secret_store.SecretSet(chosen), using=using)
        if disabled:
            _mirror_admin(endpoint, using)
    return CreatedEndpoint(endpoint, chosen)


def get_endpoint(endpoint: Endpoint | str | uuid.UUID, *, using: str = DEFAULT_DB_ALIAS) -> Endpoint:
    """The endpoint with this id (a UUID, its text, or its destination name ``endpoint:<hex>``).

    Raises:
        InvalidEndpoint: no such endpoint.
    """
    return registry.get_endpoint(endpoint, using)


def update_endpoint(
    endpoint: Endpoint | str | uuid.UUID, *, using: str = DEFAULT_DB_ALIAS, **changes: Any
) -> Endpoint:
    """Change an endpoint: any keyword of :func:`create_endpoint` but ``secret``
    (:func:`rotate_secret`) and ``disabled`` (:func:`disable_endpoint`,
    :func:`enable_endpoint`). Workers use the new configuration within the bound of
    ``docs/webhooks.md`` (``VERSION_CHECK``, at most ``CACHE_TTL`` seconds); attempts in
    flight finish with the old one. New subscriptions apply to events published later.

    Raises:
        InvalidEndpoint, UnknownEventType: bad input; nothing saved.
    """
    row = registry.get_endpoint(endpoint, using)
    for name, instead in (
        ("secret", "rotate_secret()"),
        ("disabled", "disable_endpoint()/enable_endpoint()"),
        ("disabled_reason", "disable_endpoint(reason=...)"),
    ):
        if name in changes:
            raise InvalidEndpoint(f"{name} is changed by {instead}, not update_endpoint()", field=name)
    return registry.save_endpoint(row, changes, using=using)


def disable_endpoint(
    endpoint: Endpoint | str | uuid.UUID, *, reason: str = "manual", using: str = DEFAULT_DB_ALIAS
) -> Endpoint:
    """Disable an endpoint: :func:`publish` leaves it out from now on (in this
    transaction too); on commit its state in Redis is disabled, so its pending and
    retrying deliveries wait (parked) and none starts; attempts in flight finish (a
    retryable failure among them parks with no retry charged). Workers that do not hear
    of it (the commit's process died) see it within ``CACHE_TTL`` and disable it then.

    Raises:
        InvalidEndpoint: no such endpoint.
    """
    registry.clean_text(reason, "reason", 200)
    row = registry.get_endpoint(endpoint, using)
    with transaction.atomic(using=using):
        registry.save_endpoint(row, {"disabled": True, "disabled_reason": reason}, using=using)
        _mirror_admin(row, using)
    return row


def enable_endpoint(endpoint: Endpoint | str | uuid.UUID, *, using: str = DEFAULT_DB_ALIAS) -> Endpoint:
    """Enable an endpoint (also after a pause for a secret that could not be decrypted,
    once the key is fixed): on commit its parked deliveries are put back, oldest due
    first, and it gets new events again.

    Raises:
        InvalidEndpoint: no such endpoint.
    """
    row = registry.get_endpoint(endpoint, using)
    with transaction.atomic(using=using):
        registry.save_endpoint(row, {"disabled": False}, using=using)
        _mirror_admin(row, using)
    return row


def _mirror_admin(endpoint: Endpoint, using: str) -> None:
    """On commit: the endpoint's admin state in Redis as its row says (disabled, or
    active: enabled, resumed after an unreadable secret), parked deliveries put back."""
    name, disabled, reason = endpoint.destination, endpoint.disabled, endpoint.disabled_reason

    def apply() -> None:
        try:
            if disabled:
                controls.disable(name, reason=reason or "manual")
            else:
                controls.resume(name)
                controls.enable(name)
        except (RedisError, RedisClusterException) as exc:
            logger.warning(
                "outbox: endpoint %s: its state in Redis could not be changed (%s); workers apply it "
                "within OUTBOX['ENDPOINTS']['CACHE_TTL'] seconds",
                name,
                exc,
            )

    transaction.on_commit(apply, using=using)


def rotate_secret(
    endpoint: Endpoint | str | uuid.UUID,
    secret: str | None = None,
    *,
    overlap: float | timedelta | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> str:
    """Give an endpoint a new secret; the current one keeps signing beside it for
    ``overlap`` (default ``OUTBOX["ENDPOINTS"]["SECRET_OVERLAP"]``, 24 hours; 0: at once
    replaced): every request then carries two signatures (``v1,<a> v1,<b>``), so the
    receiver verifies with either while it switches. Workers sign with the new set
    within the bound of ``docs/webhooks.md``.

    Returns:
        The new secret (show it once).

    Raises:
        InvalidEndpoint: no such endpoint, or ``secret`` is not a Standard Webhooks secret.
        SecretUnreadable: the stored secrets cannot be decrypted, or no key to encrypt.
    """
    row = registry.get_endpoint(endpoint, using)
    try:
        new = secret_store.generate_secret() if secret is None else secret_store.check_secret(secret)
    except ValueError as exc:
        raise InvalidEndpoint(str(exc), field="secret") from None
    seconds = endpoint_setting("SECRET_OVERLAP") if overlap is None else _overlap(overlap)
    seconds = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
    with transaction.atomic(using=using):
        locked = Endpoint.objects.using(using).select_for_update().get(pk=row.pk)
        current = secret_store.decrypt(locked.secrets) if locked.secrets else None
        secrets = (
            secret_store.SecretSet(new)
            if current is None
            else current.rotated(new, time.time(), max(0.0, seconds))
        )
        registry.save_endpoint(locked, {}, secrets=secrets, using=using)
    return new


#: The longest overlap :func:`rotate_secret` takes: a rotation whose old secret signs
#: longer is not a rotation (Svix keeps the old one 24 hours).
MAX_OVERLAP = 30 * 86400.0


def _overlap(value: object) -> float:
    """Seconds of ``rotate_secret``'s ``overlap``: a number or timedelta from 0 to
    :data:`MAX_OVERLAP` (not a bool, a str, NaN or infinity).

    Raises:
        InvalidEndpoint: otherwise.
    """
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= MAX_OVERLAP:
        raise InvalidEndpoint(
            f"overlap must be seconds (or a timedelta) from 0 to {MAX_OVERLAP:g} (30 days)", field="overlap"
        )
    return float(seconds)


def endpoint_secret(endpoint: Endpoint | str | uuid.UUID, *, using: str = DEFAULT_DB_ALIAS) -> str:
    """The endpoint's current secret, decrypted. Show it only to a user holding
    ``outbox.view_endpoint_secret`` (the caller checks).

    Raises:
        InvalidEndpoint: no such endpoint. SecretUnreadable: a wrong key.
    """
    row = registry.get_endpoint(endpoint.pk if isinstance(endpoint, Endpoint) else endpoint, using)
    return secret_store.decrypt(row.secrets).current


def delete_endpoint(endpoint: Endpoint | str | uuid.UUID, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Delete an endpoint. On commit: its state in Redis is disabled (nothing more
    starts), every delivery of it that is not in flight is deleted with its history
    (pending, retrying, parked, failed, succeeded), then its state is removed from Redis
    (breaker, limits, health, parked set, its name in the destination set). A delivery in
    flight finishes its attempt; its outcome is recorded on a message of a destination
    that no longer exists (a later attempt fails at once: "no such endpoint"), and
    retention purges it. Publishing never reaches it again.

    Raises:
        InvalidEndpoint: no such endpoint.
    """
    row = registry.get_endpoint(endpoint, using)
    name = row.destination
    with transaction.atomic(using=using):
        registry.on_commit([row], using, deleted=True)
        # its deliveries captured in a transaction and not yet relayed to Redis go with it
        CapturedMessage.objects.using(using).filter(destination=name).delete()
        OrderingSequence.objects.using(using).filter(destination=name).delete()
        row.delete(using=using)
        transaction.on_commit(lambda: _forget(name), using=using)


def _forget(name: str) -> bool:
    """A deleted endpoint's deliveries and state out of Redis (best effort: logged; what
    is left is finished by :func:`sweep_deleted_endpoints`). True when all is gone."""
    try:
        forget_endpoint_state(name)
    except (RedisError, RedisClusterException) as exc:
        logger.warning(
            "outbox: the Redis state of deleted endpoint %s could not be removed (%s); "
            "outbox.webhooks.sweep_deleted_endpoints() removes it later",
            name,
            exc,
        )
        return False
    return True


def forget_endpoint_state(name: str) -> int:
    """Remove from Redis what a deleted endpoint ``name`` left: it is disabled (nothing
    more starts), every delivery of it not in flight is deleted with its attempt records
    (the receivers' stored answers), then its state (breaker, limits, health, parked
    set, its name in the destination set). Safe to run again. Returns the deliveries
    deleted.

    Raises:
        redis.exceptions.RedisError: Redis unreachable (run it again later).
    """
    controls.disable(name, reason="deleted")
    repo = get_repository()
    result = execute(
        repo,
        DELETE,
        Selection(filter=MessageFilter(destination=name), description=f"deleted endpoint {name}"),
    )
    endpoint_versions.forget_destination(repo, name)
    endpoint_cache.forget([name])
    return result.acted


def sweep_deleted_endpoints(*, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Finish the deletion of endpoints whose rows are gone but whose Redis state or
    deliveries are left (Redis was unreachable when the deletion committed, or the
    process died before its on-commit step): every ``endpoint:`` name in the destination
    set without a row is forgotten (:func:`forget_endpoint_state`). Reads the set once
    and the database in chunks of 1,000 ids; run it after an outage (the warning
    "could not be removed" in the log says when) or from a periodic job. Returns the
    names swept.

    Raises:
        redis.exceptions.RedisError: Redis unreachable (nothing lost: run it again).
    """
    names = [n for n in get_repository().destinations() if endpoint_id(n) is not None]
    gone: list[str] = []
    for start in range(0, len(names), 1000):
        chunk = {endpoint_id(n): n for n in names[start : start + 1000]}
        alive = set(Endpoint.objects.using(using).filter(pk__in=list(chunk)).values_list("pk", flat=True))
        gone += [n for pk, n in chunk.items() if pk not in alive]
    for name in gone:
        forget_endpoint_state(name)
    return gone


def changed(*endpoints: Endpoint, using: str = DEFAULT_DB_ALIAS) -> None:
    """Tell the workers, when the current transaction commits, that these endpoints were
    changed through the ORM directly (their limits in Redis too). Disabling through the
    ORM is seen by workers within ``CACHE_TTL``; prefer :func:`disable_endpoint`."""
    registry.on_commit(list(endpoints), using)


def reencrypt_secrets(*, using: str = DEFAULT_DB_ALIAS) -> int:
    """Encrypt every endpoint's secrets again under the first key of
    ``OUTBOX["ENDPOINTS"]["SECRET_KEYS"]`` (after putting a new key first); then the old
    key can be removed. Returns how many endpoints were re-encrypted.

    Raises:
        SecretUnreadable: an endpoint's secrets cannot be decrypted by any key (none is
            changed after it: run again once fixed).
    """
    count = 0
    for pk, token in (
        Endpoint.objects.using(using).exclude(secrets="").values_list("pk", "secrets").iterator()
    ):
        Endpoint.objects.using(using).filter(pk=pk, secrets=token).update(
            secrets=secret_store.reencrypt(token)
        )
        count += 1
    return count


# -- publishing --------------------------------------------------------------------------


#: Byte -> a character of the base32 alphabet (RFC 4648, lower case): 256 is a multiple of
#: 32, so a uniform random byte gives a uniform character (5 random bits).
_BASE32_OF_BYTE = bytes(b"abcdefghijklmnopqrstuvwxyz234567"[i % 32] for i in range(256))


def event_id(application: Application, idempotency_key: str | None) -> str:
    """An event id, ``evt_`` + 26 base32 characters (130 bits): derived from (application,
    idempotency key) when there is a key (the same on every publish with it: the base32
    of its SHA-256, by every version), random otherwise (26 random bytes mapped to the
    alphabet in C: ``base64.b32encode`` is Python code, about 2 µs of every publish)."""
    if idempotency_key is not None:
        raw = hashlib.sha256(f"{application.pk}\x00{idempotency_key}".encode()).digest()
        return "evt_" + base64.b32encode(raw).decode().lower()[:26]
    return "evt_" + os.urandom(26).translate(_BASE32_OF_BYTE).decode()


def publish(
    event_type: str,
    payload: Any,
    *,
    application: Application | str,
    channels: Sequence[str] | None = None,
    idempotency_key: str | None = None,
    ordering_key: str | None = None,
    delay: float | timedelta | None = None,
    priority: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> PublishedEvent:
    """Publish an event: one delivery to every enabled endpoint of ``application``
    subscribed to ``event_type`` and ``channels`` (Svix's fan-out), each an ordinary
    outbox message to that endpoint.

    The subscribers are resolved now, as this process knows them (a change committed
    here at once, elsewhere within ``VERSION_CHECK``: ``docs/webhooks.md``): one
    registered later does not get this event; one disabled later gets it when enabled
    again (its delivery waits, parked). Inside ``transaction.atomic`` on ``using`` the deliveries are captured with the
    caller's rows (committed or rolled back with them, as :func:`outbox.send`), and an
    endpoint created earlier in the transaction (through this module, or announced by
    :func:`changed`) is among the subscribers; outside, they are stored before this
    returns.

    Every delivery is POSTed with the payload as its body and the headers
    ``webhook-id`` = the event id (the same for every endpoint and retry: receivers
    deduplicate by it), ``webhook-timestamp``, ``webhook-signature`` (one ``v1,``
    signature per secret signing now), ``Outbox-Event-Type``, ``Outbox-Event-Id`` and
    ``Outbox-Delivery-Id`` (its own message id).

    Args:
        event_type: a name in the catalogue, not archived (unless
            ``OUTBOX["ENDPOINTS"]["ALLOW_UNKNOWN_EVENT_TYPES"]``).
        payload: JSON-serializable data, str or bytes (UTF-8: deliveries are signed), at
            most ``OUTBOX["ENDPOINTS"]["MAX_PAYLOAD_BYTES"]`` (else ``MAX_BODY_BYTES``).
        application: an :class:`~outbox.models.Application` or its uid.
        channels: the event's channels (up to 10).
        idempotency_key: per application: publishing again with it within 24 hours
            returns the same event id, and each endpoint's delivery is the one stored
            before (deduplicated per endpoint under a key derived from (application, key,
            endpoint)); a delivery a partial failure left out (a cluster partition down)
            is stored now, and an endpoint subscribed since gets one too. The same key
            with another payload raises :class:`~outbox.exceptions.IdempotencyConflict`.
        ordering_key: scoped per endpoint: each endpoint gets the events with this key
            one at a time, in publish order (commit order inside transactions), whatever
            the other endpoints do.
        delay: seconds (or a ``timedelta``) before the first attempt.
        priority: ``"high"``, ``"default"`` or ``"low"``.
        using: the database whose transaction to join.

    Returns:
        :class:`PublishedEvent`: the event id and its deliveries.

    Raises:
        UnknownApplication: no such application.
        UnknownEventType: not in the catalogue, or archived.
        InvalidMessage: a bad payload (``MessageTooLarge``), channels or key.
        OutboxUnavailable: outside a transaction, Redis could not take every delivery:
            the text says how many were stored; ``exc.stored`` and ``exc.unstored`` list
            them (``SendOutcomeUnknown``: ``exc.unknown``, may be stored). Publishing
            again with the same idempotency key completes it.
        NotDurable: as :func:`outbox.send`.
    """
    request = _Publish(
        event_type, payload, application, channels, idempotency_key, ordering_key, delay, priority, using
    )
    event, endpoints = _resolve(request)
    return _fan_out(event, endpoints, using)


async def apublish(
    event_type: str,
    payload: Any,
    *,
    application: Application | str,
    channels: Sequence[str] | None = None,
    idempotency_key: str | None = None,
    ordering_key: str | None = None,
    delay: float | timedelta | None = None,
    priority: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> PublishedEvent:
    """:func:`publish` for ``async def`` code: ``event = await outbox.apublish(...)``.

    The same arguments, result, exceptions and guarantees as :func:`publish`. The
    subscribers are resolved (this process's endpoint cache, or the database) in
    Django's thread for synchronous code (``sync_to_async``); the deliveries are written
    as :func:`outbox.asend_many` writes (the same steps as ``send_many``, on this loop's
    ``redis.asyncio`` client), so no I/O blocks the event loop. Called through
    ``async_to_sync`` inside a synchronous ``transaction.atomic`` block, the subscribers
    are read and the deliveries captured in that block's transaction, on its thread (as
    :func:`outbox.asend`); from async code, put the atomic block and :func:`publish` in
    one ``sync_to_async`` function (docs/async.md).

    Raises:
        UnknownApplication, UnknownEventType, InvalidMessage, OutboxUnavailable,
            SendOutcomeUnknown, NotDurable: as :func:`publish`.
        SendCancelled: the task was cancelled after the deliveries' write was sent (as
            :func:`outbox.asend`: ``exc.unknown`` lists them; publishing again with the
            same idempotency key, or ``asend_again(exc.unknown)``, stores them once).
        asyncio.CancelledError: cancelled before the write was sent (nothing stored).
    """
    request = _Publish(
        event_type, payload, application, channels, idempotency_key, ordering_key, delay, priority, using
    )
    if api.atomic_block_here(using):  # on this very thread (DJANGO_ALLOW_ASYNC_UNSAFE)
        event, endpoints = _resolve(request)
    else:
        event, endpoints = await sync_to_async(_resolve, thread_sensitive=True)(request)
    if not endpoints:
        return PublishedEvent(event.id, event.event_type, event.app.uid, ())
    messages = _delivery_messages(event, endpoints)
    try:
        stored = await api._asubmit(messages, using)
    except OutboxUnavailable as exc:  # a SendCancelled too: it stays a CancelledError
        _explained(exc, event, len(messages))
        raise
    except IdempotencyConflict as exc:
        raise _conflict(exc, event) from exc
    return _published(event, endpoints, stored)


# _Publish and _Event are not frozen: every publish() makes one of each, and a frozen
# dataclass's __init__ sets each field through object.__setattr__ (about 0.15 µs a field);
# nothing changes one after it is made.
@dataclass(slots=True)
class _Publish:
    """The arguments of :func:`publish` (and :func:`apublish`)."""

    event_type: str
    payload: Any
    application: Application | str
    channels: Sequence[str] | None
    idempotency_key: str | None
    ordering_key: str | None
    delay: float | timedelta | None
    priority: str | None
    using: str


def _resolve(request: _Publish) -> tuple[_Event, Sequence[registry.Subscriber]]:
    """The checked event of a publish and its subscribers (see :func:`publish`): what
    reads the database (or this process's view of it), in the caller's thread."""
    using, event_type = request.using, request.event_type
    atomic, fresh = registry.transaction_state(using)  # fresh: read its own rows, keep nothing
    event_channels = registry.clean_channels(request.channels)
    app, endpoints = registry.publication(request.application, event_type, event_channels, using, fresh=fresh)
    key = clean_idempotency_key(request.idempotency_key)
    clean_ordering_key(request.ordering_key)
    data, content_type = _payload(request.payload)
    event = _Event(
        app,
        event_type,
        event_id(app, key),
        data,
        content_type,
        key,
        request.ordering_key,
        request.delay,
        request.priority,
        atomic,
    )
    return event, endpoints


def _payload(payload: Any) -> tuple[bytes, str]:
    """The payload encoded (as ``send()`` encodes a body), checked: UTF-8, within the limit.

    Raises:
        InvalidMessage, MessageTooLarge: otherwise.
    """
    try:
        data, content_type = encode_body(payload, None)
    except MessageTooLarge as exc:  # named as publish() names it
        raise MessageTooLarge(exc.size, exc.limit, exc.setting, field="payload") from None
    except InvalidMessage as exc:
        raise InvalidMessage(str(exc).replace("body", "payload", 1), field="payload") from None
    own = endpoint_setting("MAX_PAYLOAD_BYTES")
    limit = own or outbox_settings.MAX_BODY_BYTES
    if len(data) > int(limit):
        setting = "OUTBOX['ENDPOINTS']['MAX_PAYLOAD_BYTES']" if own else "OUTBOX['MAX_BODY_BYTES']"
        raise MessageTooLarge(len(data), int(limit), setting, field="payload")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidMessage(
            "payload must be UTF-8: deliveries are signed (Standard Webhooks signs text)", field="payload"
        ) from None
    return data, content_type


@dataclass(slots=True)
class _Event:
    """An event checked by :func:`publish`, before its fan-out."""

    app: Application
    event_type: str
    id: str
    data: bytes
    content_type: str
    key: str | None = None
    ordering_key: str | None = None
    delay: float | timedelta | None = None
    priority: str | None = None
    #: a transaction was open on the publish's database when it was resolved (None: not
    #: looked at); the same thread stores the deliveries right after, so the answer holds
    atomic: bool | None = None


def _deliveries(event: _Event, endpoints: Sequence[registry.Subscriber]) -> list[Message]:
    """One message per endpoint: the first built and checked by ``build_message`` (as
    ``send()`` builds one), the others copies of it with their own id (and partition)
    and destination: everything else of a delivery is the event's."""
    now = time.time()
    partition = random_partition(outbox_settings.partitions)
    eid = event.id
    given = SendArguments(
        endpoint_template(),  # named and numbered below, as the copies (no replace() per call)
        event.data,
        content_type=event.content_type,
        idempotency_key=None if event.key is None else f"evt:{eid}",
        ordering_key=event.ordering_key,
        delay=event.delay,
        priority=event.priority,
    )
    first = build_message(given, now, partition)
    # the event's headers, not checked again: a constant name each, the event id and a type
    # name clean_event_type_name passed (letters, digits, "._-:") are valid header values
    first.headers = {EVENT_ID_HEADER: eid, EVENT_TYPE_HEADER: event.event_type}
    keyed = first.ordering_key or first.idempotency_key
    first.destination = endpoints[0].destination
    if keyed is not None:  # its partition follows its destination's (build_message named the template's)
        first.id = new_message_id(now, message_partition(first.destination, keyed, partition))
    messages = [first]
    fields = first.__dict__
    for e in endpoints[1:]:
        m = object.__new__(Message)  # copy.copy(first) without its reduce protocol (a fan-out makes 1,000)
        m.__dict__.update(fields)
        m.id = new_message_id(now, message_partition(e.destination, keyed, partition))
        m.destination = e.destination
        m.headers = dict(first.headers)
        m.retry_policy = dict(first.retry_policy)
        messages.append(m)
    return messages


def _fan_out(event: _Event, endpoints: Sequence[registry.Subscriber], using: str) -> PublishedEvent:
    """Build one delivery per endpoint and store them (or capture them)."""
    if not endpoints:
        return PublishedEvent(event.id, event.event_type, event.app.uid, ())
    messages = _delivery_messages(event, endpoints)
    try:
        stored = api._submit(messages, using, event.atomic)
    except OutboxUnavailable as exc:
        _explained(exc, event, len(messages))
        raise
    except IdempotencyConflict as exc:
        raise _conflict(exc, event) from exc
    return _published(event, endpoints, stored)


def _delivery_messages(event: _Event, endpoints: Sequence[registry.Subscriber]) -> list[Message]:
    """The deliveries of ``event`` (:func:`_deliveries`), each referring to the payload
    when there are several."""
    messages = _deliveries(event, endpoints)
    # the payload once per partition, a reference each; inline (one copy either way) when
    # empty (a reference without a body means purged) or to one endpoint (2 commands fewer)
    for m in messages if event.data and len(messages) > 1 else ():
        m.payload_ref = event.id
    return messages


def _explained(exc: OutboxUnavailable, event: _Event, count: int) -> OutboxUnavailable:
    """``exc`` (a write of ``count`` deliveries that failed) with what it means for the
    event in its text: how many were stored, and whether publishing again is safe."""
    done = len(getattr(exc, "stored", None) or [])
    exc.args = (
        f"publish of event {event.id} ({event.event_type}) to {count} endpoint(s): {done} delivery(ies) stored. "
        + (
            "Publishing again with the same idempotency_key stores the rest once. "
            if event.key is not None
            else "Without an idempotency_key, publishing again would repeat the stored ones. "
        )
        + str(exc.args[0] if exc.args else exc),
        *exc.args[1:],
    )
    return exc


def _conflict(exc: IdempotencyConflict, event: _Event) -> IdempotencyConflict:
    """The caller's :class:`IdempotencyConflict` for ``exc``, a delivery's (whose key is
    derived from the event's): in the caller's words, its key, application and event;
    ``existing_id`` is the event's id, ``stored`` as ``exc``'s."""
    stored = (
        f"{len(exc.stored)} delivery(ies) in other partitions were stored (exc.stored)"
        if exc.stored
        else "nothing was stored for this one"
    )
    return IdempotencyConflict(
        f"idempotency_key {event.key!r} was already used for application {event.app.uid!r} with a different "
        f"payload (event {event.id}): the first event stands, {stored}",
        existing_id=event.id,
        stored=exc.stored,
    )


def _published(
    event: _Event, endpoints: Sequence[registry.Subscriber], stored: Sequence[Message]
) -> PublishedEvent:
    deliveries = tuple([Delivery(e.pk, e.destination, m) for e, m in zip(endpoints, stored, strict=True)])
    return PublishedEvent(event.id, event.event_type, event.app.uid, deliveries)


def send_test_event(
    endpoint: Endpoint | str | uuid.UUID, *, event_type: str | None = None, using: str = DEFAULT_DB_ALIAS
) -> PublishedEvent:
    """Send one event to this endpoint alone, whatever its subscriptions: ``event_type``'s
    example from the catalogue (default: the endpoint's first subscribed type, else
    :data:`TEST_EVENT_TYPE` with ``{"type": "outbox.test"}``). A disabled endpoint's test
    delivery waits until it is enabled.

    Raises:
        InvalidEndpoint: no such endpoint.
    """
    if event_type is not None and event_type != TEST_EVENT_TYPE:  # as publish() checks it
        registry.check_published_type(registry.clean_event_type_name(event_type), using, fresh=True)
    row = registry.get_endpoint(endpoint, using)
    name = event_type or (row.filter_types[0] if row.filter_types else TEST_EVENT_TYPE)
    example = EventType.objects.using(using).filter(name=name).values_list("example", flat=True).first()
    payload = example if example is not None else {"type": name, "test": True}
    data, content_type = _payload(payload)
    app = Application.objects.using(using).get(pk=row.application_id)
    event = _Event(app, name, event_id(app, None), data, content_type)
    return _fan_out(event, [registry.Subscriber.of(row)], using)


def subscribed(
    application: Application | str,
    event_type: str,
    channels: Iterable[str] = (),
    *,
    using: str = DEFAULT_DB_ALIAS,
) -> list[Endpoint]:
    """The endpoints :func:`publish` would deliver such an event to now.

    Raises:
        UnknownApplication: no such application.
    """
    registry.clean_event_type_name(event_type)
    event_channels = registry.clean_channels(channels)  # refuses a str, as publish() does
    app = registry.get_application(application, using)
    return registry.subscribers(app, event_type, event_channels, using)


__all__ = [
    "CreatedEndpoint",
    "Delivery",
    "PublishedEvent",
    "apublish",
    "changed",
    "create_application",
    "create_endpoint",
    "create_event_type",
    "delete_application",
    "delete_endpoint",
    "disable_endpoint",
    "enable_endpoint",
    "endpoint_secret",
    "get_endpoint",
    "publish",
    "reencrypt_secrets",
    "rotate_secret",
    "send_test_event",
    "subscribed",
    "sweep_deleted_endpoints",
    "update_application",
    "update_endpoint",
    "update_event_type",
]
