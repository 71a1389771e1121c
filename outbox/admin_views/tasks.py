"""Bulk operations too large for one web request, run as a background RQ job.

The job goes to the outbox's ``high`` priority queue (workers listen to it first), so
an ``outbox_worker`` (or any worker on the outbox queues) runs it. Its progress lives in
the outbox's registry of console jobs (:mod:`outbox.store.background.tasks`, JSON under
``<prefix>:task:<job id>``, kept 7 days after its last write): the console writes the
entry when it enqueues the job, the job updates it when it starts, after every batch of
1,000 ids and when it ends, and the status page reads only that. The page never
fetches an RQ job: RQ unpickles a job's ``meta``, ``data`` and result, so a job hash
planted in Redis would run code in the web process; an id the registry does not hold
is a 404. When the job ends it also records the result in the admin history for the
user who started it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from django.db import DatabaseError
from rq import get_current_job

from outbox.admin_views.history import record
from outbox.conf import outbox_settings
from outbox.operations.batches import BatchRecorder
from outbox.operations.operation import OPERATIONS, Operation, Selection, execute, report
from outbox.store import get_repository
from outbox.store.background.tasks import TaskRegistry
from outbox.store.background.wakeups import get_queue, new_job_id

logger = logging.getLogger("outbox")

JOB_FUNCTION = "outbox.admin_views.tasks.run_operation"
JOB_TIMEOUT = 3600  # seconds; 1,000,000 requeues take well under 10 minutes
RESULT_TTL = 7 * 24 * 3600  # seconds the job (and its registry entry, after its last write) is kept

#: States the job writes: enqueued, running, ended with its report, ended by an exception.
QUEUED, STARTED, FINISHED, FAILED = "queued", "started", "finished", "failed"
#: States RQ may give a job that never reported its end (work horse killed, stopped, cancelled).
ENDED_BY_RQ = ("failed", "stopped", "canceled")
#: The state shown when RQ no longer has a job that never reported its end.
LOST = "lost"


def registry() -> TaskRegistry:
    """The registry of console jobs on the outbox's Redis (its key prefix); in cluster mode
    it reads RQ's job status on RQ's own Redis."""
    repo = get_repository()
    if outbox_settings.cluster is None:
        return TaskRegistry(repo.connection, repo.keys)
    return TaskRegistry(repo.connection, repo.keys, get_queue(outbox_settings.queue_name("high")).connection)


def start(op: Operation, selection: Selection, user_id: int, total: int, batch: str | None = None) -> str:
    """Register, then enqueue, ``op`` on ``selection`` as a background job.

    Args:
        total: the expected number of messages (for the progress display).
        batch: a batch token (:mod:`outbox.operations.batches`) to record the ids acted on under, or None.

    Returns:
        The RQ job id (``[0-9a-f]{32}``), under which the registry holds the job (state
        ``queued``).

    Raises:
        redis.exceptions.RedisError: Redis could not be reached; the registry entry is
            removed again if the enqueue failed after it was written.
    """
    job_id = new_job_id()
    now = time.time()
    task = TaskStatus(
        id=job_id,
        operation=op.name,
        state=QUEUED,
        total=total,
        acted=0,
        skipped=0,
        batch=batch,
        user_id=user_id,
        created_at=now,
        updated_at=now,
    )
    tasks = registry()
    tasks.save(job_id, task.entry(), RESULT_TTL)
    try:
        get_queue(outbox_settings.queue_name("high")).enqueue(
            JOB_FUNCTION,
            op.name,
            selection.to_dict(),
            user_id,
            batch,
            job_id=job_id,
            job_timeout=JOB_TIMEOUT,
            result_ttl=RESULT_TTL,
            failure_ttl=RESULT_TTL,
            description=f"outbox {op.name}: {selection.description}"[:200],
        )
    except BaseException:
        with contextlib.suppress(Exception):  # the enqueue's error is the one to raise
            tasks.delete(job_id)
        raise
    return job_id


def run_operation(
    name: str, selection: dict[str, Any], user_id: int, batch: str | None = None
) -> dict[str, Any]:
    """The RQ job: run the operation, writing its progress to the registry of console jobs.

    The entry goes to ``started``, its counts are written after every batch of 1,000
    ids, and it ends ``finished`` with the report, or ``failed`` with the exception's
    last line (the exception is raised again, for RQ). A job enqueued by an older
    version, which has no entry, writes one (its total unknown: 0).

    Returns:
        ``{"acted": n, "skipped": n, "report": str}`` (kept as the job's result; the
        console does not read it).
    """
    op = OPERATIONS[name]
    chosen = Selection.from_dict(selection)
    job = get_current_job()
    tasks = registry()
    task: TaskStatus | None = None
    if job is not None:
        task = TaskStatus.from_entry(job.id, tasks.load(job.id) or {}) or TaskStatus(
            id=job.id, operation=name, state=QUEUED, total=0, acted=0, skipped=0, batch=batch, user_id=user_id
        )

    def write(**changes: Any) -> None:
        if task is not None:
            for field_name, value in changes.items():
                setattr(task, field_name, value)
            task.updated_at = time.time()
            tasks.save(task.id, task.entry(), RESULT_TTL)

    def progress(acted: int, skipped: int) -> None:
        write(acted=acted, skipped=skipped)

    write(state=STARTED)
    repo = get_repository()
    recorder = BatchRecorder(repo, batch) if batch else None
    try:
        result = execute(repo, op, chosen, progress, applied=recorder)
    except BaseException as exc:  # a timeout (RQ's JobTimeoutException) included
        with contextlib.suppress(Exception):  # e.g. Redis down: the job's own error is the one to raise
            write(state=FAILED, error=_last_line(exc))
        raise
    text = report(op, result, chosen.description)
    logger.info("outbox bulk %s by user %s: %s", name, user_id, text)
    write(state=FINISHED, acted=result.acted, skipped=result.skipped, report=text)
    try:
        record(user_id, op, text)
    except DatabaseError:
        logger.exception("outbox bulk %s: could not record the admin history entry", name)
    return {"acted": result.acted, "skipped": result.skipped, "report": text}


def _last_line(exc: BaseException) -> str:
    lines = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return lines[-1][:500] if lines else type(exc).__name__


@dataclass
class TaskStatus:
    """A background operation as the registry holds it, and as the status page shows it.

    Attributes:
        id: the RQ job id.
        operation: the operation's name (a key of :data:`outbox.operations.OPERATIONS`).
        state: ``queued``, ``started``, ``finished`` or ``failed`` as the job wrote it;
            on the page also ``stopped`` or ``canceled`` (RQ ended a job that never
            reported its end) or ``lost`` (RQ no longer has it).
        total: expected number of messages (a lower bound when it was estimated).
        acted, skipped: progress so far (final when finished).
        report: the final report ("" until finished).
        error: why the job failed, one line ("" unless it did).
        batch: the batch token the acted-on ids are recorded under, or None.
        user_id: the user who started it.
        created_at, updated_at: epoch seconds it was registered, and last written.
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
    user_id: int | None = None
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def done(self) -> bool:
        return self.state in (FINISHED, *ENDED_BY_RQ, LOST)

    @property
    def percent(self) -> int:
        if not self.total:
            return 100 if self.done else 0
        return min(100, int(100 * (self.acted + self.skipped) / self.total))

    def entry(self) -> dict[str, Any]:
        """The registry entry (JSON-ready; the id is the key's, not stored)."""
        data = asdict(self)
        del data["id"]
        return data

    @classmethod
    def from_entry(cls, job_id: str, entry: dict[str, Any]) -> TaskStatus | None:
        """The status of a registry entry, or None if it is not one (an unknown
        operation, or fields of the wrong type)."""
        try:
            task = cls(
                id=job_id,
                operation=str(entry["operation"]),
                state=str(entry["state"]),
                total=int(entry["total"]),
                acted=int(entry["acted"]),
                skipped=int(entry["skipped"]),
                report=str(entry.get("report") or ""),
                error=str(entry.get("error") or ""),
                batch=str(entry["batch"]) if entry.get("batch") else None,
                user_id=int(entry["user_id"]) if entry.get("user_id") is not None else None,
                created_at=float(entry.get("created_at") or 0.0),
                updated_at=float(entry.get("updated_at") or 0.0),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return task if task.operation in OPERATIONS else None


def status(job_id: str) -> TaskStatus | None:
    """The status of a background operation the console started, or None if the
    registry has no such job (read only; one round trip).

    Only the registry's JSON and RQ's plain ``status`` field are read, never an RQ job
    (see the module's docstring). RQ's status counts only for a job that has not
    reported its end: one RQ failed, stopped or cancelled shows that state; one RQ no
    longer has shows ``lost``.
    """
    entry, rq_status = registry().load_with_rq_status(job_id)
    task = TaskStatus.from_entry(job_id, entry) if entry is not None else None
    if task is None or task.state in (FINISHED, FAILED):
        return task
    if rq_status is None:
        task.state = LOST
        task.error = (
            "the job is no longer in RQ (its queue was emptied or its data deleted): start the action again"
        )
    elif rq_status in ENDED_BY_RQ:
        task.state = rq_status
        task.error = (
            f"RQ {rq_status} the job before it reported its end (its work horse was killed, "
            "stopped or cancelled); see RQ's failed job registry"
        )
    return task
