"""The outcome of an attempt, decided and written: success, retry with backoff, a dead
letter, or parked behind a held destination (:func:`decide`), written with its attempt
record, status change and event in one script call, then announced by signals
(:func:`write`), and logged (:func:`log_attempt`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from outbox.conf import outbox_settings
from outbox.delivery.attempts import ERROR_LIMIT, worker_name
from outbox.destinations.config import get_destination
from outbox.endpoint_names import is_endpoint
from outbox.events import send_destination_events, send_exhausted_signal, send_signal
from outbox.exceptions import UnknownDestination
from outbox.records import Attempt, Message, Outcome, Status
from outbox.retry import RetryPolicy, retry_delay
from outbox.store import ChangeResult, get_repository
from outbox.store.background import wakeups
from outbox.store.decisions import Decision, change_of

logger = logging.getLogger("outbox")


HEALTH_ERROR_LIMIT = 300  # characters of an error kept in a destination's error groups


@dataclass(frozen=True)
class Rules:
    """What :func:`decide` needs beyond the outcome, looked up by :func:`rules_for`.

    Attributes:
        default_policy: the retry policy of a message that names none
            (``OUTBOX["RETRY"]``).
        ordering: the destination's ``ORDERING`` policy, ``"block"`` or ``"skip"``.
        worker: this process's name (``host:pid``), written on the attempt record.
    """

    default_policy: RetryPolicy
    ordering: str
    worker: str


def rules_for(message: Message) -> Rules:
    """The configuration :func:`decide` applies to ``message``'s outcome, read now."""
    return Rules(outbox_settings.retry_policy, ordering_policy(message.destination), worker_name())


def decide(
    outcome: Outcome,
    now: float,
    rules: Rules,
    *,
    attempt_outcome: str | None = None,
    suspect: int = 0,
    charge: bool = True,
) -> Decision:
    """Turn an attempt's result (``outcome``, of ``outcome.message``, a ``sending``
    message) into what it makes of the message, decided at ``now`` (epoch seconds) under
    ``rules`` (:func:`rules_for`). Pure: it reads no configuration, encodes nothing for
    Redis (:func:`outbox.store.decisions.change_of` does, when it is written) and changes
    nothing in place (:attr:`~outbox.store.decisions.Decision.message` is a copy).

    Success -> ``succeeded``. A failure -> ``retrying`` with a backoff delay (at least
    ``retry_after``) while ``retry_count < max_retries`` and the error is not permanent,
    and ``retry_count`` goes up by one (it counts retries: attempts after the first);
    otherwise ``failed`` (dead letter), so a dead letter shows at most
    ``max_retries / max_retries``.

    A failure that is not permanent is ``parkable``: if the destination is paused,
    disabled or its circuit breaker not closed when the outcome is written, the message
    goes back to waiting (parked) with its retry count unchanged and an attempt recorded
    with outcome ``"parked"``: a destination's outage does not spend its messages' retries.

    ``attempt_outcome``: the attempt record's outcome when it is not the new status (the
    recovery sweep's ``"lost"``). ``suspect``: the message's ``suspect`` mark after this
    outcome (the recovery sweep's lost attempts, :mod:`outbox.delivery.recovery`); 0, the
    default, clears it: the attempt ended in a live process. ``charge=False``: a
    retryable failure that does not count against the retry budget (``retry_count``
    unchanged; it is retried even when no retries are left): a lost attempt beside others
    when the message has no retry left, so a neighbour's crash alone never makes it a
    dead letter.

    Never raises for a bad record: a retry policy that cannot be used (a record written
    by an older version, or edited by hand) makes the message a dead letter whose error
    says why, instead of stopping the worker or the recovery sweep.
    """
    message, ok = outcome.message, outcome.ok
    next_at, error = _due_again(outcome, now, rules, charge)
    error_class = outcome.error_class or ("" if ok else "error")
    if ok:
        status, retry_count = Status.SUCCEEDED.value, message.retry_count
    elif next_at is None:
        status, retry_count = Status.FAILED.value, message.retry_count
    else:
        status, retry_count = Status.RETRYING.value, message.retry_count + (1 if charge else 0)
    failed = status == Status.FAILED.value
    skip = bool(message.ordering_key) and failed and rules.ordering == "skip"
    spent = not ok and not outcome.permanent and failed and message.retry_count >= message.max_retries
    return Decision(
        claimed=message,
        status=status,
        at=now,
        attempt=Attempt(
            started_at=outcome.started_at,
            duration_ms=outcome.duration_ms,
            outcome=attempt_outcome or status,
            status_code=outcome.status_code,
            error=error,
            worker=rules.worker,
            retry_count=retry_count,
            detail=outcome.detail,
            error_class="" if ok else error_class,
            host=outcome.host,
        ),
        retry_count=retry_count,
        next_attempt_at=next_at,
        error=error,
        error_class="" if ok else error_class,
        status_code=outcome.status_code,
        suspect=suspect,
        parkable=not ok and not outcome.permanent,
        skip=skip,
        exhausted=(bool(message.ordering_key) and failed and not skip) or spent,
    )


def _due_again(outcome: Outcome, now: float, rules: Rules, charge: bool) -> tuple[float | None, str]:
    """When a failed attempt's message is due again (None: it is not retried: a success,
    a permanent error, its retries spent), and the error to record: the outcome's, or,
    when its retry policy cannot be used, that error and why (it is then failed)."""
    message = outcome.message
    if outcome.ok or outcome.permanent or (message.retry_count >= message.max_retries and charge):
        return None, outcome.error
    try:
        policy = RetryPolicy.from_value(message.retry_policy or None, default=rules.default_policy)
        number = message.retry_count + 1 if charge else max(1, message.retry_count)
        return now + retry_delay(policy, number, outcome.retry_after), outcome.error
    except Exception as exc:
        why = f"{outcome.error}; and its retry policy cannot be used ({type(exc).__name__}: {exc}), so it is failed"
        return None, why[:ERROR_LIMIT]


def ordering_policy(destination: str) -> str:
    """``destination``'s ``ORDERING`` policy (``"block"`` or ``"skip"``), or
    ``OUTBOX["ORDERING"]``'s for a destination no longer configured and for every
    endpoint registered at runtime (no database read here)."""
    if is_endpoint(destination):
        return str(outbox_settings.ORDERING)
    try:
        return get_destination(destination).ordering
    except UnknownDestination:
        return str(outbox_settings.ORDERING)


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
            send_signal(d.status, d.message, d.attempt)
            if d.exhausted_event is not None:
                exhausted.append(d.exhausted_event)
                send_exhausted_signal(d.message, d.attempt, d.exhausted_event)
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
    results = get_repository().transition([change_of(d) for d in decisions], now)
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
    status = written or decision.status
    parked = status == "parked"
    logger.log(
        ATTEMPT_LOG_LEVELS.get(status, logging.INFO),
        "outbox attempt id=%s destination=%s outcome=%s status_code=%s duration_ms=%.1f retry_count=%d%s",
        outcome.message.id,
        outcome.message.destination,
        status,
        outcome.status_code,
        outcome.duration_ms,
        decision.retry_count - (1 if parked and decision.status == Status.RETRYING.value else 0),
        f" error={outcome.error!r}" if outcome.error else "",
    )
