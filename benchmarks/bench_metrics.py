"""What a Prometheus scrape of the outbox costs, empty and with N pending messages
(``generate_latest`` of a registry holding :class:`outbox.metrics.OutboxCollector`,
median of 20 scrapes each).

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=benchmarks.settings python -m benchmarks.bench_metrics [N]
"""

from __future__ import annotations

import statistics
import sys
import time

import django


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    django.setup()
    from prometheus_client import CollectorRegistry, generate_latest

    import outbox
    from outbox.conf import outbox_settings
    from outbox.metrics import OutboxCollector
    from outbox.store.client.connection import get_connection

    registry = CollectorRegistry()
    registry.register(OutboxCollector())

    def scrape_ms() -> float:
        times = []
        for _ in range(20):
            started = time.perf_counter()
            generate_latest(registry)
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    get_connection().flushdb()
    print(f"{len(outbox_settings.DESTINATIONS)} destinations, {len(outbox_settings.queue_names)} queues")
    print(f"no message: {scrape_ms():.2f} ms per scrape")
    for start in range(0, n, 1000):
        outbox.send_many(
            [
                {"destination": "orders", "body": i, "delay": (i % 3) * 60}
                for i in range(start, min(n, start + 1000))
            ]
        )
    print(f"{n:,} pending messages: {scrape_ms():.2f} ms per scrape")
    get_connection().flushdb()


if __name__ == "__main__":
    main()
