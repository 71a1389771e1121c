"""Deliver in the test's own process: :func:`deliver_all`."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from outbox.conf import outbox_settings
from outbox.delivery.loop import run
from outbox.records import Status
from outbox.store import Change, get_repository
from outbox.store.reads.inspection import waiting_ids


@dataclass
class Delivered:
    """What :func:`deliver_all` did.

    Attributes:
        outcomes: status written per attempt -> count (``succeeded``, ``retrying``,
            ``failed``; ``stale`` when a lease was lost before its outcome was written).
        attempts: attempts made.
        rounds: delivery rounds run (one per pass over the queues).
    """

    outcomes: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    rounds: int = 0

    @property
    def succeeded(self) -> int:
        return self.outcomes[Status.SUCCEEDED.value]

    @property
    def failed(self) -> int:
        return self.outcomes[Status.FAILED.value]

    @property
    def retrying(self) -> int:
        return self.outcomes[Status.RETRYING.value]


def deliver_all(
    queues: Iterable[str] | None = None,
    *,
    include_future: bool = False,
    max_rounds: int = 100,
) -> Delivered:
    """Deliver every due message of ``queues`` in this process, as a worker would (the
    same claim, attempt and outcome code: :func:`outbox.delivery.run`), until nothing is due.

    No RQ worker, no forking: for tests and scripts. Messages of a paused, disabled or
    open (circuit breaker) destination wait, as they would for a worker. Messages sent
    inside a transaction that has not committed (a test wrapped in one by pytest-django or
    ``TestCase``: its on-commit callbacks never run) are pushed from the capture table
    first, as the relay of a worker would push them.

    Args:
        queues: django-rq queue names (default: every outbox queue, high first).
        include_future: also deliver what is due later (delayed messages, retries
            waiting for their backoff) by making it due now, round after round, so a
            message that keeps failing ends as a dead letter after its retries.
        max_rounds: most passes over the queues (a guard against a loop that never ends
            when ``include_future`` meets a receiver that always fails and huge budgets).

    Returns:
        A :class:`Delivered` report.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """

    names = list(queues) if queues is not None else outbox_settings.queue_names
    report = Delivered()
    _push_captured()
    for _ in range(max_rounds):
        if include_future:
            _bring_forward(names)
        report.rounds += 1
        attempted = 0
        for name in names:
            result = run(name)
            attempted += len(result.claimed)
            report.outcomes.update(result.outcomes.values())
        report.attempts += attempted
        if not attempted:
            break
    return report


async def adeliver_all(
    queues: Iterable[str] | None = None,
    *,
    include_future: bool = False,
    max_rounds: int = 100,
) -> Delivered:
    """:func:`deliver_all` for async tests: ``report = await adeliver_all()``. It runs in
    Django's thread for synchronous code (``sync_to_async``): the delivery uses the ORM
    (the capture table, endpoints) and sends the outcome signals, never on the loop."""
    deliver = sync_to_async(deliver_all, thread_sensitive=True)
    return await deliver(queues, include_future=include_future, max_rounds=max_rounds)


def _push_captured() -> int:
    """Push messages captured in the database (sent inside a transaction that has not
    committed: a test wrapped in one) to Redis, as the relay would; 0 without database access."""
    from outbox.sending.capture import (  # capture imports Django models: `import outbox.testing` must not
        relay,
        relay_databases,
    )

    pushed = 0
    for alias in relay_databases():
        try:
            pushed += relay(alias, older_than=0, log=False)
        except Exception:  # no access to this database in this test, or no table: nothing captured
            continue
    return pushed


def _bring_forward(queues: Iterable[str]) -> int:
    """Make every message waiting in the due (and quarantine) indexes of ``queues`` due now (a
    compare-and-set per message: pending/retrying stay what they are). Returns how many."""
    repo = get_repository()
    now = time.time()
    changes = []
    for queue in queues:
        ids = waiting_ids(repo, queue, now)
        if not ids:
            continue
        for message_id, status in zip(ids, repo.resend_field(ids, "status"), strict=True):
            if status in (Status.PENDING.value, Status.RETRYING.value):
                changes.append(
                    Change(
                        id=message_id,
                        from_statuses=(status,),
                        to=status,
                        score=now,
                        set={"next_attempt_at": repr(now)},
                    )
                )
    if not changes:
        return 0
    return sum(r.applied for r in repo.transition(changes, now))
