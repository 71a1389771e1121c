"""Deprecated path of :mod:`outbox.store.client.connection` (moved in 0.2; goes in 0.3)."""

from outbox._moved import forward

__getattr__ = forward(__name__, "outbox.store.client.connection", "outbox.store")
