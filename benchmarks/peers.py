"""Functions the measured workers run, imported by dotted path in their processes.

* :func:`noop`, :func:`record_latency`: outbox ``callable`` transports (``benchmarks.compare_settings``);
* :func:`noop_job`: the RQ job of the RQ peer;
* :func:`done`: counts deliveries in a worker process and, at ``BENCH_EXPECT``, writes
  ``{"done_at": perf_counter, "first_at": perf_counter, "latencies_ms": [...]}`` to ``BENCH_OUT`` (the measuring
  process waits for that file).
"""

from __future__ import annotations

import json
import os
import threading
import time

_lock = threading.Lock()
_count = 0
_latencies: list[float] = []
_written = False
_first: float | None = None


def done(sent_at: float | None = None) -> None:
    """One delivery finished in this process (``sent_at``: epoch seconds it was sent)."""
    global _count, _written, _first
    now = time.time()
    with _lock:
        _count += 1
        if _first is None:
            _first = time.perf_counter()
        if sent_at is not None:
            _latencies.append((now - sent_at) * 1000)
        expect = int(os.environ.get("BENCH_EXPECT", "0") or 0)
        if expect and _count >= expect and not _written:
            _written = True
            write_json(
                os.environ["BENCH_OUT"],
                {
                    "done_at": time.perf_counter(),
                    "first_at": _first,
                    "count": _count,
                    "latencies_ms": _latencies,
                },
            )


def write_json(path: str, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` at once (a temporary file, then ``os.replace``):
    the measuring process polls for the file and must never read it half-written."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def noop(message) -> None:
    """Outbox callable transport: deliver nothing, count it."""
    done()


def record_latency(message) -> None:
    """Outbox callable transport: record the time since the body's ``t`` (epoch seconds)."""
    done(json.loads(message.body)["t"])


def noop_job(body) -> None:
    """The RQ peer's job: does nothing but count."""
    done()
