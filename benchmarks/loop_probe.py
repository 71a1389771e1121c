"""Diagnostic (issue 33): which of an event loop's callbacks are slow, and why.

Times every ``Handle._run`` (wall and the thread's CPU time), the garbage collections
inside each (``gc.callbacks``: generation, duration, objects in the generations
collected), and for a callback still running after ``SAMPLE_AFTER`` seconds a stack
sampled every ``SAMPLE_EVERY`` s of CPU time (``ITIMER_PROF``; the handler runs between
bytecodes, so a sample taken during a collection lands where the allocation that
triggered it was). It allocates no tracked object per fast callback (floats only), so
it adds no garbage collections of its own.

    probe = LoopProbe(); probe.install(); ...; probe.uninstall(); print(probe.report())
"""

from __future__ import annotations

import asyncio
import collections
import gc
import signal
import time
from typing import Any

SAMPLE_AFTER = 0.0002
SAMPLE_EVERY = 0.0001
SLOW = 0.001


def describe(handle: Any) -> str:
    """A callback's name: a task's coroutine, else the function."""
    callback = handle._callback
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        return f"task {getattr(coro, '__qualname__', coro)}"
    return getattr(callback, "__qualname__", repr(callback))


class LoopProbe:
    def __init__(self, sample: bool = False, count_young: bool = False) -> None:
        self.walls: list[float] = []
        self.slow: list[tuple[int, float, float, list[Any], str, list[tuple[str, ...]]]] = []
        self.running = False
        self.started = 0.0
        self.gcs: list[Any] = []
        self.stacks: list[tuple[str, ...]] = []
        self.gc_started = 0.0
        self.gc_young = 0
        self.gc_outside: list[Any] = []
        self.sample, self.count_young = sample, count_young
        self.collections = [0, 0, 0]
        self.gc_time = [0.0, 0.0, 0.0]
        self._original = asyncio.events.Handle._run

    def _timed(self, handle: Any) -> None:
        self.running = True
        self.started = started = time.perf_counter()
        cpu = time.thread_time()
        try:
            self._original(handle)
        finally:
            wall = time.perf_counter() - started
            cpu = time.thread_time() - cpu
            self.running = False
            if wall > SLOW:
                self.slow.append((len(self.walls), wall, cpu, self.gcs, describe(handle), self.stacks))
            if self.gcs or wall > SLOW:
                self.gcs, self.stacks = [], []
            self.walls.append(wall)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            if self.count_young:
                self.gc_young = sum(len(gc.get_objects(g)) for g in range(info["generation"] + 1))
            self.gc_started = time.perf_counter()
            return
        entry = (info["generation"], time.perf_counter() - self.gc_started, self.gc_young, info["collected"])
        self.collections[info["generation"]] += 1
        self.gc_time[info["generation"]] += entry[1]
        (self.gcs if self.running else self.gc_outside).append(entry)

    def _sample(self, signum: int, frame: Any) -> None:
        if not self.running or time.perf_counter() - self.started < SAMPLE_AFTER:
            return
        stack = []
        while frame is not None and len(stack) < 25:
            code = frame.f_code
            stack.append(f"{'/'.join(code.co_filename.rsplit('/', 3)[-3:])}:{frame.f_lineno}:{code.co_name}")
            frame = frame.f_back
        self.stacks.append(tuple(stack))

    def install(self) -> None:
        asyncio.events.Handle._run = lambda handle: self._timed(handle)  # type: ignore[method-assign]
        gc.callbacks.append(self._gc)
        if self.sample:
            signal.signal(signal.SIGPROF, self._sample)
            signal.setitimer(signal.ITIMER_PROF, SAMPLE_EVERY, SAMPLE_EVERY)

    def uninstall(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        asyncio.events.Handle._run = self._original  # type: ignore[method-assign]
        gc.callbacks.remove(self._gc)

    def report(self, top: int = 40) -> str:
        walls = sorted(self.walls)
        p999 = walls[min(len(walls) - 1, int(len(walls) * 0.999))]
        with_gc = [s for s in self.slow if s[3]]
        gens = collections.Counter(g[0] for s in self.slow for g in s[3])
        lines = [
            f"{len(walls)} callbacks, p99.9 {p999 * 1e3:.3f} ms, max {walls[-1] * 1e3:.2f} ms, "
            f"{len(self.slow)} over {SLOW * 1e3:.0f} ms, {len(with_gc)} of them with a collection "
            f"(generations {dict(gens)}); collections outside callbacks {len(self.gc_outside)}",
            f"collections by generation {self.collections}, their time (ms) "
            f"{[round(t * 1e3, 1) for t in self.gc_time]}; callbacks over 1 ms by CPU time "
            f"{sum(1 for s in self.slow if s[2] > SLOW)}",
        ]
        for index, wall, cpu, gcs, what, stacks in sorted(self.slow, key=lambda s: -s[1])[:top]:
            collected = ",".join(f"g{g}:{t * 1e3:.2f}ms/{y}obj" for g, t, y, _ in gcs)
            lines.append(f"#{index} {wall * 1e3:.2f} ms (cpu {cpu * 1e3:.2f}) [{collected}] {what}")
            for stack, n in collections.Counter(stacks).most_common(3):
                lines.append(f"    x{n} " + " < ".join(stack[:14]))
        return "\n".join(lines)

    def by_cause(self) -> collections.Counter[str]:
        """The slow callbacks (over :data:`SLOW` wall) counted by cause: a collection
        that took over half of it (by generation); the machine (the thread's CPU time
        under :data:`SLOW`: it waited for a core or the GIL); else what the stacks
        sampled in it show (needs ``sample``), the first rule of :data:`CAUSES` that
        matches one of its samples, else its callback's name."""
        causes: collections.Counter[str] = collections.Counter()
        for _index, wall, cpu, gcs, what, stacks in self.slow:
            if sum(g[1] for g in gcs) > wall / 2:
                causes[f"garbage collection, generation {max(g[0] for g in gcs)}"] += 1
            elif cpu < SLOW:
                causes["waiting (CPU time under 1 ms: another process or thread ran)"] += 1
            else:
                causes[_cause(stacks) or f"CPU in {what} (not sampled)"] += 1
        return causes


#: (a frame's text, its cause): a sample's cause is the first of :data:`ANYWHERE` found
#: in any of its frames, else the innermost frame's that matches one of :data:`INNERMOST`.
ANYWHERE = (
    ("format_helpers.py", "asyncio debug mode: a stack extracted per callback or future"),
    ("traceback.py", "asyncio debug mode: a stack extracted per callback or future"),
    ("linecache.py", "asyncio debug mode: a stack extracted per callback or future"),
    ("threading.py", "a thread started from the loop (Thread.start waits for it)"),
    ("importlib", "an import at first use"),
    (":connect", "redis-py: a connection made"),
)
INNERMOST = (
    ("redis/", "redis-py: a write or a reply read"),
    ("aconnection.py", "the outbox's connection task (pack, write, answer the calls)"),
    ("asyncio/", "asyncio itself (futures, handles, tasks)"),
    ("outbox/", "asend's own work (validation, record, steps)"),
    ("benchmarks/", "the benchmark's own code"),
)


def _cause_of(stack: tuple[str, ...]) -> str:
    for text, cause in ANYWHERE:
        if any(text in frame for frame in stack):
            return cause
    for frame in stack:  # innermost first
        for text, cause in INNERMOST:
            if text in frame:
                return cause
    return "other Python"


def _cause(stacks: list[tuple[str, ...]]) -> str | None:
    """The cause most of ``stacks`` show."""
    named = collections.Counter(_cause_of(stack) for stack in stacks)
    return named.most_common(1)[0][0] if named else None


def main(argv: list[str]) -> None:
    """``python -m benchmarks.loop_probe [--debug] [--sample] [--rounds N]``: the callbacks
    of bench_async's 10,000 asends after its warm rounds, with the cause table."""
    import argparse
    import os

    import django

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="asyncio debug mode (the issue's measure)")
    parser.add_argument("--sample", action="store_true", help="sample the slow callbacks' stacks")
    parser.add_argument("--rounds", type=int, default=5, help="warm rounds of 5,000 send() and asend()")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    django.setup()
    from benchmarks import bench_async as bench
    from outbox.store.client.aconnection import aclose
    from outbox.store.client.connection import empty_database
    from outbox.testing import RedisServer
    from tests.support import redis_at

    with RedisServer() as server, redis_at(server.url):
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        for _ in range(args.rounds):
            empty_database()
            bench.send_round(5000)
            empty_database()
            loop.run_until_complete(bench.asend_round(5000))
        empty_database()
        loop.set_debug(args.debug)
        loop.slow_callback_duration = SLOW
        probe = LoopProbe(sample=args.sample)
        probe.install()
        try:
            loop.run_until_complete(bench.asend_round(10_000))
        finally:
            probe.uninstall()
            loop.set_debug(False)
        print(probe.report(top=10))
        print("\n| slow callbacks (> 1 ms) by cause | count |\n|---|---|")
        for cause, count in probe.by_cause().most_common():
            print(f"| {cause} | {count} |")
        loop.run_until_complete(aclose())
        loop.close()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
