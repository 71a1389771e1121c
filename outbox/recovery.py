"""The recovery sweep: nothing stays stuck.

* ``sending`` past its lease deadline (claim time + ``VISIBILITY_TIMEOUT``): the worker
  died or hung. The message goes back to ``retrying`` (due now) with a ``lost`` attempt
  recorded and its retry count raised, or to ``failed`` when no retries are left (so a
  message that kills every worker it meets ends as a dead letter, not a loop).
* ``pending``/``retrying`` due more than ``RECOVERY_GRACE`` seconds ago whose RQ job is
  gone, finished or failed (e.g. Redis lost the queue, or a job was deleted by hand):
  a new job is enqueued.

* finished messages older than ``OUTBOX["RETENTION"]`` for their status (by default
  succeeded after 7 days, cancelled after 30; dead letters are kept): deleted, at most
  ``limit`` per status per sweep.

``outbox_worker`` runs :func:`recover` every ``RECOVERY_INTERVAL`` seconds in each
worker process; a short Redis lock makes one sweep per interval across all of them.
``python manage.py outbox_recover`` runs one sweep by hand.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from rq.job import Job, JobStatus

from . import dispatch
from .conf import outbox_settings
from .connection import get_repository
from .delivery import commit, decide, write
from .records import Status
from .store import Change

logger = logging.getLogger("outbox")

LIVE_JOB_STATUSES = {JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.STARTED, JobStatus.DEFERRED}
SWEEP_LIMIT = 1000  # messages per status per sweep
FINISHED_STATUSES = (Status.SUCCEEDED.value, Status.CANCELLED.value, Status.FAILED.value)


@dataclass
class RecoveryReport:
    """What one sweep did: messages taken back from dead workers, and jobs enqueued again."""

    lost: int = 0
    reenqueued: int = 0
    purged: int = 0


def recover(now: float | None = None, limit: int = SWEEP_LIMIT) -> RecoveryReport:
    """Run one recovery sweep (see the module docstring).

    Args:
        now: epoch seconds (for tests); the current time by default.
        limit: at most this many messages per status.
    """
    now = time.time() if now is None else now
    return RecoveryReport(
        lost=_recover_lost(now, limit), reenqueued=_reenqueue_orphans(now, limit), purged=_purge_expired(now, limit)
    )


def _purge_expired(now: float, limit: int) -> int:
    """Delete finished messages past their status's retention (their index score is the
    time they entered the status)."""
    repo = get_repository()
    purged = 0
    for status, seconds in (outbox_settings.RETENTION or {}).items():
        if seconds is None or status not in FINISHED_STATUSES:
            continue
        expired = [message_id for message_id, _ in repo.due(status, now - seconds, limit)]
        purged += sum(repo.delete(expired, (status,)))
    if purged:
        logger.info("outbox recovery: deleted %d finished message(s) past their retention", purged)
    return purged


def _recover_lost(now: float, limit: int) -> int:
    repo = get_repository()
    expired = [message_id for message_id, _ in repo.due(Status.SENDING.value, now, limit)]
    decisions = []
    for message in repo.get_many(expired):
        if message is None or message.status != Status.SENDING.value:
            continue
        error = f"worker lost: no outcome within the visibility timeout of {outbox_settings.VISIBILITY_TIMEOUT}s"
        decisions.append(
            decide(message, now=now, ok=False, error=error, started_at=message.last_attempt_at, attempt_outcome="lost")
        )
    applied = sum(write(decisions, now))
    if applied:
        logger.warning("outbox recovery: took back %d message(s) from lost workers", applied)
    return applied


def _reenqueue_orphans(now: float, limit: int) -> int:
    repo = get_repository()
    candidates = []
    for status in (Status.PENDING.value, Status.RETRYING.value):
        candidates += [m for m in repo.get_many([i for i, _ in repo.due(status, now - outbox_settings.RECOVERY_GRACE, limit)]) if m]
    if not candidates:
        return 0
    jobs = Job.fetch_many([m.job_id or "-" for m in candidates], connection=repo.connection)
    orphans = [
        m
        for m, job in zip(candidates, jobs)
        if job is None or job.get_status(refresh=False) not in LIVE_JOB_STATUSES
    ]
    changes, jobs = [], []
    for queue, batch, job_id in dispatch.plan_jobs(orphans, key=lambda m: m.queue):
        jobs.append((queue, [m.id for m in batch], job_id, None))
        changes += [
            # Same status, same score: a compare-and-set that only records the new job.
            Change(id=m.id, from_statuses=(m.status,), to=m.status, score=m.next_attempt_at or now, set={"job_id": job_id})
            for m in batch
        ]
    if not changes:
        return 0
    applied = sum(r.applied for r in commit(changes, jobs, now))
    if applied:
        logger.warning("outbox recovery: enqueued %d due message(s) that had no live job", applied)
    return applied


class RecoveryLoop(threading.Thread):
    """A daemon thread running :func:`recover` every ``interval`` seconds.

    Every worker process may run one; a Redis lock (``SET NX PX``) held for most of the
    interval lets only one of them sweep per interval.
    """

    def __init__(self, interval: float | None = None) -> None:
        super().__init__(name="outbox-recovery", daemon=True)
        self.interval = float(interval or outbox_settings.RECOVERY_INTERVAL)
        self.token = uuid.uuid4().hex
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sweep_once()
            self._stop_event.wait(self.interval)

    def sweep_once(self) -> RecoveryReport | None:
        """Sweep if this process wins the lock for this interval; errors are logged."""
        try:
            if get_repository().acquire_lock("recovery", self.token, self.interval * 0.9):
                return recover()
        except Exception:
            logger.exception("outbox recovery sweep failed; will try again in %.0fs", self.interval)
        return None

    def stop(self) -> None:
        self._stop_event.set()
