"""Counts of RQ's wake-up jobs beside the outbox's due index, read without changing
anything (raw ZCOUNT/LLEN/ZCARD: unlike RQ's ``registry.count`` and django-rq's
dashboard, nothing is cleaned up on read, so a page view never changes state)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rq import Queue

from outbox.store.repository import MessageRepository


def queue_counts(
    repo: MessageRepository, queues: Sequence[Queue], now: float
) -> list[tuple[int, int, int, int, int]]:
    """Per RQ queue of ``queues``, in order: (outbox messages due by ``now`` (epoch seconds),
    due later, wake-up jobs waiting, jobs running, crashed jobs). One round trip, on RQ's
    connection (the first queue's), which is the outbox's.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    if not queues:
        return []
    pipe = queues[0].connection.pipeline(transaction=False)
    for q in queues:
        due_key = repo.keys.due(q.name)
        pipe.zcount(due_key, "-inf", repr(now))
        pipe.zcount(due_key, f"({now!r}", "+inf")
        pipe.llen(q.key)
        pipe.zcard(q.started_job_registry.key)
        pipe.zcard(q.failed_job_registry.key)
    replies: list[Any] = pipe.execute()
    per = 5
    return [
        (int(replies[i]), int(replies[i + 1]), int(replies[i + 2]), int(replies[i + 3]), int(replies[i + 4]))
        for i in range(0, per * len(queues), per)
    ]
