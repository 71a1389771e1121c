"""Which Redis errors mean an outage (Redis, or one node of a cluster, is not serving
now) rather than a bug: :data:`REDIS_UNAVAILABLE`, and :data:`PARTITION_UNAVAILABLE`
for the errors a write to one partition of a cluster can meet while the other
partitions take theirs."""

from __future__ import annotations

from collections.abc import Iterable

from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
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

#: The errors of a cluster that is moving a slot or failing over, after redis-py's own
#: retries: the same command sent again a moment later may work. ``TryAgainError``
#: (``TRYAGAIN``: a multi-key command, such as a script with its declared keys, whose keys
#: a legacy slot migration has split between two nodes), ``ClusterError`` (redis-py's
#: "TTL exhausted.": 16 redirects, ``ASK``/``MOVED``/``TRYAGAIN``, in a row; and its
#: subclass ``ClusterDownError``, ``CLUSTERDOWN``), ``SlotNotCoveredError`` (no node serves
#: the slot yet). A worker retries its writes on these with backoff, as while Redis is
#: unreachable (:mod:`outbox.delivery.loop`). A script's ``ResponseError`` "Script
#: attempted to access a non local key" is deliberately not one: the script stopped
#: half-way with its earlier writes kept, so running it again is not known to be safe; a
#: script that finds keys at run time checks them first (``lua/lib/guard.lua``) and
#: answers ``TRYAGAIN`` instead, with nothing written (tests/store/test_lua_guard.py).
CLUSTER_IN_FLUX: tuple[type[Exception], ...] = (TryAgainError, ClusterError, SlotNotCoveredError)

#: :data:`REDIS_UNAVAILABLE` and :data:`CLUSTER_IN_FLUX`: a partition that cannot take a
#: write now, while others can (its primary down, its slot half moved).
PARTITION_UNAVAILABLE: tuple[type[Exception], ...] = (*REDIS_UNAVAILABLE, *CLUSTER_IN_FLUX)


def may_have_run(exc: BaseException) -> bool:
    """Whether a write that failed with ``exc`` may still have run on Redis: True when
    the command may have reached the server and only its reply was lost (a read that
    timed out, a connection that broke after the command was written), False when the
    server cannot have run it (the connection could not be made, or the server answered
    with an error: ``LOADING``, ``READONLY``, ``CLUSTERDOWN``, ``TRYAGAIN``, ``MOVED``...).

    redis-py raises the same classes for both sides of the write, so the connect
    failures are told apart by the text redis-py gives them ("Timeout connecting to
    server", "Error 111 connecting to host:port": ``AbstractConnection._error_message``
    and ``connect``); anything else of the two classes counts as "may have run", the
    answer that cannot make a caller send a duplicate.
    """
    if isinstance(exc, (BusyLoadingError, AuthenticationError)):
        return False  # the server answered: it refused, ran nothing
    if isinstance(exc, (RedisTimeoutError, RedisConnectionError)):
        return "connecting to" not in str(exc).lower()
    return False


def unknown_first(errors: Iterable[BaseException]) -> list[BaseException]:
    """``errors`` with those whose write :func:`may_have_run` first (in their order, then
    the others): the one to raise for a call none of whose writes is known to have landed,
    so that the caller says "unknown" rather than "nothing was stored"."""
    return sorted(errors, key=lambda exc: not may_have_run(exc))
