"""Helpers for the outbox's state in tests: settings overrides (destinations, a Redis that
is down), burst workers in this process, the index invariant, and waiting for a condition."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.test import override_settings


def run_worker(
    *, burst: bool = True, simple: bool = False, max_jobs: int | None = None, relay: bool = False
) -> None:
    """Run a real outbox worker (RQ) on the outbox queues in this process, in burst mode:
    one housekeeping pass (relay, recovery, wake-ups), then every queued job.

    It forks a work horse per job (RQ's default) unless ``simple``. The relay of captured
    messages runs only with ``relay`` (it needs database access: ``django_db`` tests).
    """
    from outbox.conf import outbox_settings
    from outbox.delivery.worker import WorkerOptions
    from outbox.delivery.worker import run_worker as outbox_run_worker

    outbox_run_worker(
        outbox_settings.queue_names,
        WorkerOptions(burst=burst, fork=not simple, max_jobs=max_jobs, logging_level="WARNING", relay=relay),
    )


def with_destinations(
    transport: str | None = None, *, retry=(0,), max_retries: int = 3, **entries: dict
) -> override_settings:
    """override_settings: the test OUTBOX with destinations added or replaced.

    Each entry gets ``TRANSPORT`` (when ``transport`` is given), ``RETRY`` and
    ``MAX_RETRIES`` unless it sets them itself. Webhook entries get
    ``OPTIONS["allow_private_networks"] = True`` unless they set it: the test receivers
    listen on 127.0.0.1, which the SSRF guard refuses by default.
    """
    from django.conf import settings

    defaults = {"RETRY": list(retry), "MAX_RETRIES": max_retries}
    if transport:
        defaults["TRANSPORT"] = transport
    config = {**settings.OUTBOX}
    built = {name: {**defaults, **e} for name, e in entries.items()}
    for entry in built.values():
        if entry.get("TRANSPORT") == "webhook" and isinstance(entry.get("OPTIONS", {}), dict):
            entry["OPTIONS"] = {"allow_private_networks": True, **entry.get("OPTIONS", {})}
    config["DESTINATIONS"] = {**config["DESTINATIONS"], **built}
    return override_settings(OUTBOX=config)


def hook_settings(url: str, **destination) -> override_settings:
    """override_settings with the 'hook' destination pointing at ``url``."""
    options = {"url": url, "timeout": 5, **destination.pop("OPTIONS", {})}
    return with_destinations("webhook", hook={**destination, "OPTIONS": options})


def redis_down() -> override_settings:
    """override_settings: the outbox's Redis (its cache alias, or in cluster mode its
    cluster's nodes) pointed at a port where nothing listens."""
    from outbox.testing import free_port

    return redis_at(f"redis://127.0.0.1:{free_port()}/0")


def redis_at(url: str) -> override_settings:
    """override_settings: the outbox's cache alias pointed at ``url`` (short socket
    timeouts); in cluster mode (``OUTBOX["CLUSTER"]`` set, OUTBOX_TEST_CLUSTER) the
    cluster's startup nodes instead, when ``url`` is where nothing listens (a cluster
    node's URL is not a plain server's). The deployment stays the one of the current
    settings (``OUTBOX["DEPLOYMENT"]`` set to its identity): the same deployment whose
    Redis is away, so its relay pushes what was captured meanwhile once it is back."""
    from django.conf import settings

    from outbox.sending.deployment import current

    same = {**settings.OUTBOX, "DEPLOYMENT": current()}
    if settings.OUTBOX.get("CLUSTER"):
        cluster = {"NODES": [url], "SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 1}
        return override_settings(OUTBOX={**same, "CLUSTER": cluster})
    caches = {
        **settings.CACHES,
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 1},
        },
    }
    return override_settings(CACHES=caches, OUTBOX=same)


def index_keys(conn, repo, kind: str) -> list[bytes]:
    """Every key of the indexes of one kind ("parked", "quarantine"), in every partition."""
    prefix = repo.keys.prefix
    patterns = [f"{prefix}:{kind}:*"] if not repo.keys.partitioned else [f"{prefix}:{{p*}}:{kind}:*"]
    return [key for pattern in patterns for key in conn.scan_iter(match=pattern)]


