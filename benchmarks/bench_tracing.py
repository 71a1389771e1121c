"""What tracing costs ``send()`` (outside a transaction, locmem destination): with
``OUTBOX["TRACING"]`` off, with opentelemetry-api installed and no SDK configured (the
default for a project that does not trace), and with the SDK recording every span to an
in-memory exporter. Interleaved rounds, medians.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=benchmarks.settings python -m benchmarks.bench_tracing [N] [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time

import django


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    django.setup()
    from django.conf import settings
    from django.test.utils import override_settings
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import outbox
    from outbox import tracing
    from outbox.store.client.connection import get_connection

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    off = override_settings(OUTBOX={**settings.OUTBOX, "TRACING": False})

    def timed() -> float:
        get_connection().flushdb()
        started = time.perf_counter()
        for i in range(n):
            outbox.send("orders", {"i": i})
        return (time.perf_counter() - started) / n * 1e6

    results: dict[str, list[float]] = {"tracing off": [], "API, no SDK": [], "SDK, in-memory exporter": []}
    timed()  # warm-up: scripts loaded, connections open
    for _ in range(rounds):
        with off:
            results["tracing off"].append(timed())
        results["API, no SDK"].append(timed())
        tracing.set_tracer_provider(provider)
        results["SDK, in-memory exporter"].append(timed())
        tracing.set_tracer_provider(None)
    get_connection().flushdb()
    for label, values in results.items():
        print(f"{label:>24}: {statistics.median(values):6.1f} us per send() (median of {rounds} x {n})")


if __name__ == "__main__":
    main()
