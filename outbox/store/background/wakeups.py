"""Wake-ups: how workers learn that messages are due. The only module that enqueues
delivery jobs (the admin's background bulk actions enqueue their own job, see
``admin_views.tasks``).

The outbox's own indexes hold the work: each queue has a due index (``pending`` and
``retrying`` ids by due time) that workers claim from (:mod:`outbox.delivery`). An RQ
job ``outbox.jobs.deliver(queue)`` only wakes a worker. A queue's wake-up flag
(``outbox:wake:<queue>``, set atomically with the write that made work due) says a job
is already waiting, so ``send()`` enqueues a job only when none is: under load, one job
carries many messages. A job clears the flag when it starts, so work written after that
wakes another.

RQ's bookkeeping is never the truth about a message: a job lost with a killed worker, a
flag whose job vanished, or a retry that becomes due later is found by
:func:`outbox.delivery.recovery.wake_due`, which every ``outbox_worker`` runs each
``WAKE_INTERVAL`` (no dependency on RQ's scheduler or on any one process surviving).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from rq import Queue

from outbox.conf import outbox_settings
from outbox.store.client.connection import get_connection, is_cluster
from outbox.store.repository import get_repository

logger = logging.getLogger("outbox")

DELIVER_JOB = "outbox.jobs.deliver"
FAILURE_TTL = 7 * 24 * 3600  # seconds RQ keeps a crashed delivery job, for inspection
# A wake-up flag older than this while work is due means its job was lost (a worker
# took it off the queue and died) or all workers are busy: one more job is enqueued.
WAKE_STALE_AFTER = 5.0
# A message due within this many seconds counts as due now (clock skew between hosts):
# its write wakes the queue, and a claim takes it.
DUE_SLACK = 0.5
JOB_TIMEOUT_MARGIN = 60  # seconds past VISIBILITY_TIMEOUT before RQ kills a delivery job

_queues: dict[str, Queue] = {}


def new_job_id() -> str:
    """A fresh RQ job id."""
    return uuid.uuid4().hex


def get_queue(name: str) -> Queue:
    """The django-rq queue ``name`` on the outbox's Redis connection (cached per process);
    in cluster mode (``OUTBOX["CLUSTER"]``) on its own connection from ``RQ_QUEUES``, a
    plain Redis: RQ cannot run on a cluster.

    Jobs are enqueued at once (``commit_mode="auto"``): the outbox decides itself when
    to enqueue (after its records are written).

    Raises:
        KeyError: ``name`` is not in ``RQ_QUEUES`` (system check ``outbox.E003``).
    """
    queue = _queues.get(name)
    if queue is None:
        import django_rq  # django_rq reads Django settings when imported

        if outbox_settings.cluster is not None:
            queue = django_rq.get_queue(name, commit_mode="auto")
        else:
            queue = django_rq.get_queue(name, connection=get_connection(), commit_mode="auto")
        _queues[name] = queue
    return queue


def _server(queue: Queue) -> tuple[Any, ...]:
    """Which server ``queue``'s connection talks to: (host, port, db, unix socket path)."""
    kwargs = getattr(queue.connection.connection_pool, "connection_kwargs", {})
    return (kwargs.get("host"), kwargs.get("port"), kwargs.get("db"), kwargs.get("path"))


def enqueue_wakeups(queues: Iterable[str]) -> None:
    """Enqueue one wake-up job ``outbox.jobs.deliver(queue)`` on each queue (one round trip;
    in cluster mode one per RQ server, normally one: check outbox.W001).

    The caller has set the queues' wake-up flags (the scripts that make work due do).
    A job runs with RQ's ``result_ttl=0``: nothing of it is kept once it has run. If
    enqueueing fails, the message is safe in its due index and
    :func:`~outbox.delivery.recovery.wake_due` in any
    ``outbox_worker`` wakes the queue once the flag is stale; the error is logged, not
    raised, since the caller's write has happened.
    """
    names = list(dict.fromkeys(queues))
    if not names:
        return
    try:
        connection = get_connection()
        if not is_cluster(connection):
            _enqueue(connection, names)
        else:  # RQ's queues are on a plain Redis of their own: one pipeline per server
            by_server: dict[tuple[Any, ...], list[str]] = {}
            for name in names:
                by_server.setdefault(_server(get_queue(name)), []).append(name)
            for group in by_server.values():
                _enqueue(get_queue(group[0]).connection, group)
    except Exception:
        logger.warning(
            "outbox: could not enqueue a wake-up job for %s; the messages are stored and "
            "an outbox_worker will wake the queue within %.0fs",
            ", ".join(names),
            WAKE_STALE_AFTER + outbox_settings.WAKE_INTERVAL,
            exc_info=True,
        )


def _enqueue(connection: Any, names: list[str]) -> None:
    """One wake-up job per queue of ``names``, in one MULTI on ``connection``'s server.

    Raises:
        redis.exceptions.RedisError: the server could not be reached.
    """
    with connection.pipeline() as pipe:
        pipe.multi()  # RQ queues its commands on a caller's pipeline in MULTI mode
        for name in names:
            get_queue(name).enqueue(
                DELIVER_JOB,
                name,
                job_id=new_job_id(),
                job_timeout=outbox_settings.VISIBILITY_TIMEOUT + JOB_TIMEOUT_MARGIN,
                result_ttl=0,
                failure_ttl=FAILURE_TTL,
                description=f"outbox: wake a worker for queue {name}",
                pipeline=pipe,
            )
        pipe.execute()


def wake(queues: Iterable[str], now: float | None = None) -> list[str]:
    """Make sure a wake-up job waits for each of ``queues`` that has work due.

    Returns:
        The queues a job was enqueued for.
    """

    names = list(dict.fromkeys(queues))
    woken = get_repository().wake_candidates(names, time.time() if now is None else now, WAKE_STALE_AFTER)
    enqueue_wakeups(woken)
    return woken


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("OUTBOX", "CACHES", "RQ_QUEUES", "RQ"):
        _queues.clear()
