"""What durable mode costs: ``send()`` inside ``transaction.atomic`` (captured in the
database, pushed on commit) against ``send()`` outside a transaction (Redis only), and
against the transaction alone, measured in the same run.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=benchmarks.settings python -m benchmarks.bench_capture [N]

For each database (SQLite in a file; PostgreSQL when one answers, see tests/settings.py)
it times N iterations, 3 interleaved rounds, medians, of:

* bare: ``with atomic(): Group.objects.create(...)`` (the caller's own row);
* durable: the same with ``outbox.send()`` inside (capture row + push + delete on commit);
* and, once, ``outbox.send()`` outside any transaction.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import django


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    from django.conf import settings

    path = os.path.join(tempfile.mkdtemp(prefix="outbox-bench-"), "bench.sqlite3")
    settings.DATABASES["sqlite"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": path}
    django.setup()
    from django.contrib.auth.models import Group
    from django.core.management import call_command
    from django.db import connections, transaction

    import outbox
    from outbox.store.client.connection import get_connection

    aliases = ["sqlite"] + (["postgres"] if "postgres" in settings.DATABASES else [])
    call_command("migrate", database="default", verbosity=0)
    for alias in aliases:
        if alias == "postgres":
            settings.DATABASES[alias]["NAME"] = settings.DATABASES[alias]["TEST"]["NAME"]
            connections[alias].creation.create_test_db(verbosity=0, autoclobber=True)
        call_command("migrate", database=alias, verbosity=0)

    def bare(alias: str, i: int) -> None:
        with transaction.atomic(using=alias):
            Group.objects.using(alias).create(name=f"b{alias}{i}{time.perf_counter_ns()}")

    def durable(alias: str, i: int) -> None:
        with transaction.atomic(using=alias):
            Group.objects.using(alias).create(name=f"d{alias}{i}{time.perf_counter_ns()}")
            outbox.send("orders", {"order": i}, using=alias)

    def direct(_alias: str, i: int) -> None:
        outbox.send("orders", {"order": i})

    def per_call(fn, alias: str) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            fn(alias, i)
        return (time.perf_counter() - t0) / n * 1e6

    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(3):
        for alias in aliases:
            for name, fn in (
                ("bare transaction", bare),
                ("transaction + send()", durable),
                ("send() outside", direct),
            ):
                results.setdefault((alias, name), []).append(per_call(fn, alias))
        get_connection().flushdb()
    print(f"{n} iterations x 3 rounds, medians; load average {os.getloadavg()[0]:.2f}")
    print(f"{'database':10} {'what':24} {'us/call':>9}")
    for alias in aliases:
        base = statistics.median(results[(alias, "bare transaction")])
        for name in ("bare transaction", "transaction + send()", "send() outside"):
            value = statistics.median(results[(alias, name)])
            extra = (
                f"  (+{value - base:.0f} us over the bare transaction)"
                if name == "transaction + send()"
                else ""
            )
            print(f"{alias:10} {name:24} {value:9.0f}{extra}")
    if "postgres" in aliases:
        connections["postgres"].creation.destroy_test_db(settings.DATABASES["postgres"]["NAME"], verbosity=0)


if __name__ == "__main__":
    main()
