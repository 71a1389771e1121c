"""Model events: publish ``<app_label>.<model>.created``, ``.updated`` and ``.deleted``
for the models a project names, to the application each row belongs to.

Configured in ``OUTBOX["MODEL_EVENTS"]``, a dict from a model's label to its options::

    OUTBOX = {
        "MODEL_EVENTS": {
            "shop.Order": {
                "APPLICATION": "shop.webhooks.order_application",  # instance -> application
                "SERIALIZER": "shop.webhooks.order_payload",       # instance -> JSON-able dict
                # or, instead of SERIALIZER, the fields to send: "FIELDS": ["id", "total"],
                "EVENTS": ["created", "updated", "deleted"],       # the default: all three
                "CHANNELS": None,             # or a dotted path: instance -> list of channels
                "ORDERED": True,              # one row's events in order at each endpoint
            },
        },
    }

``APPLICATION`` is required: a dotted path to a callable taking the row and returning the
application to publish to (what :func:`outbox.publish` takes as ``application``), or
``None`` to publish nothing for that row (a row that belongs to no customer).

What is published, and when:

- The event type is ``<app_label>.<model_name>.<action>``, the model name in lower case
  (``shop.order.created``), as django-webhook names its topics. The payload is
  ``{"model": "shop.order", "action": "created", "pk": ..., "data": <serializer's dict>}``.
- **Only when the transaction commits.** The event is published from Django's
  ``post_save``/``post_delete`` signal through :func:`outbox.publish` inside
  ``transaction.atomic(using=<the row's database>)``: inside the caller's transaction it is
  captured in the same database transaction as the row, so it commits with the row, and
  is gone when the transaction, or the savepoint around the change, rolls back. Outside a
  transaction (autocommit) the row commits first and the event is captured in a
  transaction of its own right after: a process killed between the two loses that one
  event. Wrap the change in ``transaction.atomic`` (or use ``ATOMIC_REQUESTS``) for the
  row and its event to be one commit.
- ``ORDERED`` (default True): the ordering key is ``<model label>:<pk>``, so one row's
  created, updated and deleted events reach each endpoint in that order
  (:doc:`concepts`, "Ordered delivery"); rows do not wait on each other.
- Not published: changes that send no model signal. ``QuerySet.update()``,
  ``bulk_create()`` and ``bulk_update()`` send none (Django's documentation, "Signals",
  and ``QuerySet.update``); raw SQL neither. ``QuerySet.delete()`` does send
  ``post_delete`` for each row (its collector cannot take the fast path while a receiver
  is connected), so deletes are published row by row.

A misconfiguration raises :class:`django.core.exceptions.ImproperlyConfigured` when Django
starts (the receivers are connected in the app's ``ready()``), naming the model and the
option: a project whose events are misconfigured does not start without them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.serializers.json import DjangoJSONEncoder
from django.core.signals import setting_changed
from django.db import models, transaction
from django.db.models.signals import post_delete, post_migrate, post_save
from django.dispatch import receiver
from django.utils.module_loading import import_string

from outbox.conf import outbox_settings
from outbox.models import EventType
from outbox.webhooks import publish

ACTIONS = ("created", "updated", "deleted")
OPTIONS = frozenset({"APPLICATION", "SERIALIZER", "FIELDS", "EVENTS", "CHANNELS", "ORDERED"})
DISPATCH_UID = "outbox.model_events"


@dataclass(frozen=True)
class ModelEvents:
    """What one model publishes: its model class, the callables named in its options and
    the actions (a subset of :data:`ACTIONS`)."""

    model: type[models.Model]
    application: Callable[[models.Model], Any]
    serializer: Callable[[models.Model], Any]
    channels: Callable[[models.Model], Any] | None
    actions: frozenset[str]
    ordered: bool

    @property
    def label(self) -> str:
        """``app_label.model_name`` in lower case, the prefix of its event types."""
        return self.model._meta.label_lower

    def event_type(self, action: str) -> str:
        """The event type of ``action``: ``shop.order.created``."""
        return f"{self.label}.{action}"

    def event_types(self) -> list[str]:
        """Every event type this model publishes, for the event-type catalogue."""
        return [self.event_type(action) for action in ACTIONS if action in self.actions]


def parse(setting: Any) -> dict[type[models.Model], ModelEvents]:
    """Read ``OUTBOX["MODEL_EVENTS"]`` into one :class:`ModelEvents` per model.

    Raises ImproperlyConfigured, naming the model label and the option, for an unknown
    model, an unknown option, a missing ``APPLICATION``, a dotted path that does not
    import, both ``SERIALIZER`` and ``FIELDS``, a field the model does not have, or an
    action other than created, updated and deleted.
    """
    if setting in (None, {}):
        return {}
    if not isinstance(setting, Mapping):
        raise ImproperlyConfigured('OUTBOX["MODEL_EVENTS"] must be a dict of model label -> options')
    parsed: dict[type[models.Model], ModelEvents] = {}
    for label, options in setting.items():
        events = _parse_one(label, options)
        parsed[events.model] = events
    return parsed


def _parse_one(label: Any, options: Any) -> ModelEvents:
    where = f'OUTBOX["MODEL_EVENTS"][{label!r}]'
    try:
        model = apps.get_model(str(label))
    except (LookupError, ValueError) as exc:
        raise ImproperlyConfigured(f"{where}: no such model ({exc})") from None
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict of options")
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise ImproperlyConfigured(
            f"{where}: unknown option(s) {', '.join(unknown)} (known: {sorted(OPTIONS)})"
        )
    if not options.get("APPLICATION"):
        raise ImproperlyConfigured(f"{where}: APPLICATION (a dotted path: row -> application) is required")
    if options.get("SERIALIZER") and options.get("FIELDS"):
        raise ImproperlyConfigured(f"{where}: give SERIALIZER or FIELDS, not both")
    actions = options.get("EVENTS", ACTIONS)
    if isinstance(actions, str) or not set(actions) <= set(ACTIONS) or not actions:
        raise ImproperlyConfigured(f"{where}: EVENTS must be a non-empty list of {', '.join(ACTIONS)}")
    serializer = (
        _callable(where, "SERIALIZER", options["SERIALIZER"])
        if options.get("SERIALIZER")
        else _fields_serializer(where, model, options.get("FIELDS"))
    )
    return ModelEvents(
        model=model,
        application=_callable(where, "APPLICATION", options["APPLICATION"]),
        serializer=serializer,
        channels=_callable(where, "CHANNELS", options["CHANNELS"]) if options.get("CHANNELS") else None,
        actions=frozenset(actions),
        ordered=bool(options.get("ORDERED", True)),
    )


def _callable(where: str, option: str, value: Any) -> Callable[[models.Model], Any]:
    if callable(value):
        return value  # type: ignore[no-any-return]
    try:
        found = import_string(str(value))
    except ImportError as exc:
        raise ImproperlyConfigured(f"{where}: {option} {value!r} does not import ({exc})") from None
    if not callable(found):
        raise ImproperlyConfigured(f"{where}: {option} {value!r} is not callable")
    return found  # type: ignore[no-any-return]


def _fields_serializer(where: str, model: type[models.Model], fields: Any) -> Callable[[models.Model], Any]:
    """A serializer of the named concrete fields (all of them when None), each value as
    ``DjangoJSONEncoder`` would write it (dates ISO 8601, decimals as strings, UUIDs)."""
    concrete = {field.name: field for field in model._meta.concrete_fields}
    names = list(concrete) if fields is None else list(fields)
    missing = [name for name in names if name not in concrete]
    if isinstance(fields, str) or missing:
        raise ImproperlyConfigured(
            f"{where}: FIELDS must list fields of {model._meta.label}; unknown: {missing or fields}"
        )
    encoder = DjangoJSONEncoder()

    def serialize(instance: models.Model) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name in names:
            value = concrete[name].value_from_object(instance)
            data[name] = (
                value if isinstance(value, (str, int, float, bool, type(None))) else encoder.default(value)
            )
        return data

    return serialize


_connected: dict[type[models.Model], ModelEvents] = {}


def connect() -> dict[type[models.Model], ModelEvents]:
    """Connect the receivers for ``OUTBOX["MODEL_EVENTS"]`` (disconnecting any earlier
    ones first) and return what was connected. Called once the app registry is ready, and
    again when the setting changes (``override_settings``). Raises ImproperlyConfigured."""
    disconnect()
    parsed = parse(outbox_settings.MODEL_EVENTS)
    for model in parsed:
        post_save.connect(_saved, sender=model, dispatch_uid=DISPATCH_UID, weak=False)
        post_delete.connect(_deleted, sender=model, dispatch_uid=DISPATCH_UID, weak=False)
    _connected.update(parsed)
    return dict(parsed)


def disconnect() -> None:
    """Disconnect every receiver :func:`connect` connected."""
    for model in list(_connected):
        post_save.disconnect(sender=model, dispatch_uid=DISPATCH_UID)
        post_delete.disconnect(sender=model, dispatch_uid=DISPATCH_UID)
    _connected.clear()


def _saved(
    sender: type[models.Model],
    instance: models.Model,
    created: bool,
    using: str,
    raw: bool = False,
    **kwargs: Any,
) -> None:
    if raw:  # loaddata: fixtures are not business events
        return
    publish_change(instance, "created" if created else "updated", using=using)


def _deleted(sender: type[models.Model], instance: models.Model, using: str, **kwargs: Any) -> None:
    publish_change(instance, "deleted", using=using)


def publish_change(instance: models.Model, action: str, *, using: str) -> Any:
    """Publish ``action`` (created, updated or deleted) of ``instance`` as configured for
    its model, inside ``transaction.atomic(using=using)`` (so it commits with the row when
    a transaction is open). Returns the :class:`~outbox.webhooks.PublishedEvent`, or None when the
    model does not publish that action or its ``APPLICATION`` callable returned None.

    Raises what ``publish`` raises (an unknown application, an archived event type): the
    change's transaction then rolls back with it, as any failing ``post_save`` receiver's.
    """
    events = _connected.get(type(instance))
    if events is None or action not in events.actions:
        return None
    application = events.application(instance)
    if application is None:
        return None
    label = events.label
    payload = {
        "model": label,
        "action": action,
        "pk": _json_pk(instance.pk),
        "data": events.serializer(instance),
    }
    with transaction.atomic(using=using):
        return publish(
            events.event_type(action),
            payload,
            application=application,
            channels=events.channels(instance) if events.channels else None,
            ordering_key=f"{label}:{instance.pk}" if events.ordered else None,
            using=using,
        )


def _json_pk(pk: Any) -> Any:
    return pk if isinstance(pk, (str, int)) else str(pk)


def register_event_types(*, using: str = "default") -> list[str]:
    """Add every event type the configured models publish to the event-type catalogue
    (:class:`~outbox.models.EventType`) when it is not there yet, with a description
    saying where it comes from; an existing type is left as it is (an archived one stays
    archived: publishing it is then refused). Returns the names added. Run after
    ``migrate`` (the ``post_migrate`` signal) and by ``connect()``'s callers in tests."""
    added: list[str] = []
    for events in _connected.values():
        for name in events.event_types():
            action = name.rsplit(".", 1)[1]
            _, created = EventType.objects.using(using).get_or_create(
                name=name,
                defaults={"description": f"A {events.model._meta.verbose_name} was {action} (model events)."},
            )
            if created:
                added.append(name)
    return added


def _after_migrate(*, app_config: Any = None, using: str = "default", **kwargs: Any) -> None:
    if app_config is not None and app_config.label == "outbox":  # once, after the outbox's tables
        register_event_types(using=using)


post_migrate.connect(_after_migrate, dispatch_uid=DISPATCH_UID)


@receiver(setting_changed)
def _reconnect(*, setting: str, **kwargs: Any) -> None:
    if setting == "OUTBOX" and apps.ready:
        connect()
