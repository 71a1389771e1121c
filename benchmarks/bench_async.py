"""Issue 33's benchmark: ``await outbox.asend()`` on one event loop against ``send()``
from a thread pool, how long the loop's callbacks run, and a Redis that hangs.

    .venv/bin/python -m benchmarks.bench_async            # 5 interleaved rounds, ~1 min
    .venv/bin/python -m benchmarks.bench_async --quick    # 1 round, small N

On a private Redis (the test settings' server), 200-byte bodies, each call's outcome its
own (no batching: 100 concurrent ``asend`` tasks, each one message, one write):

* throughput: ``asend()`` with 100 concurrent tasks against ``send()`` from 16 threads,
  interleaved rounds, medians and the min-max spread (target: >= 2x);
* loop blocking: every callback the loop runs during 10,000 ``asend()``s is timed (the
  measure asyncio's debug mode logs over ``slow_callback_duration``, here 1 ms); the
  99.9th percentile (target: < 1 ms), wall and the loop thread's CPU time, three times:
  in asyncio's debug mode (the issue's measure: debug mode extracts a stack for every
  callback and future scheduled, and allocates for it, so each ``asend`` costs about
  three times its production CPU and the collector runs ten times as often), without
  debug mode (what a production loop runs), and in debug mode tuned with ``gc.freeze()``
  after start-up (docs/async.md: what start-up loaded is left out of later
  collections; the out-of-the-box rows are the target). The first callback of each
  (the benchmark's ``gather`` making 100 tasks) is counted too: one of ~14,000;
* a hang: the Redis is stopped (SIGSTOP) while 100 ``asend()`` wait on it; an HTTP
  endpoint served by the same loop is asked every 10 ms meanwhile; its slowest answer
  (target: < 50 ms);
* the issue's "Done when" under uvicorn (``tests/integrations/uvicorn_run.py``, the
  scenario ``tests/integrations/test_uvicorn.py`` asserts the outcome of): a view sends
  1,000 messages with ``asend`` (``asend_again`` after an unknown outcome) while
  ``/health`` of the same process is asked every 10 ms from here and the Redis is stopped
  2 s; the slowest health answer, over the whole send and during the hang (target: every
  answer < 50 ms), and whether every message was stored once; run twice, out of the box
  and tuned (the app calls ``gc.freeze()`` once loaded).

Prints a table in Markdown (docs/benchmarks.md, "Async views").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import django
import redis

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

BODY = "x" * 200
TASKS = 100
THREADS = 16


def body(i: int) -> str:
    return (f"{i:08d}" + BODY)[:200]


async def asend_round(n: int) -> float:
    """Messages per second of ``n`` asends from :data:`TASKS` concurrent tasks."""
    import outbox

    counter = iter(range(n))

    async def task() -> None:
        for i in counter:
            await outbox.asend("orders", body(i))

    started = time.perf_counter()
    await asyncio.gather(*(task() for _ in range(TASKS)))
    return n / (time.perf_counter() - started)


def send_round(n: int) -> float:
    """Messages per second of ``n`` sends from :data:`THREADS` threads."""
    import outbox

    started = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda i: outbox.send("orders", body(i)), range(n)))
    return n / (time.perf_counter() - started)


async def callback_times(n: int) -> tuple[list[float], list[float]]:
    """The run time (seconds) of every loop callback during ``n`` asends: wall-clock, and
    the loop thread's CPU time (``time.thread_time``: what the callback itself did, not
    the time the machine gave another process or thread meanwhile)."""
    walls: list[float] = []
    cpus: list[float] = []
    original = asyncio.events.Handle._run

    def timed(handle: asyncio.events.Handle) -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        original(handle)
        walls.append(time.perf_counter() - started)
        cpus.append(time.thread_time() - cpu)

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    try:
        await asend_round(n)
    finally:
        asyncio.events.Handle._run = original  # type: ignore[method-assign]
    return walls, cpus


def p999(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.999))]


def measure_callbacks(
    loop: asyncio.AbstractEventLoop, n: int, *, debug: bool, frozen: bool = False
) -> dict[str, Any]:
    """:func:`callback_times` of ``n`` asends on ``loop``: in asyncio's debug mode with its
    slow-callback log at 1 ms (the issue's measure; debug mode extracts a stack for every
    callback and future it schedules, so each asend costs more than in production), or
    without it (production). ``frozen``: after ``gc.collect(); gc.freeze()`` (the tuned
    row: what start-up loaded is left out of every later collection; undone after)."""
    from outbox.store.client.connection import empty_database

    empty_database()
    if frozen:
        gc.collect()
        gc.freeze()
    loop.set_debug(debug)
    loop.slow_callback_duration = 0.001
    try:
        walls, cpus = loop.run_until_complete(callback_times(n))
    finally:
        loop.set_debug(False)
        if frozen:
            gc.unfreeze()
    return {
        "wall": p999(walls),
        "cpu": p999(cpus),
        "max": max(walls),
        "max_cpu": max(cpus),
        "count": len(walls),
    }


def callback_rows(n: int, runs: dict[str, dict[str, Any]]) -> list[str]:
    """The table's rows of the loop callbacks (:func:`measure_callbacks`)."""
    rows = []
    for label, run in runs.items():
        met = "met" if run["wall"] < 0.001 else "not met"
        cpu_met = "met" if run["cpu"] < 0.001 else "not met"
        rows += [
            f"| loop callbacks during {n:,} asend(), {label}: p99.9 | {run['wall'] * 1000:.3f} ms "
            f"(max {run['max'] * 1000:.2f} ms, {run['count']:,} callbacks) | < 1 ms | {met} |",
            f"| the same callbacks, the loop thread's CPU time: p99.9 | {run['cpu'] * 1000:.3f} ms "
            f"(max {run['max_cpu'] * 1000:.2f} ms) | < 1 ms | {cpu_met} |",
        ]
    return rows


