"""Dispatch: how message ids reach workers. The only module that enqueues delivery jobs
(the admin's background bulk actions enqueue their own job, see ``admin_views.tasks``).

A delivery job is ``outbox.jobs.deliver(message_ids)`` on a django-rq queue. Jobs are
queued on the caller's Redis pipeline so they commit in the same MULTI/EXEC as the
records they refer to. A job whose ids were already delivered (or never written) is
harmless: the worker's claim is a compare-and-set and skips them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Sequence
from datetime import datetime, timezone
from typing import TypeVar

from redis.client import Pipeline
from rq import Queue

from .conf import outbox_settings

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

DELIVER_JOB = "outbox.jobs.deliver"
RESULT_TTL = 300  # seconds RQ keeps a finished delivery job (its summary)
FAILURE_TTL = 7 * 24 * 3600  # seconds RQ keeps a crashed delivery job, for inspection
SCHEDULE_THRESHOLD = 0.5  # seconds: a due time closer than this is enqueued at once

_queues: dict[str, Queue] = {}


def new_job_id() -> str:
    """A fresh RQ job id (recorded on the resend record before the job exists)."""
    return uuid.uuid4().hex


def get_queue(name: str) -> Queue:
    """The django-rq queue ``name`` on the outbox's Redis connection (cached per process).

    Jobs are enqueued at once (``commit_mode="auto"``): the outbox defers the whole
    write to ``transaction.on_commit`` itself.

    Raises:
        KeyError: ``name`` is not in ``RQ_QUEUES`` (system check ``outbox.E003``).
    """
    queue = _queues.get(name)
    if queue is None:
        import django_rq

        from .connection import get_connection

        queue = django_rq.get_queue(name, connection=get_connection(), commit_mode="auto")
        _queues[name] = queue
    return queue


def enqueue(
    pipe: Pipeline, queue_name: str, message_ids: Sequence[str], *, job_id: str, at: float | None = None
) -> None:
    """Queue a delivery job for ``message_ids`` on ``pipe``.

    Args:
        pipe: the Redis pipeline (MULTI/EXEC) that also writes the records.
        queue_name: the django-rq queue.
        message_ids: at most ``BATCH_SIZE`` ids.
        job_id: from :func:`new_job_id`, already written to the resend records.
        at: epoch seconds when the job becomes due; None or near now means at once.
            Later times go to RQ's scheduled job registry (a worker started
            ``--with-scheduler`` moves them to the queue; ``outbox_worker`` does).
    """
    queue = get_queue(queue_name)
    ids = list(message_ids)
    options = {
        "job_id": job_id,
        "job_timeout": outbox_settings.VISIBILITY_TIMEOUT,
        "result_ttl": RESULT_TTL,
        "failure_ttl": FAILURE_TTL,
        "description": f"outbox deliver {len(ids)} message(s): {', '.join(ids[:3])}{' ...' if len(ids) > 3 else ''}",
        "pipeline": pipe,
    }
    if at is not None and at - time.time() > SCHEDULE_THRESHOLD:
        queue.enqueue_at(datetime.fromtimestamp(at, tz=timezone.utc), DELIVER_JOB, ids, **options)
    else:
        queue.enqueue(DELIVER_JOB, ids, **options)


def plan_jobs(items: Iterable[T], key: Callable[[T], K]) -> list[tuple[K, list[T], str]]:
    """Plan delivery jobs: group items (ids, messages) by ``key`` (a queue name, or a
    queue and due time), in first-seen order, split each group into batches of at most
    ``BATCH_SIZE``, and give each batch a new job id.

    Returns:
        ``(key, batch, job_id)`` per job.
    """
    groups: dict[K, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    size = outbox_settings.BATCH_SIZE
    return [(k, group[i : i + size], new_job_id()) for k, group in groups.items() for i in range(0, len(group), size)]


def clear_cache() -> None:
    """Forget cached queues (on settings change)."""
    _queues.clear()
