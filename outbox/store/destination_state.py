"""Destination state in Redis: health and circuit breaker (``lua/health.lua``), the
operator's pause/resume/disable/enable (``lua/admin.lua``), parked messages put back
(``lua/unpark.lua``) and the probes due (``outbox:probes``). See docs/destinations.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from outbox.store.base import Members, RepositoryBase
from outbox.store.keys import Keys
from outbox.store.scripts import field_names, named

#: The fields of each attempt outcome given to :meth:`MessageRepository.health_args`, in order.
OUTCOME_FIELDS = ("destination", "kind", "ms", "code", "class", "error", "retry_after", "id", "started_at")
#: The fields of each destination's breaker settings in the health config JSON, in order
#: (:func:`outbox.destinations.config.breaker_config_json`).
BREAKER_FIELDS = (
    "failures",
    "failure_rate",
    "min_attempts",
    "window",
    "cooldown",
    "max_cooldown",
    "disable_after",
)


def health_args(
    keys: Keys, channel: str, outcomes: Sequence[Sequence[Any]], config: str, now: float
) -> list[Any]:
    """ARGV of ``lua/health.lua`` (its KEYS: ``[keys.probes]``).

    Args:
        keys: the key names (their prefix is the script's).
        channel: Pub/Sub channel for events, or "" for none.
        outcomes: per attempt ``[destination, kind ("s", "r", "p"), duration ms,
            status code (0 = none), error class, error text, retry-after seconds
            (0 = none), message id, started_at (epoch seconds, optional)]``
            (:data:`OUTCOME_FIELDS`).
        config: JSON destination -> breaker settings (:data:`BREAKER_FIELDS`,
            :func:`outbox.destinations.config.breaker_config_json`).
        now: epoch seconds.
    """
    return named(
        prefix=keys.prefix,
        parts=keys.partitions,
        now=repr(now),
        channel=channel,
        config=config,
        config_fields=field_names(BREAKER_FIELDS),
        outcomes=json.dumps(list(outcomes), separators=(",", ":")),
        outcome_fields=field_names(OUTCOME_FIELDS),
    )


class DestinationState(RepositoryBase):
    """The destination-state part of :class:`~outbox.store.repository.MessageRepository`."""

    def health_args(self, outcomes: Sequence[Sequence[Any]], config: str, now: float) -> list[Any]:
        """ARGV of ``lua/health.lua`` for this repository (see :func:`health_args`)."""
        return health_args(self.keys, self.events_channel, outcomes, config, now)

    def record_outcomes(self, outcomes: Sequence[Sequence[Any]], config: str, now: float) -> list[str]:
        """Record attempt outcomes in destination health alone (``lua/health.lua``);
        returns the destination events (JSON strings)."""
        if not outcomes:
            return []
        reply = self.run_script("health", self.health_args(outcomes, config, now), keys=[self.keys.probes])
        return [e.decode() for e in reply]

    def unpark(self, destination: str, now: float, batch: int = 1000) -> tuple[int, list[str], int]:
        """Put parked messages of ``destination`` back in their due index as far as its
        gate allows (``lua/unpark.lua``, one call, at most ``batch`` messages).

        Returns:
            (messages moved, queues whose wake-up flag the call set, messages still parked).
        """
        moved, woken, left = self.run_script(
            "unpark",
            named(
                prefix=self.keys.prefix,
                parts=self.keys.partitions,
                now=repr(now),
                destination=destination,
                batch=batch,
                wake_ttl_ms=self.wake_ttl_ms,
            ),
            keys=[self.keys.probes, self.keys.dest(destination), *self.keys.every("parked", destination)],
        )
        return int(moved), self.raise_wake_flags([q.decode() for q in woken], now), int(left)

    def destination_action(self, destination: str, action: str, now: float, reason: str = "") -> str | None:
        """Pause, resume, disable or enable a destination (``lua/admin.lua``).

        Returns:
            The event published (JSON), or None when the state did not change.
        """
        reply = self.run_script(
            "admin",
            named(
                now=repr(now),
                channel=self.events_channel,
                destination=destination,
                action=action,
                reason=reason,
            ),
            keys=[self.keys.dest(destination)],
        )
        return bytes(reply).decode() if reply else None

    def due_probes(self, now: float, limit: int = 100) -> list[str]:
        """Destinations whose parked messages the wake check must look at now (``outbox:probes``)."""
        rows = cast(
            Members,
            self.connection.zrangebyscore(self.keys.probes, "-inf", repr(now), start=0, num=limit),
        )
        return [raw.decode() for raw in rows]
