"""The message repository: the only code that reads or writes outbox keys in Redis.

Model-like access to messages (``get``, ``get_many``, ``filter``, ``count``) and atomic
status transitions (compare-and-set Lua scripts, see ``lua/transition.lua``).

:class:`MessageRepository` is composed of one part per job, each in its own module:

* :mod:`outbox.store.base`: the connection, key names and settings; running scripts;
* :mod:`outbox.store.messages`: message records: create, claim, compare-and-set
  transitions, bulk changes, release, delete, wake checks, and their reads;
* :mod:`outbox.store.indexes`: lists, pages and counts of the status and created
  indexes, walks, the destinations ever used, the per-minute outcome counters;
* :mod:`outbox.store.destination_state`: health and circuit breaker, pause, resume,
  disable and enable, parked messages put back, probes;
* :mod:`outbox.store.alerts`: alert suppression windows;
* :mod:`outbox.store.maintenance`: schema upgrade, locks, worker heartbeats.
* :mod:`outbox.store.partitioned`: the delivery round trip with more than one partition.
* :mod:`outbox.store.ordering`: ordered delivery's blocked keys and key queues.

Every name this module had before the split is importable from it still.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from outbox.conf import outbox_settings
from outbox.store.alerts import AlertStore, AlertWindow
from outbox.store.base import (
    Members,
    RepositoryBase,
    RepositorySettings,
    ScoredMembers,
    ScriptCall,
    script_call,
)
from outbox.store.client.connection import get_connection
from outbox.store.created import Created, CreateResult
from outbox.store.destination_state import BREAKER_FIELDS, OUTCOME_FIELDS, DestinationState
from outbox.store.indexes import Cursor, Index, IndexReads, score_bound, sum_counts
from outbox.store.maintenance import WORKER_HEARTBEAT_KEPT, Maintenance
from outbox.store.messages import (
    CHANGE_FIELDS,
    CREATE_FIELDS,
    BulkChange,
    BulkReply,
    BulkResult,
    Change,
    ChangeResult,
    Claim,
    ClaimOptions,
    ClaimReply,
    CreateReply,
    ReleaseReply,
    TransitionRow,
)
from outbox.store.ordering import BlockedKeyRow, OrderingReads
from outbox.store.partitioned import PartitionedMessageStore

IDEMPOTENCY_TTL = 24 * 3600  # seconds; as long as Stripe keeps idempotency keys
WAKE_TTL = 60.0  # seconds a queue's wake-up flag lives if no job clears it

__all__ = [
    "BREAKER_FIELDS",
    "CHANGE_FIELDS",
    "CREATE_FIELDS",
    "OUTCOME_FIELDS",
    "IDEMPOTENCY_TTL",
    "WAKE_TTL",
    "WORKER_HEARTBEAT_KEPT",
    "AlertWindow",
    "BlockedKeyRow",
    "BulkChange",
    "BulkReply",
    "BulkResult",
    "Change",
    "ChangeResult",
    "Claim",
    "ClaimOptions",
    "ClaimReply",
    "CreateReply",
    "CreateResult",
    "Created",
    "Cursor",
    "Index",
    "Members",
    "MessageRepository",
    "ReleaseReply",
    "RepositoryBase",
    "RepositorySettings",
    "ScoredMembers",
    "ScriptCall",
    "TransitionRow",
    "get_repository",
    "score_bound",
    "script_call",
    "sum_counts",
]


class MessageRepository(
    PartitionedMessageStore, IndexReads, DestinationState, AlertStore, Maintenance, OrderingReads
):
    """Messages in Redis under one key prefix.

    Args:
        connection: a redis-py client (``decode_responses=False``), e.g. from
            ``django_redis.get_redis_connection``.
        settings: its key prefix, partitions, retention times and events channel
            (:class:`~outbox.store.base.RepositorySettings`).

    Every write is one Lua script call, atomic on the server. Scripts are called by
    SHA1 (``EVALSHA``) and loaded again after a ``NOSCRIPT`` reply (a restarted Redis
    forgets them). Redis errors (``redis.exceptions.RedisError``) propagate unchanged.
    """


@cache
def get_repository() -> MessageRepository:
    """The process-wide :class:`MessageRepository` built from settings (cached), on the
    client of :func:`outbox.store.client.connection.get_connection`."""
    return MessageRepository(
        get_connection(),
        RepositorySettings(
            outbox_settings.KEY_PREFIX,
            attempts_kept=outbox_settings.ATTEMPTS_KEPT,
            events_channel=outbox_settings.EVENTS_CHANNEL or "",
            idempotency_ttl=IDEMPOTENCY_TTL,
            wake_ttl=WAKE_TTL,
            partitions=outbox_settings.partitions,
            ordering_key_ttl=outbox_settings.ORDERING_KEY_TTL,
        ),
    )


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("OUTBOX", "CACHES"):
        get_repository.cache_clear()  # and cluster_connection() reads OUTBOX["CLUSTER"] again
