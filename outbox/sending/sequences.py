"""Commit order for ordered messages captured inside transactions: a sequence per
(destination, ordering key) in the database (:class:`~outbox.models.OrderingSequence`).

:func:`take` numbers a transaction's captured messages of a key by incrementing the
key's row **inside the caller's transaction**: one upsert (``INSERT ... ON CONFLICT DO
UPDATE ... RETURNING``), which locks the row until the transaction ends, as ``SELECT ...
FOR UPDATE`` would, and makes it the first time, race-safe, with no savepoint (on
SQLite the database's write lock, taken by the same statement, serializes writers
anyway). So a concurrent transaction sending to the same key waits at
its ``send()`` until the first one commits or rolls back, and then reads the committed
value: the numbers follow commit order, with no gap (a rollback, or the rollback of a
savepoint, undoes its increment). Keys never wait for each other: each has its row.

The numbers only have to order the captured rows of a key that are in the table at the
same time (a push writes a key's rows in this order: :mod:`outbox.sending.push_order`),
so :func:`prune` deletes the row of a key that has none left, without ever waiting for
a transaction that holds it; the key's next transaction starts again at 1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.models import Exists, F, OuterRef

from outbox.models import CapturedMessage, OrderingSequence

#: Sequence rows :func:`prune` looks at per batch (a call goes through the whole table).
PRUNE_BATCH = 500

Key = tuple[str, str]  # (destination, ordering key)


def take(using: str, keys: Sequence[Key]) -> list[int]:
    """The next sequence number of each key of ``keys`` (a key may repeat: its numbers
    follow the list's order), taken in the current transaction on database ``using``.

    Each key's row stays locked until that transaction ends (see the module docstring).
    Rows are taken in sorted key order, so two transactions sending to the same keys in
    different orders do not deadlock here.

    Returns:
        One number per item of ``keys`` (1, 2, ... per key).

    Raises:
        django.db.DatabaseError: from the database (the caller's transaction is then
            unusable, as for any failed statement in it).
    """
    counts = Counter(keys)
    following = {}
    for key in sorted(counts):
        following[key] = _advance(using, key, counts[key]) - counts[key] + 1
    numbers = []
    for key in keys:
        numbers.append(following[key])
        following[key] += 1
    return numbers


def _advance(using: str, key: Key, n: int) -> int:
    """Add ``n`` to ``key``'s row (made when missing) and return its new ``last``.

    One statement where the database has both an upsert and ``RETURNING`` (PostgreSQL,
    SQLite 3.35+): ``INSERT ... ON CONFLICT (destination, ordering_key) DO UPDATE SET
    last = last + n RETURNING last``. Meeting a row another transaction is inserting, it
    waits for that one to end, then updates the committed row (or inserts, after a
    rollback). Elsewhere an update, a read, and when there was no row an insert in a
    savepoint (tried again as an update if a concurrent transaction made the row first).
    """
    connection = connections[using]
    if connection.vendor == "postgresql" or (
        connection.vendor == "sqlite" and connection.features.can_return_columns_from_insert
    ):
        q = connection.ops.quote_name
        table, last = q(OrderingSequence._meta.db_table), q("last")
        columns = f"{q('destination')}, {q('ordering_key')}"
        with connection.cursor() as cursor:
            cursor.execute(  # names from the model, quoted
                f"INSERT INTO {table} ({columns}, {last}) VALUES (%s, %s, %s) "
                f"ON CONFLICT ({columns}) DO UPDATE SET {last} = {table}.{last} + %s RETURNING {last}",
                [*key, n, n],
            )
            return int(cursor.fetchone()[0])
    destination, ordering_key = key
    row = OrderingSequence.objects.using(using).filter(destination=destination, ordering_key=ordering_key)
    for _ in range(3):
        if row.update(last=F("last") + n):  # locks the row until the transaction ends
            return int(row.values_list("last", flat=True).get())
        try:
            with transaction.atomic(using=using):  # a savepoint: a concurrent insert rolls back only this
                OrderingSequence.objects.using(using).create(
                    destination=destination, ordering_key=ordering_key, last=n
                )
            return n
        except IntegrityError:
            continue  # another transaction made it and committed: increment it
    raise IntegrityError(
        f"could not take a sequence number for ordering key {ordering_key!r} of {destination!r}"
    )


def prune(using: str, limit: int = PRUNE_BATCH) -> int:
    """Delete the sequence rows of keys that have no captured message left in database
    ``using``: every such row the call finds, ``limit`` rows looked at per batch, batch
    after batch in primary-key order until the table's end (so a pass keeps up with any
    number of new keys, and rows it must keep never stop it from reaching the others).

    A row is deleted only if no transaction holds it and its ``last`` is still what the
    first read saw: a transaction that numbered a message since that read either changed
    ``last`` or still holds the row. So a key's row never goes while one of its messages
    is captured (committed or not), and pruning never waits for a sending transaction:

    * with ``SELECT ... FOR UPDATE SKIP LOCKED`` (PostgreSQL, MySQL 8, MariaDB 10.6,
      Oracle): a batch's free rows are locked and deleted in one short transaction;
    * without it but with ``NOWAIT`` (MariaDB 10.5, which Django 5.2 supports): row by
      row, each in a transaction of its own that gives up at once on a held row;
    * SQLite: one ``DELETE ... WHERE NOT EXISTS`` statement, which takes the database's
      write lock before it reads (SQLite has one writer at a time), so it sees every
      committed capture and none is in progress;
    * a database with neither (none Django supports): nothing is deleted.

    Before issue 30 a call deleted at most ``limit`` (500) rows, the first ones, and
    none without ``SKIP LOCKED``: a workload making more new keys per relay pass than
    that grew the table without bound (see tests/sending/test_ordered_capture.py).

    Returns:
        How many rows were deleted.

    Raises:
        django.db.DatabaseError: from the database.
    """
    if not OrderingSequence.objects.using(using).exists():
        # the relay calls this every pass: a project sending no ordered message inside
        # transactions pays one indexed read, not a write (SQLite's lock) or a join
        return 0
    connection = connections[using]
    if connection.vendor == "sqlite":
        return _prune_in_one_statement(using)
    features = connection.features
    if features.has_select_for_update_skip_locked:
        delete = _delete_free_batch
    elif features.has_select_for_update_nowait:
        delete = _delete_free_rows
    else:
        return 0
    captured = CapturedMessage.objects.using(using).filter(
        destination=OuterRef("destination"), ordering_key=OuterRef("ordering_key")
    )
    rows = OrderingSequence.objects.using(using)
    # the rows there when the pass starts: keys made meanwhile wait for the next pass
    top = rows.order_by("-pk").values_list("pk", flat=True).first()
    unused = rows.filter(~Exists(captured), pk__lte=top).order_by("pk")
    deleted, after = 0, None
    while True:
        page = unused if after is None else unused.filter(pk__gt=after)
        seen = dict(page.values_list("pk", "last")[:limit])
        if not seen:
            return deleted
        deleted += delete(using, seen)
        if len(seen) < limit:
            return deleted
        after = max(seen)


def _delete_free_batch(using: str, seen: dict[int, int]) -> int:
    """Delete the rows of ``seen`` (pk -> ``last`` when read) that no transaction holds
    and whose ``last`` is unchanged, in one transaction (``SKIP LOCKED``)."""
    rows = OrderingSequence.objects.using(using)
    with transaction.atomic(using=using):
        free = rows.filter(pk__in=seen).select_for_update(skip_locked=True).values_list("pk", "last")
        doomed = [pk for pk, last in free if seen[pk] == last]
        if doomed:
            rows.filter(pk__in=doomed).delete()
    return len(doomed)


def _delete_free_rows(using: str, seen: dict[int, int]) -> int:
    """:func:`_delete_free_batch` where the database has ``NOWAIT`` but no ``SKIP
    LOCKED``: one transaction per row, given up (the row kept) when the row is held."""
    rows = OrderingSequence.objects.using(using)
    deleted = 0
    for pk, last in seen.items():
        try:
            with transaction.atomic(using=using):
                found = list(rows.filter(pk=pk).select_for_update(nowait=True).values_list("last", flat=True))
                if found == [last]:
                    rows.filter(pk=pk).delete()
                    deleted += 1
        except OperationalError:  # held by a sending transaction: kept, nothing waited for
            continue
    return deleted


def _prune_in_one_statement(using: str) -> int:
    connection = connections[using]
    q = connection.ops.quote_name
    sequences, captured = q(OrderingSequence._meta.db_table), q(CapturedMessage._meta.db_table)
    destination, ordering_key = q("destination"), q("ordering_key")
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {sequences} WHERE NOT EXISTS (SELECT 1 FROM {captured} AS c "  # names from the models, quoted
            f"WHERE c.{destination} = {sequences}.{destination} AND c.{ordering_key} = {sequences}.{ordering_key})"
        )
        return int(cursor.rowcount)
