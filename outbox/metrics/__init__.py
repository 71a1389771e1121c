"""Prometheus metrics of the outbox, read from Redis at scrape time.

Needs ``prometheus_client`` (``pip install "django-redis-outbox[metrics]"``); the rest of
the outbox never imports this package.

* :class:`~outbox.metrics.collector.OutboxCollector`: a custom collector
  (``prometheus_client.registry.Collector``) whose ``collect()`` reads the outbox's
  indexes in Redis in a bounded number of round trips and yields metric families.
  Every web process that serves it reports the same numbers (no multiprocess mode).
* :func:`outbox.metrics.views.metrics`: a view serving them in the text exposition
  format (staff users, or a bearer token from ``OUTBOX["METRICS_TOKEN"]``); include
  ``outbox.metrics.urls``.
* :func:`register`: add the collector to a registry, ``prometheus_client.REGISTRY`` by
  default, so django-prometheus's ``/metrics`` carries the outbox metrics too
  (``OUTBOX["METRICS_REGISTER"] = True`` does it when Django starts).

Metric names, types and labels: ``docs/metrics.md`` and :data:`~outbox.metrics.collector.METRICS`.
"""

from __future__ import annotations

try:
    import prometheus_client  # noqa: F401
except ImportError as exc:
    raise ImportError(
        "outbox.metrics needs prometheus_client: pip install 'django-redis-outbox[metrics]'"
    ) from exc

from outbox.metrics.collector import METRICS, OutboxCollector
from outbox.metrics.registration import register, unregister

__all__ = ["METRICS", "OutboxCollector", "register", "unregister"]
