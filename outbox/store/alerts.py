"""Alert suppression in Redis (``lua/alert.lua``, ``outbox:alert:*``): whether an alert
about (event, destination) goes out now, atomically across workers, and which
suppressed ones must be reported when their window ends (:mod:`outbox.destinations.alerts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from outbox.store.base import Members, RepositoryBase
from outbox.store.scripts import named


@dataclass(frozen=True)
class AlertWindow:
    """An alert that goes now (:meth:`MessageRepository.alert_window`): ``count``
    occurrences since ``since`` (epoch seconds) that no alert reported yet, the newest
    one's detail as JSON in ``last``."""

    count: int
    since: float
    last: str


@dataclass(frozen=True)
class Occurrences:
    """Occurrences of an alert's event about a destination, to count
    (:meth:`AlertStore.alert_window`).

    Attributes:
        event: the event, e.g. ``"destination.opened"``.
        destination: the destination it is about.
        add: occurrences to count (0: a trailing flush, see :meth:`AlertStore.alerts_to_flush`).
        since: epoch seconds of the first of them.
        last: JSON detail of the newest occurrence ("" when none).
    """

    event: str
    destination: str
    add: int
    since: float
    last: str = ""


class AlertStore(RepositoryBase):
    """The alerts part of :class:`~outbox.store.repository.MessageRepository`."""

    def alert_window(
        self, occurrences: Occurrences, *, now: float, window: float, trailing: bool
    ) -> AlertWindow | None:
        """Count ``occurrences`` of an event about a destination and open its suppression
        window if none is open (``lua/alert.lua``, atomic across workers).

        Args:
            window: suppression window in seconds.
            trailing: when suppressed, schedule a flush at the window's end.

        Returns:
            An :class:`AlertWindow` when the alert goes now (the count is taken), None
            when suppressed or a flush has nothing to report.
        """
        o = occurrences
        reply = self.run_script(
            "alert",
            named(
                event=o.event,
                destination=o.destination,
                add=o.add,
                since=repr(o.since),
                now=repr(now),
                window_ms=max(1, int(window * 1000)),
                trailing="1" if trailing else "0",
                last=o.last,
            ),
            keys=[
                self.keys.alert_sent(o.event, o.destination),
                self.keys.alert_count(o.event, o.destination),
                self.keys.alert_flush,
            ],
        )
        if int(reply[0]) != 1:
            return None
        n, first, newest = reply[1:4]
        return AlertWindow(int(n or 0), float(first) if first else now, newest.decode() if newest else "")

    def alerts_to_flush(self, now: float, limit: int = 100) -> list[tuple[str, str]]:
        """(event, destination) pairs whose suppression window has ended with occurrences
        not reported yet (``outbox:alert:flush``), oldest first."""
        raw = cast(
            Members,
            self.connection.zrangebyscore(self.keys.alert_flush, "-inf", repr(now), start=0, num=limit),
        )
        pairs = [r.decode().split("|", 1) for r in raw]
        return [(p[0], p[1]) for p in pairs if len(p) == 2]
