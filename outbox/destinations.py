"""Destinations: named places messages go, from ``OUTBOX["DESTINATIONS"]``.

Each entry::

    "orders": {
        "TRANSPORT": "webhook",                 # alias or dotted path to a Transport class
        "OPTIONS": {"url": "https://...", "secret": "whsec_..."},
        "MAX_RETRIES": 5,                       # optional; else OUTBOX["MAX_RETRIES"]
        "RETRY": {"base": 2, "max_delay": 600}, # optional; over OUTBOX["RETRY"]
    }

Retry settings resolve message -> destination -> global default, as Dramatiq's
retries middleware resolves message -> actor -> default.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .conf import MAX_RETRIES_LIMIT, outbox_settings
from .exceptions import UnknownDestination
from .retry import RetryPolicy
from .transports import Transport, transport_class

DESTINATION_KEYS = {"TRANSPORT", "OPTIONS", "MAX_RETRIES", "RETRY"}


@dataclass(frozen=True)
class Destination:
    """A configured destination.

    Attributes:
        name: the key in ``OUTBOX["DESTINATIONS"]``.
        transport_path: the ``TRANSPORT`` value.
        options: the ``OPTIONS`` dict.
        max_retries: retries after the first attempt.
        retry_policy: the destination's resolved :class:`RetryPolicy`.
    """

    name: str
    transport_path: str
    options: dict[str, Any]
    max_retries: int
    retry_policy: RetryPolicy

    def build_transport(self) -> Transport:
        """A new transport instance for this destination.

        Raises:
            ImproperlyConfigured: the transport refuses the options.
        """
        return transport_class(self.transport_path)(self.name, **self.options)


def validate_max_retries(value: Any, where: str) -> int:
    """Check a max_retries value: an int from 0 to 1000.

    Raises:
        ValueError: not such an int.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES_LIMIT:
        raise ValueError(f"{where} must be an integer from 0 to {MAX_RETRIES_LIMIT}, not {value!r}")
    return value


def _build(name: str, config: Any) -> Destination:
    where = f"OUTBOX['DESTINATIONS'][{name!r}]"
    if not isinstance(config, dict):
        raise ImproperlyConfigured(f"{where} must be a dict with at least 'TRANSPORT'")
    unknown = set(config) - DESTINATION_KEYS
    if unknown:
        raise ImproperlyConfigured(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if "TRANSPORT" not in config:
        raise ImproperlyConfigured(f"{where} has no 'TRANSPORT'")
    options = config.get("OPTIONS", {})
    if not isinstance(options, dict):
        raise ImproperlyConfigured(f"{where}['OPTIONS'] must be a dict")
    try:
        max_retries = validate_max_retries(config.get("MAX_RETRIES", outbox_settings.MAX_RETRIES), f"{where}['MAX_RETRIES']")
        policy = RetryPolicy.from_value(config.get("RETRY"), default=outbox_settings.retry_policy)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{where}: {exc}") from exc
    destination = Destination(name, config["TRANSPORT"], dict(options), max_retries, policy)
    destination.build_transport()  # refuses bad options now, not at the first delivery
    return destination


@cache
def get_destination(name: str) -> Destination:
    """The destination called ``name``.

    Raises:
        UnknownDestination: no such key in ``OUTBOX["DESTINATIONS"]``.
        ImproperlyConfigured: the entry is malformed.
    """
    destinations = outbox_settings.DESTINATIONS
    if not isinstance(name, str) or name not in destinations:
        known = ", ".join(sorted(destinations)) or "none configured"
        raise UnknownDestination(f"unknown destination {name!r} (known: {known})", field="destination")
    return _build(name, destinations[name])


def configuration_errors() -> list[str]:
    """Every problem with ``OUTBOX["DESTINATIONS"]``, as messages (for system checks)."""
    errors = []
    destinations = outbox_settings.DESTINATIONS
    if not isinstance(destinations, dict):
        return ["OUTBOX['DESTINATIONS'] must be a dict of name -> destination settings"]
    for name, config in destinations.items():
        try:
            _build(name, config)
        except ImproperlyConfigured as exc:
            errors.append(str(exc))
    return errors


def clear_cache() -> None:
    """Forget built destinations (on settings change)."""
    get_destination.cache_clear()
