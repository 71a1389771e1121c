"""Deprecated path of :mod:`outbox.store.background.wakeups` (moved in 0.2; goes in 0.3)."""

from outbox._moved import forward

__getattr__ = forward(__name__, "outbox.store.background.wakeups", "outbox.delivery.recovery")
