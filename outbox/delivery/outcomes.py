"""The outcome of an attempt, decided and written: success, retry with backoff, a dead
letter, or parked behind a held destination (:func:`decide`), written with its attempt
record, status change and event in one script call, then announced by signals
(:func:`write`), and logged (:func:`log_attempt`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from outbox.conf import outbox_settings
from outbox.delivery.attempts import ERROR_LIMIT, worker_name
from outbox.destinations.config import get_destination
from outbox.events import (
    DestinationEvent,
    event_payload,
    send_destination_events,
    send_exhausted_signal,
    send_signal,
)
from outbox.exceptions import UnknownDestination
from outbox.records import Attempt, Message, Outcome, Status
from outbox.retry import RetryPolicy, retry_delay
from outbox.store import Change, ChangeResult, get_repository
from outbox.store.background import wakeups

logger = logging.getLogger("outbox")


HEALTH_ERROR_LIMIT = 300  # characters of an error kept in a destination's error groups


@dataclass
class Decision:
    """An outcome to be written: the status change and the attempt record."""

    change: Change
    attempt: Attempt
    message: Message
    exhausted: DestinationEvent | None = None  # its message.exhausted event, if its retries ran out
    outcome: Outcome | None = None  # the attempt's result, logged once the decision is written
    seq: int = 0  # its number in the worker run that decided it (health counts it once), 0 = none


def decide(
    outcome: Outcome,
    now: float,
    *,
    attempt_outcome: str | None = None,
    suspect: int = 0,
    charge: bool = True,
) -> Decision:
    """Turn an attempt's result (``outcome``, of ``outcome.message``, a ``sending``
    message) into its status change, decided at ``now`` (epoch seconds).

    Success -> ``succeeded``. A failure -> ``retrying`` with a backoff delay (at least
    ``retry_after``) while ``retry_count < max_retries`` and the error is not permanent,
    and ``retry_count`` goes up by one (it counts retries: attempts after the first);
    otherwise ``failed`` (dead letter), so a dead letter shows at most
    ``max_retries / max_retries``.

    A failure that is not permanent also carries a ``park`` alternative
    (:attr:`outbox.store.Change.park`): if the destination is paused, disabled or its
    circuit breaker not closed when the outcome is written, the message goes back to
    waiting (parked) with its retry count unchanged and an attempt recorded with outcome
    ``"parked"``: a destination's outage does not spend its messages' retries.

    ``attempt_outcome``: the attempt record's outcome when it is not the new status (the
    recovery sweep's ``"lost"``). ``suspect``: the message's ``suspect`` mark after this outcome (the recovery sweep's
    lost attempts, :mod:`outbox.delivery.recovery`); 0, the default, clears it: the attempt ended
    in a live process. ``charge=False``: a retryable failure that does not count against
    the retry budget (``retry_count`` unchanged; it is retried even when no retries are
    left): a lost attempt beside others when the message has no retry left, so a
    neighbour's crash alone never makes it a dead letter.

    Never raises for a bad record: a retry policy that cannot be used (a record written
    by an older version, or edited by hand) makes the message a dead letter whose error
    says why, instead of stopping the worker or the recovery sweep.
    """
    message, ok, error, status_code = outcome.message, outcome.ok, outcome.error, outcome.status_code
    permanent, error_class = outcome.permanent, outcome.error_class
    next_at: float | None = None
    try:
        retrying = not ok and not permanent and (message.retry_count < message.max_retries or not charge)
        if retrying:
            policy = RetryPolicy.from_value(
                message.retry_policy or None, default=outbox_settings.retry_policy
            )
            number = message.retry_count + 1 if charge else max(1, message.retry_count)
            next_at = now + retry_delay(policy, number, outcome.retry_after)
    except Exception as exc:
        error = (
            f"{error}; and its retry policy cannot be used ({type(exc).__name__}: {exc}), so it is failed"[
                :ERROR_LIMIT
            ]
        )
        retrying, ok = False, False
    if not ok and not error_class:
        error_class = "error"
    base_set = {"last_status_code": str(status_code)} if status_code is not None else {}
    unset = [] if status_code is not None else ["last_status_code"]
    if not ok:
        base_set["last_error_class"] = error_class
    if suspect:
        base_set["suspect"] = str(suspect)
    elif message.suspect:
        unset.append("suspect")
    if ok:
        status, retry_count = Status.SUCCEEDED.value, message.retry_count
        fields = {**base_set}
        unset += ["next_attempt_at", "lease", "last_error", "last_error_class"]
        score = now
    elif not retrying or next_at is None:
        status, retry_count = Status.FAILED.value, message.retry_count
        fields = {**base_set, "last_error": error}
        unset += ["next_attempt_at", "lease"]
        score = now
    else:
        status, retry_count = Status.RETRYING.value, message.retry_count + (1 if charge else 0)
        fields = {
            **base_set,
            "last_error": error,
            "retry_count": str(retry_count),
            "next_attempt_at": repr(next_at),
        }
        unset += ["lease"]
        score = next_at
    record = Attempt(
        started_at=outcome.started_at,
        duration_ms=outcome.duration_ms,
        outcome=attempt_outcome or status,
        status_code=status_code,
        error=error,
        worker=worker_name(),
        retry_count=retry_count,
        detail=outcome.detail,
        error_class="" if ok else error_class,
        host=outcome.host,
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
        inline=record.inline_fields(),
        event=event_payload(
            status,
            message,
            at=now,
            retry_count=retry_count,
            status_code=status_code,
            error=error,
            next_attempt_at=next_at,
        ),
        stat=status,
        destination=message.destination,
        queue=message.queue,
        ordering_key=message.ordering_key or "",
    )
    exhausted = None
    blocks = False
    if message.ordering_key and status == Status.FAILED.value:
        change.skip = ordering_policy(message.destination) == "skip"
        blocks = not change.skip
    if blocks or (
        not ok
        and not permanent
        and status == Status.FAILED.value
        and message.retry_count >= message.max_retries
    ):
        data: dict[str, Any] = {
            "id": message.id,
            "retry_count": retry_count,
            "status_code": status_code,
            "error": error,
        }
        if message.ordering_key:
            # a dead letter of an ordering key: with the policy "block" its key waits
            data.update(ordering_key=message.ordering_key, blocked=blocks)
        exhausted = DestinationEvent("message.exhausted", message.destination, now, data)
    park = None
    if not ok and not permanent:
        park = _park_change(message, now, record, fields, unset, error)
    change.park = park
    if exhausted is not None:
        change.also = exhausted.to_json()
    message.status, message.retry_count, message.next_attempt_at = (
        status,
        retry_count,
        next_at if status == Status.RETRYING.value else None,
    )
    message.last_error = error if not ok else ""
    message.last_error_class = error_class if not ok else ""
    message.last_status_code = status_code
    message.suspect = suspect
    return Decision(change, record, message, exhausted)


def ordering_policy(destination: str) -> str:
    """``destination``'s ``ORDERING`` policy (``"block"`` or ``"skip"``), or
    ``OUTBOX["ORDERING"]``'s for a destination no longer configured."""
    try:
        return get_destination(destination).ordering
    except UnknownDestination:
        return str(outbox_settings.ORDERING)


