"""Destinations: named places messages go, from ``OUTBOX["DESTINATIONS"]``.

Each entry::

    "orders": {
        "TRANSPORT": "webhook",                 # alias or dotted path to a Transport class
        "OPTIONS": {"url": "https://...", "secret": "whsec_..."},
        "MAX_RETRIES": 5,                       # optional; else OUTBOX["MAX_RETRIES"]
        "RETRY": {"base": 2, "max_delay": 600}, # optional; over OUTBOX["RETRY"]
        "MAX_IN_FLIGHT": 8,                     # optional; else OUTBOX["MAX_IN_FLIGHT"] (a callable: CONCURRENCY)
        "BREAKER": {"FAILURES": 5},             # optional; over OUTBOX["BREAKER"]; False = none
        "RATE_LIMIT": "100/s",                  # optional; across all workers (GCRA)
        "MAX_CONCURRENCY": 4,                   # optional; attempts in flight across all workers
        "DISABLE_AFTER": 3 * 24 * 3600,         # optional; seconds failing before auto-disable
        "ORDERING": "skip",                     # optional; else OUTBOX["ORDERING"] ("block")
    }

The last four are parsed by :mod:`outbox.destinations.limits` and enforced in Redis (see
:mod:`outbox.destinations.health` and ``docs/destinations.md``).

Transports are built once per process and reused (:func:`get_transport`), so HTTP
connections to a receiver stay open across attempts.

Retry settings resolve message -> destination -> global default, as Dramatiq's
retries middleware resolves message -> actor -> default.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from outbox.conf import MAX_RETRIES_LIMIT, outbox_settings
from outbox.destinations.limits import BreakerConfig, RateLimit, parse_disable_after, parse_max_concurrency
from outbox.exceptions import UnknownDestination
from outbox.retry import RetryPolicy
from outbox.transports import Transport, transport_class

DESTINATION_KEYS = {
    "TRANSPORT",
    "OPTIONS",
    "MAX_RETRIES",
    "RETRY",
    "MAX_IN_FLIGHT",
    "BREAKER",
    "RATE_LIMIT",
    "MAX_CONCURRENCY",
    "DISABLE_AFTER",
    "ORDERING",
}

#: What a dead letter does to its ordering key (``OUTBOX["ORDERING"]``, a destination's
#: ``ORDERING``): ``block`` holds the key's later messages until it is requeued,
#: cancelled or deleted; ``skip`` sets it aside and the key goes on.
ORDERING_POLICIES = ("block", "skip")

logger = logging.getLogger("outbox")
_transports: dict[str, Transport] = {}


@dataclass(frozen=True)
class Destination:
    """A configured destination.

    Attributes:
        name: the key in ``OUTBOX["DESTINATIONS"]``.
        transport_path: the ``TRANSPORT`` value.
        options: the ``OPTIONS`` dict.
        max_retries: retries after the first attempt.
        retry_policy: the destination's resolved :class:`RetryPolicy`.
        max_in_flight: most attempts to it in flight at once in one worker process (its
            share of the worker's slots when ``max_in_flight_default``).
        breaker: its circuit breaker, or None (``BREAKER: False``).
        rate_limit: its rate limit across all workers, or None.
        max_concurrency: most attempts to it in flight across all workers, or None.
        disable_after: seconds of continuous failure before it is disabled, or None.
        max_in_flight_default: ``max_in_flight`` is ``OUTBOX``'s built-in default (set
            neither by the destination, nor by ``OUTBOX["MAX_IN_FLIGHT"]``, nor by its
            transport): a share of the worker's slots while destinations compete, and a
            run may lend it idle slots when it alone is busy (:mod:`outbox.delivery`). A
            ``MAX_IN_FLIGHT`` someone set is a hard limit.
        ordering: what a dead letter does to its ordering key, ``"block"`` or ``"skip"``
            (:data:`ORDERING_POLICIES`).
    """

    name: str
    transport_path: str
    options: dict[str, Any]
    max_retries: int
    retry_policy: RetryPolicy
    max_in_flight: int = 16
    breaker: BreakerConfig | None = BreakerConfig()
    rate_limit: RateLimit | None = None
    max_concurrency: int | None = None
    disable_after: float | None = None
    max_in_flight_default: bool = False
    ordering: str = "block"

    def build_transport(self) -> Transport:
        """A new transport instance for this destination.

        Raises:
            ImproperlyConfigured: the transport refuses the options.
        """
        return transport_class(self.transport_path)(self.name, **self.options)


def validate_max_retries(value: object, where: str) -> int:
    """Check a max_retries value: an int from 0 to 1000.

    Raises:
        ValueError: not such an int.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES_LIMIT:
        raise ValueError(f"{where} must be an integer from 0 to {MAX_RETRIES_LIMIT}, not {value!r}")
    return value


