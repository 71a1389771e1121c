"""The Prometheus collector: the outbox's state in Redis as metric families.

A custom collector in the manner of prometheus_client's "Custom Collectors"
(https://prometheus.github.io/client_python/collector/custom/): nothing is counted in
the web process; each scrape reads the outbox's indexes in Redis (see
:mod:`outbox.store.reads.gauges`), so every process that serves the metrics reports the same
numbers and no multiprocess mode is needed. A scrape costs a constant number of round
trips whatever the number of messages: one pipeline of counts, queue depths and blocked
ordering keys (plus two small ones when a destination that is no longer configured still
has messages), one
of destination health (:func:`outbox.destinations.health.get_all_health`), and three for the workers
(:func:`outbox.delivery.liveness.workers`).

When Redis cannot be read, the scrape does not fail: ``outbox_up`` is 0 and the other
outbox metrics are left out (a missing series is not a zero), as exporters do
(``redis_up`` of redis_exporter, ``up`` of Prometheus itself).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _float_to_go_string

from outbox.conf import outbox_settings
from outbox.delivery.liveness import LIVENESS, workers
from outbox.destinations.health import STATES, get_all_health
from outbox.store import get_repository
from outbox.store.reads.gauges import ENDPOINTS_LABEL, read_gauges

#: prometheus_client's own rendering of a bucket bound ("+Inf", "0.25"); its function is unannotated.
floatToGoString: Callable[[float], str] = _float_to_go_string

if TYPE_CHECKING:
    from outbox.destinations.health import DestinationHealth

logger = logging.getLogger("outbox")

#: Values of the ``state`` label of ``outbox_destination_state``: :data:`outbox.destinations.health.STATES`.
DESTINATION_STATES = STATES


@dataclass(frozen=True)
class MetricSpec:
    """One metric the collector exposes (the name as exposed, before type suffixes)."""

    name: str
    type: str  # "gauge", "counter", "histogram"
    labels: tuple[str, ...]
    help: str

    def family(self) -> Any:
        """An empty metric family of this spec: a ``GaugeMetricFamily``,
        ``CounterMetricFamily`` or ``HistogramMetricFamily`` (samples are added with
        its ``add_metric``)."""
        kinds = {
            "gauge": GaugeMetricFamily,
            "counter": CounterMetricFamily,
            "histogram": HistogramMetricFamily,
        }
        return kinds[self.type](self.name, self.help, labels=list(self.labels))


#: Every metric of :class:`OutboxCollector`, by name. ``docs/metrics.md`` lists the same.
METRICS: dict[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        MetricSpec(
            "outbox_messages",
            "gauge",
            ("destination", "status"),
            "Messages in each status, per destination (ZCARD of the status indexes at scrape time).",
        ),
        MetricSpec(
            "outbox_endpoint_counts_age_seconds",
            "gauge",
            (),
            'Age of the destination="endpoint:*" series of outbox_messages and '
            "outbox_ordering_keys_blocked (every endpoint added up): 0 when counted at scrape time, "
            "else the destination summary's age (made by the workers every RECOVERY_INTERVAL).",
        ),
        MetricSpec(
            "outbox_queue_due",
            "gauge",
            ("queue",),
            "Messages due now and not yet claimed by a worker, per queue.",
        ),
        MetricSpec(
            "outbox_queue_scheduled",
            "gauge",
            ("queue",),
            "Messages waiting for a later due time (delayed sends, retries in backoff), per queue.",
        ),
        MetricSpec(
            "outbox_queue_quarantined",
            "gauge",
            ("queue",),
            "Suspects per queue: messages taken back from lost workers, each attempted alone until "
            "an attempt ends in a live process (not counted in outbox_queue_due or _scheduled).",
        ),
        MetricSpec(
            "outbox_oldest_due_age_seconds",
            "gauge",
            ("queue",),
            "Seconds since the earliest due, unclaimed message of the queue became due (0 when none is due).",
        ),
        MetricSpec(
            "outbox_attempts",
            "counter",
            ("destination", "outcome"),
            "Delivery attempts whose outcome a worker recorded, by outcome: succeeded, retryable "
            "(a failure that may be retried), permanent (one that cannot).",
        ),
        MetricSpec(
            "outbox_attempt_duration_seconds",
            "histogram",
            ("destination",),
            "How long delivery attempts took, per destination (log-scale buckets, 1 ms to 32.768 s).",
        ),
        MetricSpec(
            "outbox_destination_state",
            "gauge",
            ("destination", "state"),
            "1 for the destination's one state (the console's and outbox_destination's), 0 for the "
            "others: " + ", ".join(STATES) + ".",
        ),
        MetricSpec(
            "outbox_destination_parked",
            "gauge",
            ("destination",),
            "Messages held back while the destination is paused, disabled or its circuit breaker open.",
        ),
        MetricSpec(
            "outbox_ordering_keys_blocked",
            "gauge",
            ("destination",),
            "Ordering keys whose head is a dead letter (ORDERING 'block'): their later messages wait "
            "until it is requeued or cancelled.",
        ),
        MetricSpec(
            "outbox_destination_consecutive_failures",
            "gauge",
            ("destination",),
            "Failed attempts in a row since the destination's last success.",
        ),
        MetricSpec(
            "outbox_workers",
            "gauge",
            ("state",),
            "RQ workers listed on the outbox queues, by liveness: live (its outbox_worker heartbeat is "
            "fresh), stale (it stopped beating: killed or hung, still listed by RQ), no_heartbeat (not an "
            "outbox_worker: a plain rqworker).",
        ),
        MetricSpec(
            "outbox_up",
            "gauge",
            (),
            "1 if the outbox's Redis answered this scrape, 0 if not (the other outbox metrics are then absent).",
        ),
        MetricSpec(
            "outbox_scrape_duration_seconds",
            "gauge",
            (),
            "Seconds this scrape spent reading the outbox's state from Redis.",
        ),
    )
}


class OutboxCollector(Collector):
    """Yields the outbox metrics of :data:`METRICS`, read from Redis when collected.

    Register it on a ``prometheus_client`` registry (see :func:`outbox.metrics.register`)
    or serve it with :func:`outbox.metrics.views.metrics`. ``describe()`` reads nothing,
    so registering it does not touch Redis.

    ``collect()`` never raises for a Redis or settings problem: it logs a warning and
    yields ``outbox_up 0``.
    """

    def describe(self) -> Iterator[Metric]:
        """The metric families without samples (what ``registry.register`` checks names against)."""
        for spec in METRICS.values():
            yield spec.family()

    def collect(self) -> Iterator[Metric]:
        """The metric families with the values read now."""
        started = time.perf_counter()
        try:
            families = self.read(time.time())
            up = 1.0
        except Exception as exc:  # a scrape reports trouble as outbox_up 0, never as an error page
            logger.warning(
                "outbox metrics: could not read the outbox's state (%s: %s)", type(exc).__name__, exc
            )
            families, up = [], 0.0
        yield from families
        yield _value("outbox_up", up)
        yield _value("outbox_scrape_duration_seconds", time.perf_counter() - started)

    def read(self, now: float) -> list[Metric]:
        """Read Redis and build the metric families (all of them, or an exception).

        Raises:
            redis.exceptions.RedisError: Redis could not be reached.
            django.core.exceptions.ImproperlyConfigured: the outbox's settings are wrong.
        """

        gauges = read_gauges(
            get_repository(),
            outbox_settings.DESTINATIONS,
            outbox_settings.queue_names,
            now,
            bool(outbox_settings.METRICS_ENDPOINT_LABELS),
        )
        messages = METRICS["outbox_messages"].family()
        for destination, counts in sorted(gauges.messages.items()):
            for status, count in counts.items():
                messages.add_metric([destination, status], count)
        due = METRICS["outbox_queue_due"].family()
        scheduled = METRICS["outbox_queue_scheduled"].family()
        quarantined = METRICS["outbox_queue_quarantined"].family()
        oldest = METRICS["outbox_oldest_due_age_seconds"].family()
        blocked = METRICS["outbox_ordering_keys_blocked"].family()
        for destination, count in sorted(gauges.blocked.items()):
            blocked.add_metric([destination], count)
        for depth in gauges.queues:
            due.add_metric([depth.queue], depth.due)
            scheduled.add_metric([depth.queue], depth.scheduled)
            quarantined.add_metric([depth.queue], depth.quarantined)
            age = 0.0 if depth.oldest_due_at is None else max(0.0, now - depth.oldest_due_at)
            oldest.add_metric([depth.queue], age)
        return [
            messages,
            due,
            scheduled,
            quarantined,
            oldest,
            blocked,
            *_endpoints_age(gauges.endpoints_age),
            *health_families(get_all_health(sorted(set(gauges.messages) - {ENDPOINTS_LABEL}), now)),
            *worker_families(outbox_settings.queue_names, now),
        ]


def _endpoints_age(age: float | None) -> list[Metric]:
    """``outbox_endpoint_counts_age_seconds``, with a sample when the ``endpoint:*`` series exist."""
    family = METRICS["outbox_endpoint_counts_age_seconds"].family()
    if age is not None:
        family.add_metric([], age)
    return [family]


def health_families(healths: Mapping[str, DestinationHealth]) -> list[Metric]:
    """The destination-health metric families of :data:`METRICS` (attempts, their
    duration, state, parked messages, consecutive failures) from :mod:`outbox.destinations.health`."""
    attempts = METRICS["outbox_attempts"].family()
    duration = METRICS["outbox_attempt_duration_seconds"].family()
    state = METRICS["outbox_destination_state"].family()
    parked = METRICS["outbox_destination_parked"].family()
    consecutive = METRICS["outbox_destination_consecutive_failures"].family()
    for name, h in sorted(healths.items()):
        for outcome, count in h.totals.items():
            attempts.add_metric([name, outcome], count)
        duration.add_metric(
            [name],
            buckets=[(floatToGoString(bound), count) for bound, count in h.latency_buckets],
            sum_value=h.latency_sum_seconds,
        )
        for value in DESTINATION_STATES:
            state.add_metric([name, value], 1.0 if h.state == value else 0.0)
        parked.add_metric([name], h.parked)
        consecutive.add_metric([name], h.consecutive_failures)
    return [attempts, duration, state, parked, consecutive]


def worker_families(queues: list[str], now: float) -> list[Metric]:
    """``outbox_workers`` by liveness (:func:`outbox.delivery.liveness.workers`), or nothing when
    RQ's Redis cannot be read (logged; the outbox's own metrics are still served)."""

    try:
        _, listed = workers(queues, now)
    except Exception as exc:  # RQ's Redis may be another server than the outbox's
        logger.warning("outbox metrics: could not read RQ's workers (%s: %s)", type(exc).__name__, exc)
        return []
    family = METRICS["outbox_workers"].family()
    for state in LIVENESS:
        family.add_metric([state], sum(1 for w in listed if w.liveness == state))
    return [family]


def _value(name: str, value: float) -> Metric:
    family: GaugeMetricFamily = METRICS[name].family()
    family.add_metric([], value)
    return family
