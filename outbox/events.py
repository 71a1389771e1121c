"""Outcome events: Django signals in the process that made the change, and JSON on a
Redis Pub/Sub channel (``OUTBOX["EVENTS_CHANNEL"]``, published by the same Lua script
that makes the status change, so an event is published if and only if it happened).

Signals (``sender`` is the :class:`~outbox.records.Message` class; keyword ``message``
is the message after the change; ``attempt`` an :class:`~outbox.records.Attempt` or None):

* :data:`message_succeeded`: delivered.
* :data:`message_retrying`: an attempt failed; a retry is scheduled (``next_attempt_at``).
* :data:`message_failed`: dead letter (permanent error, retries spent, or worker lost too often).
* :data:`messages_requeued`, :data:`messages_retried_now`, :data:`messages_cancelled`,
  :data:`messages_deleted`: a
  user or script acted on messages; keyword ``message_ids`` lists the ids acted on
  (sent once per batch of up to 1,000, not per message).

Pub/Sub payload of a delivery outcome (JSON object)::

    {"event": "message.succeeded", "id": "msg_...", "destination": "orders",
     "status": "succeeded", "retry_count": 0, "status_code": 200, "error": "",
     "next_attempt_at": null, "at": 1763780000.123}

Destination events (:mod:`outbox.destinations.health`; keyword ``event``, a
:class:`DestinationEvent`; ``sender`` is that class), sent in the process
that made the change by :func:`send_destination_events`: :data:`destination_failing`,
:data:`destination_recovered`, :data:`destination_opened`, :data:`destination_closed`,
:data:`destination_disabled`, :data:`destination_enabled`, :data:`destination_paused`,
:data:`destination_resumed`. Their Pub/Sub JSON is ``{"event": "destination.opened",
"destination": "orders", "at": ..., ...detail}``.

:data:`message_exhausted`: a dead letter because its retries ran out (not a permanent
failure), sent by the worker that wrote it, after :data:`message_failed`
(:func:`send_exhausted_signal`; ``sender`` the :class:`~outbox.records.Message` class,
keywords ``message``, ``attempt`` and ``event``, its ``message.exhausted``
:class:`DestinationEvent`).

Every signal is sent with ``send_robust``: a receiver that raises is logged with its
traceback and stops neither the other receivers nor delivery.

A bulk action publishes one event per batch of up to 1,000 messages::

    {"event": "messages.requeued", "ids": ["msg_...", ...], "at": 1763780000.123}
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.dispatch import Signal

from outbox.records import Attempt, Message

logger = logging.getLogger("outbox")

#: The events of :class:`DestinationEvent` (``destination.*`` and ``message.exhausted``).
DESTINATION_EVENTS = (
    "destination.failing",
    "destination.recovered",
    "destination.opened",
    "destination.closed",
    "destination.disabled",
    "destination.enabled",
    "destination.paused",
    "destination.resumed",
    "message.exhausted",
)


@dataclass(frozen=True)
class DestinationEvent:
    """A change of a destination's state (or a message exhausting its retries).

    Attributes:
        event: one of :data:`DESTINATION_EVENTS`, e.g. ``"destination.opened"``.
        destination: the destination's name.
        at: epoch seconds.
        detail: the rest of the event (``reason``, ``consecutive_failures``,
            ``failing_since``, ``next_probe_at``, ``id`` of a message ...).
    """

    event: str
    destination: str
    at: float
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: str | bytes) -> DestinationEvent:
        """An event from the JSON published on the events channel."""
        data = json.loads(raw)
        return cls(str(data.pop("event")), str(data.pop("destination")), float(data.pop("at")), data)

    def to_json(self) -> str:
        """The JSON published on the events channel."""
        return json.dumps(
            {"event": self.event, "destination": self.destination, "at": self.at, **self.detail},
            separators=(",", ":"),
        )


message_succeeded = Signal()
message_retrying = Signal()
message_failed = Signal()
messages_requeued = Signal()
messages_retried_now = Signal()
messages_cancelled = Signal()
messages_deleted = Signal()

destination_failing = Signal()
destination_recovered = Signal()
destination_opened = Signal()
destination_closed = Signal()
destination_disabled = Signal()
destination_enabled = Signal()
destination_paused = Signal()
destination_resumed = Signal()
message_exhausted = Signal()
#: Sent once per batch of destination events, after each event's own signal, in the
#: process that made the changes (keyword ``events``: a list of :class:`DestinationEvent`;
#: ``sender`` is that class). The alerts (:mod:`outbox.alerts`, connected
#: when the app is ready) listen to it, so destination health never calls them.
destination_events = Signal()

DESTINATION_SIGNALS = {
    "destination.failing": destination_failing,
    "destination.recovered": destination_recovered,
    "destination.opened": destination_opened,
    "destination.closed": destination_closed,
    "destination.disabled": destination_disabled,
    "destination.enabled": destination_enabled,
    "destination.paused": destination_paused,
    "destination.resumed": destination_resumed,
}

SIGNALS = {
    "succeeded": message_succeeded,
    "retrying": message_retrying,
    "failed": message_failed,
}
BULK_SIGNALS = {
    "requeued": messages_requeued,
    "retried_now": messages_retried_now,
    "cancelled": messages_cancelled,
    "deleted": messages_deleted,
}


def send_bulk_signal(action: str, message_ids: list[str]) -> None:
    """Send ``messages_<action>`` for ids acted on; receiver errors are logged."""
    if not message_ids:
        return
    for receiver, result in BULK_SIGNALS[action].send_robust(sender=Message, message_ids=message_ids):
        if isinstance(result, Exception):
            logger.error("outbox signal receiver %r failed", receiver, exc_info=result)


@dataclass(frozen=True)
class MessageEvent:
    """A message entering a status, as published on the events channel.

    Attributes:
        id: the message's id.
        destination: its destination.
        status: the status it entered.
        retry_count: its retry count after the change.
        at: epoch seconds.
        status_code: the HTTP status code of the attempt, or None.
        error: the attempt's error ("" when none).
        next_attempt_at: when it is due next (epoch seconds), or None.
        event: the event's name; None: ``message.<status>``.
    """

    id: str
    destination: str
    status: str
    retry_count: int
    at: float
    status_code: int | None = None
    error: str = ""
    next_attempt_at: float | None = None
    event: str | None = None

    def to_json(self) -> str:
        """The Pub/Sub JSON of the event."""
        return json.dumps(
            {
                "event": f"message.{self.status}" if self.event is None else self.event,
                "id": self.id,
                "destination": self.destination,
                "status": self.status,
                "retry_count": self.retry_count,
                "status_code": self.status_code,
                "error": self.error,
                "next_attempt_at": self.next_attempt_at,
                "at": self.at,
            },
            separators=(",", ":"),
        )


def send_signal(status: str, message: Message, attempt: Attempt | None = None) -> None:
    """Send the Django signal for a message that entered ``status`` (if it has one).

    A receiver that raises is logged and does not stop the others (``send_robust``):
    the status change has already happened.
    """
    signal = SIGNALS.get(status)
    if signal is None:
        return
    _send_robust(signal, message.id, sender=Message, message=message, attempt=attempt)


def send_exhausted_signal(message: Message, attempt: Attempt | None, event: DestinationEvent) -> None:
    """Send :data:`message_exhausted` for a dead letter whose retries ran out (``event``:
    its ``message.exhausted`` :class:`DestinationEvent`); receiver errors
    are logged."""
    _send_robust(message_exhausted, message.id, sender=Message, message=message, attempt=attempt, event=event)


def send_destination_signal(event: DestinationEvent) -> None:
    """Send the signal of a ``destination.*`` event (:data:`DESTINATION_SIGNALS`; none for
    other events; ``sender`` is the event's class). Never raises: receiver errors, and
    any error of the sending itself, are logged."""
    signal = DESTINATION_SIGNALS.get(event.event)
    if signal is None:
        return
    try:
        _send_robust(signal, event.event, sender=type(event), event=event)
    except Exception:
        logger.exception("outbox: sending the %s signal failed", event.event)


def send_destination_events(events: Sequence[DestinationEvent]) -> None:
    """Send the signal of each event (:func:`send_destination_signal`), then
    :data:`destination_events` once for the batch: the alerts
    (:mod:`outbox.alerts`) listen to it. Never raises: receiver errors are
    logged."""
    try:
        for event in events:
            send_destination_signal(event)
        if events:
            _send_robust(
                destination_events, "destination events", sender=DestinationEvent, events=list(events)
            )
    except Exception:
        logger.exception("outbox: handling destination events failed: %r", events)


def _send_robust(signal: Signal, about: str, **kwargs: Any) -> None:
    """``signal.send_robust(**kwargs)``, logging each receiver that raised (``about``:
    what the signal is about, for the log line)."""
    for receiver, result in signal.send_robust(**kwargs):
        if isinstance(result, Exception):
            logger.error("outbox signal receiver %r failed for %s", receiver, about, exc_info=result)
