"""Which Redis errors mean an outage (Redis, or one node of a cluster, is not serving
now) rather than a bug: :data:`REDIS_UNAVAILABLE`, and :data:`PARTITION_UNAVAILABLE`
for the errors a write to one partition of a cluster can meet while the other
partitions take theirs."""

from __future__ import annotations

from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    ReadOnlyError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

#: The Redis errors that mean Redis is not serving now: unreachable, timed out, still
#: loading its data, or failing over (a cluster without its master, a replica not yet
#: promoted). Every other ``redis.exceptions.RedisError`` (a ``ResponseError`` about an
#: argument, a script error...) is a bug of the caller, not an outage, and is never
#: reported as one.
REDIS_UNAVAILABLE: tuple[type[Exception], ...] = (
    RedisConnectionError,  # includes BusyLoadingError (LOADING) and AuthenticationError
    RedisTimeoutError,
    ClusterDownError,  # includes MasterDownError
    ReadOnlyError,
    SlotNotCoveredError,  # redis-py's cluster client: no node serves the slot (not a RedisError)
)

#: :data:`REDIS_UNAVAILABLE`, and what redis-py's cluster client raises once it has
#: retried a call of one slot for as long as it does (``TRYAGAIN`` while the slot is
#: half moved, then ``ClusterError("TTL exhausted.")``): a partition that cannot take a
#: write now, while others can.
PARTITION_UNAVAILABLE: tuple[type[Exception], ...] = (*REDIS_UNAVAILABLE, TryAgainError, ClusterError)