def parse_ordering(value: object, where: str) -> str:
    """Check an ordering policy: one of :data:`ORDERING_POLICIES`.

    Raises:
        ValueError: anything else.
    """
    if value not in ORDERING_POLICIES:
        raise ValueError(f"{where} must be one of {', '.join(ORDERING_POLICIES)}, not {value!r}")
    return str(value)


def _build(name: str, config: Any) -> Destination:
    """The :class:`Destination` of ``OUTBOX["DESTINATIONS"][name]``.

    Raises:
        ImproperlyConfigured: its first problem (:func:`_parse` lists them all).
    """
    destination, problems = _parse(name, config)
    if problems or destination is None:
        raise ImproperlyConfigured(problems[0])
    return destination


def _parse(name: str, config: Any) -> tuple[Destination | None, list[str]]:
    """The destination of ``config`` and every problem found in it, each checked on its
    own: an unknown key does not hide a bad ``MAX_RETRIES`` nor a typo in ``OPTIONS`` (the
    transport refuses its options when it is built). The destination is None when there
    is any problem."""
    where = f"OUTBOX['DESTINATIONS'][{name!r}]"
    if not isinstance(config, dict):
        return None, [f"{where} must be a dict with at least 'TRANSPORT'"]
    problems: list[str] = []
    unknown = set(config) - DESTINATION_KEYS
    if unknown:
        problems.append(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if "TRANSPORT" not in config:
        problems.append(f"{where} has no 'TRANSPORT'")
    options = config.get("OPTIONS", {})
    if not isinstance(options, dict):
        problems.append(f"{where}['OPTIONS'] must be a dict")
    try:
        cls = transport_class(config["TRANSPORT"])
        transport_default = cls.max_in_flight or (outbox_settings.CONCURRENCY if cls.in_process else None)
    except Exception:  # reported below by build_transport
        transport_default = None
    max_in_flight = config.get("MAX_IN_FLIGHT", transport_default or outbox_settings.MAX_IN_FLIGHT)
    max_in_flight_default = (
        "MAX_IN_FLIGHT" not in config
        and not transport_default
        and "MAX_IN_FLIGHT" not in outbox_settings.user_settings
    )
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        problems.append(f"{where}['MAX_IN_FLIGHT'] must be a positive integer, not {max_in_flight!r}")

    def parsed(parse: Callable[[], Any]) -> Any:
        try:
            return parse()
        except ValueError as exc:
            problems.append(str(exc) if str(exc).startswith(where) else f"{where}: {exc}")
            return None

    max_retries = parsed(
        lambda: validate_max_retries(
            config.get("MAX_RETRIES", outbox_settings.MAX_RETRIES), f"{where}['MAX_RETRIES']"
        )
    )
    policy = parsed(lambda: RetryPolicy.from_value(config.get("RETRY"), default=outbox_settings.retry_policy))
    breaker = parsed(
        lambda: BreakerConfig.parse(
            config.get("BREAKER", outbox_settings.BREAKER), outbox_settings.BREAKER, f"{where}['BREAKER']"
        )
    )
    rate_limit = parsed(
        lambda: RateLimit.parse(
            config.get("RATE_LIMIT", outbox_settings.RATE_LIMIT), f"{where}['RATE_LIMIT']"
        )
    )
    max_concurrency = parsed(
        lambda: parse_max_concurrency(
            config.get("MAX_CONCURRENCY", outbox_settings.MAX_CONCURRENCY), f"{where}['MAX_CONCURRENCY']"
        )
    )
    disable_after = parsed(
        lambda: parse_disable_after(
            config.get("DISABLE_AFTER", outbox_settings.DISABLE_AFTER), f"{where}['DISABLE_AFTER']"
        )
    )
    ordering = parsed(
        lambda: parse_ordering(config.get("ORDERING", outbox_settings.ORDERING), f"{where}['ORDERING']")
    )
    if "TRANSPORT" in config and isinstance(options, dict):
        try:  # refuses bad options now, not at the first delivery
            transport_class(config["TRANSPORT"])(name, **options)
        except ImproperlyConfigured as exc:
            problems.append(str(exc))
    if problems:
        return None, problems
    return (
        Destination(
            name,
            config["TRANSPORT"],
            dict(options),
            max_retries,
            policy,
            max_in_flight,
            breaker,
            rate_limit,
            max_concurrency,
            disable_after,
            max_in_flight_default,
            ordering,
        ),
        [],
    )


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


def usable_destinations() -> dict[str, Destination]:
    """Every configured destination that builds, by name. A broken entry is left out: its
    attempts fail at once (permanently) and the system checks report it."""
    found = {}
    for name in outbox_settings.DESTINATIONS:
        try:
            found[name] = get_destination(name)
        except Exception:
            continue
    return found


def configuration_errors() -> list[str]:
    """Every problem with ``OUTBOX["DESTINATIONS"]``, as messages (for system checks),
    each naming its destination: all of each destination's, not only its first."""
    errors = []
    destinations = outbox_settings.DESTINATIONS
    if not isinstance(destinations, dict):
        return ["OUTBOX['DESTINATIONS'] must be a dict of name -> destination settings"]
    for name, config in destinations.items():
        for text in _parse(name, config)[1]:
            # every message names its destination (a transport's own may not)
            errors.append(text if repr(name) in text else f"OUTBOX['DESTINATIONS'][{name!r}]: {text}")
    return errors


def get_transport(destination: str) -> Transport:
    """The transport of a destination, built once per process and reused (connection reuse).

    Raises:
        UnknownDestination: the destination is not (or no longer) in settings.
        ImproperlyConfigured: its settings are invalid.
    """
    transport = _transports.get(destination)
    if transport is None:
        transport = get_destination(destination).build_transport()
        _transports[destination] = transport
    return transport


def close_transports() -> None:
    """Close and forget every cached transport (closing is best effort: errors are logged)."""
    while _transports:
        _, transport = _transports.popitem()
        try:
            transport.close()
        except Exception:
            logger.exception("closing transport failed")


def clear_cache() -> None:
    """Forget built destinations, the scripts' views of them, and close their transports."""
    get_destination.cache_clear()
    breaker_config_json.cache_clear()
    limits_json.cache_clear()
    close_transports()


# -- settings as the scripts take them ------------------------------------------------------
@cache
def breaker_config_json() -> str:
    """JSON destination -> ``[failures (0 = no breaker), failure rate, min attempts, window,
    cool-down, max cool-down, disable after (0 = never)]`` for ``lua/health.lua``."""
    config = {}
    for name, d in usable_destinations().items():
        b = d.breaker
        config[name] = [
            b.failures if b else 0,
            b.failure_rate if b else 1.0,
            b.min_attempts if b else 1,
            b.window if b else 60,
            b.cooldown if b else 1.0,
            b.max_cooldown if b else 1.0,
            d.disable_after or 0,
        ]
    return json.dumps(config, separators=(",", ":"))


@cache
def limits_json() -> str:
    """JSON destination -> ``[emission interval T, tolerance tau, max concurrency]``
    (0 = none) for ``lua/claim.lua``; only destinations with a limit."""
    config = {}
    for name, d in usable_destinations().items():
        if d.rate_limit or d.max_concurrency:
            rl = d.rate_limit
            config[name] = [rl.interval if rl else 0, rl.tolerance if rl else 0, d.max_concurrency or 0]
    return json.dumps(config, separators=(",", ":"))


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("OUTBOX", "EMAIL_BACKEND", "EMAIL_TIMEOUT", "MAILERS"):
        clear_cache()