def _park_change(
    message: Message, now: float, record: Attempt, fields: dict[str, str], unset: list[str], error: str
) -> dict[str, Any]:
    """The ``park`` alternative of a failed attempt's change (see :func:`decide`)."""
    to = Status.RETRYING.value if message.retry_count > 0 else Status.PENDING.value
    set_fields = {k: v for k, v in fields.items() if k not in ("retry_count", "next_attempt_at")}
    set_fields["next_attempt_at"] = repr(now)
    parked = dataclasses.replace(record, outcome="parked", retry_count=message.retry_count)
    return {
        "to": to,
        "score": repr(now),
        "set": set_fields,
        "unset": [f for f in unset if f != "next_attempt_at"] or ["lease"],
        "attempt": parked.to_json(),
        "event": event_payload(
            to, message, at=now, retry_count=message.retry_count, error=error, event="message.parked"
        ),
    }


def decide_outcome(outcome: Outcome, now: float) -> Decision:
    """:func:`decide` for an :class:`~outbox.records.Outcome` of
    :func:`outbox.delivery.attempts.attempt`."""
    return decide(outcome, now)


def announce(decisions: Sequence[Decision], results: Sequence[ChangeResult], *, own: bool = False) -> None:
    """Send the Django signal of each written decision whose compare-and-set applied, by
    this call or by an earlier call of the same change whose result was never announced
    (:attr:`~outbox.store.ChangeResult.earlier`: a retried exchange; a parked one, whose
    status is not the decided one, sends none), hand ``message.exhausted`` events to
    :func:`outbox.alerts.notify`, and wake the queues of ordered messages that became
    their key's head (:func:`wake_promoted`; ``own``: the messages' own queues too, when
    no claim of theirs follows, as one does in a worker's exchange)."""
    exhausted = []
    for d, r in zip(decisions, results, strict=True):
        if (r.applied or r.earlier) and not r.parked:
            send_signal(d.change.to, d.message, d.attempt)
            if d.exhausted is not None:
                exhausted.append(d.exhausted)
                send_exhausted_signal(d.message, d.attempt, d.exhausted)
    send_destination_events(exhausted)
    wake_promoted(decisions, results, own=own)


