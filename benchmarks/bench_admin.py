"""Admin console speed with many messages in Redis, against bare baselines in the same run.

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=benchmarks.settings python -m benchmarks.bench_admin \\
        [--total 1000000] [--failed 100000] [--requests 30] [--rounds 3]

Loads ``--total`` messages (``--failed`` of them failed, 60% of those on ``orders``)
with :func:`benchmarks.loader.load` into the private benchmark Redis, then measures:

* pages, through Django's test client logged in as a superuser (median and p95 of
  ``--requests`` GETs after 2 warm-up requests, milliseconds per request): the
  dashboard (all destinations, and its chart of one); the message list filtered by
  ``status=failed``; by ``status=failed`` and ``destination=orders``; page 50 and the
  last page of that list; that list by ``status_code=503`` (no index: a bounded scan of
  5,000 entries, checked in Redis) and ``status=failed&error_class=http`` (the loader
  writes no error class: a scan that matches none);
  the destination page of ``orders``; a detail page; the
  confirmation page of "requeue all matching status=failed"; and, as the bare
  baseline, the admin index page (``admin:index``): every page figure is also given
  as a ratio to it;
* requeue of every failed message (seconds; median, min and max of ``--rounds``):

  (a) ``outbox.operations.actions.requeue`` fed by ``repo.iter_ids("failed")``;
  (b) the console's flow: confirmation page, confirm POST ("select all matching"
      ``status=failed``; above ``MessageAdmin.sync_action_limit`` it runs as a
      background RQ job), an RQ ``SimpleWorker`` in burst mode on the outbox's high
      priority queue (where the console puts the job), then the progress page reporting
      the job finished;
  (c) the bare baseline: a pipelined ``HSET`` + ``ZREM`` + ``ZADD`` per message on
      scratch keys, 1,000 messages per round trip, i.e. the fewest Redis commands a
      status change needs, without compare-and-set, history or delivery jobs.

After (a) and (b) the requeued messages are put back to ``failed`` (same scores) and
the delivery jobs the requeue queued are removed, so every round requeues the same set.
Targets (issue 3): dashboard and filtered list under 200 ms at the median; requeue of
100,000 failed messages under 10 s.

With ``--cluster`` it measures instead the message list on a Redis Cluster against a
single server, in one run (issue 22: under 100 ms per page at 1,000,000 messages on 3
primaries)::

    PYTHONPATH=. DJANGO_SETTINGS_MODULE=benchmarks.settings python -m benchmarks.bench_admin \
        --cluster [--total 1000000] [--failed 100000] [--partitions 16] [--primaries 3]

``--total`` messages are loaded into the private single server (one partition: today's
layout, numbered pages) and into a private ``--primaries``-primary Valkey cluster
(:class:`outbox.testing.ClusterServer`) with ``--partitions`` partitions (pages by
Previous/Next: :func:`outbox.store.reads.queries.page_at`), then both are measured the same
way (median and p95 of ``--requests`` GETs, ms): the list's first page (every message,
newest first), the next page, the page 20 pages in (``p=21``; on the cluster after
following Next 20 times), the first page of ``status=failed&destination=orders`` and
its next page, a bounded scan (``status_code=503``), and the count alone (the ZCARD of
every partition's created index, pipelined: one round trip per node) and the sidebar's
counts per status.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

import django

PAGE_TARGET_MS = 200.0
REQUEUE_TARGET_S = 10.0
BARE_BATCH = 1000
BUSY_DESTINATION = "orders"


@dataclass
class PageTiming:
    """Milliseconds per request of one page: median and 95th percentile (nearest rank)."""

    name: str
    median_ms: float
    p95_ms: float
    size_kb: float
    target_ms: float | None = None


def p95(values: list[float]) -> float:
    """95th percentile by nearest rank (of a list of at least one value)."""
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


def time_get(
    client, url: str, n: int, *, expect: int = 200, data: dict | None = None
) -> tuple[list[float], int]:
    """Milliseconds of each of ``n`` requests (GET, or POST of ``data``) after 2 warm-ups,
    and the response size in bytes."""
    send = (lambda: client.post(url, data)) if data is not None else (lambda: client.get(url))
    for _ in range(2):
        response = send()
        assert response.status_code == expect, f"{url}: HTTP {response.status_code}"
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        response = send()
        out.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == expect, f"{url}: HTTP {response.status_code}"
    return out, len(response.content)


def setup_database():
    """Create the tables in the in-memory SQLite and a logged-in superuser client."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()
    call_command("migrate", run_syncdb=True, verbosity=0)
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client, user


