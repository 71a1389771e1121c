"""Transactional capture: a message sent inside ``transaction.atomic`` is as durable as
the caller's own rows.

Inside a transaction, ``send()`` writes each message as a :class:`~outbox.models.CapturedMessage`
row in the same database transaction. Then:

* **fast path**: on commit, the messages are written to Redis in one round trip
  (:func:`outbox.sending.intake.store`) and their rows deleted. A rollback sends nothing.
* **relay**: every ``outbox_worker`` runs :func:`relay` each ``RELAY_INTERVAL``; it
  pushes rows older than ``RELAY_AFTER`` seconds that the fast path missed (Redis was
  down at commit, or the process died between commit and push), with
  ``SELECT ... FOR UPDATE SKIP LOCKED`` where the database has it (PostgreSQL, MySQL
  8, Oracle), so several workers share the rows without waiting on each other.

Pushing is idempotent on the message id, so the fast path and the relay racing never
make two messages. Redis stays the store of every record; the table holds only what
Redis has not acknowledged yet. With ``OUTBOX["DURABILITY"]``, that includes a push
that Redis wrote but did not acknowledge as durable in time
(:class:`~outbox.exceptions.NotDurable`): its rows stay, and the relay pushes them again
(writing nothing when the message is there, and waiting for the earlier write) until a
push is acknowledged, so a failover that lost the write gets it again from the table.

Idempotency keys inside transactions: a unique constraint on (destination, key) makes
a concurrent transaction using the same key wait for the first one; after it commits,
the second finds the first message (its row, or the key in Redis once pushed) and
returns it, so the id ``send()`` returns is the id of the message that exists after
commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from django.db import DatabaseError, IntegrityError, connections, router, transaction

from outbox.conf import outbox_settings
from outbox.exceptions import NotDurable, OutboxUnavailable
from outbox.models import CapturedMessage
from outbox.records import Message
from outbox.sending import intake
from outbox.store.connection import get_repository

logger = logging.getLogger("outbox")

RELAY_BATCH = 500  # rows per relay transaction


def capture(messages: Sequence[Message], using: str) -> list[Message]:
    """Capture ``messages`` in the current transaction on database ``using`` and push
    them to Redis when it commits.

    Returns:
        Per message, the message that stands: itself, or the message already sent (or
        captured) under its idempotency key with the same body.

    Raises:
        IdempotencyConflict: a key was already used for the destination with another body.
        OutboxUnavailable: a key's earlier message could only be looked up in Redis,
            which is unreachable.
    """
    standing: list[Message] = []
    rows = []
    for index, message in enumerate(messages):
        if message.idempotency_key:
            found = _capture_keyed(message, using, index if len(messages) > 1 else None)
            standing.append(found)
        else:
            rows.append(_row(message))
            standing.append(message)
    if rows:
        CapturedMessage.objects.using(using).bulk_create(rows)
    fresh = [m for m, s in zip(messages, standing, strict=True) if s is m]
    if fresh:
        transaction.on_commit(lambda: push(fresh, using), using=using)
    return standing


def _row(message: Message) -> CapturedMessage:
    return CapturedMessage(
        id=message.id,
        destination=message.destination,
        idempotency_key=message.idempotency_key,
        fingerprint=message.fingerprint(),
        body=message.body,
        record=message.to_record(),
        created_at=time.time(),
    )


def _capture_keyed(message: Message, using: str, index: int | None) -> Message:
    """Capture one keyed message, or return the message its key already names."""
    try:
        with transaction.atomic(using=using):  # a savepoint: a duplicate key rolls back only this row
            _row(message).save(using=using, force_insert=True)
        inserted = True
    except IntegrityError:
        inserted = False
        row = (
            CapturedMessage.objects.using(using)
            .filter(destination=message.destination, idempotency_key=message.idempotency_key)
            .first()
        )
        if row is not None:
            return _same_or_conflict(
                message, Message.from_record(row.record, row.body), row.fingerprint, index
            )
    # The key may name a message already in Redis (its row was pushed and deleted).
    try:
        held = get_repository().ids_for_idempotency_keys(
            [(message.destination, message.idempotency_key or "")]
        )[0]
        existing = get_repository().get_many([held])[0] if held and held != message.id else None
    except Exception as exc:
        if inserted:  # the unique row guards this transaction; Redis checks again at push
            logger.warning("outbox: could not look up idempotency key in Redis (%s); captured anyway", exc)
            return message
        raise OutboxUnavailable(
            f"cannot look up the message of idempotency key {message.idempotency_key!r}: {exc}"
        ) from exc
    if existing is None:
        if not inserted:  # the key's row vanished and Redis has nothing: capture now
            return _capture_keyed(message, using, index)
        return message
    if inserted:
        CapturedMessage.objects.using(using).filter(id=message.id).delete()
    return _same_or_conflict(message, existing, existing.fingerprint(), index)


def _same_or_conflict(message: Message, existing: Message, fingerprint: str, index: int | None) -> Message:
    if fingerprint != message.fingerprint():
        raise intake.conflict(message, existing.id, index)
    return existing


def push(messages: Sequence[Message], using: str) -> None:
    """The on-commit fast path: write captured messages to Redis, then delete their rows.

    Never raises: if Redis cannot be reached the rows stay for the relay (logged); so
    they do when Redis wrote the messages but did not acknowledge them as
    ``OUTBOX["DURABILITY"]`` asks (:class:`~outbox.exceptions.NotDurable`, logged): the
    row is the durable copy until a push is acknowledged.
    """
    try:
        created = intake.store(messages)
    except NotDurable as exc:
        _report_refused(messages, exc.created)
        logger.warning(
            "outbox: %d message(s) committed and written to Redis, but not acknowledged as "
            "OUTBOX['DURABILITY'] asks (%s); their captured rows stay until the relay of an "
            "outbox_worker pushes them with an acknowledgement",
            len(messages),
            exc,
        )
        return
    except Exception as exc:
        logger.warning(
            "outbox: %d message(s) committed but not yet in Redis (%s: %s); the relay of an "
            "outbox_worker will push them",
            len(messages),
            type(exc).__name__,
            exc,
        )
        return
    _report_refused(messages, created)
    try:
        CapturedMessage.objects.using(using).filter(id__in=[m.id for m in messages]).delete()
    except DatabaseError as exc:  # harmless: the relay pushes them again (idempotent) and deletes
        logger.warning("outbox: could not delete %d captured row(s): %s", len(messages), exc)


def _report_refused(messages: Sequence[Message], created: Sequence[object]) -> None:
    for message, c in zip(messages, created, strict=True):
        code = getattr(c, "code", "")
        if code in ("conflict", "refused"):
            logger.error(
                "outbox: captured message %s was not stored: idempotency key %r was taken meanwhile by "
                "message %s with another body",
                message.id,
                message.idempotency_key,
                getattr(c, "standing_id", ""),
            )


def captured(message_id: str) -> Message | None:
    """A message still held in the capture table of any database, or None."""
    for alias in relay_databases():
        try:
            row = CapturedMessage.objects.using(alias).filter(id=message_id).first()
        except Exception:  # no table, no database access: nothing captured there
            continue
        if row is not None:
            return Message.from_record(row.record, row.body)
    return None


def relay_databases() -> list[str]:
    """Database aliases that may hold captured messages (those the outbox migrates to)."""
    return [alias for alias in connections if router.allow_migrate_model(alias, CapturedMessage)]


def relay(
    using: str | None = None, *, older_than: float | None = None, limit: int = RELAY_BATCH, log: bool = True
) -> int:
    """Push captured messages the fast path missed; one transaction per batch.

    Args:
        using: one database alias, or None for every alias of :func:`relay_databases`.
        older_than: seconds a row must have waited (default ``RELAY_AFTER``).
        limit: rows per batch.
        log: log a warning when messages were pushed (they missed the fast path);
            :func:`outbox.testing.deliver_all` pushes on purpose and says nothing.

    Returns:
        How many messages were pushed.

    Raises:
        redis.exceptions.RedisError: Redis is unreachable (the rows stay).
        NotDurable: Redis wrote a batch but did not acknowledge it as
            ``OUTBOX["DURABILITY"]`` asks (its rows stay, for the next pass).
        django.db.DatabaseError: the database is (the rows stay).
    """

    wait = outbox_settings.RELAY_AFTER if older_than is None else older_than
    pushed = 0
    failure: Exception | None = None
    for alias in [using] if using else relay_databases():
        try:  # one database failing does not keep the others' messages back
            while True:
                n = _relay_batch(alias, time.time() - wait, limit)
                pushed += n
                if n < limit:
                    break
        except Exception as exc:
            failure = failure or exc
    if pushed and log:
        logger.warning(
            "outbox relay: pushed %d captured message(s) that missed the on-commit fast path", pushed
        )
    if failure is not None:
        raise failure
    return pushed


def _relay_batch(alias: str, cutoff: float, limit: int) -> int:
    with transaction.atomic(using=alias):
        rows = CapturedMessage.objects.using(alias).filter(created_at__lte=cutoff).order_by("created_at")
        if connections[alias].features.has_select_for_update_skip_locked:
            rows = rows.select_for_update(skip_locked=True)
        batch = list(rows[:limit])
        if not batch:
            return 0
        messages = [Message.from_record(r.record, r.body) for r in batch]
        _report_refused(messages, intake.store(messages))
        CapturedMessage.objects.using(alias).filter(id__in=[r.id for r in batch]).delete()
    return len(batch)
