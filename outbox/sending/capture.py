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
  8, Oracle), so several workers share the rows without waiting on each other; then
  it deletes the sequence rows of ordering keys with nothing captured left
  (:func:`outbox.sending.sequences.prune`).

A row is deleted only once Redis has its message (or refuses it for good: an
idempotency conflict, logged); the rows of a partition that could not be written
(on a cluster), and those a conflicting message of the same script call held back,
stay for the next push.

Deployments: every row carries the identity of the deployment that captured it (its
Redis and key prefix, or ``OUTBOX["DEPLOYMENT"]``: :mod:`outbox.sending.deployment`).
The relay, and a push reading a key's earlier rows, take only rows of their own
deployment and legacy rows (``""``, written before rows carried one), so two
deployments sharing a database never push each other's messages into the wrong Redis;
idempotency keys are unique per deployment. Rows of an identity no relay has any more
(Redis moved, a renamed deployment) are logged by the relay and adopted with
``outbox_recover --adopt-captured`` (:mod:`outbox.sending.stranded`).

Pushing is idempotent on the message id, so the fast path and the relay racing never
make two messages. Redis stays the store of every record; the table holds only what
Redis has not acknowledged yet. With ``OUTBOX["DURABILITY"]``, that includes a push
that Redis wrote but did not acknowledge as durable in time
(:class:`~outbox.exceptions.NotDurable`): its rows stay, and the relay pushes them again
(writing nothing when the message is there, and waiting for the earlier write) until a
push is acknowledged, so a failover that lost the write gets it again from the table.

Ordering keys inside transactions: each ordered message gets its place in its key from
the key's sequence row, incremented in the sending transaction and locked until it ends
(:mod:`outbox.sending.sequences`: commit order, no gaps), and every push writes the key's
earlier captured rows first (:mod:`outbox.sending.push_order`), so a key's messages
reach Redis, and are delivered, in commit order. A push writes a key's rows in one
script call (one partition), so if Redis cannot take the earlier ones it takes none of
the later ones either; they all stay captured.

Idempotency keys inside transactions: a unique constraint on (destination, key) makes
a concurrent transaction using the same key wait for the first one; after it commits,
the second finds the first message (its row, or the key in Redis once pushed) and
returns it, so the id ``send()`` returns is the id of the message that exists after
commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from django.db import DatabaseError, IntegrityError, connections, router, transaction

from outbox.conf import outbox_settings
from outbox.exceptions import NotDurable, OutboxUnavailable
from outbox.models import CapturedMessage
from outbox.records import Message
from outbox.sending import deployment, intake, push_order, sequences, stranded
from outbox.store import Created, get_repository

logger = logging.getLogger("outbox")

RELAY_BATCH = 500  # rows per relay transaction


def capture(messages: Sequence[Message], using: str) -> list[Message]:
    """Capture ``messages`` in the current transaction on database ``using`` and push
    them to Redis when it commits.

    An ordered message (with an ordering key) is numbered in its key
    (:func:`sequences.take`): the key's sequence row stays locked until the transaction
    ends, so another transaction sending to the same key waits in its ``send()`` until
    this one commits or rolls back. A message that an idempotency key answers with an
    earlier message takes no number.

    Returns:
        Per message, the message that stands: itself, or the message already sent (or
        captured) under its idempotency key with the same body.

    Raises:
        IdempotencyConflict: a key was already used for the destination with another body
            (in this deployment).
        ImproperlyConfigured: ``OUTBOX["DEPLOYMENT"]`` or the Redis settings are invalid
            (:func:`deployment.current`).
        OutboxUnavailable: a key's earlier message could only be looked up in Redis,
            which is unreachable.
        django.db.DatabaseError: from the database; with ordering keys also a deadlock
            the database detected (two transactions each holding a key the other sends
            to next) or a lock timeout the project set.
    """
    standing: list[Message] = []
    rows = []
    own = deployment.current()
    for index, message in enumerate(messages):
        if message.idempotency_key:
            found = _capture_keyed(message, using, index if len(messages) > 1 else None, own)
            standing.append(found)
        else:
            rows.append(_row(message, own))
            standing.append(message)
    fresh = [m for m, s in zip(messages, standing, strict=True) if s is m]
    numbers = _number(fresh, using)
    for row in rows:
        row.order_seq = numbers.get(row.id)
    if rows:
        _insert(using, rows)
    for m in fresh:
        if m.idempotency_key and m.id in numbers:  # its row is in already (see _capture_keyed)
            CapturedMessage.objects.using(using).filter(id=m.id).update(order_seq=numbers[m.id])
    if fresh:
        transaction.on_commit(lambda: push(fresh, using, numbers), using=using)
    return standing


