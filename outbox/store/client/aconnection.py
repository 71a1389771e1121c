"""The outbox's ``redis.asyncio`` client, one per event loop: what ``outbox.asend()``
writes through (its steps driven by :func:`outbox.store.asteps.adrive`).

The client is built from the same settings as the synchronous one
(:func:`.connection.get_connection`): on one server, the django-redis alias's pool
options (address, database, credentials, TLS, socket timeouts, retries); with
``OUTBOX["CLUSTER"]``, a ``redis.asyncio.cluster.RedisCluster`` of its nodes and
``OPTIONS``. An asyncio connection belongs to the loop that opened it, so each event
loop gets its own client and pool (a process under uvicorn has one loop: one pool;
``async_to_sync`` makes a loop per call, whose client goes with it). Concurrent
``asend()`` calls of one loop share the pool, each on a connection of its own while
its write is in flight, so one call's reply or failure never becomes another's.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Hashable, Sequence
from functools import cache
from typing import Any, TypeVar, cast

import redis.asyncio as aredis
from redis import connection as sync_connection
from redis.asyncio import connection as async_connection
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.exceptions import ResponseError

from outbox.conf import outbox_settings
from outbox.store.client.connection import get_connection

T = TypeVar("T")

AsyncClient = aredis.Redis | AsyncRedisCluster

#: Per event loop: (what the client was built from, the client).
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[object, AsyncClient]] = (
    weakref.WeakKeyDictionary()
)

#: The synchronous connection classes and their asyncio twins.
_CLASSES: dict[type[Any], type[Any]] = {
    sync_connection.Connection: async_connection.Connection,
    sync_connection.SSLConnection: async_connection.SSLConnection,
    sync_connection.UnixDomainSocketConnection: async_connection.UnixDomainSocketConnection,
}


#: The options of a synchronous pool that its asyncio twin takes as they are (its parser
#: class, maintenance-notification handlers and other synchronous objects are left out:
#: the asyncio client makes its own).
_COPIED = frozenset(
    {
        "host",
        "port",
        "path",
        "db",
        "username",
        "password",
        "credential_provider",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "retry_on_timeout",
        "retry_on_error",
        "retry",
        "encoding",
        "encoding_errors",
        "decode_responses",
        "client_name",
        "health_check_interval",
        "protocol",
    }
)


@cache
def _accepted(cls: Any) -> frozenset[str]:
    """The keyword arguments ``cls`` (an asyncio connection class) and its bases take."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names |= set(inspect.signature(init).parameters) - {"self", "args", "kwargs"}
    return frozenset(names)


def _async_retry(retry: Any) -> AsyncRetry | None:
    """The asyncio twin of a synchronous ``redis.retry.Retry`` (same backoff, count and errors)."""
    backoff, retries = getattr(retry, "_backoff", None), getattr(retry, "_retries", None)
    if backoff is None or retries is None:
        return None
    errors = getattr(retry, "_supported_errors", None)
    return AsyncRetry(backoff, retries, errors) if errors else AsyncRetry(backoff, retries)


def build_async_client() -> tuple[object, AsyncClient]:
    """A new asyncio client of the outbox's Redis and the settings object it was built
    from (the sync pool, or the ``OUTBOX["CLUSTER"]`` config), without I/O.

    Raises:
        ImproperlyConfigured: as :func:`.connection.get_connection`.
    """
    config = outbox_settings.cluster
    if config is not None:
        allowed = set(inspect.signature(AsyncRedisCluster.__init__).parameters) - {"self", "kwargs"}
        kwargs = {k: v for k, v in config.client_kwargs().items() if k in allowed}
        if "retry" in kwargs:
            kwargs["retry"] = _async_retry(kwargs["retry"])
        nodes = [AsyncClusterNode(host, port) for host, port in config.nodes]
        return config, AsyncRedisCluster(startup_nodes=nodes, **kwargs)
    pool = get_connection().connection_pool
    connection_class: type[Any] = _CLASSES.get(pool.connection_class, async_connection.Connection)
    given = dict(pool.connection_kwargs)
    # redis-py 8 keeps the timeouts a pool was made with as orig_* (maintenance notifications)
    given.setdefault("socket_timeout", given.get("orig_socket_timeout"))
    given.setdefault("socket_connect_timeout", given.get("orig_socket_connect_timeout"))
    kwargs = {
        k: v
        for k, v in given.items()
        if k in _COPIED or (k.startswith("ssl_") and k in _accepted(cast(Hashable, connection_class)))
    }
    if "retry" in kwargs:
        retry = _async_retry(kwargs["retry"])
        if retry is None:
            del kwargs["retry"]
        else:
            kwargs["retry"] = retry
    async_pool = aredis.ConnectionPool(
        connection_class=connection_class, max_connections=pool.max_connections, **kwargs
    )
    return pool, aredis.Redis(connection_pool=async_pool)


async def async_connection_for_loop() -> AsyncClient:
    """This event loop's asyncio client of the outbox's Redis (built on first use in the
    loop, and again after the settings changed). A cluster client reads the slot map
    the first time.

    Raises:
        ImproperlyConfigured: as :func:`.connection.get_connection`.
        redis.exceptions.RedisError: a cluster client could not read the slot map.
    """
    loop = asyncio.get_running_loop()
    source: object = outbox_settings.cluster
    if source is None:
        source = get_connection().connection_pool
    held = _clients.get(loop)
    if held is not None and held[0] is source:
        return held[1]
    built, client = build_async_client()
    if isinstance(client, AsyncRedisCluster):
        await client.initialize()
    _clients[loop] = (built, client)
    return client


async def aclose() -> None:
    """Close this event loop's client and its connections (tests, and a loop about to
    end: ``async_to_sync`` callers need not, its loop's client is garbage with it)."""
    held = _clients.pop(asyncio.get_running_loop(), None)
    if held is not None:
        await held[1].aclose()


async def arun_batch(client: AsyncClient, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``commands`` on ``client``: one command as itself, several in a pipeline without
    ``MULTI`` (a cluster client's routes each command by its keys and follows
    redirects); a ``ResponseError`` is that command's reply."""
    if len(commands) == 1:
        try:
            return [await client.execute_command(*commands[0])]
        except ResponseError as exc:
            return [exc]
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    replies: list[Any] = await pipe.execute(raise_on_error=False)
    return replies
