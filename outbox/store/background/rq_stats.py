"""Counts of RQ's wake-up jobs beside the outbox's due index, read without changing
anything (raw ZCOUNT/LLEN/ZCARD: unlike RQ's ``registry.count`` and django-rq's
dashboard, nothing is cleaned up on read, so a page view never changes state)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster
from rq import Queue

from outbox.store.repository import MessageRepository


def queue_counts(
    repo: MessageRepository, queues: Sequence[Queue], now: float
) -> list[tuple[int, int, int, int, int]]:
    """Per RQ queue of ``queues``, in order: (outbox messages due by ``now`` (epoch seconds),
    due later, wake-up jobs waiting, jobs running, crashed jobs). One round trip, on RQ's
    connection (the first queue's), which is the outbox's; on a cluster (where RQ has a
    plain Redis of its own) two: the due indexes on the cluster, RQ's keys on RQ's Redis.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    if not queues:
        return []
    rq_pipe = queues[0].connection.pipeline(transaction=False)
    cluster = isinstance(repo.connection, RedisCluster)
    due_pipe = repo.connection.pipeline(transaction=False) if cluster else rq_pipe
    for q in queues:
        rq_pipe.llen(q.key)
        rq_pipe.zcard(q.started_job_registry.key)
        rq_pipe.zcard(q.failed_job_registry.key)
    for q in queues:
        for due_key in repo.keys.every("due", q.name):
            due_pipe.zcount(due_key, "-inf", repr(now))
            due_pipe.zcount(due_key, f"({now!r}", "+inf")
    replies: list[Any] = rq_pipe.execute()
    # on a single server one pipeline holds both: RQ's counts first, then the due counts
    due: list[Any] = due_pipe.execute() if cluster else replies[3 * len(queues) :]
    per = 2 * repo.keys.partitions  # due counts per queue
    out = []
    for i in range(len(queues)):
        row = due[i * per : (i + 1) * per]
        rq = replies[3 * i : 3 * i + 3]
        out.append(
            (
                sum(int(c) for c in row[0::2]),
                sum(int(c) for c in row[1::2]),
                int(rq[0]),
                int(rq[1]),
                int(rq[2]),
            )
        )
    return out
