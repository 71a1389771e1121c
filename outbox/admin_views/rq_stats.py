"""Read-only figures about the django-rq queues that carry outbox jobs, and their workers.

Counts are raw ZCARD/LLEN of RQ's keys in one pipeline: unlike RQ's ``registry.count``
(and django-rq's dashboard) nothing is cleaned up on read, so a page view never
changes state. Workers are those registered on an outbox queue whose key has not
expired (RQ refreshes it with every heartbeat).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rq.worker import Worker
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from ..dispatch import get_queue

WORKER_FIELDS = ("state", "queues", "hostname", "pid", "last_heartbeat", "current_job")


@dataclass
class QueueStats:
    """Jobs of one django-rq queue: waiting, scheduled for later, running, crashed."""

    name: str
    queued: int = 0
    scheduled: int = 0
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


def queue_stats(names: Sequence[str]) -> tuple[list[QueueStats], list[WorkerInfo]]:
    """Job counts per queue and the live workers of these queues. Two round trips.

    Returns:
        (one :class:`QueueStats` per name in order, the live workers sorted by name).
    """
    queues = [get_queue(name) for name in names]
    if not queues:
        return [], []
    conn = queues[0].connection
    pipe = conn.pipeline(transaction=False)
    for q in queues:
        pipe.llen(q.key)
        pipe.zcard(q.scheduled_job_registry.key)
        pipe.zcard(q.started_job_registry.key)
        pipe.zcard(q.failed_job_registry.key)
        pipe.smembers(WORKERS_BY_QUEUE_KEY % q.name)
    replies = pipe.execute()
    stats, members = [], []
    for i, q in enumerate(queues):
        queued, scheduled, started, failed, registered = replies[5 * i : 5 * i + 5]
        stats.append(QueueStats(q.name, queued, scheduled, started, failed))
        members.append({m.decode() for m in registered})
    keys = sorted(set().union(*members))
    if not keys:
        return stats, []
    pipe = conn.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, WORKER_FIELDS)
    live: dict[str, WorkerInfo] = {}
    for key, values in zip(keys, pipe.execute()):
        if not any(values):  # the key expired: the worker is gone
            continue
        data = {f: (v.decode() if v else "") for f, v in zip(WORKER_FIELDS, values)}
        live[key] = WorkerInfo(
            name=key.removeprefix(Worker.redis_worker_namespace_prefix),
            state=data["state"],
            queues=[q for q in data["queues"].split(",") if q],
            hostname=data["hostname"],
            pid=data["pid"],
            last_heartbeat=data["last_heartbeat"],
            current_job=data["current_job"],
        )
    for s, registered in zip(stats, members):
        s.workers = sum(1 for key in registered if key in live)
    return stats, [live[k] for k in sorted(live)]
