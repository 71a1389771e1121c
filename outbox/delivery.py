"""The worker side: claim messages, call their transports, record the outcome.

One call of :func:`deliver_batch` (the body of the RQ job ``outbox.jobs.deliver``):

1. claims every id in one compare-and-set (``pending``/``retrying`` and due ->
   ``sending`` with a fresh lease) that also returns both records (one round trip);
2. delivers each claimed message through its destination's transport;
3. records each outcome (attempt record, status change, event, and the retry job when
   one is due later) in one pipeline, flushed at least once a second.

A claim that fails means another worker has the message, or it is not due, or it was
cancelled: nothing to do. A completion whose lease no longer matches (the worker overran
the visibility timeout and the message was taken back) changes nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.core.exceptions import ImproperlyConfigured
from rq.timeouts import JobTimeoutException

from . import dispatch
from .conf import outbox_settings
from .connection import get_repository
from .destinations import get_destination
from .events import event_payload, send_signal
from .exceptions import DeliveryError, PermanentDeliveryError, UnknownDestination
from .records import Attempt, Message, Status
from .retry import RetryPolicy, retry_delay
from .store import Change, ChangeResult
from .transports import Transport

logger = logging.getLogger("outbox")

ERROR_LIMIT = 1000  # characters of an error kept in records
FLUSH_INTERVAL = 1.0  # seconds between writes of finished outcomes within a batch
# A claim takes messages due up to this many seconds from now: it covers clock skew
# between hosts and retries enqueued at once because they were due within
# dispatch.SCHEDULE_THRESHOLD, which would otherwise wait for the recovery sweep.
DUE_SLACK = 2 * dispatch.SCHEDULE_THRESHOLD
LEASE_BUDGET = 0.5  # share of VISIBILITY_TIMEOUT after which a batch starts no new attempt

_transports: dict[str, Transport] = {}


def worker_name() -> str:
    """``host:pid`` of this process, written on each attempt record."""
    return f"{socket.gethostname()}:{os.getpid()}"


def get_transport(destination: str) -> Transport:
    """The transport for a destination, built once per process and reused (connection reuse).

    Raises:
        UnknownDestination: the destination was removed from settings.
        ImproperlyConfigured: its settings are invalid.
    """
    transport = _transports.get(destination)
    if transport is None:
        transport = get_destination(destination).build_transport()
        _transports[destination] = transport
    return transport


def close_transports() -> None:
    """Close and forget every cached transport."""
    while _transports:
        _, transport = _transports.popitem()
        try:
            transport.close()
        except Exception:  # closing is best effort
            logger.exception("closing transport failed")


@dataclass
class BatchReport:
    """What one :func:`deliver_batch` call did (also the RQ job's result).

    Attributes:
        claimed: ids this call claimed and attempted.
        skipped: ids it did not claim (taken, not due, cancelled, or missing).
        outcomes: id -> status after the attempt (``succeeded``, ``retrying``, ``failed``),
            or ``"stale"`` when the lease was lost before the outcome was written.
    """

    claimed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        counts: dict[str, int] = {}
        for outcome in self.outcomes.values():
            counts[outcome] = counts.get(outcome, 0) + 1
        return {"claimed": len(self.claimed), "skipped": len(self.skipped), "released": len(self.released), "outcomes": counts}


def claim(message_ids: Sequence[str], now: float) -> tuple[list[Message], list[str]]:
    """Claim due messages for delivery: ``pending``/``retrying`` -> ``sending``.

    Returns:
        (claimed messages with their records, ids not claimed).
    """
    lease = uuid.uuid4().hex
    deadline = now + outbox_settings.VISIBILITY_TIMEOUT
    changes = [
        Change(
            id=message_id,
            from_statuses=(Status.PENDING.value, Status.RETRYING.value),
            to=Status.SENDING.value,
            score=deadline,
            set={"lease": lease, "last_attempt_at": repr(now)},
            due_by=now + DUE_SLACK,
            load=True,
        )
        for message_id in dict.fromkeys(message_ids)
    ]
    results = get_repository().transition(changes, now)
    claimed = [r.message for r in results if r.applied and r.message is not None]
    skipped = [r.id for r in results if not r.applied]
    return claimed, skipped


@dataclass
class Outcome:
    """The result of one attempt, before it is written."""

    message: Message
    started_at: float
    duration_ms: float
    status_code: int | None = None
    error: str = ""
    ok: bool = False
    permanent: bool = False
    retry_after: float | None = None
    detail: str = ""


def attempt(message: Message) -> Outcome:
    """Deliver one claimed message through its transport and time it.

    Every failure of the transport becomes part of the :class:`Outcome`; only RQ's
    ``JobTimeoutException`` propagates: the job ran out of time, which is no fault of
    the message in flight (it stays ``sending`` and the recovery sweep takes it back).
    """
    started_at = time.time()
    t0 = time.perf_counter()
    outcome = Outcome(message, started_at, 0.0)
    try:
        try:
            transport = get_transport(message.destination)
        except (UnknownDestination, ImproperlyConfigured) as exc:
            raise PermanentDeliveryError(f"destination {message.destination!r} cannot be used: {exc}") from exc
        result = transport.deliver(message)
        outcome.ok = True
        outcome.status_code = result.status_code
        outcome.detail = (result.detail or "")[:ERROR_LIMIT]
    except JobTimeoutException:
        raise
    except DeliveryError as exc:
        outcome.error = str(exc) or type(exc).__name__
        outcome.status_code = exc.status_code
        outcome.permanent = exc.permanent
        outcome.retry_after = exc.retry_after
    except Exception as exc:  # a transport bug or an unexpected library error: retryable
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.duration_ms = (time.perf_counter() - t0) * 1000
    outcome.error = outcome.error[:ERROR_LIMIT]
    return outcome


@dataclass
class Decision:
    """A written-to-be outcome: the status change and, for a retry, its job."""

    change: Change
    attempt: Attempt
    message: Message
    retry_job: tuple[str, float] | None = None  # (job id, due time)


def decide(
    message: Message,
    *,
    now: float,
    ok: bool,
    error: str = "",
    status_code: int | None = None,
    permanent: bool = False,
    retry_after: float | None = None,
    started_at: float | None = None,
    duration_ms: float = 0.0,
    attempt_outcome: str | None = None,
    detail: str = "",
) -> Decision:
    """Turn an attempt's result into the status change for a ``sending`` message.

    Success -> ``succeeded``. A failure -> ``retrying`` with a backoff delay (at least
    ``retry_after``) while ``retry_count < max_retries`` and the error is not permanent,
    and ``retry_count`` goes up by one (it counts retries: attempts after the first);
    otherwise ``failed`` (dead letter), so a dead letter shows at most
    ``max_retries / max_retries``.
    """
    base_set = {"last_status_code": str(status_code)} if status_code is not None else {}
    unset = [] if status_code is not None else ["last_status_code"]
    retry_job = None
    if ok:
        status, retry_count, next_at = Status.SUCCEEDED.value, message.retry_count, None
        fields = {**base_set}
        unset += ["next_attempt_at", "lease", "last_error"]
        score = now
    else:
        fields = {**base_set, "last_error": error}
        if permanent or message.retry_count >= message.max_retries:
            status, retry_count, next_at = Status.FAILED.value, message.retry_count, None
            unset += ["next_attempt_at", "lease"]
            score = now
        else:
            status, retry_count = Status.RETRYING.value, message.retry_count + 1
            fields["retry_count"] = str(retry_count)
            policy = RetryPolicy.from_value(message.retry_policy or None, default=outbox_settings.retry_policy)
            next_at = now + retry_delay(policy, retry_count, retry_after)
            job_id = dispatch.new_job_id()
            fields.update(next_attempt_at=repr(next_at), job_id=job_id)
            unset += ["lease"]
            score = next_at
            retry_job = (job_id, next_at)
    record = Attempt(
        started_at=now if started_at is None else started_at,
        duration_ms=duration_ms,
        outcome=attempt_outcome or status,
        status_code=status_code,
        error=error,
        worker=worker_name(),
        retry_count=retry_count,
        detail=detail,
    )
    change = Change(
        id=message.id,
        from_statuses=(Status.SENDING.value,),
        to=status,
        score=score,
        set=fields,
        unset=unset,
        lease=message.lease,
        attempt=record,
        event=event_payload(
            status, message, at=now, retry_count=retry_count, status_code=status_code, error=error, next_attempt_at=next_at
        ),
        stat=status,
    )
    message.status, message.retry_count, message.next_attempt_at = status, retry_count, next_at
    message.last_error = error if not ok else ""
    message.last_status_code = status_code
    return Decision(change, record, message, retry_job)


#: A delivery job to enqueue: (queue, message ids, job id, due epoch seconds or None for now).
JobSpec = tuple[str, Sequence[str], str, "float | None"]


def commit(changes: Sequence[Change], jobs: Sequence[JobSpec], now: float) -> list[ChangeResult]:
    """Apply status changes and enqueue their delivery jobs in one MULTI/EXEC.

    A job whose messages' changes were refused is harmless: its claim will find nothing.
    """
    repo = get_repository()
    with repo.pipeline() as pipe:
        repo.transition(changes, now, pipe=pipe)
        for queue, ids, job_id, at in jobs:
            dispatch.enqueue(pipe, queue, ids, job_id=job_id, at=at)
        reply = pipe.execute()[0]
    return repo.parse_transition(changes, reply)


def write(decisions: Sequence[Decision], now: float) -> list[bool]:
    """Write decisions in one MULTI/EXEC: the status changes and any retry jobs.

    Sends the Django signal for each change that applied.

    Returns:
        Per decision, True if its compare-and-set applied.
    """
    if not decisions:
        return []
    jobs = [(d.message.queue, [d.message.id], *d.retry_job) for d in decisions if d.retry_job is not None]
    results = commit([d.change for d in decisions], jobs, now)
    for d, r in zip(decisions, results):
        if r.applied:
            send_signal(d.change.to, d.message, d.attempt)
    return [r.applied for r in results]


def release(messages: Sequence[Message], now: float) -> list[str]:
    """Give claimed, unattempted messages back (``sending`` -> ``pending``/``retrying``, due
    now) with a new delivery job, in one MULTI/EXEC. No attempt is recorded.

    Returns:
        The ids released (those whose lease still matched).
    """
    if not messages:
        return []
    changes, jobs = [], []
    for queue, batch, job_id in dispatch.plan_jobs(messages, key=lambda m: m.queue):
        jobs.append((queue, [m.id for m in batch], job_id, None))
        changes += [
            Change(
                id=m.id,
                from_statuses=(Status.SENDING.value,),
                to=Status.RETRYING.value if m.retry_count else Status.PENDING.value,
                score=now,
                set={"next_attempt_at": repr(now), "job_id": job_id},
                unset=("lease",),
                lease=m.lease,
            )
            for m in batch
        ]
    released = [r.id for r in commit(changes, jobs, now) if r.applied]
    logger.warning("outbox: released %d claimed message(s) to a new job: half the visibility timeout was spent", len(released))
    return released


def deliver_batch(message_ids: Sequence[str]) -> BatchReport:
    """Claim, deliver and record a batch of messages. The RQ job calls this.

    Returns:
        A :class:`BatchReport`.
    """
    report = BatchReport()
    claimed_at = time.time()
    claimed, report.skipped = claim(message_ids, claimed_at)
    report.claimed = [m.id for m in claimed]
    # Start no attempt once half the lease is spent: the rest are released to another job
    # rather than delivered under a lease that may run out mid-attempt.
    start_by = claimed_at + outbox_settings.VISIBILITY_TIMEOUT * LEASE_BUDGET
    pending: list[Decision] = []
    last_flush = time.monotonic()

    def flush() -> None:
        applied = write(pending, time.time())
        for d, ok in zip(pending, applied):
            report.outcomes[d.message.id] = d.change.to if ok else "stale"
        pending.clear()

    for index, message in enumerate(claimed):
        if time.time() > start_by:
            report.released = release(claimed[index:], time.time())
            break
        outcome = attempt(message)
        decision = decide(
            message,
            now=time.time(),
            ok=outcome.ok,
            error=outcome.error,
            status_code=outcome.status_code,
            permanent=outcome.permanent,
            retry_after=outcome.retry_after,
            started_at=outcome.started_at,
            duration_ms=outcome.duration_ms,
            detail=outcome.detail,
        )
        logger.info(
            "outbox attempt id=%s destination=%s outcome=%s status_code=%s duration_ms=%.1f retry_count=%d%s",
            message.id,
            message.destination,
            decision.change.to,
            outcome.status_code,
            outcome.duration_ms,
            decision.message.retry_count,
            f" error={outcome.error!r}" if outcome.error else "",
        )
        pending.append(decision)
        if time.monotonic() - last_flush >= FLUSH_INTERVAL:
            flush()
            last_flush = time.monotonic()
    flush()
    return report
