"""Where an idempotency record lives, and the reservation that puts it there for an
ordered message stored in another partition.

**The rule.** The idempotency record of ``(destination, key)`` lives in the partition that
pair maps to, its *home* (:meth:`~outbox.store.keys.Keys.idempotency_home`,
:func:`~outbox.store.keys.partition_for` of the destination and the idempotency key), for
every combination of keys; every lookup goes there (``ids_for_idempotency_keys``: the
transactional capture, the console's search). An idempotency key names one message of
its destination, whatever its ordering key: a send under a key that already names a
message returns that message (the same body and content type) or is refused with
:class:`~outbox.exceptions.IdempotencyConflict` (another body), also when it gives another
ordering key or none (the message returned carries the ordering key it was sent with).

A message without an ordering key is stored in its key's home (its partition comes from
its idempotency key), so ``lua/create.lua`` checks and writes the record in the same
atomic call. A message with an ordering key is stored in its ordering key's partition,
which is usually another slot: before that partition's create call,
:func:`~outbox.store.creating.reserve_steps` writes the record in the home (``SET NX``,
then ``GET``, one pipelined round trip for the whole call). When the record already
names another message ``E`` with the same fingerprint, the send stands for ``E``: if
``E`` is in the same partition it is created under ``E``'s id (a no-op when ``E`` is
stored: ``create.lua`` is idempotent on the id), so a send whose reservation was written
and whose create failed (an outage, a crash) is completed by the next send under that
key, never stored twice and never left as an id that does not exist; if ``E`` is in
another partition (sent with another ordering key, or none) it is returned when it
exists.

The create call still writes the record in the message's own partition too: the older
rule put it there, and a process of an older version (a rolling upgrade) looks there.
Records are kept ``IDEMPOTENCY_TTL`` seconds (24 h by default): during that window after
an upgrade, a record an older version wrote for an *ordered* message lives only in the
ordering key's partition: a send of the same (key, ordering key) still finds it there
(the create call's own check, which then points the home record at that message), but
a lookup by key alone (the console's search, the capture's look-up inside a transaction)
does not; after ``IDEMPOTENCY_TTL`` no such record is left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from outbox.records import Message


@dataclass
class Held:
    """A reservation :func:`~outbox.store.creating.reserve_steps` did not get: the key's
    home names ``id`` with ``fingerprint`` (``lua/create.lua``'s ``<id>|<fingerprint>``)."""

    id: str
    fingerprint: str


@dataclass
class Reservations:
    """What :func:`~outbox.store.creating.reserve_steps` found: ``held`` maps a message's
    position in the call to the record that names another message; the others at
    ``mine`` hold their home record."""

    held: dict[int, Held] = field(default_factory=dict)
    mine: list[int] = field(default_factory=list)


def away_from_home(keys: Any, message: Message) -> bool:
    """Whether ``message``'s idempotency record has a home other than its own partition (an
    ordered message with an idempotency key whose pairs map to two partitions)."""
    if not (message.idempotency_key and message.ordering_key) or keys.partitions <= 1:
        return False
    home = keys.idempotency_home(message.destination, message.idempotency_key)
    return bool(home != keys.of(message.id).idempotency(message.destination, message.idempotency_key))
