"""What commit order costs: ``send(..., ordering_key=...)`` inside ``transaction.atomic``
(the key's sequence row incremented and locked in the transaction, the number stored in
the captured row, the key's earlier rows looked up before the push) against the same
``send()`` without an ordering key, measured in the same run.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=benchmarks.settings python -m benchmarks.ordered_capture [N]

For each database (SQLite in a file; PostgreSQL when one answers, see tests/settings.py)
it sends N messages (default 2000), 3 interleaved rounds, medians, per ``send()``:

* one send per transaction, and 100 sends per transaction;
* unordered (no key), ordered on one key (its row updated every time), and ordered on a
  new key per transaction (its row inserted first: the first send to a key, or the first
  after the relay pruned it).

Each transaction also writes one row of its own (a ``Group``), as a caller's would. The
push on commit is included (one Redis round trip per ``send()``: each send's on-commit
callback pushes its own message).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import django

PER_TRANSACTION = (1, 100)
KINDS = ("unordered", "ordered, one key", "ordered, new key per transaction")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    from django.conf import settings

    path = os.path.join(tempfile.mkdtemp(prefix="outbox-bench-"), "bench.sqlite3")
    settings.DATABASES["sqlite"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": path}
    django.setup()
    from django.contrib.auth.models import Group
    from django.core.management import call_command
    from django.db import connections, transaction

    import outbox
    from outbox.models import CapturedMessage, OrderingSequence
    from outbox.store.connection import get_connection

    aliases = ["sqlite"] + (["postgres"] if "postgres" in settings.DATABASES else [])
    call_command("migrate", database="default", verbosity=0)
    for alias in aliases:
        if alias == "postgres":
            settings.DATABASES[alias]["NAME"] = settings.DATABASES[alias]["TEST"]["NAME"]
            connections[alias].creation.create_test_db(verbosity=0, autoclobber=True)
        call_command("migrate", database=alias, verbosity=0)

    def run(alias: str, kind: str, per_tx: int, round_: int) -> float:
        """Microseconds per send() for n sends, ``per_tx`` per transaction."""
        key: Callable[[int], str | None] = {
            "unordered": lambda t: None,
            "ordered, one key": lambda t: "order-1",
            "ordered, new key per transaction": lambda t: f"order-{round_}-{t}",
        }[kind]
        t0 = time.perf_counter()
        for t in range(n // per_tx):
            with transaction.atomic(using=alias):
                Group.objects.using(alias).create(name=f"{alias}{KINDS.index(kind)}-{per_tx}-{round_}-{t}")
                for i in range(per_tx):
                    outbox.send("orders", {"order": i}, ordering_key=key(t), using=alias)
        return (time.perf_counter() - t0) / (n // per_tx * per_tx) * 1e6

    results: dict[tuple[str, int, str], list[float]] = {}
    for round_ in range(3):
        for alias in aliases:
            for per_tx in PER_TRANSACTION:
                for kind in KINDS:
                    results.setdefault((alias, per_tx, kind), []).append(run(alias, kind, per_tx, round_))
            assert not CapturedMessage.objects.using(alias).exists()  # every push went through
            Group.objects.using(alias).all().delete()
            OrderingSequence.objects.using(alias).all().delete()
        get_connection().flushdb()
    print(f"{n} sends x 3 rounds, medians; load average {os.getloadavg()[0]:.2f}")
    print(f"{'database':9} {'sends/tx':>8}  {'what':34} {'us/send':>8} {'vs unordered':>13}")
    for alias in aliases:
        for per_tx in PER_TRANSACTION:
            base = statistics.median(results[(alias, per_tx, "unordered")])
            for kind in KINDS:
                value = statistics.median(results[(alias, per_tx, kind)])
                extra = "" if kind == "unordered" else f"{value / base:6.2f}x {value - base:+5.0f} us"
                print(f"{alias:9} {per_tx:8}  {kind:34} {value:8.0f} {extra:>13}")
    if "postgres" in aliases:
        connections["postgres"].creation.destroy_test_db(settings.DATABASES["postgres"]["NAME"], verbosity=0)


if __name__ == "__main__":
    main()
