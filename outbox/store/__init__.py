"""The store: the only code that issues Redis commands, in rooms by job. Data flows down
this list; nothing imports a room above it (the import-linter contract ``store-rooms`` in
pyproject.toml).

- :mod:`~outbox.store.background`: RQ plumbing and the console's records in Redis: the
  wake-up jobs (:mod:`~outbox.store.background.wakeups`), RQ's queue counts and worker
  registrations read without changing them, the console's task registry and the records
  of bulk operations.
- :mod:`~outbox.store.reads`: read models for the console, the metrics and the testing
  helpers: filtered and merged pages of messages, gauges, destination health reads.
- The repository, at the top of this folder: :class:`MessageRepository`
  (:mod:`~outbox.store.repository`, one part per job: :mod:`~outbox.store.messages`,
  :mod:`~outbox.store.indexes`, :mod:`~outbox.store.destination_state`,
  :mod:`~outbox.store.alerts`, :mod:`~outbox.store.maintenance`,
  :mod:`~outbox.store.ordering`, :mod:`~outbox.store.idempotency`, the delivery round
  trip :mod:`~outbox.store.exchange` and :mod:`~outbox.store.partitioned`, on
  :mod:`~outbox.store.base`) and :func:`get_repository`, the process-wide one.
- :mod:`~outbox.store.client`: the Redis client and topology: the connection, one held
  client per thread, the cluster's routing and administration, which errors are outages,
  durability waits (``WAIT``/``WAITAOF``), diagnostics of the server's settings.
- Leaves: :mod:`~outbox.store.keys` (every key name, built here and passed to the scripts
  in KEYS) and :mod:`~outbox.store.scripts` (the Lua scripts of ``lua/``).

:func:`get_repository` and the repository's types are re-exported here: import them from
``outbox.store``.
"""

from outbox.store.exchange import OTHERS, ExchangeReply, ExchangeRequest, PartitionAsk, cap_of
from outbox.store.keys import Keys
from outbox.store.repository import (
    BulkChange,
    BulkResult,
    Change,
    ChangeResult,
    Claim,
    ClaimOptions,
    Created,
    CreateResult,
    MessageRepository,
    RepositorySettings,
    get_repository,
)

__all__ = [
    "BulkChange",
    "BulkResult",
    "Change",
    "ChangeResult",
    "Claim",
    "ClaimOptions",
    "CreateResult",
    "Created",
    "ExchangeReply",
    "ExchangeRequest",
    "Keys",
    "OTHERS",
    "MessageRepository",
    "PartitionAsk",
    "RepositorySettings",
    "cap_of",
    "get_repository",
]
