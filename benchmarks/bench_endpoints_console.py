"""The console at 10,000 endpoints registered (issue 34, item 6), cold and warm.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=benchmarks.settings python -m benchmarks.bench_endpoints_console \\
        [--endpoints 10000] [--busy 1000] [--messages 100000] [--failed 5000] [--requests 20]

Set-up (not timed): ``--endpoints`` endpoints registered through the ORM
(``Endpoint.objects.bulk_create``, 10 applications, each endpoint with its own secret
encrypted at rest), then announced to the workers (:func:`outbox.webhooks.changed`: one
bump of the change counter); ``--messages`` messages spread over ``--busy`` of them
(:func:`benchmarks.loader.load`, the repository's own scripts: ``--failed`` dead letters,
some retrying and pending, the rest succeeded); then the destination summary is
refreshed once, as a worker's recovery sweep does (:func:`outbox.destinations.summary.refresh`;
its time is printed: that is the cost of the counts' freshness, paid in the background).

Measured through Django's test client logged in as a staff superuser (milliseconds per
page; ``cold``: the first request after every in-process cache of the console and the
endpoints was cleared, the summary in Redis as the last refresh left it; ``warm``: the
median and p95 of ``--requests`` requests after it): the dashboard, the console's
endpoint list (``admin:outbox_endpoints``, its first and 50th page), the admin's
``Endpoint`` changelist, the message list (every destination, newest first) and the
message list of ``status=failed``. Target: under 100 ms per page, cold and warm.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import uuid

import django

ENDPOINTS_PER_APP_DIVISOR = 10


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


def register(n: int) -> list[str]:
    """``n`` endpoints over 10 applications, bulk-created; returns their destination names."""
    from outbox import webhooks
    from outbox.destinations import secrets
    from outbox.models import Application, Endpoint

    apps = [Application.objects.create(uid=f"customer-{i}", name=f"Customer {i}") for i in range(10)]
    rows = []
    for i in range(n):
        token = secrets.encrypt(secrets.SecretSet(secrets.generate_secret()))
        rows.append(
            Endpoint(
                id=uuid.uuid4(),
                application=apps[i % len(apps)],
                uid=f"ep-{i}",
                url=f"https://hooks{i % 97}.example.com/in/{i}",
                secrets=token,
            )
        )
    Endpoint.objects.bulk_create(rows, batch_size=2000)
    webhooks.changed(*rows)
    return [r.destination for r in rows]


def cold(client, url: str) -> float:
    """One request after the in-process caches are cleared (ms)."""
    from outbox.destinations.config import endpoint_cache

    endpoint_cache.clear()
    t0 = time.perf_counter()
    response = client.get(url)
    ms = (time.perf_counter() - t0) * 1000
    assert response.status_code == 200, f"{url}: HTTP {response.status_code}"
    return ms


def warm(client, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        response = client.get(url)
        out.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200, f"{url}: HTTP {response.status_code}"
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=10_000)
    parser.add_argument("--busy", type=int, default=1_000, help="endpoints the messages are spread over")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--failed", type=int, default=5_000)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args(argv)
    django.setup()

    from django.urls import reverse

    from benchmarks.bench_admin import setup_database
    from benchmarks.loader import load
    from outbox.store import get_repository
    from outbox.store.client.connection import get_connection

    try:
        from outbox.destinations import summary
    except ImportError:  # code from before the summary (a baseline run): nothing to make
        summary = None  # type: ignore[assignment]

    get_connection().flushdb()
    client, _user = setup_database()
    t0 = time.perf_counter()
    names = register(args.endpoints)
    registered = time.perf_counter() - t0
    t0 = time.perf_counter()
    written = load(args.messages, failed=args.failed, destinations=names[: args.busy])
    loaded = time.perf_counter() - t0
    repo = get_repository()
    t0 = time.perf_counter()
    if summary is not None:
        summary.refresh(repo)
    refreshed = (time.perf_counter() - t0) * 1000
    print(
        f"{args.endpoints:,} endpoints registered in {registered:.1f} s; {args.messages:,} messages over "
        f"{args.busy:,} of them in {loaded:.1f} s ({written}); {len(repo.destinations()):,} destinations "
        f"known to Redis; summary made in {refreshed:.0f} ms (in the background: the workers' "
        "recovery sweep, every RECOVERY_INTERVAL)"
    )
    listing = reverse("admin:outbox_message_list")
    pages = [
        ("dashboard", reverse("admin:outbox_dashboard")),
        ("console endpoint list, page 1", reverse("admin:outbox_endpoints")),
        ("console endpoint list, page 50", reverse("admin:outbox_endpoints") + "?page=50"),
        ("admin Endpoint changelist", reverse("admin:outbox_endpoint_changelist")),
        ("message list (all)", listing),
        ("message list status=failed", listing + "?status=failed"),
    ]
    load_avg = os.getloadavg()
    print(f"load average before measuring: {load_avg[0]:.2f} ({os.cpu_count()} CPUs, shared)")
    print()
    print("| page | cold ms | warm median ms | warm p95 ms |")
    print("|---|---:|---:|---:|")
    for label, url in pages:
        c = cold(client, url)
        w = warm(client, url, args.requests)
        print(f"| {label} | {c:.0f} | {statistics.median(w):.1f} | {p95(w):.1f} |")


if __name__ == "__main__":
    main()
