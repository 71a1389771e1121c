"""How messages enter Redis: one write step shared by ``send()`` outside a transaction,
the on-commit fast path and the relay of captured messages (:mod:`outbox.sending.capture`).

:func:`store` writes the records and indexes in one script call (idempotent on the
message id, so a fast path and a relay racing never make two messages) and then
enqueues a wake-up job for each queue that had none waiting (see :mod:`outbox.store.background.wakeups`).
With ``OUTBOX["DURABILITY"]``, the write waits for replicas or AOF fsyncs on its own
connection, and :func:`store` raises :class:`~outbox.exceptions.NotDurable` when they
did not acknowledge it in time (see :mod:`outbox.store.client.durability`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import partial

from django.utils.module_loading import import_string

from outbox.conf import outbox_settings
from outbox.exceptions import IdempotencyConflict
from outbox.records import Message, new_message_id, partition_of
from outbox.store import Created, CreateResult, MessageRepository, get_repository
from outbox.store.background import wakeups
from outbox.store.client import durability
from outbox.store.client.outages import PARTITION_UNAVAILABLE, may_have_run, unknown_first
from outbox.store.creating import create_steps
from outbox.store.steps import Blocking, Elsewhere, Steps, drive


def store(messages: Sequence[Message], now: float | None = None, *, repeat: bool = True) -> list[Created]:
    """Write ``messages`` to Redis and wake their queues.

    Args:
        messages: the messages (status ``pending``).
        now: epoch seconds (default: the current time).
        repeat: the messages may have been written before (a push of captured
            messages); False for ids fresh from ``send()``, which skips that check.

    Returns:
        One :class:`~outbox.store.Created` per message, in order.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached or refused the write
            (nothing was written: the write is one atomic script call), or the reply
            did not come back (:func:`~outbox.store.client.outages.may_have_run`: then the
            write may have run).
        NotDurable: ``OUTBOX["DURABILITY"]`` asks for a wait and fewer replicas (or AOF
            fsyncs) than asked acknowledged the write within its ``TIMEOUT``, or the wait
            failed. The messages are written and their queues woken (raised after the
            wake-ups: a queue's wake-up flag is set by the write, so a wake-up left out
            would delay its messages until the flag expires); ``exc.created`` is what
            this function would have returned.
        django.core.exceptions.ImproperlyConfigured: ``OUTBOX["DURABILITY"]`` is invalid
            (nothing was written).

    With more than one partition (on a cluster), a message's partition may be unable to
    take a write now while others can: its :class:`~outbox.store.Created` code is then
    ``"unstored"`` (the others are written), or ``"unknown"`` when its partition's write
    was sent and its reply lost (it may be stored). A fresh message without a key
    (``repeat=False``, no idempotency key) whose partition refused goes to another
    partition instead, on another primary, up to :data:`REPICKS` times: its id changes
    (``Created.id`` is the new one); one whose write may have run never moves.
    """
    return drive(get_repository(), store_steps(messages, now, repeat=repeat))


def store_steps(
    messages: Sequence[Message], now: float | None = None, *, repeat: bool = True
) -> Steps[list[Created]]:
    """The steps of :func:`store` (which states what they do, return and raise), I/O-free
    (:mod:`outbox.store.steps`): :func:`store` drives them on the synchronous client,
    ``outbox.asend()`` on ``redis.asyncio`` (:func:`outbox.store.asteps.adrive`).
    The wake-up jobs (RQ), the eager delivery and the ``DURABILITY`` confirmation are
    :class:`~outbox.store.steps.Blocking` steps: an event loop runs them in a thread."""
    if not messages:
        return []
    wait = durability.configured()
    repository = get_repository()
    result = yield from _create_steps(repository, messages, time.time() if now is None else now, repeat, wait)
    # partial, not lambdas: a lambda's names are cells made at every call of this
    # generator (objects for the collector), whichever branch runs
    if outbox_settings.EAGER:
        # the worker's code, with the ORM and signals: Django's one thread for sync code
        yield Blocking(partial(deliver_now, {m.queue for m in messages}), thread_sensitive=True)
    elif result.woken:
        yield Blocking(partial(wakeups.enqueue_wakeups, result.woken))
    if wait.waits:
        yield Blocking(partial(durability.confirm, repository, wait, result.created, result.acknowledged))
    return result.created


#: How many other partitions a fresh message without a key tries, on a cluster, when its
#: partition cannot be written (see :func:`store`).
REPICKS = 2


def _create_steps(
    repository: MessageRepository,
    messages: Sequence[Message],
    now: float,
    repeat: bool,
    wait: durability.Durability,
) -> Steps[CreateResult]:
    """``repository.create``'s steps (see :func:`store`), and on a cluster the fresh
    messages without a key that their partition could not take written to other
    partitions.

    Raises:
        redis.exceptions.RedisError: as ``create``, when nothing could be written.
    """
    cluster = repository.cluster  # one check per connection, not per call
    movable = not repeat and cluster
    try:
        result = yield from create_steps(
            repository, messages, now, wakeups.DUE_SLACK, repeat, wait, cluster=cluster
        )
    except PARTITION_UNAVAILABLE as exc:
        # a write that may have run is never moved: that would store the message twice
        if not movable or may_have_run(exc) or all(m.idempotency_key or m.ordering_key for m in messages):
            raise
        result = _unstored(messages, exc)
    if not result.errors:  # every partition written (always so on one server)
        return result
    # the rest in its own generator: the names its comprehensions read would be cells
    # made at every call of this one (objects for the collector, per send)
    return (yield from _fall_over_steps(repository, messages, now, repeat, wait, result, movable))


def _unstored(messages: Sequence[Message], exc: Exception) -> CreateResult:
    """The result of a create that no partition took (``exc``)."""
    unstored = [Created(m.id, m.id, "unstored") for m in messages]
    return CreateResult(unstored, [], errors={partition_of(m.id): exc for m in messages})


def _fall_over_steps(
    repository: MessageRepository,
    messages: Sequence[Message],
    now: float,
    repeat: bool,
    wait: durability.Durability,
    result: CreateResult,
    movable: bool,
) -> Steps[CreateResult]:
    """After a create that left partitions unwritten (``result.errors``): the fresh
    messages without a key moved to other partitions (``movable``, up to
    :data:`REPICKS` times), then each message still unstored whose write may have run
    marked unknown (see :func:`store`)."""

    def create(batch: Sequence[Message]) -> Steps[CreateResult]:
        return create_steps(
            repository, batch, now, wakeups.DUE_SLACK, repeat, wait, cluster=repository.cluster
        )

    for _ in range(REPICKS if movable else 0):
        stuck = [
            i
            for i, c in enumerate(result.created)
            if c.code == "unstored"
            and not (messages[i].idempotency_key or messages[i].ordering_key)
            and not may_have_run(result.errors[partition_of(c.id)])
        ]
        elsewhere = (yield Elsewhere(frozenset(result.errors))) if stuck else None
        if elsewhere is None:
            break
        moved = [replace(messages[i], id=new_message_id(now, elsewhere)) for i in stuck]
        try:
            again = yield from create(moved)
        except PARTITION_UNAVAILABLE as exc:
            result.errors[elsewhere] = exc
            continue
        for i, c in zip(stuck, again.created, strict=True):
            result.created[i] = c
        result.woken += [q for q in again.woken if q not in result.woken]
        result.errors.update(again.errors)
        if again.acknowledged is not None:
            earlier = result.acknowledged
            result.acknowledged = (
                again.acknowledged if earlier is None else durability.combined([earlier, again.acknowledged])
            )
    # an unstored message whose partition's write may have run (a timeout) is unknown
    result.created = [
        replace(c, code="unknown")
        if c.code == "unstored" and may_have_run(result.errors[partition_of(c.id)])
        else c
        for c in result.created
    ]
    if all(c.code in ("unstored", "unknown") for c in result.created):
        # nothing is known to be written: the error that may have run first, if any
        raise unknown_first(result.errors.values())[0]
    return result


#: What ``OUTBOX["EAGER"]`` runs in this process instead of waking a worker, by dotted
#: path, as RQ finds ``outbox.jobs.deliver``: the sending side never imports the worker side.
EAGER_RUN = "outbox.delivery.run"


def deliver_now(queues: Iterable[str]) -> None:
    """``OUTBOX["EAGER"]``: deliver what is due on ``queues`` in this process, at once,
    with the worker's own code (:data:`EAGER_RUN`, :func:`outbox.delivery.run`), instead
    of waking a worker. A failed attempt is recorded and its retry left waiting (nothing
    sleeps)."""
    run = import_string(EAGER_RUN)
    for queue in sorted(queues):
        run(queue)


def conflict_error(message: Message, existing_id: str, index: int | None = None) -> IdempotencyConflict:
    """The :class:`IdempotencyConflict` for a message whose key names message ``existing_id``."""
    where = f"send_many item {index}: " if index is not None else ""
    return IdempotencyConflict(
        f"{where}idempotency_key {message.idempotency_key!r} was already used for destination "
        f"{message.destination!r} with a different body (message {existing_id})",
        existing_id=existing_id,
    )
