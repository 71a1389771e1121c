"""Deprecated path of :mod:`outbox.destinations.health` and
:mod:`outbox.destinations.controls` (moved in 0.2; goes in 0.3)."""

from outbox._moved import forward

__getattr__ = forward(
    __name__,
    "outbox.destinations.health",
    "outbox.destinations.controls",
    "outbox.destinations.config",
    "outbox.events",
)
