"""The outbox's Redis connection: the django-redis alias's client (a single
server), or in cluster mode (``OUTBOX["CLUSTER"]``) a process-wide
``redis.cluster.RedisCluster`` built from the outbox's own settings, since django-redis
has no cluster client.

Connection helpers work on both: :func:`client_like` (a client with other options),
:func:`ping` (every primary), :func:`empty_database` (every primary), :func:`primary_clients`
(one plain client per primary, for the commands that must see every one of them).
"""

from __future__ import annotations

import inspect
import ipaddress
import sys
import threading
import time
from collections.abc import Callable
from functools import cache
from typing import Any, cast
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django_redis import get_redis_connection
from redis import ConnectionPool, Redis
from redis.cluster import REDIS_ALLOWED_KEYS, ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from outbox.conf import ClusterConfig, outbox_settings
from outbox.forks import renew_lock_after_fork


def get_connection() -> Redis:
    """The outbox's redis-py client: the django-redis cache alias ``OUTBOX["REDIS_ALIAS"]``'s,
    or with ``OUTBOX["CLUSTER"]`` set the process-wide :class:`redis.cluster.RedisCluster`
    (:func:`cluster_connection`).

    A ``RedisCluster`` is not a subclass of ``redis.Redis`` but has its command methods;
    it is typed as ``Redis`` here so the repository type-checks unchanged. Code that must
    tell them apart uses :func:`is_cluster`.

    Raises:
        ImproperlyConfigured: the alias is not a django-redis cache; ``OUTBOX["CLUSTER"]``
            is invalid, or its nodes are not cluster nodes.
        redis.exceptions.ConnectionError: cluster mode, and no startup node answered.
    """

    if outbox_settings.cluster is not None:
        return cast(Redis, cluster_connection())
    alias = outbox_settings.REDIS_ALIAS
    try:
        connection: Redis = get_redis_connection(alias)  # django-redis ships no types
    except (NotImplementedError, KeyError) as exc:
        raise ImproperlyConfigured(
            f"OUTBOX['REDIS_ALIAS'] = {alias!r} must name a django-redis cache in CACHES"
        ) from exc
    return connection


def is_cluster(client: object) -> bool:
    """Whether ``client`` is a :class:`redis.cluster.RedisCluster`."""
    return isinstance(client, RedisCluster)


_cluster_lock = threading.Lock()

# held while another thread builds the cluster client (a slot map asked of a node:
# seconds when one is down)
renew_lock_after_fork(sys.modules[__name__], "_cluster_lock")
#: The process-wide cluster client and the settings it was built from, once built.
_cluster: list[tuple[ClusterConfig, RedisCluster]] = []


def cluster_connection() -> RedisCluster:
    """The process-wide :class:`redis.cluster.RedisCluster` of ``OUTBOX["CLUSTER"]``, built
    on first use (it asks a startup node for the slot map). ``decode_responses=False``:
    replies are bytes. After ``setting_changed`` the settings are read again: the same
    client while ``OUTBOX["CLUSTER"]`` is unchanged, else a new one (the old one is not
    closed, so a caller still holding it keeps working; it closes when it is garbage).

    Raises:
        ImproperlyConfigured: ``OUTBOX["CLUSTER"]`` is unset or invalid (an unknown
            ``OPTIONS`` key included), or a startup node is not a cluster node.
        redis.exceptions.ConnectionError: no startup node answered (or the cluster does
            not serve every slot); the next call tries again.
    """
    config = outbox_settings.cluster
    if _cluster and _cluster[0][0] is config:
        return _cluster[0][1]
    if config is None:
        raise ImproperlyConfigured("OUTBOX['CLUSTER'] is not set")
    with _cluster_lock:
        if not (_cluster and _cluster[0][0] == config):
            _cluster[:] = [(config, build_cluster_client(config))]
        else:
            _cluster[0] = (config, _cluster[0][1])
        return _cluster[0][1]


