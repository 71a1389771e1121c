"""The recovery sweep: nothing stays stuck, and finished messages do not pile up.

* ``sending`` past its lease deadline (claim time + ``VISIBILITY_TIMEOUT``): the worker
  died or hung with the attempt in flight. The message goes back to ``retrying`` (due
  after its backoff) with a ``lost`` attempt recorded, and becomes a *suspect*: its next
  attempts are made alone, one per worker process (the quarantine lane: ``lua/claim.lua``,
  :meth:`outbox.delivery.loop.WorkerRun.lane`), until one ends in a live process. The sweep
  cannot tell which of the attempts in flight ended the process, so:

  - lost beside others (not a suspect yet): the loss is charged once (retry count + 1),
    but never makes a dead letter: with no retry left it is retried alone without
    charge. So an innocent message claimed with a poison message is charged at most one lost
    attempt per poison neighbour, and settles after its one attempt alone;
  - lost alone (a suspect, attempted in the quarantine lane): the message likely ended
    its worker itself. Charged, and ``failed`` when no retries are left (so a message that
    kills every worker it meets ends as a dead letter, not a loop); it keeps its mark,
    so a person's requeue still attempts it alone.

  A message whose record cannot be handled is failed with the reason; the sweep goes on
  with the others.
* records written by an older version are brought up to date once
  (:meth:`~outbox.store.MessageRepository.upgrade`);
* finished messages older than ``OUTBOX["RETENTION"]`` for their status (by default
  succeeded after 7 days, cancelled after 30; dead letters are kept): deleted, in
  chunks, for up to half the sweep interval, so purging keeps pace with delivery.

Due messages whose wake-up job was lost are not the sweep's business: every
``outbox_worker`` wakes due queues itself each ``WAKE_INTERVAL``
(:func:`wake_due`), from the outbox's own indexes.

``outbox_worker`` runs :func:`recover` every ``RECOVERY_INTERVAL`` seconds in each
worker process; a short Redis lock makes one sweep per interval across all of them.
``python manage.py outbox_recover`` runs one sweep by hand.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from outbox.conf import outbox_settings
from outbox.delivery.outcomes import decide, rules_for, write
from outbox.destinations import summary
from outbox.destinations.controls import close_breakers_left, release_parked_due
from outbox.records import Message, Outcome, Status
from outbox.store import get_repository
from outbox.store.background import wakeups
from outbox.store.decisions import Decision

logger = logging.getLogger("outbox")

SWEEP_LIMIT = 1000  # messages per script call
FINISHED_STATUSES = (Status.SUCCEEDED.value, Status.CANCELLED.value, Status.FAILED.value)
PURGE_SHARE = 0.5  # share of RECOVERY_INTERVAL one sweep may spend purging


@dataclass
class RecoveryReport:
    """What one sweep did: messages taken back from lost workers (``lost``; of them
    ``quarantined``: lost beside others, now attempted alone, and ``lost_alone``: lost
    while attempted alone, so each ended its worker itself), and messages purged."""

    lost: int = 0
    purged: int = 0
    purge_backlog: int = 0
    quarantined: int = 0
    lost_alone: int = 0


def wake_due(now: float | None = None) -> list[str]:
    """Wake every outbox queue that has a due message and no waiting job (see module doc).

    First, parked messages whose time has come go back to their due index
    (:func:`outbox.destinations.controls.release_parked_due`): the probe of an open circuit breaker
    after its cool-down, and what waits behind a breaker that closed.
    """
    release_parked_due(now)
    return wakeups.wake(outbox_settings.queue_names, now)


def recover(
    now: float | None = None, limit: int = SWEEP_LIMIT, purge_budget: float | None = None
) -> RecoveryReport:
    """Run one recovery sweep (see the module docstring).

    Args:
        now: epoch seconds (for tests); the current time by default.
        limit: messages per script call.
        purge_budget: seconds the purge may take (default: half ``RECOVERY_INTERVAL``).
    """
    now = time.time() if now is None else now
    budget = outbox_settings.RECOVERY_INTERVAL * PURGE_SHARE if purge_budget is None else purge_budget
    upgraded = get_repository().upgrade()
    if upgraded:
        logger.warning(
            "outbox recovery: put %d message(s) written by an older version in their due index", upgraded
        )
        wake_due(now)
    close_breakers_left()
    report = RecoveryReport()
    _recover_lost(now, limit, report)
    report.purged, report.purge_backlog = _purge_expired(now, limit, budget)
    _refresh_summary()
    return report


def _refresh_summary() -> None:
    """Make the destination summary again when the console reads it (more destinations
    than ``LIVE_DESTINATIONS``) and it is older than ``MAX_AGE`` (one process at a time:
    :func:`outbox.destinations.summary.refresh_if_old`). A failure is logged, not raised:
    the console then makes it itself past ``STALE_AFTER``."""
    try:
        if summary.many():
            summary.refresh_if_old()
    except Exception:
        logger.exception("outbox recovery: the destination summary could not be made")


def repair_indexes() -> dict[str, int]:
    """Take out of every index the entries whose message's record disagrees with it (the
    message gone, or of another status or destination), which made counts and lists lie
    (:meth:`~outbox.store.maintenance.Maintenance.repair_indexes`; ``manage.py
    outbox_recover --repair-indexes``). Logs and returns how many, by kind of index."""
    repo = get_repository()
    repaired = repo.repair_indexes(repo.destinations(), outbox_settings.queue_names)
    if repaired:
        logger.warning(
            "outbox: took out %d index entries whose record disagreed: %s",
            sum(repaired.values()),
            dict(repaired),
        )
    return dict(repaired)


def purge_backlog(now: float | None = None) -> int:
    """Finished messages past their retention, not yet deleted (O(log N) per status)."""
    retention = {s: v for s, v in (outbox_settings.RETENTION or {}).items() if s in FINISHED_STATUSES}
    return get_repository().count_past_retention(retention, time.time() if now is None else now)


def _purge_expired(now: float, limit: int, budget: float) -> tuple[int, int]:
    """Delete finished messages past their status's retention (their index score is the
    time they entered the status), ``limit`` per call, until none is left or ``budget``
    seconds are spent. Returns (purged, left past retention)."""
    repo = get_repository()
    purged = 0
    stop_at = time.monotonic() + budget
    for status, seconds in (outbox_settings.RETENTION or {}).items():
        if seconds is None or status not in FINISHED_STATUSES:
            continue
        while True:
            expired = [message_id for message_id, _ in repo.due(status, now - seconds, limit)]
            if not expired:
                break
            purged += sum(repo.delete(expired, (status,)))
            if len(expired) < limit or time.monotonic() > stop_at:
                break
    if purged:
        logger.info("outbox recovery: deleted %d finished message(s) past their retention", purged)
    left = purge_backlog(now) if time.monotonic() > stop_at else 0
    if left:
        logger.warning(
            "outbox recovery: %d finished message(s) past their retention wait for the next sweep", left
        )
    return purged, left


def lost_decision(message: Message, now: float) -> Decision:
    """The outcome of a ``sending`` message whose lease ran out: a ``lost`` attempt, the
    message a suspect (see the module docstring)."""
    alone = message.suspect > 0  # claimed in the quarantine lane: alone in its process
    lost = f"worker lost: no outcome within the visibility timeout of {outbox_settings.VISIBILITY_TIMEOUT}s"
    charge = alone or message.retry_count < message.max_retries
    if alone:
        error = (
            f"{lost}; attempted alone, so it likely ended its worker itself "
            f"({message.suspect + 1} lost attempts in a row)"
        )
    elif charge:
        error = f"{lost}, beside other attempts; quarantined: its next attempt is made alone"
    else:
        error = f"{lost}, beside other attempts; not charged (no retry left): quarantined, attempted alone once more"
    started_at = now if message.last_attempt_at is None else message.last_attempt_at
    outcome = Outcome(message, started_at, 0.0, error=error, error_class="lease_expired")
    rules = rules_for(message)
    return decide(outcome, now, rules, attempt_outcome="lost", suspect=message.suspect + 1, charge=charge)


def _recover_lost(now: float, limit: int, report: RecoveryReport) -> None:
    """Take back messages whose lease ran out (see the module docstring)."""
    repo = get_repository()
    while True:
        expired = [message_id for message_id, _ in repo.due(Status.SENDING.value, now, limit)]
        if not expired:
            return
        decisions, alone = [], []
        for message_id, message in zip(expired, repo.get_many(expired), strict=True):
            if message is None or message.status != Status.SENDING.value:
                _drop_orphan(message_id, now)
                continue
            alone.append(message.suspect > 0)
            decisions.append(lost_decision(message, now))
        results = write(decisions, now)
        applied = sum(results)
        if applied:
            by_alone = [was_alone for was_alone, ok in zip(alone, results, strict=True) if ok]
            report.lost_alone += sum(by_alone)
            report.quarantined += len(by_alone) - sum(by_alone)
            failed = [
                d.message.id
                for d, ok in zip(decisions, results, strict=True)
                if ok and d.status == Status.FAILED.value
            ]
            logger.warning(
                "outbox recovery: took back %d message(s) from lost workers: %d lost beside other attempts "
                "(quarantined: each is attempted alone next), %d lost while attempted alone (each likely "
                "ended its worker itself)%s",
                applied,
                len(by_alone) - sum(by_alone),
                sum(by_alone),
                f"; dead letters: {', '.join(failed)}" if failed else "",
            )
            wakeups.wake({d.message.queue for d in decisions if d.status == Status.RETRYING.value}, now)
        report.lost += applied
        if len(expired) < limit or not applied:
            return


def _drop_orphan(message_id: str, now: float) -> None:
    """An id in the sending index without a sending record (a half-deleted message):
    remove the index entry so it cannot stall the sweep."""
    get_repository().drop_index_entry(Status.SENDING.value, message_id)
    logger.warning("outbox recovery: removed %s from the sending index: it has no sending record", message_id)
