"""Putting the outbox collector on a ``prometheus_client`` registry (django-prometheus's,
by default ``prometheus_client.REGISTRY``), once per registry."""

from __future__ import annotations

import threading
import weakref

from prometheus_client.registry import REGISTRY, CollectorRegistry

from outbox.metrics.collector import OutboxCollector

_registered: weakref.WeakKeyDictionary[CollectorRegistry, OutboxCollector] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def register(registry: CollectorRegistry | None = None) -> OutboxCollector:
    """Register an :class:`OutboxCollector` on ``registry`` (default
    ``prometheus_client.REGISTRY``, the one django-prometheus's ``/metrics`` serves
    outside its multiprocess mode). Idempotent: a second call for the same registry
    returns the collector already there. Reads nothing from Redis (the collector has a
    ``describe()``).

    Returns:
        The collector registered on ``registry``.

    Raises:
        ValueError: from ``registry.register``, when another collector already exposes
            metrics named like the outbox's (e.g. an :class:`OutboxCollector` registered
            by hand).
    """
    registry = REGISTRY if registry is None else registry
    with _lock:
        collector = _registered.get(registry)
        if collector is None:
            collector = OutboxCollector()
            registry.register(collector)
            _registered[registry] = collector
        return collector


def unregister(registry: CollectorRegistry | None = None) -> bool:
    """Remove the collector :func:`register` put on ``registry`` (default ``REGISTRY``).

    Returns:
        True if one was registered there.
    """
    registry = REGISTRY if registry is None else registry
    with _lock:
        collector = _registered.pop(registry, None)
        if collector is None:
            return False
        registry.unregister(collector)
        return True
