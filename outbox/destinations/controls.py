"""Operator controls of destinations: pause, resume, disable, enable, and the release of
parked messages (``docs/destinations.md``).

Each action changes the destination's admin state atomically in Redis and publishes an
event; a paused or disabled destination delivers nothing and loses nothing: its messages
wait in ``outbox:parked:<name>`` and :func:`resume`/:func:`enable` put them back, oldest
due first. The events reach the Django signals and the alerts through
:func:`outbox.events.send_destination_events`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from outbox.conf import outbox_settings
from outbox.destinations.config import usable_destinations
from outbox.endpoint_names import is_endpoint
from outbox.events import DestinationEvent, send_destination_events
from outbox.exceptions import UnknownDestination
from outbox.store import get_repository
from outbox.store.background import wakeups

logger = logging.getLogger("outbox")

UNPARK_BATCH = 1000  # messages moved per unpark script call


def _check(name: str) -> None:
    if is_endpoint(name):  # an endpoint registered at runtime (outbox.webhooks checks it exists)
        return
    if not isinstance(name, str) or name not in outbox_settings.DESTINATIONS:
        known = ", ".join(sorted(outbox_settings.DESTINATIONS)) or "none configured"
        raise UnknownDestination(f"unknown destination {name!r} (known: {known})", field="destination")


def _act(name: str, action: str, reason: str) -> bool:
    _check(name)
    raw = get_repository().destination_action(name, action, time.time(), reason)
    if raw:
        send_destination_events([DestinationEvent.from_json(raw)])
    return raw is not None


def pause(name: str, *, reason: str = "") -> None:
    """Stop delivering to ``name``: its messages wait (parked) until :func:`resume`.
    Attempts in flight finish; a retryable failure among them parks with no retry charged.

    Raises:
        UnknownDestination: not a configured destination (nor an endpoint's name).
    """
    _act(name, "pause", reason)


def resume(name: str) -> int:
    """Deliver to a paused destination again; returns how many parked messages were put
    back in their queue (oldest due first). Its breaker, if open, still gates them.

    Raises:
        UnknownDestination: not a configured destination (nor an endpoint's name).
    """
    _act(name, "resume", "")
    return unpark_all(name)


def disable(name: str, *, reason: str = "") -> None:
    """Disable ``name`` (as :func:`pause`, shown as disabled, with a reason; also done
    automatically on ``410 Gone`` and after ``DISABLE_AFTER`` of continuous failure).

    Raises:
        UnknownDestination: not a configured destination (nor an endpoint's name).
    """
    _act(name, "disable", reason or "manual")


def enable(name: str) -> int:
    """Enable a disabled destination: its breaker closes and its failure run is
    forgotten; returns how many parked messages were put back (oldest due first).

    Raises:
        UnknownDestination: not a configured destination (nor an endpoint's name).
    """
    _act(name, "enable", "")
    return unpark_all(name)


def unpark_all(name: str, now: float | None = None, *, budget: float | None = None) -> int:
    """Put back every parked message of ``name`` its gate allows (``lua/unpark.lua``,
    :data:`UNPARK_BATCH` per call, while calls move full batches: an open breaker lets
    one probe go, not one per call) and wake their queues; returns how many moved.

    ``budget`` (seconds) stops early; the rest is left to the wake check
    (:func:`release_parked_due`), which the script keeps informed through ``outbox:probes``.
    """
    repo = get_repository()
    stop_at = None if budget is None else time.monotonic() + budget
    total = 0
    while True:
        moved, woken, left = repo.unpark(name, time.time() if now is None else now, UNPARK_BATCH)
        wakeups.enqueue_wakeups(woken)
        total += moved
        if moved < UNPARK_BATCH or not left or (stop_at is not None and time.monotonic() > stop_at):
            return total


def release_parked_due(now: float | None = None, budget: float = 0.5) -> int:
    """The wake check's part (run each ``WAKE_INTERVAL`` by every ``outbox_worker``): for
    each destination in ``outbox:probes`` whose time has come, unpark what its gate
    allows (the one probe of an open breaker, or batches behind one that closed, for up
    to ``budget`` seconds per destination) and wake the queues. Returns messages moved."""
    now = time.time() if now is None else now
    return sum(unpark_all(name, now, budget=budget) for name in get_repository().due_probes(now))


def close_breakers_left() -> list[str]:
    """Close the circuit breaker of each destination that has none configured now
    (``"BREAKER": False``, or no ``OUTBOX["BREAKER"]``) but whose state an earlier
    setting left ``open`` or ``half_open``, and put its parked messages back: otherwise
    they would stay parked for good, one probe per cool-down or visibility timeout. Run
    by the recovery sweep (every ``RECOVERY_INTERVAL`` seconds); a delivery outcome of
    such a destination closes it too (``lua/health.lua``). Sends a ``destination.closed``
    event (``reason``: "no breaker configured") for each.

    Reads one field per such destination (one pipelined round trip); returns the names
    closed.
    """
    names = [name for name, d in usable_destinations().items() if d.breaker is None]
    repo = get_repository()
    closed = []
    for name in repo.breakers_not_closed(names):
        raw = repo.destination_action(name, "close", time.time(), "no breaker configured")
        if raw:
            send_destination_events([DestinationEvent.from_json(raw)])
            logger.warning(
                "outbox: destination %r has no circuit breaker configured; the state an earlier "
                "setting left open was closed and its parked messages put back",
                name,
            )
            unpark_all(name)
            closed.append(name)
    return closed


def parse_events(raw: Iterable[str | bytes]) -> list[DestinationEvent]:
    """Events from the JSON the scripts return (unparseable ones are logged and skipped)."""
    out = []
    for item in raw:
        try:
            out.append(DestinationEvent.from_json(item))
        except (ValueError, KeyError, TypeError):
            logger.warning("outbox: unreadable destination event %r", item)
    return out
