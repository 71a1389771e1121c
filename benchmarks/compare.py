"""Issue 7's side-by-side benchmark: the outbox against RQ, Dramatiq and plain httpx.

    .venv/bin/python -m benchmarks.compare                 # 3 interleaved rounds, ~6 min
    .venv/bin/python -m benchmarks.compare --quick         # 1 round, small N (development)
    .venv/bin/python -m benchmarks.compare --baseline DIR  # the outbox's cases, this checkout vs DIR
    .venv/bin/python -m benchmarks.compare --cluster       # issue 22's cluster rows only, ~5 min
    .venv/bin/python -m benchmarks.compare --ordered       # issue 23's ordered-delivery rows only, ~4 min
    .venv/bin/python -m benchmarks.compare --send --rounds 5   # issue 30's send-side rows only, ~5 min
    .venv/bin/python -m benchmarks.compare --endpoints     # issue 34's rows (10,000 endpoints), ~3 min

Every measurement ("case") runs in a process of its own with its own private Redis
(:class:`outbox.testing.RedisServer`), so memory figures are clean; workers are real
processes: ``outbox.delivery.worker.run_worker`` (what ``manage.py outbox_worker`` runs, relay
off since the benchmark has no database table), RQ's ``SimpleWorker``, Dramatiq's
``Worker`` with one thread. Rounds are interleaved (round 1 runs every case, then round
2 ...); the table shows medians and the min-max spread, ratios against the peer
measured in the same run, the issue's target and whether it is met, and is written to
``benchmarks/results/latest.md``. Dramatiq comes from the ``bench`` extra, installed
into the running venv when missing.

Internal entry points (run by the orchestrator): ``case NAME``, ``outbox-worker``,
``rq-worker``, ``dramatiq-worker``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from benchmarks import endpoints, peers
from benchmarks.common import (  # shared with benchmarks.endpoints
    RESULTS,
    ROOT,
    body_200,
    commandstats,
    fmt,
    loadavg,
    med,
    outbox_burst,
    private_redis,
    publish,
    receiver_rate,
    run_json,
    setup_django,
    stats_delta,
    steady,
    use_profile,
    used_memory,
)

RECEIVER_DELAY = 0.050  # seconds the webhook receiver takes to answer
HTTPX_THREADS = 16
LATENCY_RATE = 200  # messages per second, steady
OUTBOX_QUEUES = ["outbox_high", "outbox", "outbox_low"]


def spawn(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.compare", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_file(path: Path, proc: subprocess.Popen, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited {proc.returncode}: {proc.stderr.read()[-4000:]}")
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {path}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def commandstats_usec(conn) -> dict[str, int]:
    """Microseconds the server has spent in each command (``INFO commandstats``: a
    script's EVALSHA counts its whole run, and each command it runs counts again under
    its own name)."""
    return {k: int(v["usec"]) for k, v in conn.info("commandstats").items()}


def server_cpu(conn) -> float:
    """Seconds of CPU the Redis server has used (user + system)."""
    cpu = conn.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


# -- a receiver that answers after 50 ms ------------------------------------------------
def start_receiver(delay: float, status_of=None, latencies: bool = False) -> tuple[ThreadingHTTPServer, str]:
    """A threaded HTTP/1.1 server on loopback answering 200 after ``delay``; it records
    when each answer was sent (``server.answered``, perf_counter seconds) and the most
    requests it was answering at once (``server.most_active[0]``).

    ``status_of``: a function of the request's headers returning the status to answer
    (default 200). ``latencies``: also record, for each 2xx answer to a JSON body with a
    ``t`` (epoch seconds it was sent), milliseconds from ``t`` to the moment the receiver
    accepted it, just before it answers (``server.latencies_ms``)."""
    answered: list[float] = []
    latencies_ms: list[float] = []
    active, most_active, lock = [0], [0], threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                active[0] += 1
                most_active[0] = max(most_active[0], active[0])
            if delay:
                time.sleep(delay)
            status = status_of(self.headers) if status_of else 200
            if latencies and 200 <= status < 300:
                sent_at = json.loads(raw).get("t")
                if sent_at is not None:
                    latencies_ms.append((time.time() - sent_at) * 1000)
            with lock:
                active[0] -= 1
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            answered.append(time.perf_counter())

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128

    server = Server(("127.0.0.1", 0), Handler)
    server.answered = answered
    server.latencies_ms = latencies_ms
    server.most_active = most_active
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/hook"


# -- cases (each in its own process, with its own Redis) ---------------------------------


def outbox_warmed(body: dict):
    """Send one message (scripts loaded, queues known, this thread's connection made),
    then empty Redis as a running deployment would find it; returns the connection."""
    import outbox
    from outbox.store import get_repository
    from outbox.store.client.connection import get_connection

    conn = get_connection()
    outbox.send("noop", body)
    conn.flushdb()
    # A deployment's first worker upgrades the records once (`outbox:schema`); the flush
    # above removed that mark, which would make a worker scan every pending message for
    # a 0.1 upgrade that a running system does not repeat.
    get_repository().upgrade()
    return conn


def case_outbox(n: int, many: bool, profile: str = "tuned") -> dict:
    """send() (or send_many(100)) of n no-op messages, then one worker process delivers
    them, with the destinations' ``MAX_IN_FLIGHT`` of ``profile`` (see :func:`use_profile`)."""
    use_profile(profile)
    server = private_redis()
    try:
        setup_django()
        import outbox
        from outbox.store import get_repository

        body = body_200()
        conn = outbox_warmed(body)
        mem0 = used_memory(conn)
        t0 = time.perf_counter()
        if many:
            for i in range(0, n, 100):
                outbox.send_many([{"destination": "noop", "body": body}] * min(100, n - i))
        else:
            for _ in range(n):
                outbox.send("noop", body)
        sent = time.perf_counter() - t0
        mem1 = used_memory(conn)
        cs0, cpu0 = commandstats(conn), server_cpu(conn)
        worker = outbox_burst(n)
        cs1, cpu1 = commandstats(conn), server_cpu(conn)
        repo = get_repository()
        succeeded = repo.count("succeeded")
        assert succeeded == n, f"{succeeded} of {n} succeeded"
        mem2 = used_memory(conn)
        server_cmds = stats_delta(cs0, cs1)
        rq_keys = len(conn.keys("rq:*"))
        return {
            "send_per_s": n / sent,
            "deliver_per_s": n / worker["drain"],
            "deliver_steady_per_s": worker["steady"],
            "pending_bytes": (mem1 - mem0) / n,
            "succeeded_bytes": (mem2 - mem0) / n,
            "server_cmds_per_msg": sum(server_cmds.values()) / n,
            "server_hgetall_per_msg": server_cmds.get("cmdstat_hgetall", 0) / n,
            "server_cpu_us_per_msg": (cpu1 - cpu0) / n * 1e6,
            "server_top": sorted(server_cmds.items(), key=lambda kv: -kv[1])[:12],
            "client_cmds_per_msg": worker["commands"] / n,
            "client_trips_per_msg": worker["trips"] / n,
            "rq_keys_left": rq_keys,
        }
    finally:
        server.stop()


def case_rq(n: int) -> dict:
    server = private_redis()
    try:
        from redis import Redis
        from rq import Queue

        conn = Redis.from_url(server.url)
        queue = Queue("bench", connection=conn)
        body = body_200()
        queue.enqueue("benchmarks.peers.noop_job", body)
        conn.flushdb()
        mem0 = used_memory(conn)
        t0 = time.perf_counter()
        for _ in range(n):
            queue.enqueue("benchmarks.peers.noop_job", body)
        sent = time.perf_counter() - t0
        mem1 = used_memory(conn)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "done.json"
            worker = run_json(
                ["rq-worker"],
                env={"BENCH_REDIS_URL": server.url, "BENCH_EXPECT": str(n), "BENCH_OUT": str(out)},
            )
            done = json.loads(out.read_text())
            worker["steady"] = steady(done)
            worker["drain"] = done["done_at"] - worker["t0"]
        assert queue.count == 0
        mem2 = used_memory(conn)
        conn.flushdb()
        t0 = time.perf_counter()
        for i in range(0, n, 100):
            queue.enqueue_many(
                [Queue.prepare_data("benchmarks.peers.noop_job", (body,)) for _ in range(min(100, n - i))]
            )
        many = time.perf_counter() - t0
        assert queue.count == n
        return {
            "send_per_s": n / sent,
            "many_per_s": n / many,
            "deliver_per_s": n / worker["drain"],
            "deliver_steady_per_s": worker["steady"],
            "pending_bytes": (mem1 - mem0) / n,
            "succeeded_bytes": (mem2 - mem0) / n,
        }
    finally:
        server.stop()


def case_dramatiq(n: int) -> dict:
    server = private_redis()
    try:
        from redis import Redis

        from benchmarks import dramatiq_peer as dp

        conn = Redis.from_url(server.url)
        body = body_200()
        dp.noop_actor.send(body)
        conn.flushdb()
        mem0 = used_memory(conn)
        t0 = time.perf_counter()
        for _ in range(n):
            dp.noop_actor.send(body)
        sent = time.perf_counter() - t0
        mem1 = used_memory(conn)
        out: dict = {"send_per_s": n / sent, "pending_bytes": (mem1 - mem0) / n}
        for label, prefetch in (("deliver_per_s", 0), ("deliver_prefetch_per_s", 100)):
            if prefetch:  # a fresh backlog for the second worker
                for _ in range(n):
                    dp.noop_actor.send(body)
            res = dramatiq_worker_run(server.url, n, prefetch)
            out[label] = n / res["elapsed"]
            out[label.replace("_per_s", "_steady_per_s")] = res["steady"]
        return out
    finally:
        server.stop()


def dramatiq_worker_run(url: str, n: int, prefetch: int, timeout: float = 300) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "done.json"
        env = {
            "BENCH_REDIS_URL": url,
            "BENCH_EXPECT": str(n),
            "BENCH_OUT": str(out),
            "BENCH_PREFETCH": str(prefetch),
            "BENCH_READY": str(Path(tmp) / "ready.json"),
        }
        proc = spawn(["dramatiq-worker"], env)
        try:
            ready = wait_file(Path(env["BENCH_READY"]), proc, 60)
            done = wait_file(out, proc, timeout)
        finally:
            stop(proc)
        return {
            "elapsed": done["done_at"] - ready["t0"],
            "steady": steady(done),
            "latencies_ms": done["latencies_ms"],
        }


def case_webhook_outbox(n: int, profile: str = "defaults") -> dict:
    """n webhooks to the 50 ms receiver, drained by one worker process, with the
    destinations' ``MAX_IN_FLIGHT`` of ``profile`` (see :func:`use_profile`)."""
    use_profile(profile)
    receiver, url = start_receiver(RECEIVER_DELAY)
    os.environ["BENCH_HOOK_URL"] = url
    server = private_redis()
    try:
        setup_django()
        import outbox
        from outbox.store import get_repository
        from outbox.store.client.connection import get_connection

        body = body_200()
        for i in range(0, n, 100):
            outbox.send_many([{"destination": "hook", "body": body}] * min(100, n - i))
        conn = get_connection()
        cs0, cpu0 = commandstats(conn), server_cpu(conn)
        worker = outbox_burst(n, env={"BENCH_HOOK_URL": url})
        cs1, cpu1 = commandstats(conn), server_cpu(conn)
        succeeded = get_repository().count("succeeded")
        assert succeeded == n, f"{succeeded} of {n} succeeded: {get_repository().counts()}"
        server_cmds = stats_delta(cs0, cs1)
        return {
            "deliver_per_s": receiver_rate(receiver),
            "most_in_flight": receiver.most_active[0],
            "run_per_s": n / worker["elapsed"],
            "server_cmds_per_msg": sum(server_cmds.values()) / n,
            "server_cpu_us_per_msg": (cpu1 - cpu0) / n * 1e6,
        }
    finally:
        server.stop()
        receiver.shutdown()


def case_webhook_httpx(n: int) -> dict:
    import httpx

    receiver, url = start_receiver(RECEIVER_DELAY)
    payload = json.dumps(body_200(), separators=(",", ":")).encode()
    counter = iter(range(n))
    lock = threading.Lock()
    client = httpx.Client(
        limits=httpx.Limits(max_connections=HTTPX_THREADS, max_keepalive_connections=HTTPX_THREADS)
    )

    def post_all():
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            r = client.post(
                url, content=payload, headers={"content-type": "application/json", "webhook-id": f"msg_{i}"}
            )
            r.raise_for_status()

    try:
        threads = [threading.Thread(target=post_all) for _ in range(HTTPX_THREADS)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"deliver_per_s": receiver_rate(receiver), "run_per_s": n / (time.perf_counter() - t0)}
    finally:
        client.close()
        receiver.shutdown()


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def steady_send(n: int, rate: float, send) -> None:
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(body_200(t=time.time()))


def case_latency_outbox(n: int) -> dict:
    server = private_redis()
    try:
        setup_django()
        import outbox

        with tempfile.TemporaryDirectory() as tmp:
            out, ready = Path(tmp) / "done.json", Path(tmp) / "ready.json"
            proc = spawn(
                ["outbox-worker"], {"BENCH_EXPECT": str(n), "BENCH_OUT": str(out), "BENCH_READY": str(ready)}
            )
            try:
                wait_file(ready, proc, 60)
                time.sleep(1.0)  # RQ's worker registers and starts listening
                steady_send(n, LATENCY_RATE, lambda body: outbox.send("latency", body))
                done = wait_file(out, proc, 120)
            finally:
                stop(proc)
        lat = done["latencies_ms"]
        return {"median_ms": statistics.median(lat), "p99_ms": percentile(lat, 0.99), "max_ms": max(lat)}
    finally:
        server.stop()


def case_latency_dramatiq(n: int) -> dict:
    server = private_redis()
    try:
        from benchmarks import dramatiq_peer as dp

        with tempfile.TemporaryDirectory() as tmp:
            out, ready = Path(tmp) / "done.json", Path(tmp) / "ready.json"
            env = {
                "BENCH_EXPECT": str(n),
                "BENCH_OUT": str(out),
                "BENCH_READY": str(ready),
                "BENCH_PREFETCH": "100",
            }
            proc = spawn(["dramatiq-worker"], env)
            try:
                wait_file(ready, proc, 60)
                time.sleep(1.0)
                steady_send(n, LATENCY_RATE, lambda body: dp.latency_actor.send(body))
                done = wait_file(out, proc, 120)
            finally:
                stop(proc)
        lat = done["latencies_ms"]
        return {"median_ms": statistics.median(lat), "p99_ms": percentile(lat, 0.99), "max_ms": max(lat)}
    finally:
        server.stop()


def case_send_alternating(n: int, block: int = 200) -> dict:
    """``outbox.send`` and Dramatiq's ``send`` in one process against one Redis, in
    alternating blocks of ``block`` calls, n calls each: both see the same machine at
    nearly the same moment, so drift between cases (a VM's neighbours) cancels out.
    Returns the median µs per call over the blocks of each."""
    server = private_redis()
    try:
        setup_django()
        import outbox
        from benchmarks import dramatiq_peer as dp

        body = body_200()
        dp.noop_actor.send(body)  # warm-up: its script loaded, its connection made
        outbox_warmed(body)

        def timed(send) -> float:
            t0 = time.perf_counter()
            for _ in range(block):
                send(body)
            return (time.perf_counter() - t0) / block * 1e6

        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(max(1, n // block)):
            ours.append(timed(lambda b: outbox.send("noop", b)))
            theirs.append(timed(dp.noop_actor.send))
        return {
            "outbox_us": statistics.median(ours),
            "dramatiq_us": statistics.median(theirs),
            "blocks": len(ours),
        }
    finally:
        server.stop()


def alternate(sides: dict, rounds: int) -> dict[str, list[float]]:
    """Run each of ``sides`` (name -> a function timing one block, returning µs) in turn,
    ``rounds`` times, which goes first alternating round by round: every side sees the
    machine at nearly the same moments. Returns each side's block figures."""
    out: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            out[name].append(sides[name]())
    return out


def case_many_alternating(n: int, block: int = 10) -> dict:
    """``outbox.send_many`` of 100 messages and RQ's ``Queue.enqueue_many`` of 100
    ``Queue.prepare_data`` jobs in one process against one Redis, in alternating blocks
    of ``block`` calls, n messages each. Returns the median messages per second over
    the blocks of each."""
    server = private_redis()
    try:
        setup_django()
        from redis import Redis
        from rq import Queue

        import outbox

        body = body_200()
        outbox_warmed(body)
        queue = Queue("bench", connection=Redis.from_url(server.url))
        queue.enqueue("benchmarks.peers.noop_job", body)  # warm-up
        items = [{"destination": "noop", "body": body}] * 100

        def ours() -> float:
            t0 = time.perf_counter()
            for _ in range(block):
                outbox.send_many(items)
            return block * 100 / (time.perf_counter() - t0)

        def rq_many() -> float:
            t0 = time.perf_counter()
            for _ in range(block):
                queue.enqueue_many(
                    [Queue.prepare_data("benchmarks.peers.noop_job", (body,)) for _ in range(100)]
                )
            return block * 100 / (time.perf_counter() - t0)

        got = alternate({"outbox": ours, "rq": rq_many}, max(1, n // (100 * block)))
        return {
            "outbox_per_s": statistics.median(got["outbox"]),
            "rq_per_s": statistics.median(got["rq"]),
            "blocks": len(got["outbox"]),
        }
    finally:
        server.stop()


def case_atomic_alternating(n: int, block: int = 200) -> dict:
    """``outbox.send`` inside ``transaction.atomic`` (captured in the database, pushed to
    Redis when the transaction commits) against django-rq's ``enqueue`` inside
    ``transaction.atomic`` with ``commit_mode="on_db_commit"`` (the job enqueued when the
    transaction commits: django-rq's own way of not sending what a rollback undoes), and
    for reference with its default ``"auto"`` (enqueued at once, inside the
    transaction), in one process against one Redis and the settings' database (SQLite in
    memory), in alternating blocks of ``block`` transactions, n each. Returns the median
    µs per transaction over the blocks of each."""
    server = private_redis()
    try:
        setup_django()
        import django_rq
        from django.core.management import call_command
        from django.db import transaction

        import outbox

        call_command("migrate", verbosity=0)
        body = body_200()
        outbox_warmed(body)
        on_commit = django_rq.get_queue("outbox", commit_mode="on_db_commit")
        auto = django_rq.get_queue("outbox", commit_mode="auto")
        for q in (on_commit, auto):
            with transaction.atomic():
                q.enqueue("benchmarks.peers.noop_job", body)  # warm-up

        def timed(send) -> Callable[[], float]:
            def run() -> float:
                t0 = time.perf_counter()
                for _ in range(block):
                    with transaction.atomic():
                        send()
                return (time.perf_counter() - t0) / block * 1e6

            return run

        got = alternate(
            {
                "outbox": timed(lambda: outbox.send("noop", body)),
                "on_commit": timed(lambda: on_commit.enqueue("benchmarks.peers.noop_job", body)),
                "auto": timed(lambda: auto.enqueue("benchmarks.peers.noop_job", body)),
            },
            max(1, n // block),
        )
        from outbox.models import CapturedMessage

        assert not CapturedMessage.objects.exists(), "a captured message was not pushed on commit"
        return {
            "outbox_us": statistics.median(got["outbox"]),
            "django_rq_us": statistics.median(got["on_commit"]),
            "django_rq_auto_us": statistics.median(got["auto"]),
            "blocks": len(got["outbox"]),
        }
    finally:
        server.stop()


def case_delivery_alternating(n: int, bursts: int = 6) -> dict:
    """Out of the box against tuned, one private Redis: ``bursts`` bursts of n no-op
    messages (sent with ``send_many``, then drained by a new worker process), the profile
    alternating burst by burst and which goes first alternating pair by pair, so both see
    the machine at nearly the same moments (the per-case rows run seconds apart, and on a
    shared VM the first of two back-to-back runs was often 20-30 % faster, whichever it
    was). Returns the median drain rate of each profile."""
    server = private_redis()
    try:
        setup_django()
        import outbox
        from outbox.store import get_repository

        body = body_200()
        outbox_warmed(body)
        rates: dict[str, list[float]] = {"defaults": [], "tuned": []}
        delivered = 0
        for i in range(bursts):
            pair = ("tuned", "defaults") if (i // 2) % 2 == 0 else ("defaults", "tuned")
            profile = pair[i % 2]
            for j in range(0, n, 100):
                outbox.send_many([{"destination": "noop", "body": body}] * min(100, n - j))
            worker = outbox_burst(n, env={"BENCH_PROFILE": profile})
            delivered += n
            assert get_repository().count("succeeded") == delivered
            rates[profile].append(n / worker["drain"])
        return {
            "defaults_per_s": statistics.median(rates["defaults"]),
            "tuned_per_s": statistics.median(rates["tuned"]),
            "bursts": bursts,
        }
    finally:
        server.stop()


def case_cluster(n: int, primaries: int, partitions: int, profile: str = "defaults") -> dict:
    """Issue 22's cluster rows: on a private cluster of ``primaries`` primaries in
    ``partitions`` partitions (RQ's queues on a plain private Redis beside it), or with
    ``primaries`` 0 on one private server: ``send()`` of n no-op messages, one worker
    process delivers them; then ``send_many(100)`` of n more, delivered likewise. Out of
    the box (``profile`` "defaults": no ``MAX_IN_FLIGHT`` set, see :func:`use_profile`)."""
    from outbox.testing.cluster_server import ClusterServer

    use_profile(profile)
    server = private_redis()  # RQ's plain Redis (and the only one with primaries 0)
    cluster = ClusterServer(primaries=primaries).start() if primaries else None
    if cluster is not None:
        os.environ["BENCH_CLUSTER_NODES"] = ",".join(cluster.urls)
        os.environ["BENCH_PARTITIONS"] = str(partitions)
    elif partitions > 1:
        os.environ["BENCH_PARTITIONS"] = str(partitions)
    try:
        setup_django()
        import outbox
        from outbox.store import get_repository
        from outbox.store.client.connection import empty_database

        body = body_200()
        outbox.send("noop", body)  # scripts loaded, queues known, this thread's connection made
        empty_database()
        # A new repository: the old one remembers the destinations it registered (a set in
        # the {g} slot with partitions), which FLUSHDB removed.
        get_repository.cache_clear()
        get_repository().upgrade()  # as outbox_warmed: a running deployment's schema mark
        out: dict = {}
        for label, many in (("send", False), ("many", True)):
            t0 = time.perf_counter()
            if many:
                for i in range(0, n, 100):
                    outbox.send_many([{"destination": "noop", "body": body}] * min(100, n - i))
            else:
                for _ in range(n):
                    outbox.send("noop", body)
            out[f"{label}_per_s"] = n / (time.perf_counter() - t0)
            worker = outbox_burst(n)
            succeeded = get_repository().count("succeeded")
            assert succeeded == n * (2 if many else 1), (
                f"{succeeded} succeeded after {label}: {worker} {get_repository().counts()}"
            )
            out[f"{label}_deliver_per_s"] = n / worker["drain"]
            out[f"{label}_deliver_steady_per_s"] = worker["steady"]
            out[f"{label}_client_trips_per_msg"] = worker["trips"] / n
        return out
    finally:
        if cluster is not None:
            cluster.stop()
        server.stop()


#: The set-ups of the cluster rows: (label, primaries (0: one server), partitions).
#: ``single16`` (one server at P = 16, a private server of its own) tells the cost of
#: partitions from the cost of the cluster client.
CLUSTER_SETUPS = (("single", 0, 1), ("single16", 0, 16), ("cluster1", 1, 16), ("cluster3", 3, 16))
CLUSTER_SEND_BLOCK = 200  # send() calls per timed block
CLUSTER_MANY_BLOCK = 5  # send_many(100) calls per timed block
#: The tuned delivery rows' worker CONCURRENCY (out of the box: 32). A worker's round
#: claims up to its free slots, split over the partitions with due work: more slots, more
#: messages per script call.
CLUSTER_TUNED_CONCURRENCY = 128


#: The set-ups of the partitions rows (docs/operations.md, "Choosing P"): P on 3 primaries.
PARTITION_SETUPS = (("p16", 3, 16), ("p64", 3, 64), ("p256", 3, 256))


def case_cluster_alternating(n: int, bursts: int = 2, setups: tuple = CLUSTER_SETUPS) -> dict:
    """Issue 22's cluster rows, in one process: one private server (P = 1), another at
    P = 16, a private 1-primary and a 3-primary cluster (P = 16, RQ's queues on the first
    private server beside them, as a cluster deployment runs it), used in turn, so the three see the machine
    at nearly the same moments (on this shared VM the load moves within seconds; the
    per-set-up cases ``single-p1``... run tens of seconds apart).

    * ``send()``: blocks of :data:`CLUSTER_SEND_BLOCK` calls, set-up after set-up in a
      rotating order, n calls each; median µs per call over the blocks of each.
    * ``send_many(100)``: blocks of :data:`CLUSTER_MANY_BLOCK` calls likewise, n
      messages each; median messages/s over the blocks.
    * no-op delivery: ``bursts`` bursts of n messages per set-up (sent with
      ``send_many``, then drained by a new worker process on that set-up, out of the
      box: no ``MAX_IN_FLIGHT``), set-up after set-up; median drain rate. Beside each,
      a burst drained by a tuned worker (``CONCURRENCY`` :data:`CLUSTER_TUNED_CONCURRENCY`),
      which goes first every other turn.

    ``setups``: (label, primaries, partitions) of each (:data:`PARTITION_SETUPS`: three
    3-primary clusters at P = 16, 64, 256). The outbox is pointed at each set-up with ``override_settings`` (the repository and
    connection built anew at each switch, before the block's timing starts)."""
    from django.test import override_settings

    from outbox.testing import RedisServer
    from outbox.testing.cluster_server import ClusterServer

    use_profile("defaults")
    server = private_redis()
    other = RedisServer().start()  # single16's
    clusters: dict[str, ClusterServer] = {}
    try:
        for label, primaries, _ in setups:
            if primaries:
                clusters[label] = ClusterServer(primaries=primaries).start()
        setup_django()
        from django.conf import settings

        import outbox
        from outbox.store import get_repository
        from outbox.store.client.connection import empty_database

        base = settings.OUTBOX
        rq_plain = {name: {"URL": server.url} for name in OUTBOX_QUEUES}

        def use(label: str):
            """override_settings for set-up ``label``, and the worker's environment."""
            _, primaries, partitions = next(s for s in setups if s[0] == label)
            if not primaries and partitions == 1:
                return override_settings(OUTBOX={**base}), {"BENCH_CLUSTER_NODES": "", "BENCH_PARTITIONS": ""}
            if not primaries:
                caches = {"default": {**settings.CACHES["default"], "LOCATION": other.url}}
                env = {
                    "BENCH_CLUSTER_NODES": "",
                    "BENCH_PARTITIONS": str(partitions),
                    "OUTBOX_TEST_REDIS_URL": other.url,
                }
                return override_settings(OUTBOX={**base, "PARTITIONS": partitions}, CACHES=caches), env
            urls = clusters[label].urls
            outbox_setting = {**base, "CLUSTER": {"NODES": urls}, "PARTITIONS": partitions}
            env = {"BENCH_CLUSTER_NODES": ",".join(urls), "BENCH_PARTITIONS": str(partitions)}
            return override_settings(OUTBOX=outbox_setting, RQ_QUEUES=rq_plain), env

        labels = [label for label, _, _ in setups]

        def turns(count: int):
            """(turn, label) for ``count`` turns of every set-up, the order rotating."""
            for t in range(count):
                shift = t % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    yield t, label

        def empty_all() -> None:
            for label in labels:
                context, _ = use(label)
                with context:
                    empty_database()

        body = body_200()
        send_us: dict[str, list[float]] = {label: [] for label in labels}
        for _, label in turns(max(1, n // CLUSTER_SEND_BLOCK)):
            context, _ = use(label)
            with context:
                outbox.send("noop", body)  # this set-up's repository, scripts and connections ready
                t0 = time.perf_counter()
                for _ in range(CLUSTER_SEND_BLOCK):
                    outbox.send("noop", body)
                send_us[label].append((time.perf_counter() - t0) / CLUSTER_SEND_BLOCK * 1e6)
        many_rate: dict[str, list[float]] = {label: [] for label in labels}
        for _, label in turns(max(1, n // (100 * CLUSTER_MANY_BLOCK))):
            context, _ = use(label)
            with context:
                outbox.send("noop", body)
                t0 = time.perf_counter()
                for _ in range(CLUSTER_MANY_BLOCK):
                    outbox.send_many([{"destination": "noop", "body": body}] * 100)
                many_rate[label].append(100 * CLUSTER_MANY_BLOCK / (time.perf_counter() - t0))
        empty_all()  # and RQ's wake-up jobs of those sends, on the private server
        deliver_rate: dict[str, list[float]] = {label: [] for label in labels}
        tuned_rate: dict[str, list[float]] = {label: [] for label in labels}
        delivered = dict.fromkeys(labels, 0)
        for turn, label in turns(bursts):
            context, env = use(label)
            with context:
                get_repository().upgrade()  # a running deployment's schema mark (see outbox_warmed)
                # out of the box, then tuned (or the other way round, turn by turn)
                for tuned in (False, True) if turn % 2 == 0 else (True, False):
                    for i in range(0, n, 100):
                        outbox.send_many([{"destination": "noop", "body": body}] * min(100, n - i))
                    worker_env = {**env, "BENCH_CONCURRENCY": str(CLUSTER_TUNED_CONCURRENCY) if tuned else ""}
                    worker = outbox_burst(n, env=worker_env)
                    delivered[label] += n
                    succeeded = get_repository().count("succeeded")
                    assert succeeded == delivered[label], (
                        f"{label}: {succeeded} of {delivered[label]} succeeded"
                    )
                    (tuned_rate if tuned else deliver_rate)[label].append(n / worker["drain"])
        out: dict = {}
        for label in labels:
            out[f"{label}_send_us"] = statistics.median(send_us[label])
            out[f"{label}_send_per_s"] = 1e6 / out[f"{label}_send_us"]
            out[f"{label}_many_per_s"] = statistics.median(many_rate[label])
            out[f"{label}_deliver_per_s"] = statistics.median(deliver_rate[label])
            out[f"{label}_tuned_deliver_per_s"] = statistics.median(tuned_rate[label])
        return out
    finally:
        for cluster in clusters.values():
            cluster.stop()
        other.stop()
        server.stop()


# -- ordered delivery (issue 23) -----------------------------------------------------------
ORDER_PER_KEY = 10  # messages per ordering key of the throughput rows (issue 23: 1,000 keys x 10)
ORDER_PAIRS = 2  # pairs of webhook bursts (ordered, unordered) per case run, in ABBA order
ORDER_NOOP_PAIRS = 4  # pairs of no-op bursts per case run (a burst of 10,000 takes seconds)
ORDER_LATENCY_PAIRS = 3  # pairs of latency runs (not blocked, blocked) per case run
ORDER_LATENCY_KEYS = 100  # ordering keys the steady traffic of the blocked-key rows is spread over
ORDER_BACKLOG = 1000  # messages waiting behind the blocked key's dead letter
BLOCKED_KEY = "blocked-key"  # the receiver answers 400 (permanent) to this key's messages


def ordered_items(destination: str, keys: int, per_key: int, ordered: bool, body: dict) -> list[dict]:
    """``send_many`` items of ``keys`` x ``per_key`` messages, interleaved: message 1 of
    ``key-0`` ... ``key-{keys-1}``, then message 2 of each, and so on; with ``ordered``
    False the same messages without an ordering key."""
    items = []
    for _ in range(per_key):
        for k in range(keys):
            item = {"destination": destination, "body": body}
            if ordered:
                item["ordering_key"] = f"key-{k}"
            items.append(item)
    return items


def top_delta(before: dict[str, int], after: dict[str, int], n: int, count: int = 10) -> list:
    """The ``count`` largest increases of a commandstats figure, per message, by command."""
    delta = stats_delta(before, after)
    return [
        (k.removeprefix("cmdstat_"), round(v / n, 2)) for k, v in sorted(delta.items(), key=lambda kv: -kv[1])
    ][:count]


def case_ordered_delivery(
    n: int, destination: str, per_key: int = ORDER_PER_KEY, pairs: int = ORDER_PAIRS
) -> dict:
    """Issue 23's throughput rows: n messages in n / per_key ordering keys, sent
    interleaved (:func:`ordered_items`, ``send_many(100)``) and drained by one worker
    process (``outbox_worker --burst``, out of the box: no ``MAX_IN_FLIGHT`` set), against
    the same n messages without ordering keys, in one private Redis (emptied before each
    burst): ``pairs`` pairs of bursts in ABBA order (ordered, unordered, unordered,
    ordered, ...), so both see the machine at nearly the same moments.

    ``destination`` "noop" (the no-op callable): rate = n / (worker start to last
    delivery); "hook" (the receiver answering after :data:`RECEIVER_DELAY`): rate as the
    receiver saw it, (n - 1) / (first to last answer). Per mode: the median rate, the
    rate of each burst, send_many's rate, and per delivered message the server's
    commands, CPU µs and µs in scripts (``INFO commandstats``, ``INFO cpu``), with the
    commands that grew most (of the mode's last burst)."""
    use_profile("defaults")
    receiver, env = None, {}
    if destination == "hook":
        receiver, url = start_receiver(RECEIVER_DELAY)
        os.environ["BENCH_HOOK_URL"] = env["BENCH_HOOK_URL"] = url
    server = private_redis()
    try:
        setup_django()
        import outbox
        from outbox.store import get_repository

        body = body_200()
        conn = outbox_warmed(body)
        keys = max(1, n // per_key)
        n = keys * per_key
        modes = ("ordered", "unordered")
        figures: dict[str, dict[str, list]] = {m: {} for m in modes}
        for i in range(2 * pairs):
            mode = modes[(i + 1) // 2 % 2]  # ordered, unordered, unordered, ordered, ...
            conn.flushdb()
            get_repository().upgrade()  # the schema mark of a running deployment (see outbox_warmed)
            items = ordered_items(destination, keys, per_key, mode == "ordered", body)
            t0 = time.perf_counter()
            for j in range(0, n, 100):
                outbox.send_many(items[j : j + 100])
            send_s = time.perf_counter() - t0
            if receiver is not None:
                receiver.answered.clear()
                receiver.most_active[0] = 0
            cs0, us0, cpu0 = commandstats(conn), commandstats_usec(conn), server_cpu(conn)
            worker = outbox_burst(n, env=env)
            cs1, us1, cpu1 = commandstats(conn), commandstats_usec(conn), server_cpu(conn)
            counts = get_repository().counts()
            assert counts["succeeded"] == n, f"{mode}: {counts}"
            rate = receiver_rate(receiver) if receiver is not None else n / worker["drain"]
            got = figures[mode]
            for key, value in (
                ("per_s", rate),
                ("send_per_s", n / send_s),
                ("server_cmds_per_msg", sum(stats_delta(cs0, cs1).values()) / n),
                ("server_cpu_us_per_msg", (cpu1 - cpu0) / n * 1e6),
                ("script_us_per_msg", (us1.get("cmdstat_evalsha", 0) - us0.get("cmdstat_evalsha", 0)) / n),
                ("client_trips_per_msg", worker["trips"] / n),
                ("worker_cpu_us_per_msg", worker["cpu"] / n * 1e6),
                ("most_in_flight", receiver.most_active[0] if receiver is not None else 0),
            ):
                got.setdefault(key, []).append(value)
            got["top_calls"] = top_delta(cs0, cs1, n)
            got["top_usec"] = top_delta(us0, us1, n)
        out: dict = {"keys": keys, "per_key": per_key, "n": n, "redis": conn.info("server")["redis_version"]}
        for mode in modes:
            for key, values in figures[mode].items():
                if key.startswith("top_"):
                    out[f"{mode}_{key}"] = values
                else:
                    out[f"{mode}_{key}"] = statistics.median(values)
                    out[f"{mode}_{key}_each"] = values
        out["ratio"] = out["ordered_per_s"] / out["unordered_per_s"]
        return out
    finally:
        server.stop()
        if receiver is not None:
            receiver.shutdown()


def wait_until(condition, timeout: float, what: str) -> None:
    """Poll ``condition()`` every 20 ms until it is true; RuntimeError after ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def case_ordered_blocked(
    n: int, backlog: int = ORDER_BACKLOG, pairs: int = ORDER_LATENCY_PAIRS, keys: int = ORDER_LATENCY_KEYS
) -> dict:
    """Issue 23's cost of one blocked key to the others: n ordered webhooks sent at a
    steady :data:`LATENCY_RATE` per second, spread round-robin over ``keys`` ordering
    keys, with the send time in the body, to a receiver on loopback that answers at once;
    latency = the receiver's acceptance time - the send time. One long-running worker
    process (``outbox_worker``, out of the box), started anew for each run on an emptied
    private Redis. With the key blocked: before the worker starts, :data:`BLOCKED_KEY`
    gets ``backlog`` + 1 messages; the receiver answers its head 400 (permanent), so the
    head is a dead letter blocking the key with ``backlog`` messages waiting behind it,
    and the steady traffic starts once that is so. In both variants the traffic starts 1 s
    after a warm-up message was delivered. ``pairs`` pairs of runs in ABBA order
    (clear, blocked, blocked, clear). Returns p50, p99 and max of each run, and their
    medians per variant."""
    use_profile("defaults")

    def status_of(headers) -> int:
        return 400 if headers.get("Outbox-Ordering-Key") == BLOCKED_KEY else 200

    receiver, url = start_receiver(0.0, status_of=status_of, latencies=True)
    os.environ["BENCH_HOOK_URL"] = url
    server = private_redis()
    try:
        setup_django()
        import outbox
        from outbox.store import get_repository

        body = body_200()
        conn = outbox_warmed(body)
        repo = get_repository()

        def latencies(blocked: bool) -> tuple[list[float], dict[str, float]]:
            """One run on an emptied Redis with a new worker: the traffic's latencies, ms,
            and per message of the traffic the server's commands and CPU µs."""
            conn.flushdb()
            repo.upgrade()
            if blocked:
                items = [{"destination": "hook", "body": body, "ordering_key": BLOCKED_KEY}] * (backlog + 1)
                for j in range(0, len(items), 100):
                    outbox.send_many(items[j : j + 100])
            receiver.latencies_ms.clear()
            with tempfile.TemporaryDirectory() as tmp:
                ready = Path(tmp) / "ready.json"
                proc = spawn(["outbox-worker"], {"BENCH_READY": str(ready), "BENCH_HOOK_URL": url})
                try:
                    wait_file(ready, proc, 60)
                    if blocked:
                        wait_until(lambda: repo.blocked_key_count("hook") == 1, 60, "the key to block")
                    # Both variants start warm: a first delivery (the worker's first webhook
                    # made its client; without it the first 0.4 s of traffic waited up to 0.3 s)
                    warm = outbox.send("hook", body, ordering_key="warm-up")
                    wait_until(lambda: outbox.get(warm.id).status == "succeeded", 60, "the warm-up delivery")
                    time.sleep(1.0)
                    cs0, cpu0 = commandstats(conn), server_cpu(conn)
                    sent = iter(range(n))
                    steady_send(
                        n,
                        LATENCY_RATE,
                        lambda b: outbox.send("hook", b, ordering_key=f"key-{next(sent) % keys}"),
                    )
                    wait_until(lambda: len(receiver.latencies_ms) >= n, 120, f"{n} acceptances")
                    cs1, cpu1 = commandstats(conn), server_cpu(conn)
                finally:
                    stop(proc)
            counts = repo.counts()
            if blocked:  # the key stayed blocked, its messages undelivered
                assert counts["waiting"] == backlog and counts["failed"] == 1, counts
                assert repo.blocked_key_count("hook") == 1
            assert counts["succeeded"] == n + 1, counts  # and the warm-up
            cost = {
                "server_cmds_per_msg": sum(stats_delta(cs0, cs1).values()) / n,
                "server_cpu_us_per_msg": (cpu1 - cpu0) / n * 1e6,
            }
            return list(receiver.latencies_ms), cost

        runs: dict[str, dict[str, list[float]]] = {"clear": {}, "blocked": {}}
        for i in range(2 * pairs):
            variant = ("clear", "blocked")[(i + 1) // 2 % 2]  # clear, blocked, blocked, clear, ...
            lat, cost = latencies(variant == "blocked")
            for key, value in (
                ("p50_ms", statistics.median(lat)),
                ("p99_ms", percentile(lat, 0.99)),
                ("max_ms", max(lat)),
                *cost.items(),
            ):
                runs[variant].setdefault(key, []).append(value)
        out: dict = {"n": n, "keys": keys, "backlog": backlog, "redis": conn.info("server")["redis_version"]}
        for variant, figures in runs.items():
            for key, values in figures.items():
                out[f"{variant}_{key}"] = statistics.median(values)
                out[f"{variant}_{key}_each"] = values
        return out
    finally:
        server.stop()
        receiver.shutdown()


CASES = {
    "send-alternating": case_send_alternating,
    "many-alternating": case_many_alternating,
    "atomic-alternating": case_atomic_alternating,
    "outbox-send": lambda n: case_outbox(n, many=False),
    "outbox-send-defaults": lambda n: case_outbox(n, many=False, profile="defaults"),
    "delivery-alternating": case_delivery_alternating,
    "outbox-many": lambda n: case_outbox(n, many=True),
    "rq": case_rq,
    "dramatiq": case_dramatiq,
    "webhook-outbox": case_webhook_outbox,
    "webhook-outbox-tuned": lambda n: case_webhook_outbox(n, profile="tuned"),
    "webhook-httpx": case_webhook_httpx,
    "latency-outbox": case_latency_outbox,
    "latency-dramatiq": case_latency_dramatiq,
    # issue 22: the same on one server (P = 1), a 1-primary and a 3-primary cluster (P = 16)
    "cluster-alternating": case_cluster_alternating,
    "partitions-alternating": lambda n: case_cluster_alternating(n, setups=PARTITION_SETUPS),
    # issue 23: ordered delivery (n messages; n // ORDER_PER_KEY keys of ORDER_PER_KEY each)
    "ordered-noop": lambda n, **kw: case_ordered_delivery(n, "noop", pairs=ORDER_NOOP_PAIRS, **kw),
    "ordered-hook": lambda n, **kw: case_ordered_delivery(n, "hook", **kw),
    "ordered-blocked": case_ordered_blocked,
    # issue 34: webhooks for customers at 10,000 endpoints (benchmarks/endpoints.py)
    "endpoints": lambda n, **kw: endpoints.case_endpoints(n, **kw),
    "single-p1": lambda n: case_cluster(n, primaries=0, partitions=1),
    "cluster1-p16": lambda n: case_cluster(n, primaries=1, partitions=16),
    "cluster3-p16": lambda n: case_cluster(n, primaries=3, partitions=16),
    # diagnostics, not in a table: partitions alone (a cluster needs P > 1: keys of several slots)
    "single-p16": lambda n: case_cluster(n, primaries=0, partitions=16),
    # choosing P (docs/operations.md): the cost of more partitions on 3 primaries
    "cluster3-p64": lambda n: case_cluster(n, primaries=3, partitions=64),
    "cluster3-p256": lambda n: case_cluster(n, primaries=3, partitions=256),
}


# -- worker processes --------------------------------------------------------------------
def count_client_commands() -> dict[str, int]:
    """Count commands and round trips this process sends to Redis (redis-py, all clients)."""
    from redis.connection import AbstractConnection

    counts = {"commands": 0, "trips": 0}
    lock = threading.Lock()
    send_command, pack_commands = AbstractConnection.send_command, AbstractConnection.pack_commands

    def counted_send_command(self, *args, **kwargs):
        with lock:
            counts["commands"] += 1
            counts["trips"] += 1
        return send_command(self, *args, **kwargs)

    def counted_pack_commands(self, commands):
        commands = list(commands)
        with lock:
            counts["commands"] += len(commands)
            counts["trips"] += 1
        return pack_commands(self, commands)

    AbstractConnection.send_command = counted_send_command
    AbstractConnection.pack_commands = counted_pack_commands
    return counts


def profile_threads(prefix: str | None):
    """Diagnostics (``BENCH_CPROFILE=PREFIX``, burst worker only): cProfile every thread of
    this process (the main one and each thread started from now on: the attempt threads,
    the housekeeper), timed by each thread's own CPU clock (``time.thread_time``: not the
    time a thread waits for the GIL, a socket or a lock), each to ``PREFIX.<thread id>.prof``;
    merge them with ``pstats.Stats(*glob(PREFIX + ".*.prof"))``. Returns the function that stops the main
    thread's profiler and writes its file, or None without the variable."""
    if not prefix:
        return None
    import cProfile

    def dump(profiler: cProfile.Profile) -> None:
        profiler.disable()
        profiler.dump_stats(f"{prefix}.{threading.get_ident()}.prof")

    run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        try:
            run(self)
        finally:
            dump(profiler)

    threading.Thread.run = profiled_run  # type: ignore[method-assign]
    main = cProfile.Profile(time.thread_time)
    main.enable()
    return lambda: dump(main)


def outbox_worker(burst: bool) -> None:
    setup_django()
    from django.core import checks

    from outbox.delivery.worker import WorkerOptions, run_worker

    # What `manage.py outbox_worker` does before its worker starts: Django's system checks,
    # which build every configured destination (importing its transport module). Dramatiq's
    # worker likewise has its broker and actors imported before its clock starts.
    checks.run_checks()

    if burst:
        profiling = profile_threads(os.environ.get("BENCH_CPROFILE"))
        counts = count_client_commands()
        t0, cpu0 = time.perf_counter(), time.process_time()
        run_worker(OUTBOX_QUEUES, WorkerOptions(burst=True, logging_level="WARNING", relay=False))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if profiling is not None:
            profiling()
        print(json.dumps({"t0": t0, "elapsed": elapsed, "cpu": cpu, **counts}))
        return
    peers.write_json(os.environ["BENCH_READY"], {"t0": time.perf_counter()})
    run_worker(OUTBOX_QUEUES, WorkerOptions(logging_level="WARNING", relay=False))


def rq_worker() -> None:
    from redis import Redis
    from rq import Queue, SimpleWorker

    conn = Redis.from_url(os.environ["BENCH_REDIS_URL"])
    worker = SimpleWorker([Queue("bench", connection=conn)], connection=conn)
    t0 = time.perf_counter()
    worker.work(burst=True, logging_level="WARNING")
    print(json.dumps({"t0": t0, "elapsed": time.perf_counter() - t0}))


def dramatiq_worker() -> None:
    from dramatiq import Worker

    from benchmarks import dramatiq_peer as dp

    worker = Worker(dp.broker, worker_threads=1)
    prefetch = int(os.environ.get("BENCH_PREFETCH", "0"))
    if prefetch:
        worker.queue_prefetch = prefetch
    t0 = time.perf_counter()
    worker.start()
    peers.write_json(os.environ["BENCH_READY"], {"t0": t0})
    try:
        while True:
            time.sleep(3600)
    finally:
        worker.stop()


# -- the orchestrator --------------------------------------------------------------------
def ensure_dramatiq() -> None:
    try:
        import dramatiq  # noqa: F401
    except ImportError:
        print("installing the bench extra (dramatiq[redis]) into this venv ...", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-e",
                f"{ROOT}[bench]",
            ],
            check=True,
        )


def run_admin(total: int, failed: int) -> dict:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.settings", "PYTHONPATH": str(ROOT)}
    env.pop("OUTBOX_TEST_REDIS_URL", None)  # benchmarks.settings starts its own private Redis
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.bench_admin",
            "--total",
            str(total),
            "--failed",
            str(failed),
            "--requests",
            "20",
            "--rounds",
            "1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"bench_admin failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    pages = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"\|\s*([^|]+?)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|", line)
        if m and "requeue" not in m.group(1) and not m.group(1).startswith("("):
            pages[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return pages


#: The cases of ``--send``.
SEND_CASES = ["send-alternating", "many-alternating", "atomic-alternating"]


def send_rows(m, vals, row) -> None:
    """Issue 30's send-side rows, each from one case that alternates the outbox with its
    peer in one process (:func:`case_send_alternating`, :func:`case_many_alternating`,
    :func:`case_atomic_alternating`): the ratio of the medians of the rounds, and each
    round's own ratio, so the spread of the ratio shows beside that of the figures."""

    def per_round(case: str, ours: str, theirs: str, faster: str) -> str:
        pairs = zip(vals(case, ours), vals(case, theirs), strict=True)
        return ", ".join(f"{(t / o if faster == 'lower' else o / t):.2f}" for o, t in pairs)

    r = m("send-alternating", "dramatiq_us") / m("send-alternating", "outbox_us")
    row(
        "send(), µs per call; one process, alternating blocks of 200 calls with Dramatiq's send",
        med(vals("send-alternating", "outbox_us")),
        f"Dramatiq send {med(vals('send-alternating', 'dramatiq_us'))}",
        f"{r:.2f}× Dramatiq (rounds: {per_round('send-alternating', 'outbox_us', 'dramatiq_us', 'lower')})",
        "≥ 1.0× Dramatiq send",
        r >= 1.0,
    )
    r = m("many-alternating", "outbox_per_s") / m("many-alternating", "rq_per_s")
    row(
        "send_many(100), msg/s; one process, alternating blocks of 10 calls with RQ's enqueue_many(100)",
        med(vals("many-alternating", "outbox_per_s")),
        f"RQ enqueue_many(100) {med(vals('many-alternating', 'rq_per_s'))}",
        f"{r:.2f}× RQ (rounds: {per_round('many-alternating', 'outbox_per_s', 'rq_per_s', 'higher')})",
        "≥ 2× RQ enqueue_many",
        r >= 2.0,
    )
    r = m("atomic-alternating", "django_rq_us") / m("atomic-alternating", "outbox_us")
    auto = m("atomic-alternating", "django_rq_auto_us") / m("atomic-alternating", "outbox_us")
    row(
        "send() inside transaction.atomic (SQLite), µs per transaction; one process, alternating blocks of "
        "200 with django-rq's enqueue inside transaction.atomic",
        med(vals("atomic-alternating", "outbox_us")),
        f"django-rq, commit_mode on_db_commit (enqueued at commit): "
        f"{med(vals('atomic-alternating', 'django_rq_us'))}; default auto (enqueued at once, "
        f"inside the transaction): {med(vals('atomic-alternating', 'django_rq_auto_us'))}",
        f"{r:.2f}× django-rq on_db_commit "
        f"(rounds: {per_round('atomic-alternating', 'outbox_us', 'django_rq_us', 'lower')}); {auto:.2f}× auto",
        "≥ 0.8× django-rq in atomic",
        r >= 0.8,
    )


#: The cases of ``--settings-only``.
SETTINGS_CASES = [
    "outbox-send",
    "outbox-send-defaults",
    "delivery-alternating",
    "dramatiq",
    "webhook-outbox",
    "webhook-outbox-tuned",
]


def settings_rows(m, vals, row) -> None:
    """The rows out of the box beside tuned (issue 20, item 13): a worker with one busy
    destination must reach, with the settings a user gets, at least 90 % of its tuned
    rate. "Tuned" sets every destination's MAX_IN_FLIGHT to 32, the worker's CONCURRENCY;
    "out of the box" sets none (``benchmarks/compare_settings.py``, ``BENCH_PROFILE``)."""
    d, t = m("outbox-send-defaults", "deliver_per_s"), m("outbox-send", "deliver_per_s")
    row(
        "no-op delivery, 1 worker, sent with send(), msg/s, **out of the box** (no MAX_IN_FLIGHT set: "
        "a callable may use the worker's CONCURRENCY, 32)",
        med(vals("outbox-send-defaults", "deliver_per_s")),
        f"tuned (MAX_IN_FLIGHT 32): {med(vals('outbox-send', 'deliver_per_s'))}; "
        f"Dramatiq prefetch 100: {med(vals('dramatiq', 'deliver_prefetch_per_s'))}",
        f"{d / t:.2f}× tuned; {d / m('dramatiq', 'deliver_prefetch_per_s'):.2f}× Dramatiq prefetch 100",
        "≥ 0.9× tuned",
        d >= 0.9 * t,
    )
    d, t = m("delivery-alternating", "defaults_per_s"), m("delivery-alternating", "tuned_per_s")
    row(
        "  same, alternating bursts in one process and one Redis (out of the box, tuned, tuned, out of the box, ...), "
        "median drain rate of each, msg/s",
        med(vals("delivery-alternating", "defaults_per_s")),
        f"tuned (MAX_IN_FLIGHT 32): {med(vals('delivery-alternating', 'tuned_per_s'))}",
        f"{d / t:.2f}× tuned",
        "≥ 0.9× tuned",
        d >= 0.9 * t,
    )
    dc = m("outbox-send-defaults", "server_cmds_per_msg")
    row(
        "  same, Redis per delivered message: server commands (of them HGETALL), server CPU µs",
        f"out of the box: {med(vals('outbox-send-defaults', 'server_cmds_per_msg'))} "
        f"({med(vals('outbox-send-defaults', 'server_hgetall_per_msg'))}), "
        f"{med(vals('outbox-send-defaults', 'server_cpu_us_per_msg'))} µs",
        f"tuned: {med(vals('outbox-send', 'server_cmds_per_msg'))} "
        f"({med(vals('outbox-send', 'server_hgetall_per_msg'))}), {med(vals('outbox-send', 'server_cpu_us_per_msg'))} µs",
        f"{dc / m('outbox-send', 'server_cmds_per_msg'):.2f}× tuned",
        "≤ 10 commands",
        dc <= 10,
    )
    d, t = m("webhook-outbox", "deliver_per_s"), m("webhook-outbox-tuned", "deliver_per_s")
    row(
        f"webhook, receiver answers after {RECEIVER_DELAY * 1000:.0f} ms, 1 worker, msg/s as the receiver sees them, "
        "**out of the box** (no MAX_IN_FLIGHT set: its default 16 is a share; one busy destination "
        "borrows idle slots up to CONCURRENCY 32 minus a reserve of 8)",
        f"{med(vals('webhook-outbox', 'deliver_per_s'))}; at most "
        f"{med(vals('webhook-outbox', 'most_in_flight'))} in flight at the receiver",
        f"tuned (MAX_IN_FLIGHT 32): {med(vals('webhook-outbox-tuned', 'deliver_per_s'))}; at most "
        f"{med(vals('webhook-outbox-tuned', 'most_in_flight'))} in flight",
        f"{d / t:.2f}× tuned",
        "≥ 0.9× tuned",
        d >= 0.9 * t,
    )
    row(
        "  same, Redis per delivered message: server commands, server CPU µs",
        f"out of the box: {med(vals('webhook-outbox', 'server_cmds_per_msg'))}, "
        f"{med(vals('webhook-outbox', 'server_cpu_us_per_msg'))} µs",
        f"tuned: {med(vals('webhook-outbox-tuned', 'server_cmds_per_msg'))}, "
        f"{med(vals('webhook-outbox-tuned', 'server_cpu_us_per_msg'))} µs",
        f"{m('webhook-outbox', 'server_cmds_per_msg') / m('webhook-outbox-tuned', 'server_cmds_per_msg'):.2f}× tuned",
        "(informative)",
        None,
    )


#: The cases of ``--cluster``.
CLUSTER_CASES = ["cluster-alternating"]
#: Cases run by name only (``case NAME``), for diagnostics: no row of the table reads them.
DIAGNOSTIC_CASES = {
    "partitions-alternating",
    "single-p1",
    "cluster1-p16",
    "cluster3-p16",
    "single-p16",
    "cluster3-p64",
    "cluster3-p256",
}


def cluster_rows(m, vals, row) -> None:
    """Issue 22's cluster rows (:func:`case_cluster_alternating`): each figure on a
    1-primary cluster at P = 16 against one server at P = 1, the 3-primary cluster beside
    it, out of the box (no ``MAX_IN_FLIGHT`` set; nothing tuned). Target: cluster / single
    >= 0.85x on one primary. The scaling figure (1, 3, 6 primaries, >= 0.8x linear) needs
    a machine with a core per primary and its clients; on fewer cores it is not measured."""
    case = "cluster-alternating"
    for key, what in (
        ("send_per_s", f"send() per s, one thread (median of blocks of {CLUSTER_SEND_BLOCK} calls)"),
        ("many_per_s", f"send_many(100) msg/s, one thread (median of blocks of {CLUSTER_MANY_BLOCK} calls)"),
        ("deliver_per_s", "no-op delivery (callable), 1 worker, sent with send_many(100), msg/s"),
    ):
        one, single, three = m(case, f"cluster1_{key}"), m(case, f"single_{key}"), m(case, f"cluster3_{key}")
        partitioned = m(case, f"single16_{key}")
        row(
            f"cluster, **out of the box**: {what}: 1-primary cluster, P = 16",
            med(vals(case, f"cluster1_{key}")),
            f"one server, P = 1: {med(vals(case, f'single_{key}'))}; "
            f"3-primary cluster, P = 16: {med(vals(case, f'cluster3_{key}'))}; "
            f"one server, P = 16: {med(vals(case, f'single16_{key}'))}",
            f"{one / single:.2f}× one server (3 primaries: {three / single:.2f}×; "
            f"one server at P = 16: {partitioned / single:.2f}×)",
            "≥ 0.85× one server",
            one / single >= 0.85,
        )
    key = "tuned_deliver_per_s"
    one, single, three = m(case, f"cluster1_{key}"), m(case, f"single_{key}"), m(case, f"cluster3_{key}")
    row(
        f"cluster, **tuned** (every worker CONCURRENCY {CLUSTER_TUNED_CONCURRENCY}, against 32 out of the box): "
        "no-op delivery, 1 worker, msg/s: 1-primary cluster, P = 16",
        med(vals(case, f"cluster1_{key}")),
        f"one server, P = 1, tuned alike: {med(vals(case, f'single_{key}'))}; "
        f"3-primary cluster, P = 16: {med(vals(case, f'cluster3_{key}'))}; "
        f"one server, P = 16: {med(vals(case, f'single16_{key}'))}",
        f"{one / single:.2f}× one server (3 primaries: {three / single:.2f}×; "
        f"one server at P = 16: {m(case, f'single16_{key}') / single:.2f}×)",
        "≥ 0.85× one server",
        one / single >= 0.85,
    )
    row(
        "cluster scaling: msg/s at 1, 3 and 6 primaries",
        f"not measured: this machine has {os.cpu_count()} CPUs",
        "",
        "",
        "≥ 0.8× linear (on a machine of 16 cores)",
        None,
    )


#: The outbox's own cases, and their figures, of ``--baseline``.
BASELINE_CASES = {
    "outbox-send": ("send_per_s", "deliver_per_s", "pending_bytes", "succeeded_bytes", "server_cmds_per_msg"),
    "outbox-many": ("send_per_s", "deliver_per_s"),
    "webhook-outbox": ("deliver_per_s",),
    "latency-outbox": ("median_ms", "p99_ms"),
}


def baseline_run(args: argparse.Namespace, argv: list[str]) -> None:
    """The outbox's cases in this checkout and in ``args.baseline`` (another checkout, e.g.
    a git worktree of an older commit, whose ``benchmarks.compare`` has the same cases),
    interleaved: each round runs every case in both, in alternating order. Prints and
    writes each figure of both with its spread, and this/baseline."""
    baseline = Path(args.baseline).resolve()
    sizes = {"webhook-outbox": args.webhook_n, "latency-outbox": int(LATENCY_RATE * args.latency_seconds)}
    trees = {"this": ROOT, "baseline": baseline}
    results: dict[tuple[str, str], list[dict]] = {(t, c): [] for t in trees for c in BASELINE_CASES}
    started = time.time()
    for r in range(1, args.rounds + 1):
        for name in BASELINE_CASES:
            order = list(trees) if (r + list(BASELINE_CASES).index(name)) % 2 else list(reversed(trees))
            for tree in order:
                t = time.perf_counter()
                res = run_json(["case", name, "--n", str(sizes.get(name, args.n))], root=trees[tree])
                results[(tree, name)].append(res)
                figures = {k: round(res[k], 2) for k in BASELINE_CASES[name]}
                print(
                    f"round {r} {tree:8s} {name:15s} {time.perf_counter() - t:5.1f} s  load {loadavg()}  {figures}",
                    flush=True,
                )
    lines = [
        f"# This checkout against a baseline ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))})",
        "",
        f"`python -m benchmarks.compare {' '.join(argv)}`; this: {ROOT}, baseline: {baseline}.",
        f"{args.rounds} interleaved round(s); median (min-max of the rounds).",
        "",
        "| case | figure | this | baseline | this/baseline |",
        "|---|---|---|---|---|",
    ]
    for name, keys in BASELINE_CASES.items():
        for key in keys:
            ours = [res[key] for res in results[("this", name)]]
            base = [res[key] for res in results[("baseline", name)]]
            ratio = (
                statistics.median(ours) / statistics.median(base) if statistics.median(base) else float("nan")
            )
            lines.append(f"| {name} | {key} | {med(ours)} | {med(base)} | {ratio:.3f} |")
    publish(lines, args.out, "baseline.md")


#: The cases of ``--ordered`` (issue 23).
ORDERED_CASES = ["ordered-noop", "ordered-hook", "ordered-blocked"]


def ordered_run(args: argparse.Namespace, argv: list[str]) -> None:
    """Issue 23's rows (``--ordered``): ordered against unordered delivery, no-op and
    webhook (:func:`case_ordered_delivery`), and the latency of unblocked keys with and
    without a blocked key (:func:`case_ordered_blocked`); each case pairs its bursts or
    runs in ABBA order in one process, so a round is already paired. Prints the table and
    writes it (``benchmarks/results/ordered.md`` unless ``--out``)."""
    n = args.order_keys * args.order_per_key
    latency_n = int(LATENCY_RATE * args.latency_seconds)
    extra = {
        "ordered-noop": ["--n", str(n), "--per-key", str(args.order_per_key)],
        "ordered-hook": ["--n", str(n), "--per-key", str(args.order_per_key)],
        "ordered-blocked": ["--n", str(latency_n), "--backlog", str(args.order_backlog)],
    }
    results: dict[str, list[dict]] = {name: [] for name in ORDERED_CASES}
    loads, started = [loadavg()], time.time()
    for r in range(1, args.rounds + 1):
        for name in ORDERED_CASES if r % 2 else list(reversed(ORDERED_CASES)):
            t = time.perf_counter()
            res = run_json(["case", name, *extra[name]], timeout=1800)
            results[name].append(res)
            shown = {k: round(v, 1) for k, v in res.items() if isinstance(v, float)}
            print(
                f"round {r} {name:15s} {time.perf_counter() - t:5.1f} s  load {loadavg()}  {shown}",
                flush=True,
            )
        loads.append(loadavg())

    def every(case: str, key: str) -> list[float]:
        """Every burst's (or run's) figure of all rounds."""
        return [v for res in results[case] for v in res[f"{key}_each"]]

    rows: list[str] = []

    def row(what, ours, peer, ratio, target, met) -> None:
        cells = (what, ours, peer, ratio, target, "" if met is None else ("yes" if met else "**NO**"))
        rows.append(f"| {' | '.join(cells)} |")

    for case, what in (
        ("ordered-noop", "no-op delivery (callable), 1 worker, msg/s (worker start to last delivery)"),
        (
            "ordered-hook",
            f"webhook, receiver answers after {RECEIVER_DELAY * 1000:.0f} ms, 1 worker, msg/s as the receiver sees them",
        ),
    ):
        o, u = every(case, "ordered_per_s"), every(case, "unordered_per_s")
        ratio = statistics.median(o) / statistics.median(u)
        pairs = [a / b for a, b in zip(o, u, strict=True)]
        flight = ""
        if case == "ordered-hook":
            flight = f"; at most {med(every(case, 'ordered_most_in_flight'))} in flight at the receiver"
        row(
            f"ordered, **out of the box**: {what}; {args.order_keys:,} ordering keys × {args.order_per_key} "
            "messages sent interleaved with send_many(100)",
            med(o) + flight,
            f"the same {n:,} messages without ordering keys: {med(u)}",
            f"{ratio:.2f}× unordered (burst pairs: {', '.join(f'{p:.2f}' for p in pairs)})",
            "≥ 0.8× unordered",
            ratio >= 0.8,
        )
        o_cpu, u_cpu = (
            every(case, "ordered_server_cpu_us_per_msg"),
            every(case, "unordered_server_cpu_us_per_msg"),
        )
        o_w, u_w = (
            every(case, "ordered_worker_cpu_us_per_msg"),
            every(case, "unordered_worker_cpu_us_per_msg"),
        )
        row(
            "  same, per delivered message: worker process CPU µs; Redis server commands, server CPU µs, "
            "of it in scripts µs (wall)",
            f"ordered: {med(o_w)} µs; {med(every(case, 'ordered_server_cmds_per_msg'))}, {med(o_cpu)} µs, "
            f"{med(every(case, 'ordered_script_us_per_msg'))} µs",
            f"unordered: {med(u_w)} µs; {med(every(case, 'unordered_server_cmds_per_msg'))}, {med(u_cpu)} µs, "
            f"{med(every(case, 'unordered_script_us_per_msg'))} µs",
            f"worker CPU {statistics.median(o_w) / statistics.median(u_w):.2f}×, "
            f"server CPU {statistics.median(o_cpu) / statistics.median(u_cpu):.2f}×",
            "(informative)",
            None,
        )
    o, u = every("ordered-noop", "ordered_send_per_s"), every("ordered-noop", "unordered_send_per_s")
    row(
        "  send_many(100) of those messages (no-op case), msg/s",
        f"ordered: {med(o)}",
        f"unordered: {med(u)}",
        f"{statistics.median(o) / statistics.median(u):.2f}× unordered",
        "(informative)",
        None,
    )
    case = "ordered-blocked"
    for q in ("p50", "p99"):
        b, c = every(case, f"blocked_{q}_ms"), every(case, f"clear_{q}_ms")
        ratio = statistics.median(b) / statistics.median(c)
        row(
            f"{q} delivery latency (send → the receiver accepts it), ms, of ordered webhooks of "
            f"{ORDER_LATENCY_KEYS} keys at a steady {LATENCY_RATE}/s ({latency_n:,} per run), receiver answering at once, "
            f"1 worker, out of the box: **one other key blocked** (a dead letter at its head, answered 400, "
            f"{args.order_backlog:,} messages waiting behind it)",
            med(b),
            f"no key blocked: {med(c)}",
            f"{ratio:.2f}× not blocked (run pairs: "
            + ", ".join(f"{x / y:.2f}" for x, y in zip(b, c, strict=True))
            + ")",
            "≤ 1.1× not blocked",
            ratio <= 1.1,
        )
    b_cmd, c_cmd = every(case, "blocked_server_cmds_per_msg"), every(case, "clear_server_cmds_per_msg")
    b_cpu, c_cpu = every(case, "blocked_server_cpu_us_per_msg"), every(case, "clear_server_cpu_us_per_msg")
    row(
        "  same, per message of that traffic: Redis server commands, server CPU µs",
        f"blocked: {med(b_cmd)}, {med(b_cpu)} µs",
        f"not blocked: {med(c_cmd)}, {med(c_cpu)} µs",
        f"{statistics.median(b_cmd) / statistics.median(c_cmd):.2f}× commands, "
        f"{statistics.median(b_cpu) / statistics.median(c_cpu):.2f}× CPU",
        "(informative)",
        None,
    )
    first = results["ordered-noop"][0]
    lines = [
        f"# Ordered delivery (issue 23) ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))})",
        "",
        f"`python -m benchmarks.compare {' '.join(argv)}`",
        f"{args.rounds} round(s). Each case runs in one process with one private Redis (emptied before each "
        f"burst or run), in ABBA order: {ORDER_NOOP_PAIRS} pairs of no-op bursts, {ORDER_PAIRS} of webhook "
        f"bursts, {ORDER_LATENCY_PAIRS} of latency runs per round; median (min-max) of every burst or run. "
        f"Throughput: {args.order_keys:,} keys × {args.order_per_key} = {n:,} messages per burst; latency: "
        f"{latency_n:,} messages per run ({args.latency_seconds:g} s at {LATENCY_RATE}/s).",
        f"Machine: {os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}, "
        f"Redis {first.get('redis', '?')}; load average (1, 5, 15 min) at start and after each round: "
        f"{' | '.join(loads)}.",
        "",
        "| what | ordered / blocked | unordered / not blocked, same run | ratio | target | met |",
        "|---|---|---|---|---|:-:|",
        *rows,
        "",
        "Server commands that grew most per delivered message, no-op case (last burst of each): "
        f"ordered {results['ordered-noop'][-1]['ordered_top_calls']}; "
        f"unordered {results['ordered-noop'][-1]['unordered_top_calls']}.",
    ]
    publish(lines, args.out, "ordered.md")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="Issue 7's side-by-side benchmark (see docs/benchmarks.md).")
    parser.add_argument(
        "--rounds", type=int, help="rounds (default 3; 1 with --ordered, whose cases pair within)"
    )
    parser.add_argument(
        "--n", type=int, default=2000, help="messages per throughput/memory case (default 2,000)"
    )
    parser.add_argument(
        "--webhook-n", type=int, default=1000, help="messages per webhook case (default 1,000)"
    )
    parser.add_argument(
        "--latency-seconds", type=float, default=10, help="seconds of steady 200 msg/s traffic (default 10)"
    )
    parser.add_argument(
        "--admin-total", type=int, default=1_000_000, help="messages loaded for bench_admin (0: skip)"
    )
    parser.add_argument("--admin-failed", type=int, default=100_000, help="of which failed (default 100,000)")
    parser.add_argument(
        "--quick", action="store_true", help="1 round, n=500, 3 s latency, admin 20,000 (development)"
    )
    parser.add_argument(
        "--settings-only",
        action="store_true",
        help="only the delivery rows out of the box beside tuned (no-op and webhook; Dramatiq for reference)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="only the cluster rows: one server (P=1), a 1- and a 3-primary cluster (P=16), used in turn "
        "(benchmarks/results/cluster.md)",
    )
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="another checkout (e.g. `git worktree add /tmp/base <commit>`): only the outbox's cases, "
        "run interleaved in both; before/after figures (benchmarks/results/baseline.md)",
    )
    parser.add_argument(
        "--ordered",
        action="store_true",
        help="only issue 23's rows: ordered against unordered delivery (no-op, webhook), and the latency of "
        "unblocked keys beside a blocked one (benchmarks/results/ordered.md); ~4 min at the defaults",
    )
    parser.add_argument(
        "--order-keys", type=int, default=1000, help="--ordered: ordering keys (default 1,000)"
    )
    parser.add_argument(
        "--order-per-key", type=int, default=10, help="--ordered: messages per key (default 10)"
    )
    parser.add_argument(
        "--order-backlog",
        type=int,
        default=1000,
        help="--ordered: messages behind the blocked key (default 1,000)",
    )
    parser.add_argument(
        "--send",
        action="store_true",
        help="only issue 30's send-side rows, each measured in one process against its peer in alternating "
        "blocks: send() vs Dramatiq, send_many(100) vs RQ enqueue_many, send() in transaction.atomic vs "
        "django-rq (benchmarks/results/send.md); ~1 min per round",
    )
    parser.add_argument(
        "--endpoints",
        action="store_true",
        help="issue 34's rows only: 10,000 endpoints against one settings destination "
        "(benchmarks/results/endpoints.md unless --out; --n deliveries, default 2,000)",
    )
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.ordered else 3
    if args.quick:
        args.rounds, args.n, args.webhook_n, args.latency_seconds = 1, 500, 300, 3
        args.admin_total, args.admin_failed = min(args.admin_total, 20_000), 2_000
        args.order_keys, args.order_backlog = 100, 200
    if args.ordered:
        ordered_run(args, argv)
        return
    if args.endpoints:
        endpoints.endpoints_run(args.rounds, args.n, args.out)
        return
    if args.baseline:
        baseline_run(args, argv)
        return
    ensure_dramatiq()
    import dramatiq
    import redis
    import rq

    latency_n = int(LATENCY_RATE * args.latency_seconds)
    sizes = {
        "send-alternating": 3 * args.n,  # sends of each, in blocks of 200
        "many-alternating": 5 * args.n,  # messages of each, in blocks of 10 calls of 100
        "atomic-alternating": 2 * args.n,  # transactions of each, in blocks of 200
        "webhook-outbox": args.webhook_n,
        "webhook-outbox-tuned": args.webhook_n,
        "webhook-httpx": args.webhook_n,
        "latency-outbox": latency_n,
        "latency-dramatiq": latency_n,
    }
    cases = (
        SETTINGS_CASES
        if args.settings_only
        else [c for c in CASES if c not in DIAGNOSTIC_CASES and c != "endpoints"]
    )
    if args.settings_only:
        args.admin_total = 0
        if args.out == str(RESULTS):
            args.out = str(RESULTS.with_name("settings.md"))
    if args.cluster:
        cases, args.admin_total = CLUSTER_CASES, 0
        if args.out == str(RESULTS):
            args.out = str(RESULTS.with_name("cluster.md"))
    if args.send:
        cases, args.admin_total = SEND_CASES, 0
        if args.out == str(RESULTS):
            args.out = str(RESULTS.with_name("send.md"))
    results: dict[str, list[dict]] = {name: [] for name in cases}
    loads = [loadavg()]
    started = time.time()
    for r in range(1, args.rounds + 1):
        names = list(cases)
        if r % 2 == 0:
            names.reverse()  # alternate the order, so no case always runs first or last
        for name in names:
            t = time.perf_counter()
            res = run_json(["case", name, "--n", str(sizes.get(name, args.n))])
            results[name].append(res)
            print(
                f"round {r} {name:17s} {time.perf_counter() - t:5.1f} s  load {loadavg()}  "
                f"{ {k: (round(v, 1) if isinstance(v, float) else v) for k, v in res.items() if k != 'server_top'} }",
                flush=True,
            )
        loads.append(loadavg())
    admin = {}
    if args.admin_total:
        t = time.perf_counter()
        admin = run_admin(args.admin_total, args.admin_failed)
        print(f"admin ({args.admin_total:,} messages) {time.perf_counter() - t:.0f} s: {admin}", flush=True)
        loads.append(loadavg())

    def vals(case: str, key: str) -> list[float]:
        return [res[key] for res in results[case]]

    def m(case: str, key: str) -> float:
        return statistics.median(vals(case, key))

    rows: list[tuple[str, str, str, str, str, str]] = []  # what, outbox, peer(s), ratio, target, met

    def row(what, ours, peers, ratio, target, met):
        rows.append((what, ours, peers, ratio, target, "" if met is None else ("yes" if met else "**NO**")))

    if "many-alternating" in results:
        send_rows(m, vals, row)
    if not (args.settings_only or args.cluster or args.send):
        r = m("outbox-send", "send_per_s") / m("dramatiq", "send_per_s")
        row(
            "send() per s",
            med(vals("outbox-send", "send_per_s")),
            f"RQ enqueue {med(vals('rq', 'send_per_s'))}; Dramatiq send {med(vals('dramatiq', 'send_per_s'))}",
            f"{r:.2f}× Dramatiq; {m('outbox-send', 'send_per_s') / m('rq', 'send_per_s'):.2f}× RQ",
            "≥ 1.0× Dramatiq send",
            r >= 1.0,
        )
        r = m("outbox-many", "send_per_s") / m("rq", "many_per_s")
        row(
            "send_many(100) msg/s",
            med(vals("outbox-many", "send_per_s")),
            f"RQ enqueue_many(100) {med(vals('rq', 'many_per_s'))}",
            f"{r:.2f}× RQ",
            "≥ 2× RQ enqueue_many",
            r >= 2.0,
        )
        r = m("outbox-send", "deliver_per_s") / m("dramatiq", "deliver_prefetch_per_s")
        row(
            "no-op delivery, 1 worker, sent with send(), msg/s (tuned: every MAX_IN_FLIGHT 32)",
            med(vals("outbox-send", "deliver_per_s")),
            f"RQ SimpleWorker {med(vals('rq', 'deliver_per_s'))}; Dramatiq 1 proc 1 thread {med(vals('dramatiq', 'deliver_per_s'))}; "
            f"Dramatiq prefetch 100: {med(vals('dramatiq', 'deliver_prefetch_per_s'))}",
            f"{r:.2f}× Dramatiq prefetch 100",
            "≥ 1.0× Dramatiq prefetch 100",
            r >= 1.0,
        )
        r = m("outbox-send", "deliver_steady_per_s") / m("dramatiq", "deliver_prefetch_steady_per_s")
        row(
            "  same, steady state only (first to last delivery, no start-up), msg/s",
            med(vals("outbox-send", "deliver_steady_per_s")),
            f"RQ SimpleWorker {med(vals('rq', 'deliver_steady_per_s'))}; Dramatiq 1 proc 1 thread {med(vals('dramatiq', 'deliver_steady_per_s'))}; "
            f"Dramatiq prefetch 100: {med(vals('dramatiq', 'deliver_prefetch_steady_per_s'))}",
            f"{r:.2f}× Dramatiq prefetch 100",
            "(informative)",
            None,
        )
        r = m("outbox-many", "deliver_per_s") / m("dramatiq", "deliver_prefetch_per_s")
        row(
            "no-op delivery, 1 worker, sent with send_many(100), msg/s",
            med(vals("outbox-many", "deliver_per_s")),
            f"Dramatiq prefetch 100: {med(vals('dramatiq', 'deliver_prefetch_per_s'))}",
            f"{r:.2f}× Dramatiq prefetch 100",
            "",
            None,
        )
        ours, peer = m("webhook-outbox", "deliver_per_s"), m("webhook-httpx", "deliver_per_s")
        row(
            f"webhook, receiver answers after {RECEIVER_DELAY * 1000:.0f} ms, 1 worker, msg/s as the receiver sees them "
            "(out of the box: no MAX_IN_FLIGHT set, up to 24 in flight by borrowing idle slots)",
            med(vals("webhook-outbox", "deliver_per_s")),
            f"plain httpx, {HTTPX_THREADS} threads, one process: {med(vals('webhook-httpx', 'deliver_per_s'))}",
            f"{ours / peer:.2f}× httpx",
            "≥ 200/s and ≥ 0.7× httpx",
            ours >= 200 and ours / peer >= 0.7,
        )
        lo_med, lo_p99 = m("latency-outbox", "median_ms"), m("latency-outbox", "p99_ms")
        row(
            f"end-to-end latency at a steady {LATENCY_RATE} msg/s, 1 worker (no-op receiver), ms",
            f"median {med(vals('latency-outbox', 'median_ms'))}, p99 {med(vals('latency-outbox', 'p99_ms'))}",
            f"Dramatiq 1 thread prefetch 100: median {med(vals('latency-dramatiq', 'median_ms'))}, p99 {med(vals('latency-dramatiq', 'p99_ms'))}",
            f"{lo_med / m('latency-dramatiq', 'median_ms'):.2f}× / {lo_p99 / m('latency-dramatiq', 'p99_ms'):.2f}× Dramatiq",
            "median < 20, p99 < 100",
            lo_med < 20 and lo_p99 < 100,
        )
        r = m("outbox-send", "pending_bytes") / m("rq", "pending_bytes")
        row(
            "Redis bytes per pending message (200-byte JSON body), send()",
            med(vals("outbox-send", "pending_bytes")),
            f"queued RQ job {med(vals('rq', 'pending_bytes'))}; Dramatiq {med(vals('dramatiq', 'pending_bytes'))}",
            f"{r:.2f}× RQ job",
            "≤ 1.5× RQ job",
            r <= 1.5,
        )
        r = m("outbox-send", "succeeded_bytes") / m("rq", "pending_bytes")
        row(
            "Redis bytes per succeeded message, send(), RQ residue included",
            med(vals("outbox-send", "succeeded_bytes")),
            f"queued RQ job {med(vals('rq', 'pending_bytes'))} (RQ job after success, default result_ttl: {med(vals('rq', 'succeeded_bytes'))})",
            f"{r:.2f}× RQ job",
            "≤ 1.0× RQ job",
            r <= 1.0,
        )
        sc, ct = m("outbox-send", "server_cmds_per_msg"), m("outbox-send", "client_trips_per_msg")
        row(
            "Redis commands per delivered message, send() traffic (worker process; tuned)",
            f"server {med(vals('outbox-send', 'server_cmds_per_msg'))} (INFO commandstats, Lua included); "
            f"client {med(vals('outbox-send', 'client_cmds_per_msg'))} commands in {med(vals('outbox-send', 'client_trips_per_msg'))} round trips",
            "",
            "",
            "≤ 10 commands, ≤ 1 round trip",
            sc <= 10 and ct <= 1.0,
        )
        for page, label in (
            ("dashboard", "dashboard"),
            ("list status=failed", "list status=failed"),
            ("list status=failed&destination=orders", "list failed, one destination"),
            ("same, page 50", "list failed, one destination, page 50"),
        ):
            if page in admin:
                base = admin.get("baseline: admin index", (0, 0))[0]
                row(
                    f"admin {label}, {args.admin_total:,} messages, ms (median of 20)",
                    fmt(admin[page][0]),
                    f"admin index {fmt(base)}",
                    f"{admin[page][0] / base:.2f}× index" if base else "",
                    "< 100 ms",
                    admin[page][0] < 100,
                )

    if "outbox-send-defaults" in results:
        settings_rows(m, vals, row)
    if "cluster-alternating" in results:
        cluster_rows(m, vals, row)

    notes = []
    if "outbox-send" in results:
        top = results["outbox-send"][-1]["server_top"]
        notes = [
            "",
            "Server-side commands during the send() delivery run (tuned; last round, N messages): "
            + ", ".join(f"{k} {v}" for k, v in top),
            f"RQ keys left after the outbox's deliveries (last round): {results['outbox-send'][-1]['rq_keys_left']}.",
        ]
    lines = [
        f"# Side-by-side benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))})",
        "",
        f"`python -m benchmarks.compare {' '.join(argv)}`".replace(" `", "`"),
        f"{args.rounds} interleaved round(s); median (min-max of the rounds). N = {args.n:,} per throughput/memory case, "
        f"{args.webhook_n:,} per webhook case, {latency_n:,} for latency ({args.latency_seconds:g} s at {LATENCY_RATE}/s).",
        f"Machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, redis-py {redis.__version__}, RQ {rq.__version__}, "
        f"Dramatiq {dramatiq.__version__}; load average (1, 5, 15 min) at start and after each round/step: {' | '.join(loads)}.",
        "",
        "| what | outbox | peer(s), same run | ratio | target | met |",
        "|---|---|---|---|---|:-:|",
        *[f"| {' | '.join(cells)} |" for cells in rows],
        *notes,
    ]
    publish(lines, args.out)


def entry(argv: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    if argv[:1] == ["case"]:
        p = argparse.ArgumentParser()
        p.add_argument("name")
        p.add_argument("--n", type=int, required=True)
        p.add_argument("--per-key", type=int, help="ordered-noop, ordered-hook: messages per ordering key")
        p.add_argument("--backlog", type=int, help="ordered-blocked: messages behind the blocked key's head")
        p.add_argument("--round", type=int, help="endpoints: the round (the order of its pair alternates)")
        a = p.parse_args(argv[1:])
        extra = {
            k: v
            for k, v in (("per_key", a.per_key), ("backlog", a.backlog), ("round_no", a.round))
            if v is not None
        }
        print(json.dumps(CASES[a.name](a.n, **extra)))
    elif argv[:1] == ["outbox-worker"]:
        outbox_worker(burst="--burst" in argv)
    elif argv[:1] == ["rq-worker"]:
        rq_worker()
    elif argv[:1] == ["dramatiq-worker"]:
        dramatiq_worker()
    else:
        main(argv)


if __name__ == "__main__":
    entry(sys.argv[1:])