def build_cluster_client(config: ClusterConfig, **overrides: Any) -> RedisCluster:
    """A new :class:`redis.cluster.RedisCluster` for ``config`` (its startup nodes, then
    ``config.client_kwargs()`` with ``overrides``); close it when done.

    Raises:
        ImproperlyConfigured: an unknown ``OPTIONS`` key, or a node that is not a cluster
            node (cluster support disabled: a single server belongs in ``REDIS_ALIAS``).
        redis.exceptions.ConnectionError: no startup node answered, or the slots are not
            all served (``require_full_coverage``, redis-py's default).
    """
    kwargs = {**config.client_kwargs(), **overrides}
    unknown = sorted(set(config.options) - cluster_option_names())
    if unknown:
        raise ImproperlyConfigured(
            f"OUTBOX['CLUSTER']['OPTIONS'] has key(s) that redis.cluster.RedisCluster does not take: "
            f"{', '.join(map(repr, unknown))}"
        )
    nodes = [ClusterNode(host, port) for host, port in config.nodes]  # type: ignore[no-untyped-call]
    try:
        return RedisCluster(startup_nodes=nodes, **kwargs)
    except RedisClusterException as exc:
        cause = exc.__cause__
        if isinstance(cause, RedisClusterException) and "not enabled" in str(cause):
            raise ImproperlyConfigured(
                f"OUTBOX['CLUSTER']['NODES'] ({config.where}): cluster support is disabled on that "
                "server; a single Redis belongs in the django-redis alias OUTBOX['REDIS_ALIAS'], "
                "with OUTBOX['CLUSTER'] unset"
            ) from exc
        raise RedisConnectionError(f"Redis Cluster at {config.where} cannot be used: {exc}") from exc


@cache
def cluster_option_names() -> frozenset[str]:
    """The keyword arguments ``redis.cluster.RedisCluster`` takes (its own, and those it
    passes on to each node's client), for ``OUTBOX["CLUSTER"]["OPTIONS"]``."""
    own = set(inspect.signature(RedisCluster.__init__).parameters) - {"self", "kwargs"}
    return frozenset((own | set(REDIS_ALLOWED_KEYS)) - {"host", "port", "startup_nodes", "url"})


def primary_clients(client: Redis) -> list[Redis]:
    """One plain :class:`redis.Redis` per server that ``client`` writes to: each primary
    of a cluster (redis-py's own client of that node, sharing its pool), or ``client``
    itself. For the commands that must reach every primary one by one (``INFO``,
    ``CONFIG GET``, ``SCRIPT LOAD`` in a pipeline)."""
    if is_cluster(client):
        cluster = cast(RedisCluster, client)
        primaries = cluster.get_primaries()  # type: ignore[no-untyped-call]
        return [cluster.get_redis_connection(node) for node in primaries]
    return [client]


def client_like(client: Redis, *, max_connections: int | None = None, **overrides: Any) -> Redis:
    """A new client on a connection pool of its own, to the server of ``client``'s pool with
    its options (``connection_kwargs``: address, credentials, TLS, timeouts), ``overrides``
    replacing some of them (``socket_timeout=None``: no read timeout). Given a
    ``RedisCluster``, a new ``RedisCluster`` on the same startup nodes with its options and
    ``overrides`` (``max_connections`` per node).

    For connections whose options must differ from the alias's without changing the
    alias's pool: RQ's blocking wait (:func:`outbox.delivery.worker.waiting_connection`), quick
    inspections (:mod:`outbox.store.client.diagnostics`).

    Returns:
        A :class:`redis.Redis` (close its pool, ``connection_pool.disconnect()``, when
        done), or a :class:`redis.cluster.RedisCluster` typed as one (``close()`` it).

    Raises:
        redis.exceptions.ConnectionError: ``client`` is a cluster client and no startup
            node answered (a cluster client asks for the slot map when it is made).
    """
    if is_cluster(client):
        cluster = cast(RedisCluster, client)
        given = cluster.get_connection_kwargs()  # type: ignore[no-untyped-call]
        kwargs = {k: v for k, v in given.items() if k in REDIS_ALLOWED_KEYS}
        kwargs.pop("redis_connect_func", None)  # RedisCluster sets its own
        if max_connections is not None:
            kwargs["max_connections"] = max_connections
        primaries = cluster.get_primaries()  # type: ignore[no-untyped-call]
        nodes = [ClusterNode(n.host, n.port) for n in primaries]  # type: ignore[no-untyped-call]
        try:
            built = RedisCluster(startup_nodes=nodes, **{**kwargs, **overrides})
        except RedisClusterException as exc:
            raise RedisConnectionError(f"Redis Cluster cannot be used: {exc}") from exc
        return cast(Redis, built)
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, **overrides}
    own = ConnectionPool(connection_class=pool.connection_class, max_connections=max_connections, **kwargs)
    return Redis(connection_pool=own)