def measure_pages(client, repo, n: int) -> list[PageTiming]:
    from django.urls import reverse

    def u(name: str, *args: str) -> str:
        return reverse(f"admin:{name}", args=args)

    failed_orders = repo.count("failed", BUSY_DESTINATION)
    last_page = max(1, -(-failed_orders // 50))
    detail_id = repo.filter("failed", BUSY_DESTINATION, limit=1)[0]
    listing = u("outbox_message_list")
    pages: list[tuple[str, str, dict | None, float | None]] = [
        ("baseline: admin index", u("index"), None, None),
        ("dashboard", u("outbox_dashboard"), None, PAGE_TARGET_MS),
        ("list status=failed", f"{listing}?status=failed", None, PAGE_TARGET_MS),
        (
            f"list status=failed&destination={BUSY_DESTINATION}",
            f"{listing}?status=failed&destination={BUSY_DESTINATION}",
            None,
            PAGE_TARGET_MS,
        ),
        (
            "  same, page 50",
            f"{listing}?status=failed&destination={BUSY_DESTINATION}&p=50",
            None,
            PAGE_TARGET_MS,
        ),
        (
            f"  same, last page ({last_page:,})",
            f"{listing}?status=failed&destination={BUSY_DESTINATION}&p={last_page}",
            None,
            PAGE_TARGET_MS,
        ),
        (
            "  same, status_code=503 (scan)",
            f"{listing}?status=failed&destination={BUSY_DESTINATION}&status_code=503",
            None,
            PAGE_TARGET_MS,
        ),
        (
            "list status=failed&error_class=http (scan)",
            f"{listing}?status=failed&error_class=http",
            None,
            PAGE_TARGET_MS,
        ),
        (
            "dashboard, chart of one destination",
            f"{u('outbox_dashboard')}?chart={BUSY_DESTINATION}",
            None,
            PAGE_TARGET_MS,
        ),
        (
            f"destination page ({BUSY_DESTINATION})",
            u("outbox_destination", BUSY_DESTINATION),
            None,
            PAGE_TARGET_MS,
        ),
        ("detail (failed, with attempts)", u("outbox_message_detail", detail_id), None, None),
        (
            "confirm page: requeue all status=failed",
            u("outbox_message_action"),
            {"action": "requeue", "select_across": "1", "status": "failed"},
            None,
        ),
    ]
    out = []
    for name, url, data, target in pages:
        times, size = time_get(client, url, n, data=data)
        out.append(PageTiming(name, statistics.median(times), p95(times), size / 1024, target))
    return out


def put_back_failed(repo, scored: list[tuple[bytes, float]]) -> None:
    """Move requeued messages back to ``failed`` with their old scores (not timed)."""
    from outbox.records import Status
    from outbox.store import Change

    now = time.time()
    for i in range(0, len(scored), 2000):
        changes = [
            Change(
                id=raw.decode(),
                from_statuses=(Status.PENDING.value,),
                to=Status.FAILED.value,
                score=score,
                set={
                    "retry_count": "6",
                    "last_error": "HTTP 500 Internal Server Error",
                    "last_status_code": "500",
                },
                unset=("next_attempt_at",),
            )
            for raw, score in scored[i : i + 2000]
        ]
        results = repo.transition(changes, now)
        assert all(r.applied for r in results), "could not put messages back to failed"


def drop_delivery_jobs() -> int:
    """Remove the delivery jobs a requeue queued (so they are not run); returns how many."""
    from outbox.conf import outbox_settings
    from outbox.store.background.wakeups import get_queue

    return sum(get_queue(name).empty() for name in outbox_settings.queue_names)


def requeue_api(repo) -> tuple[float, int]:
    """(a): seconds to requeue every failed message through ``outbox.operations.actions.requeue``."""
    from outbox.operations import actions

    t0 = time.perf_counter()
    result = actions.requeue(chain.from_iterable(repo.iter_ids("failed")))
    return time.perf_counter() - t0, result.acted


def requeue_console(client, repo) -> tuple[dict[str, float], str]:
    """(b): seconds per step of the console's "select all matching" requeue, and the report."""
    import re

    from django.urls import reverse
    from rq import SimpleWorker

    from outbox.conf import outbox_settings
    from outbox.store.background.wakeups import get_queue

    url = reverse("admin:outbox_message_action")
    form = {
        "action": "requeue",
        "select_across": "1",
        "status": "failed",
        "next": reverse("admin:outbox_message_list"),
    }
    steps: dict[str, float] = {}
    t0 = time.perf_counter()
    response = client.post(url, form)
    assert response.status_code == 200, response.status_code
    steps["confirmation page"] = time.perf_counter() - t0
    as_of = re.search(rb'name="as_of" value="([^"]+)"', response.content).group(1).decode()

    t1 = time.perf_counter()
    response = client.post(url, {**form, "as_of": as_of, "post": "yes"})
    steps["confirm POST"] = time.perf_counter() - t1
    assert response.status_code == 302, response.status_code
    location = response["Location"]
    report = ""
    if "/action/" in location:  # background job: a worker on the high queue runs it
        high = get_queue(outbox_settings.queue_name("high"))
        t2 = time.perf_counter()
        worker = SimpleWorker([high], connection=high.connection)
        worker.work(burst=True, logging_level="WARNING", max_jobs=1)
        steps["worker runs the job"] = time.perf_counter() - t2
        t3 = time.perf_counter()
        page = client.get(location)
        steps["progress page"] = time.perf_counter() - t3
        text = page.content.decode()
        state = re.search(r'id="task-state" data-state="([^"]+)"', text).group(1)
        assert state == "finished", f"background requeue ended {state}"
        report = re.search(r'id="task-report"[^>]*>([^<]*)<', text).group(1)
    else:
        from django.contrib.messages import get_messages

        report = " ".join(str(m) for m in get_messages(response.wsgi_request))
    total = time.perf_counter() - t0
    steps["total"] = total
    return steps, report


def requeue_bare(conn, n: int) -> float:
    """(c): seconds for ``n`` pipelined HSET + ZREM + ZADD on scratch keys, 1,000 per round trip."""
    prefix = "bench-bare"
    ids = [f"msg_bare{i:07d}" for i in range(n)]
    for i in range(0, n, BARE_BATCH):  # setup, not timed
        pipe = conn.pipeline(transaction=False)
        for message_id in ids[i : i + BARE_BATCH]:
            pipe.hset(f"{prefix}:resend:{message_id}", mapping={"status": "failed", "retry_count": "6"})
        pipe.zadd(f"{prefix}:status:failed", {m: 1.0 for m in ids[i : i + BARE_BATCH]})
        pipe.execute()
    now = time.time()
    t0 = time.perf_counter()
    for i in range(0, n, BARE_BATCH):
        pipe = conn.pipeline(transaction=False)
        for message_id in ids[i : i + BARE_BATCH]:
            pipe.hset(f"{prefix}:resend:{message_id}", mapping={"status": "pending", "retry_count": "0"})
            pipe.zrem(f"{prefix}:status:failed", message_id)
            pipe.zadd(f"{prefix}:status:pending", {message_id: now})
        pipe.execute()
    elapsed = time.perf_counter() - t0
    assert conn.zcard(f"{prefix}:status:pending") == n
    for i in range(0, n, BARE_BATCH):  # clean up, not timed
        conn.delete(*[f"{prefix}:resend:{m}" for m in ids[i : i + BARE_BATCH]])
    conn.delete(f"{prefix}:status:failed", f"{prefix}:status:pending")
    return elapsed


def show(
    pages: list[PageTiming],
    requeues: list[tuple[str, list[float], int, float | None]],
    out: Callable[[str], None],
) -> None:
    """Print both tables (GitHub markdown)."""
    base = pages[0].median_ms
    out("")
    out("| page (test client, ms per request) | median | p95 | × baseline (median) | KiB | target | ok |")
    out("|---|---:|---:|---:|---:|---:|:-:|")
    for p in pages:
        ok = "" if p.target_ms is None else ("yes" if p.median_ms < p.target_ms else "**NO**")
        target = "" if p.target_ms is None else f"< {p.target_ms:.0f}"
        out(
            f"| {p.name} | {p.median_ms:.1f} | {p.p95_ms:.1f} | {p.median_ms / base:.2f} | {p.size_kb:.0f} | {target} | {ok} |"
        )
    out("")
    bare = statistics.median(requeues[-1][1])
    out(
        f"| requeue of every failed message ({len(requeues[0][1])} rounds) | median s | min s | max s | messages/s (median) | × bare | target | ok |"
    )
    out("|---|---:|---:|---:|---:|---:|---:|:-:|")
    for name, runs, n, target in requeues:
        median = statistics.median(runs)
        ok = "" if target is None else ("yes" if median < target else "**NO**")
        tgt = "" if target is None else f"< {target:.0f}"
        out(
            f"| {name} | {median:.2f} | {min(runs):.2f} | {max(runs):.2f} | {n / median:,.0f} | {median / bare:.2f} | {tgt} | {ok} |"
        )


def time_call(fn: Callable[[], object], n: int) -> list[float]:
    """Milliseconds of each of ``n`` calls of ``fn`` after 2 warm-ups."""
    for _ in range(2):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def measure_list(client, repo, n: int, label: str) -> list[PageTiming]:
    """The message list's pages and counts on the outbox as configured now (see the
    module's ``--cluster``): numbered pages with one partition, Previous/Next with more."""
    from django.urls import reverse

    from outbox.store.reads.queries import MessageFilter, count_range, plan

    listing = reverse("admin:outbox_message_list")
    partitioned = repo.keys.partitioned

    def nth(query: str, pages: int) -> str:
        """The URL of the page ``pages`` after the first of ``listing?query``."""
        if not partitioned:
            return f"{listing}?{query}{'&' if query else ''}p={pages + 1}"
        url = f"{listing}?{query}"
        for _ in range(pages):
            response = client.get(url)
            assert response.status_code == 200, f"{url}: HTTP {response.status_code}"
            url = listing + response.context["next_url"]
        return url

    failed = f"status=failed&destination={BUSY_DESTINATION}"
    urls = [
        ("list, first page (all, newest first)", f"{listing}?"),
        ("list, next page", nth("", 1)),
        ("list, 20 pages in", nth("", 20)),
        (f"list {failed}, first page", f"{listing}?{failed}"),
        (f"list {failed}, next page", nth(failed, 1)),
        (f"list {failed}&status_code=503 (scan)", f"{listing}?{failed}&status_code=503"),
    ]
    out = []
    for name, url in urls:
        times, size = time_get(client, url, n)
        out.append(PageTiming(f"{label}: {name}", statistics.median(times), p95(times), size / 1024, 100.0))
    every = plan(repo, MessageFilter())
    for name, fn in (
        ("count of every message (ZCARD per sorted set, pipelined)", lambda: count_range(repo, every)),
        ("counts per status (the sidebar)", lambda: repo.counts()),
    ):
        times = time_call(fn, n)
        out.append(PageTiming(f"{label}: {name}", statistics.median(times), p95(times), 0.0, 100.0))
    return out


def show_list(pages: list[PageTiming], out: Callable[[str], None]) -> None:
    """Print the list's figures (GitHub markdown)."""
    out("")
    out("| message list (test client; counts: the store call alone), ms | median | p95 | KiB | target | ok |")
    out("|---|---:|---:|---:|---:|:-:|")
    for p in pages:
        ok = "yes" if p.target_ms is None or p.median_ms < p.target_ms else "**NO**"
        size = f"{p.size_kb:.0f}" if p.size_kb else ""
        out(f"| {p.name} | {p.median_ms:.1f} | {p.p95_ms:.1f} | {size} | < {p.target_ms:.0f} | {ok} |")


def main_cluster(args: argparse.Namespace) -> None:
    """``--cluster``: the message list on a cluster against a single server (see the module)."""
    from django.conf import settings
    from django.test.utils import override_settings

    from benchmarks.loader import load
    from outbox.store import get_repository
    from outbox.store.client.connection import get_connection
    from outbox.testing.cluster_server import ClusterServer

    client, _user = setup_database()
    n = max(20, args.requests)

    def load_here(where: str) -> None:
        t0 = time.perf_counter()
        written = load(
            args.total,
            failed=args.failed,
            destinations=settings.BENCH_DESTINATIONS,
            progress=lambda line: print(f"\r{where}: {line}", end="", flush=True),
        )
        print(f"\r{where}: loaded {args.total:,} messages in {time.perf_counter() - t0:.0f} s: {written}")

    get_connection().flushdb()
    get_repository.cache_clear()
    load_here("single server, 1 partition")
    with ClusterServer(primaries=args.primaries) as cluster:
        options = {**settings.OUTBOX, "CLUSTER": {"NODES": cluster.urls}, "PARTITIONS": args.partitions}
        on_cluster = override_settings(OUTBOX=options, SILENCED_SYSTEM_CHECKS=["outbox.E010"])
        with on_cluster:
            get_repository.cache_clear()
            load_here(f"cluster of {args.primaries} primaries, {args.partitions} partitions")
            memory = sum(cluster.node_client(node).info("memory")["used_memory"] for node in cluster.nodes)
            print(f"cluster used_memory: {memory / 2**30:.2f} GiB in all")
        # both loaded: measured one right after the other, under the same load
        get_repository.cache_clear()
        print(f"load average before measuring: {load_average()} ({os.cpu_count()} CPUs, shared)")
        single = measure_list(client, get_repository(), n, "single server")
        with on_cluster:
            get_repository.cache_clear()
            try:
                print(f"load average before measuring the cluster: {load_average()}")
                clustered = measure_list(
                    client, get_repository(), n, f"cluster {args.primaries}×, P={args.partitions}"
                )
            finally:
                get_repository.cache_clear()
    print(f"\n{args.total:,} messages ({args.failed:,} failed); {n} timed requests per row")
    show_list(single + clustered, print)
    get_connection().flushdb(asynchronous=True)  # a million keys: in the background


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=1_000_000, help="messages to load (default 1,000,000)")
    parser.add_argument("--failed", type=int, default=100_000, help="of which failed (default 100,000)")
    parser.add_argument(
        "--requests", type=int, default=30, help="timed requests per page (default 30, at least 20)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="times each requeue is measured (default 3)")
    parser.add_argument(
        "--cluster", action="store_true", help="measure the message list on a cluster against a single server"
    )
    parser.add_argument("--partitions", type=int, default=16, help="partitions on the cluster (default 16)")
    parser.add_argument("--primaries", type=int, default=3, help="primaries of the cluster (default 3)")
    args = parser.parse_args(argv)
    django.setup()
    if args.cluster:
        main_cluster(args)
        return

    from django.conf import settings

    from benchmarks.loader import load
    from outbox.store import get_repository
    from outbox.store.client.connection import get_connection

    conn = get_connection()
    conn.flushdb()
    repo = get_repository()
    client, _user = setup_database()

    t0 = time.perf_counter()
    written = load(
        args.total,
        failed=args.failed,
        destinations=settings.BENCH_DESTINATIONS,
        progress=lambda line: print(f"\r{line}", end="", flush=True),
    )
    loaded = time.perf_counter() - t0
    memory = conn.info("memory")
    print(f"\rloaded {args.total:,} messages in {loaded:.0f} s: {written}")
    print(
        f"Redis used_memory_human after loading: {memory['used_memory_human']} "
        f"(used_memory {memory['used_memory'] / args.total:.0f} bytes per message); "
        f"failed on {BUSY_DESTINATION}: {repo.count('failed', BUSY_DESTINATION):,}"
    )

    print(
        f"load average before measuring: {load_average()} ({os.cpu_count()} CPUs; other processes share them)"
    )
    pages = measure_pages(client, repo, max(20, args.requests))

    scored = [row for key in repo.index("failed").keys for row in conn.zrange(key, 0, -1, withscores=True)]
    n_failed = len(scored)
    api_runs, console_runs, bare_runs = [], [], []
    for round_number in range(1, args.rounds + 1):
        api_s, api_n = requeue_api(repo)
        assert api_n == n_failed, f"requeued {api_n} of {n_failed}"
        api_runs.append(api_s)
        drop_delivery_jobs()
        put_back_failed(repo, scored)
        assert repo.count("failed") == n_failed

        steps, report = requeue_console(client, repo)
        assert repo.count("failed") == 0, f"{repo.count('failed')} still failed after the console's requeue"
        console_runs.append(steps["total"])
        drop_delivery_jobs()
        put_back_failed(repo, scored)

        bare_runs.append(requeue_bare(conn, n_failed))
        print(
            f"round {round_number}: (a) {api_s:.2f} s, (b) {steps['total']:.2f} s "
            f"({', '.join(f'{k} {v:.2f} s' for k, v in steps.items() if k != 'total')}), "
            f"(c) {bare_runs[-1]:.2f} s; load average {load_average()}"
        )
    print(f"(b) report: {report}")

    show(
        pages,
        [
            ("(a) outbox.operations.actions.requeue(repo.iter_ids)", api_runs, n_failed, REQUEUE_TARGET_S),
            ("(b) console: select all matching + confirm + job", console_runs, n_failed, REQUEUE_TARGET_S),
            ("(c) bare: pipelined HSET+ZREM+ZADD, 1,000 per trip", bare_runs, n_failed, None),
        ],
        print,
    )


def load_average() -> str:
    """The 1-minute load average (other processes share the CPUs), or "?"."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