def _number(fresh: Sequence[Message], using: str) -> dict[str, int]:
    """Message id -> its place in its ordering key (commit order), for the ordered
    messages of ``fresh``, taken in the current transaction (:func:`sequences.take`)."""
    ordered = [m for m in fresh if m.ordering_key]
    if not ordered:
        return {}
    taken = sequences.take(using, [(m.destination, m.ordering_key or "") for m in ordered])
    return {m.id: n for m, n in zip(ordered, taken, strict=True)}


def _insert(using: str, rows: Sequence[CapturedMessage]) -> None:
    """Insert ``rows`` (every field set) in the current transaction on ``using``: one
    ``INSERT`` per batch the database takes (``bulk_batch_size``), each value prepared by
    its model field as the ORM prepares it. What ``bulk_create`` does for this model
    (no signals, no database defaults asked for), without its per-call work: about
    100 µs of the 500 of ``send()`` inside ``transaction.atomic`` (issue 30, item 10).

    Raises:
        django.db.DatabaseError: from the database (an ``IntegrityError`` for a row
            whose id or key is taken).
    """
    connection = connections[using]
    fields = CapturedMessage._meta.concrete_fields
    q = connection.ops.quote_name
    columns = ", ".join(q(f.column) for f in fields)
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    size = max(1, connection.ops.bulk_batch_size(list(fields), list(rows)))
    with connection.cursor() as cursor:
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            cursor.execute(  # names from the model, quoted; values as parameters
                f"INSERT INTO {q(CapturedMessage._meta.db_table)} ({columns}) VALUES "
                + ", ".join([one] * len(batch)),
                [f.get_db_prep_save(getattr(row, f.attname), connection) for row in batch for f in fields],
            )


def _delete(using: str, ids: Sequence[str]) -> None:
    """Delete the captured rows of ``ids`` on ``using``: ``DELETE ... WHERE id IN``, per
    batch the database takes. What ``QuerySet.delete()`` does for this model (nothing
    refers to it, no signal receivers), without its collector's work per call.

    Raises:
        django.db.DatabaseError: from the database.
    """
    if not ids:
        return
    connection = connections[using]
    q = connection.ops.quote_name
    pk = CapturedMessage._meta.pk
    size = max(1, connection.ops.bulk_batch_size([pk], list(ids)))
    with connection.cursor() as cursor:
        for start in range(0, len(ids), size):
            batch = ids[start : start + size]
            cursor.execute(  # names from the model, quoted; ids as parameters
                f"DELETE FROM {q(CapturedMessage._meta.db_table)} WHERE {q(pk.column)} IN ("
                + ", ".join(["%s"] * len(batch))
                + ")",
                list(batch),
            )


def _row(message: Message, own: str) -> CapturedMessage:
    return CapturedMessage(
        id=message.id,
        destination=message.destination,
        idempotency_key=message.idempotency_key,
        fingerprint=message.fingerprint(),
        body=message.body,
        record=message.capture_json(),
        created_at=time.time(),
        ordering_key=message.ordering_key,
        deployment=own,
    )


