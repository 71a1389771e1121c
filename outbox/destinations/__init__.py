"""Destinations: where messages go, how each is protected, how each is doing.

- :mod:`~outbox.destinations.config`: ``OUTBOX["DESTINATIONS"]`` parsed into
  :class:`Destination` objects (re-exported here: ``outbox.destinations.get_destination``
  is the documented name).
- :mod:`~outbox.destinations.limits`: breaker, rate limit, concurrency cap, disable-after.
- :mod:`~outbox.destinations.health`: what each destination's attempts did lately.
- :mod:`~outbox.alerts`: signals, email and webhooks about destination events.
"""

from outbox.destinations.config import (
    DESTINATION_KEYS,
    Destination,
    clear_cache,
    close_transports,
    configuration_errors,
    get_destination,
    get_transport,
    usable_destinations,
    validate_max_retries,
)

__all__ = [
    "DESTINATION_KEYS",
    "Destination",
    "clear_cache",
    "close_transports",
    "configuration_errors",
    "get_destination",
    "get_transport",
    "usable_destinations",
    "validate_max_retries",
]
