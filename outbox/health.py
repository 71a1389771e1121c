"""Deprecated path of :mod:`outbox.destinations.health` and
:mod:`outbox.destinations.controls` (moved in 0.2; goes in 0.3)."""

from outbox._moved import forward

__getattr__ = forward(
    __name__,
    "outbox.destinations.health",
    "outbox.events",
    "outbox.destinations.controls",
    "outbox.destinations.config",
    renamed={
        "EVENTS": "outbox.events.DESTINATION_EVENTS",
        "health_config_json": "outbox.destinations.config.breaker_config_json",
        "notify": "outbox.events.send_destination_events",
    },
)
