"""Read-only figures about the outbox queues and their workers.

Messages waiting per queue come from the outbox's own due index (due now, due later);
RQ's figures (wake-up jobs waiting, jobs running, crashed jobs) are raw ZCARD/LLEN of
RQ's keys in the same pipeline: unlike RQ's ``registry.count``
(and django-rq's dashboard) nothing is cleaned up on read, so a page view never
changes state. Workers are those registered on an outbox queue whose key has not
expired (RQ refreshes it with every heartbeat).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rq.worker import Worker
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from ..connection import get_repository
from ..dispatch import get_queue

WORKER_FIELDS = ("state", "queues", "hostname", "pid", "last_heartbeat", "current_job")


@dataclass
class QueueStats:
    """One outbox queue: messages due now and later (the outbox's due index), and RQ's
    jobs: wake-ups waiting, running, crashed."""

    name: str
    due: int = 0
    later: int = 0
    queued: int = 0
    started: int = 0
    failed: int = 0
    workers: int = 0


@dataclass
class WorkerInfo:
    """A live RQ worker on an outbox queue (fields as RQ stores them)."""

    name: str
    state: str = ""
    queues: list[str] = field(default_factory=list)
    hostname: str = ""
    pid: str = ""
    last_heartbeat: str = ""
    current_job: str = ""


def queue_stats(names: Sequence[str], now: float | None = None) -> tuple[list[QueueStats], list[WorkerInfo]]:
    """Job counts per queue and the live workers of these queues. Two round trips.

    Returns:
        (one :class:`QueueStats` per name in order, the live workers sorted by name).
    """
    queues = [get_queue(name) for name in names]
    if not queues:
        return [], []
    conn = queues[0].connection
    due_keys = get_repository().keys
    now = time.time() if now is None else now
    pipe = conn.pipeline(transaction=False)
    for q in queues:
        pipe.zcount(due_keys.due(q.name), "-inf", repr(now))
        pipe.zcount(due_keys.due(q.name), f"({now!r}", "+inf")
        pipe.llen(q.key)
        pipe.zcard(q.started_job_registry.key)
        pipe.zcard(q.failed_job_registry.key)
        pipe.smembers(WORKERS_BY_QUEUE_KEY % q.name)
    replies = pipe.execute()
    stats, members = [], []
    for i, q in enumerate(queues):
        due, later, queued, started, failed, registered = replies[6 * i : 6 * i + 6]
        stats.append(QueueStats(q.name, due, later, queued, started, failed))
        members.append({m.decode() for m in registered})
    keys = sorted(set().union(*members))
    if not keys:
        return stats, []
    pipe = conn.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, WORKER_FIELDS)
    live: dict[str, WorkerInfo] = {}
    for key, values in zip(keys, pipe.execute(), strict=True):
        if not any(values):  # the key expired: the worker is gone
            continue
        data = {f: (v.decode() if v else "") for f, v in zip(WORKER_FIELDS, values, strict=True)}
        live[key] = WorkerInfo(
            name=key.removeprefix(Worker.redis_worker_namespace_prefix),
            state=data["state"],
            queues=[q for q in data["queues"].split(",") if q],
            hostname=data["hostname"],
            pid=data["pid"],
            last_heartbeat=data["last_heartbeat"],
            current_job=data["current_job"],
        )
    for s, registered in zip(stats, members, strict=True):
        s.workers = sum(1 for key in registered if key in live)
    return stats, [live[k] for k in sorted(live)]