def _capture_keyed(message: Message, using: str, index: int | None, own: str) -> Message:
    """Capture one keyed message in deployment ``own``, or return the message its key
    already names there."""
    try:
        with transaction.atomic(using=using):  # a savepoint: a duplicate key rolls back only this row
            _row(message, own).save(using=using, force_insert=True)
        inserted = True
    except IntegrityError:
        inserted = False
        row = (
            CapturedMessage.objects.using(using)
            .filter(deployment=own, destination=message.destination, idempotency_key=message.idempotency_key)
            .first()
        )
        if row is not None:
            return _same_or_conflict(
                message, Message.from_capture_json(row.record, row.body), row.fingerprint, index
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
            return _capture_keyed(message, using, index, own)
        return message
    if inserted:
        CapturedMessage.objects.using(using).filter(id=message.id).delete()
    return _same_or_conflict(message, existing, existing.fingerprint(), index)


def _same_or_conflict(message: Message, existing: Message, fingerprint: str, index: int | None) -> Message:
    if fingerprint != message.fingerprint():
        raise intake.conflict_error(message, existing.id, index)
    return existing


def push(messages: Sequence[Message], using: str, numbers: Mapping[str, int] | None = None) -> None:
    """The on-commit fast path: write captured messages to Redis, then delete their rows.

    Ordered messages go with their key's earlier captured rows, first
    (:func:`push_order.in_key_order`), and those rows are deleted too once Redis has
    them. ``numbers``: message id -> ``order_seq`` of the ordered ones, as
    :func:`capture` gave them; None: read from the table (an ordered message whose row
    is gone was pushed already, and is left out).

    Never raises: if Redis cannot be reached the rows stay for the relay (logged); so
    they do when Redis wrote the messages but did not acknowledge them as
    ``OUTBOX["DURABILITY"]`` asks (:class:`~outbox.exceptions.NotDurable`, logged): the
    row is the durable copy until a push is acknowledged.
    """
    try:
        if numbers is None:
            messages, numbers = _numbered(messages, using)
        messages = push_order.in_key_order(using, messages, numbers, RELAY_BATCH, deployment.relayed())
    except DatabaseError as exc:
        logger.warning(
            "outbox: %d message(s) committed but not pushed: the capture table could not be read (%s); "
            "the relay of an outbox_worker will push them",
            len(messages),
            exc,
        )
        return
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
    try:
        _delete(using, _settled(messages, created))
    except DatabaseError as exc:  # harmless: the relay pushes them again (idempotent) and deletes
        logger.warning("outbox: could not delete %d captured row(s): %s", len(messages), exc)


def _numbered(messages: Sequence[Message], using: str) -> tuple[list[Message], dict[str, int]]:
    """``messages`` without the ordered ones whose rows are gone, and the ``order_seq``
    of the ordered ones (from the table)."""
    ordered = [m.id for m in messages if m.ordering_key]
    if not ordered:
        return list(messages), {}
    found = CapturedMessage.objects.using(using).filter(id__in=ordered).values_list("id", "order_seq")
    numbers = {i: n for i, n in found if n is not None}
    held = {i for i, _ in found}
    return [m for m in messages if not m.ordering_key or m.id in held], numbers


def _settled(messages: Sequence[Message], created: Sequence[Created]) -> list[str]:
    """The ids of ``messages`` whose rows can go: Redis has them, or refuses them for
    good (an idempotency conflict, logged). Not those of a partition that could not be
    written now (``unstored``), nor those a conflict of another message refused with it
    (``refused``: the call writes nothing when one message conflicts): they stay
    captured, and the next push writes them."""
    _report_refused(messages, created)
    kept = [c.id for c in created if c.code in ("unstored", "refused")]
    if kept:
        logger.warning(
            "outbox: %d captured message(s) not written this time (their partition unavailable, or refused "
            "with a conflicting message of the same call); they stay captured for the next push",
            len(kept),
        )
    return [m.id for m, c in zip(messages, created, strict=True) if c.code not in ("unstored", "refused")]


def _report_refused(messages: Sequence[Message], created: Sequence[Created]) -> None:
    for message, c in zip(messages, created, strict=True):
        if c.code == "conflict":
            logger.error(
                "outbox: captured message %s was not stored: idempotency key %r was taken meanwhile by "
                "message %s with another body",
                message.id,
                message.idempotency_key,
                c.standing_id,
            )


def captured(message_id: str) -> Message | None:
    """A message of this deployment (or a legacy row) still held in the capture table of
    any database, or None."""
    for alias in relay_databases():
        try:
            rows = CapturedMessage.objects.using(alias).filter(deployment__in=deployment.relayed())
            row = rows.filter(id=message_id).first()
        except Exception:  # no table, no database access: nothing captured there
            continue
        if row is not None:
            return Message.from_capture_json(row.record, row.body)
    return None


def relay_databases() -> list[str]:
    """Database aliases that may hold captured messages (those the outbox migrates to)."""
    return [alias for alias in connections if router.allow_migrate_model(alias, CapturedMessage)]


def relay(
    using: str | None = None, *, older_than: float | None = None, limit: int = RELAY_BATCH, log: bool = True
) -> int:
    """Push captured messages the fast path missed, of this deployment
    (:func:`deployment.relayed`: its own rows and legacy ones); one transaction per batch.

    Args:
        using: one database alias, or None for every alias of :func:`relay_databases`.
        older_than: seconds a row must have waited (default ``RELAY_AFTER``).
        limit: rows per batch.
        log: log a warning when messages were pushed (they missed the fast path), and,
            at most once per :data:`stranded.CHECK_INTERVAL` per process, one per other
            deployment whose rows have waited longer than :data:`stranded.STRANDED_AFTER`
            (:func:`stranded.warn_if_due`); :func:`outbox.testing.deliver_all` pushes on
            purpose and says nothing.

    Returns:
        How many captured rows were pushed (Redis has their messages) and deleted;
        rows of the batches' ordering keys pushed with them count too.

    Raises:
        redis.exceptions.RedisError: Redis is unreachable (the rows stay).
        NotDurable: Redis wrote a batch but did not acknowledge it as
            ``OUTBOX["DURABILITY"]`` asks (its rows stay, for the next pass).
        django.db.DatabaseError: the database is (the rows stay).
        ImproperlyConfigured: ``OUTBOX["DEPLOYMENT"]`` or the Redis settings are invalid.
    """

    wait = outbox_settings.RELAY_AFTER if older_than is None else older_than
    pushed = 0
    failure: Exception | None = None
    mine = deployment.relayed()
    aliases = [using] if using else relay_databases()
    for alias in aliases:
        try:  # one database failing does not keep the others' messages back
            while True:
                n, more = _relay_batch(alias, mine, time.time() - wait, limit)
                pushed += n
                if not more:
                    break
            sequences.prune(alias)
        except Exception as exc:
            failure = failure or exc
    if pushed and log:
        logger.warning(
            "outbox relay: pushed %d captured message(s) that missed the on-commit fast path", pushed
        )
    if log:
        stranded.warn_if_due(aliases)
    if failure is not None:
        raise failure
    return pushed


def _relay_batch(alias: str, deployments: Sequence[str], cutoff: float, limit: int) -> tuple[int, bool]:
    """Push one batch: up to ``limit`` rows of ``deployments`` older than ``cutoff``, locked (skipping rows
    another relay holds, where the database can), with the earlier rows of their
    ordering keys first (read without waiting for their locks: pushing is idempotent).

    Returns:
        (rows pushed and deleted, whether to go on: the batch was full and rows of it
        went; rows that stay, as a partition that cannot be written now, are picked
        again first, so a batch of nothing else ends the pass).
    """
    with transaction.atomic(using=alias):
        rows = (
            CapturedMessage.objects.using(alias)
            .filter(deployment__in=deployments, created_at__lte=cutoff)  # index outbox_captured_relay
            .order_by("created_at")
        )
        if connections[alias].features.has_select_for_update_skip_locked:
            rows = rows.select_for_update(skip_locked=True)
        batch = list(rows[:limit])
        if not batch:
            return 0, False
        numbers = {r.id: r.order_seq for r in batch if r.ordering_key and r.order_seq is not None}
        own = [Message.from_capture_json(r.record, r.body) for r in batch]
        messages = push_order.in_key_order(alias, own, numbers, limit, deployments)
        settled = _settled(messages, intake.store(messages))
        mine = {r.id for r in batch}
        deleted, _ = (
            CapturedMessage.objects.using(alias).filter(id__in=[i for i in settled if i in mine]).delete()
        )
        also = _delete_unheld(alias, [i for i in settled if i not in mine])
    return deleted + also, len(batch) == limit and deleted > 0


def _delete_unheld(alias: str, ids: Sequence[str]) -> int:
    """Delete the rows of ``ids`` (pushed along with a relay batch) that no other
    transaction holds, and return how many; a row another relay holds is left to it,
    never waited for (two relays each waiting for the other's rows would deadlock)."""
    if not ids:
        return 0
    rows = CapturedMessage.objects.using(alias).filter(id__in=ids)
    if connections[alias].features.has_select_for_update_skip_locked:
        ids = list(rows.select_for_update(skip_locked=True).values_list("id", flat=True))
        rows = CapturedMessage.objects.using(alias).filter(id__in=ids)
    deleted, _ = rows.delete()
    return deleted
