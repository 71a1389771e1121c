"""Which captured messages a push writes to Redis, and in which order, so that the
messages of an ordering key reach Redis in commit order.

A captured ordered message carries its place in its key (``order_seq``, commit order:
:mod:`outbox.sending.sequences`). Redis numbers a key's messages in the order it is
given them, so before a push (the on-commit fast path or the relay) writes such a
message it writes every earlier captured row of the same (destination, key) that is
still in the table, lowest number first, in the same script call. A row leaves the
table only after Redis has its message, so "still in the table" is "maybe not in Redis
yet"; pushing is idempotent on the message id, so two pushers racing write a message
once, and whichever runs first writes a key's rows in order. Hence: a captured message
is never written to Redis after a later captured message of its key, from any process,
by either path.

Only rows of the pushing deployment, and legacy rows, are read (``deployments``): two
deployments sharing a database share a key's sequence row (their numbers interleave,
each deployment's in commit order, with gaps where the other's are), and a push never
writes the other deployment's rows into its own Redis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from django.db import connections

from outbox.models import CapturedMessage
from outbox.records import Message
from outbox.sending.sequences import Key

#: Keys per query of the table (3 parameters each: under SQLite's oldest limit of 999).
KEYS_PER_QUERY = 200


def in_key_order(
    using: str,
    messages: Sequence[Message],
    numbers: Mapping[str, int],
    per_key: int,
    deployments: Sequence[str],
) -> list[Message]:
    """What to push for ``messages``, in push order.

    Args:
        using: the database alias of the capture table.
        messages: the messages to push (captured on ``using``).
        numbers: message id -> its ``order_seq``, for the ordered ones among
            ``messages``; a message with an ordering key but no number here is pushed
            as it comes (a row captured before numbering existed).
        per_key: at most this many rows of one key (its lowest numbers) per push; the
            later ones wait for the next push, which takes them in order.
        deployments: the identities of the rows read from the table (the pusher's own
            and legacy: :func:`outbox.sending.deployment.relayed`).

    Returns:
        The messages without a number, in their order; then per key, its captured rows
        numbered up to the highest number of ``messages`` in that key, lowest first
        (rows of other transactions of ``deployments`` included; ``messages`` whose rows are gone from the
        table left out: a push had them written already). A key whose numbers in
        ``messages`` are 1, 2, ... k has nothing before them: its ``messages`` are taken
        as they are, without reading the table.

    Raises:
        django.db.DatabaseError: the table could not be read.
    """
    loose = [m for m in messages if m.id not in numbers]
    own: dict[Key, list[tuple[int, str]]] = {}
    for m in messages:
        if m.id in numbers and m.ordering_key:
            own.setdefault((m.destination, m.ordering_key), []).append((numbers[m.id], m.id))
    queued: dict[Key, list[str]] = {}
    highest: dict[Key, int] = {}
    for key, numbered in own.items():
        numbered.sort()
        if [n for n, _ in numbered] == list(range(1, len(numbered) + 1)):
            # The key's first numbers: its sequence row was made for them, which happens
            # only when the key has no captured row (see sequences.prune), so nothing
            # comes before them. No read (every key sent to less often than the relay
            # runs is numbered from 1 again).
            queued[key] = [i for _, i in numbered[:per_key]]
        else:
            highest[key] = numbered[-1][0]
    if highest:
        queued.update(_queued(using, sorted(highest.items()), per_key, deployments))
    if not queued:
        return loose
    given = {m.id: m for m in messages}
    missing = [i for ids in queued.values() for i in ids if i not in given]
    if missing:
        for row in CapturedMessage.objects.using(using).filter(id__in=missing):
            given[row.id] = Message.from_capture_json(row.record, row.body)
    return loose + [given[i] for ids in queued.values() for i in ids if i in given]


def _queued(
    using: str, keys: Sequence[tuple[Key, int]], per_key: int, deployments: Sequence[str]
) -> dict[Key, list[str]]:
    """Per key of ``keys`` ((key, highest number) pairs), the ids of its captured rows of
    ``deployments`` numbered up to that number, lowest first, at most ``per_key`` of them.

    Plain SQL on the index (destination, ordering_key, order_seq): it runs on every push
    of an ordered message, and the ORM took 0.9-1.2 ms to build and run this query where
    the same SQL on the same cursor took 0.11-0.12 ms (PostgreSQL on loopback, a loaded
    2-core machine). One key (every ``send()``): with a ``LIMIT``; more
    (``send_many``): :data:`KEYS_PER_QUERY` keys per query.
    """
    connection = connections[using]
    q = connection.ops.quote_name
    table = q(CapturedMessage._meta.db_table)
    id_, destination, ordering_key, seq, deployment = (
        q(name) for name in ("id", "destination", "ordering_key", "order_seq", "deployment")
    )
    among = ", ".join(["%s"] * len(deployments))
    queued: dict[Key, list[str]] = {}
    with connection.cursor() as cursor:
        for start in range(0, len(keys), KEYS_PER_QUERY):
            chunk = keys[start : start + KEYS_PER_QUERY]
            where = " OR ".join(
                [f"({destination} = %s AND {ordering_key} = %s AND {seq} <= %s)"] * len(chunk)
            )
            limit = f" {connection.ops.limit_offset_sql(0, per_key)}" if len(chunk) == 1 else ""
            cursor.execute(  # names from the model, quoted; values as parameters
                f"SELECT {id_}, {destination}, {ordering_key} FROM {table} "
                f"WHERE ({where}) AND {deployment} IN ({among}) "
                f"ORDER BY {destination}, {ordering_key}, {seq}{limit}",
                [value for (d, k), n in chunk for value in (d, k, n)] + list(deployments),
            )
            for found, d, k in cursor.fetchall():
                ids = queued.setdefault((d, k), [])
                if len(ids) < per_key:
                    ids.append(found)
    return queued
