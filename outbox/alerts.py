"""Destination events in the process that made the change: Django signals.

A minimal version shipped with the health engine (issue 8): :func:`notify` sends the
signal of each event (:data:`outbox.events.DESTINATION_SIGNALS`). Alert delivery (email,
webhook, suppression) is built on branch ``h8-alerts``, which replaces this module.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .events import DESTINATION_SIGNALS

if TYPE_CHECKING:
    from .health import DestinationEvent

logger = logging.getLogger("outbox")


def notify(events: Sequence[DestinationEvent]) -> None:
    """Send the Django signal of each event (``sender`` the event's class, keyword
    ``event``); a receiver that raises is logged. Never raises."""
    for event in events:
        signal = DESTINATION_SIGNALS.get(event.event)
        if signal is None:
            continue
        try:
            for receiver, result in signal.send_robust(sender=type(event), event=event):
                if isinstance(result, Exception):
                    logger.error(
                        "outbox signal receiver %r failed for %s", receiver, event.event, exc_info=result
                    )
        except Exception:
            logger.exception("outbox: sending %s failed", event.event)