async def hang(server_pid: int, seconds: float) -> tuple[list[float], int]:
    """Stop Redis for ``seconds`` with :data:`TASKS` asends waiting on it; an HTTP
    endpoint on this loop is asked every 10 ms from a thread. Returns each answer's
    latency (seconds) during the hang and how many asends raised SendOutcomeUnknown."""
    import outbox

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    latencies: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                    while s.recv(100):
                        pass
            except OSError:  # no answer within 5 s (counted, as that long) or the server closed
                if stop.is_set():
                    break
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)

    await outbox.asend("orders", body(0))
    os.kill(server_pid, signal.SIGSTOP)
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        results = await asyncio.gather(
            *(outbox.asend("orders", body(i)) for i in range(TASKS)), return_exceptions=True
        )
        await asyncio.sleep(max(0.0, seconds))
    finally:
        stop.set()
        os.kill(server_pid, signal.SIGCONT)
    prober.join()
    server.close()
    unknown = sum(isinstance(r, outbox.SendOutcomeUnknown) for r in results)
    return latencies, unknown


def spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="Issue 33's benchmark (see docs/benchmarks.md).")
    parser.add_argument("--quick", action="store_true", help="1 round, small N")
    args = parser.parse_args(argv)
    rounds, n, blocking_n = (1, 1000, 2000) if args.quick else (5, 5000, 10_000)
    django.setup()
    from django.conf import settings

    from outbox.store.client.aconnection import aclose
    from outbox.store.client.connection import empty_database
    from outbox.testing import RedisServer
    from tests.integrations import uvicorn_run
    from tests.support import redis_at

    with RedisServer() as server, redis_at(server.url):
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        async_rates: list[float] = []
        sync_rates: list[float] = []
        send_round(200)  # warm both
        loop.run_until_complete(asend_round(200))
        for _ in range(rounds):
            empty_database()
            sync_rates.append(send_round(n))
            empty_database()
            async_rates.append(loop.run_until_complete(asend_round(n)))
        callbacks = {
            "asyncio debug mode (the issue's measure)": measure_callbacks(loop, blocking_n, debug=True),
            "without debug mode (production)": measure_callbacks(loop, blocking_n, debug=False),
            "debug mode, tuned: gc.freeze() after start-up": measure_callbacks(
                loop, blocking_n, debug=True, frozen=True
            ),
        }
        empty_database()
        timeout = settings.CACHES[next(iter(settings.CACHES))].get("OPTIONS", {}).get("SOCKET_TIMEOUT")
        latencies, unknown = loop.run_until_complete(hang(server.process.pid, 0.0))
        loop.run_until_complete(aclose())
        loop.close()
    views = {}
    for tuned in (False, True):
        with RedisServer() as server:
            view = uvicorn_run.run(server, n=1000, hang=2.0, socket_timeout=1.0, gc_freeze=tuned)
            views[tuned] = (view, len(redis.Redis.from_url(server.url).keys("*:message:*")))
    ratios = [a / s for a, s in zip(async_rates, sync_rates, strict=True)]
    lines = [
        f"Issue 33: asend() on one event loop (Python {sys.version.split()[0]}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}; "
        f"{rounds} interleaved round(s), median (min-max))",
        "",
        "| measure | result | target | met |",
        "|---|---|---|---|",
        f"| send() from {THREADS} threads, {n} x 200 B | {spread(sync_rates, '{:,.0f}')} msg/s | | |",
        f"| asend() from {TASKS} tasks, {n} x 200 B | {spread(async_rates, '{:,.0f}')} msg/s | | |",
        f"| asend / send | {spread(ratios, '{:.2f}')}x | >= 2x | {'met' if statistics.median(ratios) >= 2 else 'not met'} |",
        *callback_rows(blocking_n, callbacks),
        f"| Redis stopped (SIGSTOP) {TASKS} asend() waiting ({timeout} s socket timeout): health endpoint "
        f"on the same loop, slowest of {len(latencies)} | {max(latencies) * 1000:.1f} ms | < 50 ms | "
        f"{'met' if max(latencies) < 0.05 else 'not met'} |",
        f"| asend() during the hang that raised SendOutcomeUnknown | {unknown} of {TASKS} | all | "
        f"{'met' if unknown == TASKS else 'not met'} |",
        *uvicorn_rows(*views[False]),
        *uvicorn_rows(*views[True], tuned=True),
    ]
    print("\n".join(lines))