def assert_index_invariant(repo) -> None:
    """Every message id is in exactly one status index, the one its resend record names,
    of its own destination in its own partition, and in that destination's created index;
    no index across destinations (kept by 0.1) is written."""
    from outbox.records import STATUSES

    conn = repo.connection
    assert not conn.exists(*repo.keys.legacy_indexes(STATUSES)), "an index across destinations was written"
    seen: dict[str, str] = {}
    all_ids: set[str] = set()
    for destination in repo.destinations():
        for k in repo.keys.partition_numbers():
            part = repo.keys.partition(k)
            for status in STATUSES:
                for raw in conn.zrange(part.status(status, destination), 0, -1):
                    message_id = raw.decode()
                    assert message_id not in seen, f"{message_id} in both {seen[message_id]} and {status}"
                    assert repo.keys.of(message_id) == part, f"{message_id} indexed in partition {k}"
                    seen[message_id] = status
                    assert conn.hget(repo.keys.resend(message_id), "destination").decode() == destination
            all_ids |= {r.decode() for r in conn.zrange(part.created(destination), 0, -1)}
    assert set(seen) == all_ids, "status indexes and the created index disagree"
    for message_id, status in seen.items():
        assert conn.hget(repo.keys.resend(message_id), "status").decode() == status
    # A pending or retrying message waits in exactly one place: its queue's due index, its
    # queue's quarantine index (a suspect, attempted alone), or its destination's parked
    # set (paused, disabled, circuit breaker open). A parked set holds nothing else.
    waiting = {i: s for i, s in seen.items() if s in ("pending", "retrying")}
    for key in index_keys(conn, repo, "parked"):
        destination = key.decode().split(":parked:", 1)[1]
        for raw in conn.zrange(key, 0, -1):
            message_id = raw.decode()
            assert message_id in waiting, f"{message_id} parked but {seen.get(message_id, 'gone')}"
            record = conn.hmget(repo.keys.resend(message_id), "destination", "queue")
            assert record[0].decode() == destination
            assert conn.zscore(repo.keys.of(message_id).due(record[1].decode()), message_id) is None, (
                f"{message_id} both parked and due"
            )
            waiting.pop(message_id)
    for message_id in waiting:
        queue = conn.hget(repo.keys.resend(message_id), "queue").decode()
        part = repo.keys.of(message_id)
        due = conn.zscore(part.due(queue), message_id) is not None
        quarantined = conn.zscore(part.quarantine(queue), message_id) is not None
        assert due != quarantined, f"{message_id} is {seen[message_id]}: due {due}, quarantined {quarantined}"
        if quarantined:
            assert conn.hexists(repo.keys.resend(message_id), "suspect"), (
                f"{message_id} quarantined, no suspect"
            )
    for key in index_keys(conn, repo, "quarantine"):
        for raw in conn.zrange(key, 0, -1):
            assert raw.decode() in waiting, f"{raw.decode()} quarantined but {seen.get(raw.decode(), 'gone')}"


def settle(worker, ids, *, passes: int = 20) -> None:
    """Run burst workers in this process (``simple``: no fork) until every message of
    ``ids`` is succeeded or failed. A retry due at once can be left to the next pass's
    wake-up, so one pass is not always enough.

    Raises:
        AssertionError: still unsettled after ``passes`` passes.
    """
    import outbox
    from outbox.conf import outbox_settings
    from outbox.store.background.wakeups import enqueue_wakeups

    for _ in range(passes):
        worker(simple=True)
        if all(outbox.get(i).status in ("succeeded", "failed") for i in ids):
            return
        # a wake-up job for the next pass, as wake_due enqueues one once a flag is older
        # than WAKE_STALE_AFTER (5 s): in some matrix runs the job of a flag set by an
        # earlier pass was not there to take (order-dependent), and the passes ended
        # inside those 5 s with the messages still pending
        enqueue_wakeups(outbox_settings.queue_names)
        time.sleep(0.1)
    raise AssertionError(f"not settled: {[outbox.get(i).status for i in ids]}")


def settle_due(worker, messages) -> None:
    """Run burst workers until none of ``messages`` is due within a second (a retry due
    a few milliseconds after a burst worker stopped waits for the next one)."""
    import outbox

    for _ in range(10):
        worker()
        soon = time.time() + 1
        if not any(
            m.status in ("pending", "retrying", "sending") and (m.next_attempt_at or 0) <= soon
            for m in (outbox.get(x.id) for x in messages)
        ):
            return
        time.sleep(0.05)


def wait_for(predicate: Callable[[], object], timeout: float = 15.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` every ``interval`` seconds until it is true (True) or
    ``timeout`` seconds have passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def assert_due_order(repo, got: list[str], expected: list[str]) -> None:
    """Assert ``got`` (ids in delivery order) is ``expected``'s delivery in due order.

    With one partition that is the exact order. With more, due order holds within each
    partition; a run's claims share its slots among the partitions, so across them it is
    only roughly due order: the same deliveries, each partition's in ``expected``'s order.
    """
    from outbox.records import partition_of

    if not repo.keys.partitioned:
        assert got == expected
        return
    assert sorted(got) == sorted(expected)
    for k in {partition_of(i) for i in expected}:
        assert [i for i in got if partition_of(i) == k] == [i for i in expected if partition_of(i) == k]