def wake_promoted(
    decisions: Sequence[Decision], results: Sequence[ChangeResult], *, own: bool = False
) -> None:
    """Wake the queue of each ordered message that a written outcome made its key's head
    (:attr:`~outbox.store.ChangeResult.promoted`) when it is another queue (priority) than
    the decided message's (``own``: whichever queue): the worker of that queue claims next
    in the same round trip (lua/transition.lua then lua/claim.lua), the others would wait
    for the wake-up check (``WAKE_INTERVAL``). One round trip, only when there is such a
    queue. Redis errors (of the server or the cluster client) are logged, not raised (the outcomes are written; the wake-up check
    finds the message)."""
    queues = [
        r.promoted
        for d, r in zip(decisions, results, strict=True)
        if r.promoted and (own or r.promoted != d.message.queue)
    ]
    if not queues:
        return
    try:
        wakeups.wake(queues)
    except (RedisError, RedisClusterException):
        logger.warning(
            "outbox: could not wake queue(s) %s for the next message of an ordering key; "
            "the wake-up check will find it",
            ", ".join(dict.fromkeys(queues)),
            exc_info=True,
        )


def health_outcome(outcome: Outcome) -> list[Any]:
    """An attempt as ``lua/health.lua`` records it (see
    :meth:`outbox.store.MessageRepository.health_args`)."""
    kind = "s" if outcome.ok else ("p" if outcome.permanent else "r")
    return [
        outcome.message.destination,
        kind,
        round(outcome.duration_ms, 3),
        outcome.status_code or 0,
        "" if outcome.ok else (outcome.error_class or "error"),
        outcome.error[:HEALTH_ERROR_LIMIT],
        outcome.retry_after or 0,
        outcome.message.id,
        outcome.started_at,
        outcome.message.lease or "",
    ]


def write(decisions: Sequence[Decision], now: float) -> list[bool]:
    """Write decisions (one script call) and send their signals.

    Returns:
        Per decision, True if its compare-and-set applied.
    """
    if not decisions:
        return []
    results = get_repository().transition([d.change for d in decisions], now)
    announce(decisions, results, own=True)
    return [r.applied for r in results]


#: Log level of an attempt's line by the status it led to: a dead letter needs a person.
ATTEMPT_LOG_LEVELS = {
    Status.SUCCEEDED.value: logging.INFO,
    Status.RETRYING.value: logging.WARNING,
    Status.FAILED.value: logging.ERROR,
    "parked": logging.WARNING,
}


def log_attempt(outcome: Outcome, decision: Decision, written: str | None = None) -> None:
    """One log line per attempt on the ``outbox`` logger: INFO when delivered, WARNING
    when a retry follows or the message was parked (its destination held, no retry
    charged), ERROR for a dead letter. ``written`` is what the write did (``"parked"``,
    ``"stale"``...), the decided status by default."""
    status = written or decision.change.to
    parked = status == "parked"
    logger.log(
        ATTEMPT_LOG_LEVELS.get(status, logging.INFO),
        "outbox attempt id=%s destination=%s outcome=%s status_code=%s duration_ms=%.1f retry_count=%d%s",
        outcome.message.id,
        outcome.message.destination,
        status,
        outcome.status_code,
        outcome.duration_ms,
        decision.message.retry_count - (1 if parked and decision.change.to == Status.RETRYING.value else 0),
        f" error={outcome.error!r}" if outcome.error else "",
    )