def uvicorn_rows(view: Any, stored: int, tuned: bool = False) -> list[str]:
    """The table's rows of the uvicorn run (``uvicorn_run.Run``); ``tuned``: the app
    calls ``gc.freeze()`` once loaded (``OUTBOX_TEST_GC_FREEZE``, docs/async.md)."""
    name = "uvicorn, tuned (gc.freeze() after start-up)" if tuned else "uvicorn"
    slowest = max(view.latencies)
    hang = max(view.during_hang) if view.during_hang else float("nan")
    p99 = sorted(view.latencies)[min(len(view.latencies) - 1, int(len(view.latencies) * 0.99))]
    once = view.status == 200 and len(set(view.ids)) == len(view.ids) == stored == 1000
    return [
        f"| {name}: /health while a view sends 1,000 with asend, Redis stopped 2 s: slowest of "
        f"{len(view.latencies)} (p99 {p99 * 1000:.1f} ms; during the hang, slowest of {len(view.during_hang)}: "
        f"{hang * 1000:.1f} ms) | {slowest * 1000:.1f} ms | < 50 ms | {'met' if slowest < 0.05 else 'not met'} |",
        f"| {name}: messages stored once ({view.again} asend_again after an unknown outcome) | {stored} of 1000 "
        f"| all, once | {'met' if once else 'not met'} |",
    ]


if __name__ == "__main__":
    main(sys.argv[1:])