def ping(rq_connection: Redis | None = None) -> None:
    """Send PING to the outbox's Redis (the alias's client and its timeouts), or to every
    primary of the cluster; then to ``rq_connection``'s server when given (RQ's own Redis
    in cluster mode).

    Raises:
        redis.exceptions.RedisError: Redis (a primary, RQ's) did not answer.
    """
    connection = get_connection()
    if is_cluster(connection):
        cast(RedisCluster, connection).ping(target_nodes=RedisCluster.PRIMARIES)
    else:
        connection.ping()
    if rq_connection is not None:
        rq_connection.ping()


def clock_offsets(clock: Callable[[], float] = time.time) -> list[tuple[str, float, float]]:
    """How far the outbox's Redis clock (``TIME``; on a cluster, each primary's) is from
    this process's ``clock`` (epoch seconds), read once per server.

    Returns:
        Per server: (its name, ``host:port``; seconds its clock is ahead of ``clock``,
        negative when behind, measured at the middle of the round trip; the error bar,
        half the round trip, in seconds).

    Raises:
        redis.exceptions.RedisError: a server did not answer.
        redis.exceptions.RedisClusterException: the cluster client has no slot map.
    """
    connection = get_connection()
    if is_cluster(connection):
        primaries = cast(RedisCluster, connection).get_primaries()  # type: ignore[no-untyped-call]
        servers = [(str(node.name), node.redis_connection) for node in primaries]
    else:
        kwargs = connection.connection_pool.connection_kwargs
        servers = [(f"{kwargs.get('host', kwargs.get('path', ''))}:{kwargs.get('port', '')}", connection)]
    out = []
    for name, client in servers:
        if client is None:
            raise RedisConnectionError(f"no connection to the cluster's primary {name}")
        before = clock()
        seconds, micros = client.time()
        after = clock()
        out.append((name, seconds + micros / 1e6 - (before + after) / 2, (after - before) / 2))
    return out


def empty_database() -> Redis:
    """Empty the outbox's Redis database (``FLUSHDB``; on every primary of a cluster) and
    return its client: for tests only (:func:`outbox.testing.state.empty_outbox`)."""
    connection = get_connection()
    if is_cluster(connection):
        cast(RedisCluster, connection).flushdb(target_nodes=RedisCluster.PRIMARIES)
    else:
        connection.flushdb()
    return connection


def redis_location() -> str:
    """``host:port/db`` of the outbox's Redis (from ``CACHES``), without credentials; in
    cluster mode its startup nodes."""
    try:
        config = outbox_settings.cluster
    except ImproperlyConfigured:
        return "OUTBOX['CLUSTER'] (invalid)"
    if config is not None:
        return f"OUTBOX['CLUSTER'] ({config.where})"
    alias = outbox_settings.REDIS_ALIAS
    location = (getattr(settings, "CACHES", {}).get(alias) or {}).get("LOCATION", "")
    if isinstance(location, (list, tuple)):
        location = location[0] if location else ""
    try:
        parts = urlsplit(str(location))
        where = f"{parts.hostname}:{parts.port or 6379}" if parts.hostname else (parts.path or "?")
    except ValueError:
        where = "?"
    return f"CACHES[{alias!r}] ({where})"


def data_location() -> str:
    """Where the outbox's data lives, normalised, without credentials and without asking
    the network: ``"redis://localhost:6379/0"`` (host lower-cased, every loopback address
    ``localhost``, the default port and database written out), ``"unix://<path>/<db>"``,
    ``"sentinel://<service>/<db>"``, or ``"cluster://<host:port>,..."`` (the configured
    startup nodes, sorted, without duplicates). The input of a derived deployment
    identity (:mod:`outbox.sending.deployment`).

    Raises:
        ImproperlyConfigured: the Redis settings are invalid.
    """
    config = outbox_settings.cluster
    if config is not None:
        nodes = sorted({f"{_host(host)}:{port}" for host, port in config.nodes})
        return "cluster://" + ",".join(nodes)
    pool = get_connection().connection_pool
    kwargs = pool.connection_kwargs
    db = int(kwargs.get("db") or 0)
    service = getattr(pool, "service_name", None)
    if isinstance(service, str):  # redis.sentinel.SentinelConnectionPool
        return f"sentinel://{service}/{db}"
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}/{db}"
    return f"redis://{_host(str(kwargs.get('host') or 'localhost'))}:{int(kwargs.get('port') or 6379)}/{db}"


def _host(host: str) -> str:
    """``host`` lower-cased, without brackets or a trailing dot; a loopback address is
    ``localhost`` (a loopback server serves only its own host, so its processes may
    write it either way). Names are not resolved."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name in ("localhost", "localhost.localdomain") or name.endswith(".localhost"):
        return "localhost"
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name
    return "localhost" if address.is_loopback else address.compressed
