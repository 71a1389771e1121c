"""Bulk operations too large for one web request, run as a background RQ job.

The job goes to the outbox's ``high`` priority queue (workers listen to it first), so
an ``outbox_worker`` (or any worker on the outbox queues) runs it. It reports
progress in the job's ``meta`` (``total``, ``acted``, ``skipped``, updated after every
batch of 1,000), which the console's status page reads; no other keys are written.
When it ends it records the result in the admin history for the user who started it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError
from rq import get_current_job
from rq.exceptions import NoSuchJobError
from rq.job import Job

from ..batches import BatchRecorder
from ..conf import outbox_settings
from ..connection import get_connection, get_repository
from ..dispatch import get_queue
from ..operations import OPERATIONS, Operation, Selection, execute, report
from .history import record

logger = logging.getLogger("outbox")

JOB_FUNCTION = "outbox.admin_views.tasks.run_operation"
JOB_TIMEOUT = 3600  # seconds; 1,000,000 requeues take well under 10 minutes
RESULT_TTL = 7 * 24 * 3600  # seconds the job (and its report) is kept


def start(op: Operation, selection: Selection, user_id: int, total: int, batch: str | None = None) -> str:
    """Enqueue ``op`` on ``selection`` as a background job; returns the RQ job id.

    Args:
        total: the expected number of messages (for the progress display).
        batch: a batch token (:mod:`outbox.batches`) to record the ids acted on under, or None.
    """
    queue = get_queue(outbox_settings.queue_name("high"))
    job = queue.enqueue(
        JOB_FUNCTION,
        op.name,
        selection.to_dict(),
        user_id,
        batch,
        job_timeout=JOB_TIMEOUT,
        result_ttl=RESULT_TTL,
        failure_ttl=RESULT_TTL,
        description=f"outbox {op.name}: {selection.description}"[:200],
        meta={
            "operation": op.name,
            "total": total,
            "acted": 0,
            "skipped": 0,
            "user_id": user_id,
            "batch": batch,
        },
    )
    return job.id


def run_operation(
    name: str, selection: dict[str, Any], user_id: int, batch: str | None = None
) -> dict[str, Any]:
    """The RQ job: run the operation, updating progress in the job's meta.

    Returns:
        ``{"acted": n, "skipped": n, "report": str}`` (kept as the job's result).
    """
    op = OPERATIONS[name]
    chosen = Selection.from_dict(selection)
    job = get_current_job()

    def progress(acted: int, skipped: int) -> None:
        if job is not None:
            job.meta.update(acted=acted, skipped=skipped)
            job.save_meta()

    repo = get_repository()
    recorder = BatchRecorder(repo, batch) if batch else None
    result = execute(repo, op, chosen, progress, applied=recorder)
    text = report(op, result, chosen.description)
    logger.info("outbox bulk %s by user %s: %s", name, user_id, text)
    try:
        record(user_id, op, text)
    except DatabaseError:
        logger.exception("outbox bulk %s: could not record the admin history entry", name)
    return {"acted": result.acted, "skipped": result.skipped, "report": text}


@dataclass
class TaskStatus:
    """What the status page shows of a background operation.

    Attributes:
        id: the RQ job id.
        operation: the operation's name.
        state: RQ's job status (``queued``, ``started``, ``finished``, ``failed``, ...).
        total: expected number of messages (a lower bound when it was estimated).
        acted, skipped: progress so far (final when finished).
        report: the final report ("" until finished).
        error: the last line of the exception when the job failed.
        batch: the batch token the acted-on ids are recorded under, or None.
    """

    id: str
    operation: str
    state: str
    total: int
    acted: int
    skipped: int
    report: str = ""
    error: str = ""
    batch: str | None = None

    @property
    def done(self) -> bool:
        return self.state in ("finished", "failed", "stopped", "canceled")

    @property
    def percent(self) -> int:
        if not self.total:
            return 100 if self.done else 0
        return min(100, int(100 * (self.acted + self.skipped) / self.total))


def status(job_id: str) -> TaskStatus | None:
    """The status of a background operation, or None if there is no such job (read only)."""
    try:
        job = Job.fetch(job_id, connection=get_connection())
    except NoSuchJobError:
        return None
    meta = job.meta or {}
    if meta.get("operation") not in OPERATIONS:
        return None
    raw_state = job.get_status(refresh=False)
    state = getattr(raw_state, "value", raw_state) or ""
    result = job.return_value() if state == "finished" else None
    error = ""
    if state == "failed":
        latest = job.latest_result()
        lines = (latest.exc_string or "").strip().splitlines() if latest else []
        error = lines[-1] if lines else "failed"
    acted = result["acted"] if result else int(meta.get("acted", 0))
    skipped = result["skipped"] if result else int(meta.get("skipped", 0))
    return TaskStatus(
        id=job.id,
        operation=meta["operation"],
        state=state,
        total=int(meta.get("total", 0)),
        acted=acted,
        skipped=skipped,
        report=result["report"] if result else "",
        error=error,
        batch=meta.get("batch"),
    )
