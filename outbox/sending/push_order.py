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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import reduce
from operator import or_

from django.db.models import Q

from outbox.models import CapturedMessage
from outbox.records import Message
from outbox.sending.sequences import Key

#: Keys per query of the table (3 parameters each: under SQLite's oldest limit of 999).
KEYS_PER_QUERY = 200


def in_key_order(
    using: str, messages: Sequence[Message], numbers: Mapping[str, int], per_key: int
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

    Returns:
        The messages without a number, in their order; then per key, its captured rows
        numbered up to the highest number of ``messages`` in that key, lowest first
        (rows of other transactions included; ``messages`` whose rows are gone from the
        table left out: a push had them written already).

    Raises:
        django.db.DatabaseError: the table could not be read.
    """
    loose = [m for m in messages if m.id not in numbers]
    highest: dict[Key, int] = {}
    for m in messages:
        if m.id in numbers and m.ordering_key:
            key = (m.destination, m.ordering_key)
            highest[key] = max(highest.get(key, 0), numbers[m.id])
    if not highest:
        return loose
    rows = CapturedMessage.objects.using(using)
    queued: dict[Key, list[str]] = {}
    keys = sorted(highest.items())
    for start in range(0, len(keys), KEYS_PER_QUERY):
        earlier = reduce(
            or_,
            (
                Q(destination=d, ordering_key=k, order_seq__lte=n)
                for (d, k), n in keys[start : start + KEYS_PER_QUERY]
            ),
        )
        found = rows.filter(earlier).order_by("destination", "ordering_key", "order_seq")
        for id_, destination, ordering_key in found.values_list("id", "destination", "ordering_key"):
            ids = queued.setdefault((destination, ordering_key or ""), [])
            if len(ids) < per_key:
                ids.append(id_)
    given = {m.id: m for m in messages}
    missing = [i for ids in queued.values() for i in ids if i not in given]
    if missing:
        for row in rows.filter(id__in=missing):
            given[row.id] = Message.from_record(row.record, row.body)
    return loose + [given[i] for ids in queued.values() for i in ids if i in given]
