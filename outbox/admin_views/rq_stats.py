"""Read-only figures about the outbox queues and their workers.

Messages waiting per queue come from the outbox's own due index (due now, due later);
RQ's figures (wake-up jobs waiting, jobs running, crashed jobs) are raw ZCARD/LLEN of
RQ's keys in the same pipeline (:func:`outbox.store.background.rq_stats.queue_counts`): nothing is
cleaned up on read, so a page view never changes state. Workers are those RQ lists on an outbox queue, each live or stale by the
outbox's own per-worker heartbeat (:mod:`outbox.delivery.liveness`): a killed worker is not
counted live while RQ still lists it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from outbox.delivery.liveness import WorkerInfo, workers
from outbox.store import get_repository
from outbox.store.background.rq_stats import queue_counts
from outbox.store.background.wakeups import get_queue

__all__ = ["QueueStats", "WorkerInfo", "queue_stats"]


@dataclass
class QueueStats:
    """One outbox queue: messages due now and later (the outbox's due index), RQ's
    jobs (wake-ups waiting, running, crashed) and its live workers."""

    name: str
    due: int = 0
    later: int = 0
    queued: int = 0
    started: int = 0
    failed: int = 0
    workers: int = 0


def queue_stats(names: Sequence[str], now: float | None = None) -> tuple[list[QueueStats], list[WorkerInfo]]:
    """Job counts per queue and the workers RQ lists on these queues, each with its
    liveness (:func:`outbox.delivery.liveness.workers`). Four round trips.

    Returns:
        (one :class:`QueueStats` per name in order (``workers``: the live ones), the
        workers sorted by name, stale ones included).
    """
    queues = [get_queue(name) for name in names]
    if not queues:
        return [], []
    now = time.time() if now is None else now
    counts = queue_counts(get_repository(), queues, now)
    live, listed = workers([q.name for q in queues], now)
    stats = [
        QueueStats(q.name, *figures, workers=live[i])
        for i, (q, figures) in enumerate(zip(queues, counts, strict=True))
    ]
    return stats, listed
