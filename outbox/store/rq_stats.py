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
    parts = repo.keys.partitions
    for q in queues:
        pipe.llen(q.key)
        pipe.zcard(q.started_job_registry.key)
        pipe.zcard(q.failed_job_registry.key)
        for due_key in repo.keys.every("due", q.name):
            pipe.zcount(due_key, "-inf", repr(now))
            pipe.zcount(due_key, f"({now!r}", "+inf")
    replies: list[Any] = pipe.execute()
    per = 3 + 2 * parts
    out = []
    for i in range(0, per * len(queues), per):
        row = replies[i : i + per]
        due, later = sum(int(c) for c in row[3::2]), sum(int(c) for c in row[4::2])
        out.append((due, later, int(row[0]), int(row[1]), int(row[2])))
    return out
