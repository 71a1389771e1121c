"""Helpers shared by the benchmark scripts (benchmarks.compare and benchmarks.endpoints):
a private Redis, Django set up with the benchmarks' settings, Redis figures (memory,
command counts), the no-op burst of one outbox worker, medians and the results file.

Here so that benchmarks.endpoints does not import benchmarks.compare, which runs it."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "latest.md"
SETTINGS = "benchmarks.compare_settings"


def publish(lines: list[str], out: str, default: str | None = None) -> None:
    """Print a results table (``lines``) and write it to ``out``; when ``out`` is left at
    :data:`RESULTS` and the run has a file of its own (``default``, e.g. ``"ordered.md"``),
    to that file beside it instead."""
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    path = RESULTS.with_name(default) if default and out == str(RESULTS) else Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"written to {path}")


def body_200(**extra) -> dict:
    """A JSON body that serializes (compact) to exactly 200 bytes."""
    body = {
        "order": 123456,
        "customer": "cus_8f2a1c",
        "currency": "EUR",
        "total": "129.90",
        **extra,
        "pad": "",
    }
    size = len(json.dumps(body, separators=(",", ":")))
    body["pad"] = "x" * (200 - size)
    return body


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_json(args: list[str], env: dict | None = None, timeout: float = 600, root: Path = ROOT) -> dict:
    """Run ``python -m benchmarks.compare ARGS`` in the checkout ``root`` (its code) and
    parse its last stdout line as JSON."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare", *args],
        cwd=root,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{args} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def used_memory(conn) -> int:
    return int(conn.info("memory")["used_memory"])


def commandstats(conn) -> dict[str, int]:
    return {k: int(v["calls"]) for k, v in conn.info("commandstats").items()}


def server_cpu(conn) -> float:
    """CPU seconds the Redis server's main thread has used (``INFO cpu``:
    ``used_cpu_user_main_thread`` + ``used_cpu_sys_main_thread``, Redis 6.2+ and Valkey),
    where commands and scripts run: a delta over a run is the server's cost of it."""
    info = conn.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def use_profile(profile: str) -> None:
    """Pick the destinations' ``MAX_IN_FLIGHT`` (``benchmarks.compare_settings``): before
    Django starts in this case's process; its worker processes inherit it."""
    os.environ["BENCH_PROFILE"] = profile


def stats_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    out = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return {k: v for k, v in out.items() if v > 0 and k not in ("info",)}


def private_redis():
    from outbox.testing import RedisServer

    server = RedisServer().start()
    os.environ["OUTBOX_TEST_REDIS_URL"] = server.url
    os.environ["BENCH_REDIS_URL"] = server.url
    return server


def setup_django() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django

    django.setup()


def steady(done: dict) -> float:
    """Deliveries per second from the first to the last one (no start-up)."""
    return (done["count"] - 1) / (done["done_at"] - done["first_at"])


def outbox_burst(n: int, env: dict | None = None) -> dict:
    """Run one outbox worker process in burst mode until nothing is due; adds the
    steady rate seen by the no-op transport (``steady``) when it delivered n."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "done.json"
        result = run_json(
            ["outbox-worker", "--burst"], env={**(env or {}), "BENCH_EXPECT": str(n), "BENCH_OUT": str(out)}
        )
        if out.exists():
            done = json.loads(out.read_text())
            result["steady"] = steady(done)
            result["drain"] = done["done_at"] - result["t0"]
        return result


def receiver_rate(receiver) -> float:
    """Answers per second as the receiver saw them: (n - 1) / (last - first answer), so
    neither side's start-up counts."""
    times = sorted(receiver.answered)
    return (len(times) - 1) / (times[-1] - times[0])


def fmt(x: float, unit: str = "") -> str:
    if x >= 100:
        s = f"{x:,.0f}"
    elif x >= 10:
        s = f"{x:.1f}"
    else:
        s = f"{x:.2f}"
    return s + unit


def med(values: list[float]) -> str:
    """Median, with the min-max spread of the rounds."""
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"
