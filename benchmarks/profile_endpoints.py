"""Diagnostics for issue 34's delivery row (not a table): where the burst worker's CPU
goes per delivery, to 1,000 endpoints against the settings destination ``hook``.

``python -m benchmarks.profile_endpoints [--n 2000] [--out DIR] [--top 40]`` sets up what
one round of ``benchmarks.compare --endpoints`` sets up (:func:`benchmarks.endpoints.case_endpoints`:
10,000 endpoints, the verifying receiver answering after 50 ms), then drains ``n``
deliveries to app-0's endpoints and ``n`` to ``hook``, each by one cold ``outbox_worker
--burst`` process, twice per side:

1. unprofiled: the worker's CPU seconds (``time.process_time``) per delivery and the
   receiver's rate;
2. under cProfile in every thread (``BENCH_CPROFILE``, :func:`benchmarks.compare.profile_threads`):
   per function, the CPU (own time, and cumulative) per delivery on each side, and the
   difference, largest first. cProfile's overhead inflates Python-heavy code: read the
   profiled figures for where, the unprofiled ones for how much.
"""

from __future__ import annotations

import argparse
import glob
import pstats
from pathlib import Path


def _drain(n: int, receiver, prefix: str | None) -> dict[str, float]:
    from benchmarks.common import outbox_burst, receiver_rate
    from benchmarks.endpoints import sweep

    receiver.answered.clear()
    sweep()  # as benchmarks.endpoints.drain: under the lock, so the burst worker skips its own
    env = {"BENCH_CPROFILE": prefix} if prefix else {}
    result = outbox_burst(n, env=env)
    return {"cpu_ms": result["cpu"] * 1000 / n, "per_s": receiver_rate(receiver)}


def _fill(side: str, n: int) -> None:
    import outbox
    from benchmarks.common import body_200
    from benchmarks.endpoints import PER_APPLICATION
    from outbox.store.client.connection import get_connection

    get_connection().flushdb()
    body = body_200()
    if side == "endpoints":
        for _ in range(n // PER_APPLICATION):
            outbox.publish("order.paid", body, application="app-0")
    else:
        for i in range(0, n, 100):
            outbox.send_many([{"destination": "hook", "body": body}] * min(100, n - i))


def _stats(prefix: str) -> dict[tuple, tuple[float, float, int]]:
    stats = pstats.Stats(*glob.glob(prefix + ".*.prof"))
    return {func: (tt, ct, nc) for func, (cc, nc, tt, ct, callers) in stats.stats.items()}  # type: ignore[attr-defined]


def _name(func: tuple) -> str:
    path, line, name = func
    path = path.split("site-packages/")[-1].split("wt-rate/")[-1].split("/work/main/")[-1]
    return f"{path}:{line}({name})"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--out", default=None)
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    from benchmarks.endpoints import registered

    with registered("bench-profile-") as (receiver, _, _, tmp):
        out = Path(a.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        plain = {}
        for side in ("endpoints", "hook"):
            _fill(side, a.n)
            plain[side] = _drain(a.n, receiver, None)
        profiled = {}
        for side in ("endpoints", "hook"):
            _fill(side, a.n)
            _drain(a.n, receiver, str(out / side))
            profiled[side] = _stats(str(out / side))
        assert receiver.bad[0] == 0, f"{receiver.bad[0]} bad signatures"
    for side, r in plain.items():
        print(f"{side}: {r['cpu_ms']:.3f} ms CPU per delivery (unprofiled), {r['per_s']:.0f} msg/s")
    for side in profiled:
        total = sum(v[0] for v in profiled[side].values()) * 1000 / a.n
        print(f"{side}: {total:.3f} ms profiled CPU per delivery (sum of own times, every thread)")
    e, h = profiled["endpoints"], profiled["hook"]
    rows = []
    for func in set(e) | set(h):
        et, ec, en = e.get(func, (0.0, 0.0, 0))
        ht, hc, hn = h.get(func, (0.0, 0.0, 0))
        rows.append((func, et, ht, ec, hc, en, hn))
    print("\nby own time, endpoints - hook, µs per delivery:")
    print(
        f"{'function':70} {'endp own':>9} {'hook own':>9} {'diff':>8} {'endp cum':>9} {'hook cum':>9} {'calls e/h':>13}"
    )
    us = 1e6 / a.n
    for func, et, ht, ec, hc, en, hn in sorted(rows, key=lambda r: r[2] - r[1])[: a.top]:
        print(
            f"{_name(func)[:70]:70} {et * us:9.1f} {ht * us:9.1f} {(et - ht) * us:8.1f} {ec * us:9.1f} {hc * us:9.1f} {en:>6}/{hn:<6}"
        )
    print("\nby cumulative time, endpoints - hook, µs per delivery:")
    for func, et, ht, ec, hc, en, hn in sorted(rows, key=lambda r: r[4] - r[3])[: a.top]:
        print(
            f"{_name(func)[:70]:70} {et * us:9.1f} {ht * us:9.1f} {(ec - hc) * us:8.1f} {ec * us:9.1f} {hc * us:9.1f} {en:>6}/{hn:<6}"
        )
    print(f"\nprofiles in {out}")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
