"""Alerts about destination events: Django signals always, and optionally an email to
``ADMINS`` and a signed operational webhook, at most once per suppression window
(``docs/destinations.md``, "Alerts").

The worker that made a change hands its events to :func:`notify` (circuit breaker
opened, destination disabled, a message's retries ran out ...; see
:data:`outbox.events.DESTINATION_EVENTS`). :func:`notify` sends each ``destination.*`` event's Django
signal (:data:`outbox.events.DESTINATION_SIGNALS`: in-process facts, never suppressed;
``message_exhausted`` is sent by the worker itself, which has the message) and, when
``OUTBOX["ALERTS"]`` names a channel, delivers alerts **through the outbox**: each alert
is a message to the configured email or webhook destination, so it gets retries,
Standard Webhooks signing and the console like any other message::

    OUTBOX["ALERTS"] = {
        "SUPPRESS": 900,            # seconds between two alerts of one event about one destination
        "EMAIL_ADMINS": "ops-mail", # an email destination: mails settings.ADMINS (None = no email)
        "WEBHOOK": "ops-hook",      # a webhook destination: operational webhooks (None = none)
        "EVENTS": None,             # the events alerted (a list of names; None = all)
    }

Suppression across all workers: an alert about (event, destination) goes out at most
once per ``SUPPRESS`` seconds, decided atomically in Redis (``SET NX PX`` in
``lua/alert.lua``); occurrences in between are counted and the next alert reports
them (``count`` and ``since``). ``message.exhausted`` is aggregated per destination: one
alert ("N messages exhausted for orders since T"), not one per message; what a window
counted is reported when it ends (:func:`flush_due`, run by every worker's housekeeping),
so no exhausted message goes unreported. A state event that a window suppressed is not
sent later (it may be stale by then): the Django signals, the Pub/Sub channel and the
console always tell the current state.

An alert has an idempotency key per (event, destination, suppression window), so a
repeated :func:`notify` of the same event cannot send it twice.

No alert loops: an alert about destination ``D`` is never delivered through ``D``
itself (when the ops webhook fails, its own ``destination.failing`` goes by email only,
and vice versa). Alert messages can still fail and produce events about the alert
destinations, but each (event, destination) pair alerts at most once per window, so
the number of alerts stays bounded (at most one per event kind per alert destination
per window) and none can trigger itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from outbox.conf import outbox_settings
from outbox.endpoint_names import is_endpoint
from outbox.events import DESTINATION_EVENTS as EVENTS
from outbox.events import DestinationEvent, destination_events, send_destination_events
from outbox.exceptions import NotDurable
from outbox.sending import intake
from outbox.sending.validation import MAX_IDEMPOTENCY_KEY, SendArguments, build_message
from outbox.store import get_repository
from outbox.store.alerts import Occurrences

logger = logging.getLogger("outbox")

EXHAUSTED = "message.exhausted"
ALERT_KEYS = ("SUPPRESS", "EMAIL_ADMINS", "WEBHOOK", "EVENTS")
DEFAULT_SUPPRESS = 900.0  # seconds
SUBJECTS = {
    "destination.failing": "{d} is failing",
    "destination.recovered": "{d} recovered",
    "destination.opened": "{d}: circuit breaker opened (deliveries held)",
    "destination.closed": "{d}: circuit breaker closed (delivering again)",
    "destination.disabled": "{d} was disabled",
    "destination.enabled": "{d} was enabled",
    "destination.paused": "{d} was paused",
    "destination.resumed": "{d} was resumed",
    EXHAUSTED: "{n} message(s) exhausted their retries for {d}",
}


@dataclass(frozen=True)
class AlertSettings:
    """``OUTBOX["ALERTS"]``, checked (see :func:`parse_alert_settings`).

    Attributes:
        suppress: seconds between two alerts of one event about one destination.
        email_admins: the email destination that mails ``ADMINS``, or None.
        webhook: the webhook destination of operational webhooks, or None.
        events: the event names alerted.
    """

    suppress: float = DEFAULT_SUPPRESS
    email_admins: str | None = None
    webhook: str | None = None
    events: frozenset[str] = frozenset()

    @property
    def channels(self) -> tuple[str, ...]:
        """The alert destinations configured (email first)."""
        return tuple(c for c in (self.email_admins, self.webhook) if c)


def parse_alert_settings(value: Any) -> AlertSettings:
    """Check an ``OUTBOX["ALERTS"]`` value (shape only; the destinations it names are
    checked by :func:`channel_problems`).

    Raises:
        ValueError: not a dict (or None), an unknown key, ``SUPPRESS`` not a positive
            number of seconds, a channel not a destination name, or ``EVENTS`` not a list
            of known event names.
    """

    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"OUTBOX['ALERTS'] must be a dict, not {type(value).__name__}")
    unknown = set(value) - set(ALERT_KEYS)
    if unknown:
        raise ValueError(
            f"OUTBOX['ALERTS'] has unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
            f"known: {', '.join(ALERT_KEYS)}"
        )
    suppress = value.get("SUPPRESS", DEFAULT_SUPPRESS)
    if isinstance(suppress, bool) or not isinstance(suppress, (int, float)) or not 0 < suppress < 10**9:
        raise ValueError(
            f"OUTBOX['ALERTS']['SUPPRESS'] must be a positive number of seconds, not {suppress!r}"
        )
    channels = {}
    for key in ("EMAIL_ADMINS", "WEBHOOK"):
        name = value.get(key)
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"OUTBOX['ALERTS']['{key}'] must be a destination name or None, not {name!r}")
        channels[key] = name
    events = value.get("EVENTS")
    if events is None:
        chosen = frozenset(EVENTS)
    elif isinstance(events, (list, tuple, set, frozenset)) and all(isinstance(e, str) for e in events):
        bad = sorted(set(events) - set(EVENTS))
        if bad:
            raise ValueError(
                f"OUTBOX['ALERTS']['EVENTS'] names unknown event(s) {', '.join(bad)}; known: {', '.join(EVENTS)}"
            )
        chosen = frozenset(events)
    else:
        raise ValueError(f"OUTBOX['ALERTS']['EVENTS'] must be a list of event names or None, not {events!r}")
    return AlertSettings(float(suppress), channels["EMAIL_ADMINS"], channels["WEBHOOK"], chosen)


def channel_problems(config: AlertSettings) -> list[str]:
    """What is wrong with the destinations ``config`` names: not configured, or not of the
    transport its channel needs (an email transport for ``EMAIL_ADMINS``, a webhook
    transport for ``WEBHOOK``; subclasses count). Empty when all is well."""
    if config.email_admins is None and config.webhook is None:
        return []  # no channel: nothing to check (and no transport module to import)
    from outbox.transports import (
        transport_class,  # transports load their client libraries (httpx) only where an alert channel is set
    )
    from outbox.transports.email import (
        EmailTransport,  # transports load their client libraries (httpx) only where an alert channel is set
    )
    from outbox.transports.webhook import (
        WebhookTransport,  # transports load their client libraries (httpx) only where an alert channel is set
    )

    problems = []
    destinations = outbox_settings.DESTINATIONS if isinstance(outbox_settings.DESTINATIONS, dict) else {}
    for key, name, needed in (
        ("EMAIL_ADMINS", config.email_admins, EmailTransport),
        ("WEBHOOK", config.webhook, WebhookTransport),
    ):
        if name is None:
            continue
        entry = destinations.get(name)
        if not isinstance(entry, dict):
            known = ", ".join(sorted(destinations)) or "none configured"
            problems.append(f"OUTBOX['ALERTS']['{key}'] = {name!r} is not a destination (known: {known})")
            continue
        try:
            cls = transport_class(entry.get("TRANSPORT", ""))
        except ImproperlyConfigured:
            continue  # outbox.E002 reports the destination itself
        if not issubclass(cls, needed):
            kind = "an email" if needed is EmailTransport else "a webhook"
            problems.append(
                f"OUTBOX['ALERTS']['{key}'] = {name!r} must be {kind} destination, "
                f"but its transport is {entry.get('TRANSPORT')!r}"
            )
    return problems


@cache
def alert_settings() -> AlertSettings:
    """``OUTBOX["ALERTS"]`` checked, cached until the setting changes (an invalid value
    is not cached: it raises again).

    Raises:
        ImproperlyConfigured: the value is invalid or names wrong destinations
            (``manage.py check`` reports the same as ``outbox.E007``).
    """
    try:
        config = parse_alert_settings(outbox_settings.ALERTS)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    problems = channel_problems(config)
    if problems:
        raise ImproperlyConfigured("; ".join(problems))
    return config


@receiver(setting_changed)
def _reset_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == "OUTBOX":  # ADMINS is read when an email alert is sent, not cached
        alert_settings.cache_clear()


# -- notify ------------------------------------------------------------------------------
def notify(events: Sequence[DestinationEvent]) -> None:
    """Send the Django signal of each ``destination.*`` event, then deliver the alerts
    ``OUTBOX["ALERTS"]`` asks for (see the module docstring): the same as
    :func:`outbox.events.send_destination_events`, whose batch signal reaches
    :func:`on_destination_events`. Never raises: every error (a signal receiver, Redis, a
    bad setting) is logged with its traceback.

    Cheap without alert channels: the signals and one cached settings read.
    """
    send_destination_events(events)


@receiver(destination_events)
def on_destination_events(*, events: Sequence[DestinationEvent], **kwargs: Any) -> None:
    """Deliver the alerts ``OUTBOX["ALERTS"]`` asks for about ``events`` (the receiver of
    :data:`outbox.events.destination_events`, connected when this module is imported:
    the app's ``ready()`` imports it). Never raises."""
    try:
        _alert_about(events)
    except Exception:
        logger.exception("outbox: handling destination events failed: %r", events)


def _alert_about(events: Sequence[DestinationEvent]) -> None:
    try:
        config = alert_settings()
    except Exception:
        logger.exception("outbox: OUTBOX['ALERTS'] is invalid; no alert delivered (signals were sent)")
        return
    if not config.channels:
        return
    exhausted: dict[str, list[DestinationEvent]] = {}
    for event in events:
        if event.event not in config.events:
            continue
        if event.event == EXHAUSTED:
            exhausted.setdefault(event.destination, []).append(event)
            continue
        _alert(config, event.event, event.destination, add=1, since=event.at, at=event.at, last=event.detail)
    for destination, group in exhausted.items():
        newest = max(group, key=lambda e: e.at)
        _alert(
            config,
            EXHAUSTED,
            destination,
            add=len(group),
            since=min(e.at for e in group),
            at=newest.at,
            last=newest.detail,
        )


def flush_due(now: float | None = None) -> int:
    """Report what ended suppression windows counted (``message.exhausted`` messages
    exhausted while its alert was suppressed): one alert per (event, destination).
    Run by every worker's housekeeping (``WAKE_INTERVAL``); returns alerts sent. One
    Redis read when alert channels are configured, none otherwise.

    Raises:
        ImproperlyConfigured: ``OUTBOX["ALERTS"]`` is invalid.
        redis.exceptions.RedisError: the flush schedule could not be read (the
            housekeeping step logs it once and tries again); errors of single alerts
            are logged, not raised.
    """
    config = alert_settings()
    if not config.channels:
        return 0

    now = time.time() if now is None else now
    pairs = get_repository().alerts_to_flush(now)
    return sum(
        _alert(config, event, destination, add=0, since=now, at=now, last=None)
        for event, destination in pairs
    )


def _alert(
    config: AlertSettings,
    event: str,
    destination: str,
    *,
    add: int,
    since: float,
    at: float,
    last: dict[str, Any] | None,
) -> bool:
    """Count the occurrences, and when the suppression window allows, send the alert to
    each channel but ``destination`` itself. True if an alert was sent. Never raises."""
    channels = [c for c in config.channels if c != destination]
    if not channels:
        return False  # the only channel is the destination the event is about: no loop
    try:
        last_json = json.dumps(last, separators=(",", ":"), default=str) if last is not None else ""
        window = get_repository().alert_window(
            Occurrences(event, destination, add, since, last_json),
            now=time.time(),
            window=config.suppress,
            trailing=event == EXHAUSTED,
        )
    except Exception:
        logger.exception("outbox: the suppression window of the %s alert about %s failed", event, destination)
        return False
    if window is None:
        return False
    detail = last if last is not None else (json.loads(window.last) if window.last else {})
    alert = Alert(event, destination, at, window.count, window.since, detail, endpoint_label(destination))
    key = alert.idempotency_key(config.suppress)
    sent = False
    for channel in channels:
        try:
            if channel == config.email_admins:
                sent |= _send_email(channel, alert, key)
            else:
                _send(channel, alert.webhook_payload(), key)
                sent = True
        except Exception:
            logger.exception(
                "outbox: sending the %s alert about %s to %s failed", event, destination, channel
            )
    return sent


def endpoint_label(destination: str) -> Any:
    """What an alert says of ``destination`` when it is an endpoint registered at runtime:
    its :class:`~outbox.destinations.endpoints.EndpointLabel` (application, uid, URL host;
    one database query, at most once per alert sent), else None (a settings destination,
    a deleted endpoint, or the database unreachable: logged, the alert still goes)."""
    if not is_endpoint(destination):
        return None
    try:
        from outbox.destinations import endpoints  # Django models: loaded only for an endpoint's alert

        return endpoints.describe([destination]).get(destination)
    except Exception:
        logger.exception("outbox: the alert about %s cannot name its application and endpoint", destination)
        return None


def _send(
    channel: str,
    body: Any,
    key: str,
    content_type: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Store the alert message in Redis now (validated as :func:`outbox.send` does,
    priority ``high``), also inside ``transaction.atomic``: the change it reports is in
    Redis already and is not rolled back with the caller's transaction."""
    given = SendArguments(channel, body, content_type, headers, idempotency_key=key, priority="high")
    message = build_message(given)
    try:
        (created,) = intake.store([message], repeat=False)
    except NotDurable as exc:  # written; a replica or the AOF did not confirm it in time
        logger.warning("outbox: alert %s to %s: %s", key, channel, exc)
        (created,) = exc.created
    if created.code in ("duplicate", "conflict"):
        logger.info("outbox: alert %s was already sent to %s", key, channel)


def _send_email(channel: str, alert: Alert, key: str) -> bool:
    addresses = admin_addresses()
    if not addresses:
        logger.warning(
            "outbox: no email alert to %s: settings.ADMINS is empty (%s)", channel, alert.subject()
        )
        return False
    _send(
        channel,
        alert.email_text(),
        key,
        content_type="text/plain; charset=utf-8",
        headers={"To": ", ".join(addresses), "Subject": settings.EMAIL_SUBJECT_PREFIX + alert.subject()},
    )
    return True


def admin_addresses() -> list[str]:
    """The email addresses of ``settings.ADMINS`` (``(name, address)`` pairs, or plain
    addresses as Django 6.0 allows)."""
    out = []
    for entry in getattr(settings, "ADMINS", None) or ():
        address = entry[1] if isinstance(entry, (list, tuple)) and len(entry) == 2 else entry
        if isinstance(address, str) and address:
            out.append(address)
    return out


# -- the alert ---------------------------------------------------------------------------
def _iso(epoch: float) -> str:
    return (
        datetime.fromtimestamp(epoch, tz=timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


@dataclass(frozen=True)
class Alert:
    """One alert as delivered (see :meth:`webhook_payload` and :meth:`email_text`).

    Attributes:
        event: the event name, e.g. ``"destination.opened"``.
        destination: the destination it is about.
        at: epoch seconds of the (newest) occurrence.
        count: occurrences no earlier alert reported (this one included): for
            ``message.exhausted``, messages exhausted since ``since``.
        since: epoch seconds of the first of them.
        detail: the newest occurrence's detail (``consecutive_failures``, ``reason``,
            ``id`` and ``error`` of an exhausted message ...).
        endpoint: for an endpoint registered at runtime, its
            :class:`~outbox.destinations.endpoints.EndpointLabel` (application, uid, URL
            host), named in the subject, the email and the webhook's ``data.endpoint``.
    """

    event: str
    destination: str
    at: float
    count: int
    since: float
    detail: dict[str, Any]
    endpoint: Any = None

    @property
    def about(self) -> str:
        """Who it is about: the destination's name, and for an endpoint its uid, URL
        host and application (``endpoint:<hex> (endpoint main (acme.example) of
        application customer-42 (ACME))``)."""
        if self.endpoint is None:
            return self.destination
        return f"{self.destination} ({self.endpoint.text()})"

    def idempotency_key(self, suppress: float) -> str:
        """``alert:<event>:<destination>:<window>``, ``window`` = ``at // suppress``:
        one key per suppression window (the destination hashed when the key would be
        longer than 255 characters)."""
        key = f"alert:{self.event}:{self.destination}:{int(self.at // suppress)}"
        if len(key) > MAX_IDEMPOTENCY_KEY:
            digest = hashlib.sha256(self.destination.encode()).hexdigest()
            key = f"alert:{self.event}:{digest}:{int(self.at // suppress)}"
        return key

    def webhook_payload(self) -> dict[str, Any]:
        """The operational webhook's JSON body, in the Standard Webhooks event shape
        (``type``, ``timestamp`` ISO 8601, ``data``; https://www.standardwebhooks.com/)."""
        if self.event == EXHAUSTED:
            data = {
                "destination": self.destination,
                "count": self.count,
                "since": self.since,
                "last": self.detail,
            }
        else:
            data = {
                "destination": self.destination,
                "at": self.at,
                **self.detail,
                "count": self.count,
                "since": self.since,
            }
        if self.endpoint is not None:
            data["endpoint"] = self.endpoint.as_dict()
        return {"type": self.event, "timestamp": _iso(self.at), "data": data}

    def subject(self) -> str:
        """A one-line subject, e.g. ``outbox: orders: circuit breaker opened (deliveries held)``."""
        template = SUBJECTS.get(self.event, "{d}: " + self.event)
        return "outbox: " + template.format(d=self.about, n=self.count)

    def ordering_lines(self) -> list[str]:
        """What an exhausted alert says of the newest dead letter's ordering key (its
        detail's ``ordering_key`` and ``blocked``, :mod:`outbox.delivery.outcomes`):
        whether its key is blocked, and how to release it. Empty for a message without
        a key."""
        key = self.detail.get("ordering_key")
        if not key:
            return []
        d = self.destination
        if self.detail.get("blocked"):
            return [
                "",
                f"Its ordering key {key!r} is blocked: the key's later messages wait (status waiting) "
                f"until this dead letter is requeued or cancelled: the outbox admin's blocked keys of "
                f"{d!r}, or manage.py outbox_ordering release {d} {key!r} --requeue (or --cancel).",
            ]
        return [
            "",
            f"Its ordering key {key!r} is not blocked (ORDERING 'skip'): the key's next message "
            "is delivered without it.",
        ]

    def email_text(self) -> str:
        """The email body: what happened, when, the detail, and what was suppressed."""
        lines = [self.subject().removeprefix("outbox: ") + ".", ""]
        if self.endpoint is not None:
            e = self.endpoint
            lines += [
                f"Application: {e.application_uid}"
                + (f" ({e.application_name})" if e.application_name else ""),
                f"Endpoint: {e.uid or '(no uid)'}, id {e.id}, URL host {e.host}",
                "",
            ]
        if self.event == EXHAUSTED:
            lines.append(
                f"{self.count} message(s) to {self.about!r} became dead letters after their last retry "
                f"since {_iso(self.since)}."
            )
            if self.detail:
                lines += ["", "Newest:"] + [f"  {k}: {v}" for k, v in self.detail.items()]
                lines += self.ordering_lines()
        else:
            lines.append(f"Event {self.event} at {_iso(self.at)}.")
            lines += [f"  {k}: {v}" for k, v in self.detail.items()]
            if self.count > 1:
                lines += [
                    "",
                    f"It happened {self.count} times since {_iso(self.since)}; "
                    f"{self.count - 1} alert(s) were suppressed.",
                ]
        lines += [
            "",
            "Alerts of one event about one destination are sent at most once per suppression window "
            "(OUTBOX['ALERTS']['SUPPRESS']). The outbox admin shows the destination's current state.",
        ]
        return "\n".join(lines) + "\n"
