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
        due_key = repo.keys.due(q.name)
        due_pipe.zcount(due_key, "-inf", repr(now))
        due_pipe.zcount(due_key, f"({now!r}", "+inf")
        rq_pipe.llen(q.key)
        rq_pipe.zcard(q.started_job_registry.key)
        rq_pipe.zcard(q.failed_job_registry.key)
    replies: list[Any] = rq_pipe.execute()
    if cluster:  # the due counts, then RQ's, per queue as one pipeline would have them
        due: list[Any] = due_pipe.execute()
        replies = [
            r for i in range(len(queues)) for r in (*due[2 * i : 2 * i + 2], *replies[3 * i : 3 * i + 3])
        ]
    per = 5
    return [
        (int(replies[i]), int(replies[i + 1]), int(replies[i + 2]), int(replies[i + 3]), int(replies[i + 4]))
        for i in range(0, per * len(queues), per)
    ]
