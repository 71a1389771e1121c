"""What commit order costs: ``send(..., ordering_key=...)`` inside ``transaction.atomic``
(the key's sequence row incremented and locked in the transaction, the number stored in
the captured row, the key's earlier rows looked up before the push) against the same
``send()`` without an ordering key, measured in the same run.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=benchmarks.settings python -m benchmarks.ordered_capture [N [ROUNDS]]

For each database (SQLite in a file; PostgreSQL when one answers, see tests/settings.py)
it sends N messages (default 2000), ROUNDS interleaved rounds (default 5), per
``send()``, the median and the fastest round (the machine's other work only adds):

* one send per transaction, and 100 sends per transaction;
* unordered (no key), ordered on one key (its row updated every time), and ordered on a
  new key per transaction (its row inserted first: the first send to a key, or the first
  after the relay pruned it).

Each transaction also writes one row of its own (a ``Group``), as a caller's would. The
push on commit is included (one Redis round trip per ``send()``: each send's on-commit
callback pushes its own message). Beside them, the same ``send()`` outside a
transaction, unordered and on one key: what Redis's own ordering costs (in the ordered
figures above too), apart from the database's. And, counted once (not timed), the
database statements per ``send()`` of each case (commits not counted): on a loaded
machine each costs a wait for the database process, so they say more than the times.
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
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    from django.conf import settings

    path = os.path.join(tempfile.mkdtemp(prefix="outbox-bench-"), "bench.sqlite3")
    settings.DATABASES["sqlite"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": path}
    django.setup()
    from django.contrib.auth.models import Group
    from django.core.management import call_command
    from django.db import connections, transaction
    from django.test.utils import CaptureQueriesContext

    import outbox
    from outbox.models import CapturedMessage, OrderingSequence
    from outbox.store.client.connection import get_connection

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

    def outside(kind: str) -> float:
        """Microseconds per send() outside a transaction."""
        key = None if kind == "unordered" else "order-1"
        t0 = time.perf_counter()
        for i in range(n):
            outbox.send("orders", {"order": i}, ordering_key=key)
        return (time.perf_counter() - t0) / n * 1e6

    def statements(alias: str, kind: str, per_tx: int) -> float:
        """Database statements per send() (commits aside), counted over 200 sends."""
        sends = 200
        with CaptureQueriesContext(connections[alias]) as queries:
            for t in range(sends // per_tx):
                with transaction.atomic(using=alias):
                    for i in range(per_tx):
                        key = {"unordered": None, "ordered, one key": "order-1"}.get(kind, f"count-{t}")
                        outbox.send("orders", {"order": i}, ordering_key=key, using=alias)
        return len(queries) / sends

    results: dict[tuple[str, int, str], list[float]] = {}
    for round_ in range(rounds):
        for alias in aliases:
            for per_tx in PER_TRANSACTION:
                for kind in KINDS:
                    results.setdefault((alias, per_tx, kind), []).append(run(alias, kind, per_tx, round_))
            assert not CapturedMessage.objects.using(alias).exists()  # every push went through
            Group.objects.using(alias).all().delete()
            OrderingSequence.objects.using(alias).all().delete()
        for kind in KINDS[:2]:
            results.setdefault(("redis", 0, kind), []).append(outside(kind))
        get_connection().flushdb()
    counted = {
        (alias, per_tx, kind): statements(alias, kind, per_tx)
        for alias in aliases
        for per_tx in PER_TRANSACTION
        for kind in KINDS
    }
    get_connection().flushdb()
    print(f"{n} sends x {rounds} rounds; load average {os.getloadavg()[0]:.2f}")
    print(
        f"{'database':9} {'sends/tx':>8}  {'what':34} {'median us':>9} {'vs unordered':>16} "
        f"{'fastest us':>10} {'vs unordered':>16} {'statements':>10}"
    )
    for alias, per_tx in [(a, p) for a in aliases for p in PER_TRANSACTION] + [("redis", 0)]:
        runs = {kind: results[(alias, per_tx, kind)] for kind in KINDS if (alias, per_tx, kind) in results}
        for kind in runs:
            cells = []
            for pick in (statistics.median, min):
                value, base = pick(runs[kind]), pick(runs["unordered"])
                extra = "" if kind == "unordered" else f"{value / base:5.2f}x {value - base:+6.0f} us"
                cells.append(f"{value:9.0f} {extra:>16}")
            count = f"{counted[(alias, per_tx, kind)]:10.2f}" if (alias, per_tx, kind) in counted else ""
            where = "no tx" if alias == "redis" else f"{per_tx:8}"
            print(
                f"{alias if alias != 'redis' else '-':9} {where:>8}  {kind:34} {cells[0]} {cells[1]:>27}{count}"
            )
    if "postgres" in aliases:
        connections["postgres"].creation.destroy_test_db(settings.DATABASES["postgres"]["NAME"], verbosity=0)


if __name__ == "__main__":
    main()
