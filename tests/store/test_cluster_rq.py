"""RQ beside the cluster: in cluster mode the wake-up jobs, RQ's counts and the console's
job status live on RQ's own plain Redis (the private single server here), the outbox's
data on the cluster; the connection helpers that fall back to a shared client do."""

from __future__ import annotations

import time

import pytest
from redis import Redis
from rq.job import Job

from outbox.store import get_repository
from outbox.store.background.rq_stats import queue_counts
from outbox.store.background.tasks import TaskRegistry
from outbox.store.background.wakeups import enqueue_wakeups, get_queue
from outbox.store.client.thread_client import ThreadClients

QUEUES = ("outbox_high", "outbox", "outbox_low")


@pytest.fixture
def rq_redis(cluster_outbox, settings):
    """Cluster mode with RQ's queues on the private single Redis; its client."""
    settings.RQ_QUEUES = {name: {"URL": settings.REDIS_URL} for name in QUEUES}
    client = Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


def test_wakeup_jobs_go_to_rqs_own_redis(rq_redis, cluster_outbox, redis_cluster):
    queue = get_queue("outbox")
    assert (
        queue.connection.connection_pool.connection_kwargs["port"]
        == rq_redis.connection_pool.connection_kwargs["port"]
    )
    enqueue_wakeups(["outbox", "outbox_low", "outbox"])
    assert rq_redis.llen("rq:queue:outbox") == 1 and rq_redis.llen("rq:queue:outbox_low") == 1
    assert not any(redis_cluster.node_client(n).keys("rq:*") for n in redis_cluster.nodes)


def test_queue_counts_read_the_due_index_on_the_cluster_and_rqs_keys_on_rqs_redis(rq_redis, cluster_outbox):
    repo = get_repository()
    now = time.time()
    # With partitions, the counts add up the due index of every partition (here the first
    # and the last; one and the same index with one partition).
    first, last = repo.keys.partition(0), repo.keys.partition(repo.keys.partitions - 1)
    cluster_outbox.zadd(first.due("outbox"), {"a": now - 5, "c": now + 60})
    cluster_outbox.zadd(last.due("outbox"), {"b": now - 1})
    cluster_outbox.zadd(last.due("outbox_low"), {"d": now + 60})
    enqueue_wakeups(["outbox"])
    counts = queue_counts(repo, [get_queue(q) for q in ("outbox", "outbox_low")], now)
    assert counts == [(2, 1, 1, 0, 0), (0, 1, 0, 0, 0)]


def test_the_console_reads_rqs_job_status_on_rqs_redis(rq_redis, cluster_outbox):
    from outbox.admin_views.tasks import registry

    tasks = registry()
    assert isinstance(tasks, TaskRegistry) and tasks.rq_connection is not None
    tasks.save("j1", {"state": "queued"}, 60)
    rq_redis.hset(Job.key_for("j1"), "status", "started")
    assert tasks.load_with_rq_status("j1") == ({"state": "queued"}, "started")
    assert cluster_outbox.exists(tasks.keys.task("j1"))  # the registry stays with the data


def test_a_thread_on_a_cluster_uses_the_shared_cluster_client(cluster_outbox):
    clients = ThreadClients(cluster_outbox)
    assert clients.limit == 0 and clients.get() is cluster_outbox
    assert clients.run(lambda c: c.set("t", 1)) is True


def test_a_worker_waits_for_rqs_redis_too_in_cluster_mode(rq_redis):
    from outbox.delivery.worker import redis_reachable
    from outbox.testing import free_port

    assert redis_reachable(rq_redis)
    assert not redis_reachable(Redis(port=free_port(), socket_connect_timeout=0.5))
