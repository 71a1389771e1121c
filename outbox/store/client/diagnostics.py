"""Is the outbox's Redis safe to keep messages in? Eviction, persistence, shared cache alias.

The outbox keeps its messages *only* in Redis, so a Redis that may drop keys loses
accepted messages silently. Three settings decide that (issue 11, item 6: with
``maxmemory-policy allkeys-lru``, 2,729 of 3,000 accepted messages vanished):

* ``maxmemory-policy``: at ``maxmemory``, ``noeviction`` refuses writes (``send()``
  raises, the caller knows); ``allkeys-*`` evicts any key, message records included;
  ``volatile-*`` evicts keys that have a TTL: idempotency keys (a re-send with the same
  key then creates a duplicate) and RQ's job hashes.
  https://redis.io/docs/latest/develop/reference/eviction/
* persistence: with neither an append-only file (``appendonly yes``) nor RDB snapshots
  (``save``), a restart of Redis empties the outbox.
  https://redis.io/docs/latest/operate/oss_and_stack/management/persistence/
* the cache alias: django-redis's ``cache.clear()`` is ``FLUSHDB``; when the outbox uses
  the ``default`` alias (as the README's quick start does), any code calling
  ``django.core.cache.cache.clear()`` deletes every message.

:func:`inspect_redis` asks Redis with ``CONFIG GET`` (https://redis.io/docs/latest/commands/config-get/)
and falls back to ``INFO memory``/``INFO persistence``
(https://redis.io/docs/latest/commands/info/) where ``CONFIG`` is disabled or renamed, as
on most managed services. :func:`shared_alias_findings` needs no Redis. The system checks
in :mod:`outbox.checks` and :func:`log_startup_findings` (called by the worker at start)
report the findings.

Finding ids (also the system check ids):

=============  ======================================================================
outbox.E006    ``maxmemory-policy`` is ``allkeys-*`` and a ``maxmemory`` limit is set
               (or unknown): messages themselves are evicted
outbox.W006    another eviction policy other than ``noeviction`` (``volatile-*``, or
               ``allkeys-*`` with no limit set yet)
outbox.W004    no persistence: neither AOF nor RDB snapshots
outbox.W005    the outbox's cache alias is ``default``, or shares its Redis database
               with another cache alias, so a cache ``clear()`` deletes every message
outbox.W007    Redis could not be inspected (unreachable, or refused both CONFIG and INFO)
outbox.E008    the django-redis alias's server is a Redis Cluster node (``INFO cluster``:
               ``cluster_enabled:1``): django-redis has no cluster client
outbox.E009    cluster mode, and an outbox queue of ``RQ_QUEUES`` is on a cluster node:
               RQ cannot run on a cluster
outbox.E011    ``OUTBOX["PARTITIONS"]`` is not the partition count the data in Redis was
               written with (:attr:`~outbox.store.keys.Keys.partitions_record`, or the
               untagged destination set of one partition): the messages written before
               would be out of sight under other key names
=============  ======================================================================

In cluster mode (``OUTBOX["CLUSTER"]``) :func:`inspect_redis` inspects every primary,
each finding naming its node; the alias is not the outbox's Redis then, so W005 does not
apply, and :func:`rq_server_findings` inspects RQ's Redis.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, cast

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis import Redis
from redis.exceptions import RedisError, ResponseError

from outbox.conf import outbox_settings
from outbox.store.client.connection import (
    build_cluster_client,
    client_like,
    get_connection,
    is_cluster,
    primary_clients,
)
from outbox.store.keys import Keys

INSPECT_TIMEOUT = 1.0  # seconds to connect and to wait for each reply when inspecting

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    """One thing wrong (or unknown) about the outbox's Redis.

    Attributes:
        id: a stable id, the system check id (``"outbox.E006"``, ...).
        level: ``"error"`` or ``"warning"``.
        msg: one sentence saying what is wrong.
        hint: what to do about it.
    """

    id: str
    level: str
    msg: str
    hint: str = ""


@dataclass
class RedisSettings:
    """What :func:`inspect_redis` learnt about a Redis server.

    Attributes:
        maxmemory_policy: e.g. ``"noeviction"``; None when unknown.
        maxmemory: the limit in bytes (0: no limit); None when unknown.
        appendonly: whether the AOF is on; None when unknown.
        save: the RDB snapshot schedule (``""``: none); None when unknown (``INFO``
            does not show it).
        source: ``"config"`` (``CONFIG GET`` answered), ``"info"`` (the fallback),
            ``"cluster"`` (a cluster: see ``primaries``), or ``"none"`` (Redis could not
            be inspected).
        error: why Redis could not be inspected, when ``source`` is ``"none"``.
        cluster_enabled: whether the server is a cluster node (``INFO cluster``); None
            when unknown.
        primaries: on a cluster, what was learnt of each primary, by ``"host:port"``
            (the other fields then stay unknown).
        findings: what is wrong, see the module docstring.
    """

    maxmemory_policy: str | None = None
    maxmemory: int | None = None
    appendonly: bool | None = None
    save: str | None = None
    source: str = "none"
    error: str = ""
    cluster_enabled: bool | None = None
    primaries: dict[str, RedisSettings] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_config(connection: Redis, out: RedisSettings) -> bool:
    """Fill ``out`` from ``CONFIG GET``. Returns False when CONFIG is refused (disabled,
    renamed, or not allowed to this user), True when it answered.

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: Redis is unreachable.
    """
    values: dict[str, str] = {}
    try:
        for name in ("maxmemory-policy", "maxmemory", "appendonly", "save"):
            # One name per call: CONFIG GET with several patterns needs Redis 7.
            values.update({_text(k): _text(v) for k, v in connection.config_get(name).items()})
    except ResponseError:  # "unknown command", "NOPERM", ...
        return False
    if "maxmemory-policy" not in values:  # a proxy that answers CONFIG GET with nothing
        return False
    out.maxmemory_policy = values["maxmemory-policy"]
    out.maxmemory = int(values["maxmemory"]) if values.get("maxmemory", "").isdigit() else None
    out.appendonly = values.get("appendonly") == "yes" if "appendonly" in values else None
    out.save = values.get("save")
    out.source = "config"
    return True


def _read_info(connection: Redis, out: RedisSettings) -> bool:
    """Fill ``out`` from ``INFO memory`` and ``INFO persistence`` (``maxmemory_policy``,
    ``maxmemory``, ``aof_enabled``; the RDB schedule is not shown). Returns False when
    INFO is refused too.

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: Redis is unreachable.
    """
    try:
        memory = connection.info("memory")
        persistence = connection.info("persistence")
    except ResponseError:
        return False
    if "maxmemory_policy" in memory:
        out.maxmemory_policy = _text(memory["maxmemory_policy"])
    if "maxmemory" in memory:
        out.maxmemory = int(memory["maxmemory"])
    if "aof_enabled" in persistence:
        out.appendonly = bool(int(persistence["aof_enabled"]))
    out.source = "info"
    return True


def _findings(found: RedisSettings, where: str) -> list[Finding]:
    """The findings for what was read (see the module docstring)."""
    findings = []
    policy = found.maxmemory_policy
    if policy and policy != "noeviction":
        limited = found.maxmemory is None or found.maxmemory > 0
        limit = (
            "no maxmemory limit set yet"
            if not limited
            else (f"maxmemory {found.maxmemory} bytes" if found.maxmemory else "an unknown maxmemory")
        )
        hint = (
            "set 'maxmemory-policy noeviction' on the outbox's Redis (a dedicated server or database): "
            "at the limit Redis then refuses writes and send() raises, instead of dropping messages"
        )
        if policy.startswith("allkeys-") and limited:
            findings.append(
                Finding(
                    "outbox.E006",
                    ERROR,
                    f"{where} has maxmemory-policy {policy} with {limit}: when memory runs short Redis "
                    "deletes outbox messages that send() already accepted, silently",
                    hint,
                )
            )
        else:
            what = (
                "evicts keys with a TTL: idempotency keys (a re-send then creates a duplicate) and RQ job data"
                if policy.startswith("volatile-")
                else "would evict any key, outbox messages included, once a maxmemory limit is set"
            )
            findings.append(
                Finding(
                    "outbox.W006",
                    WARNING,
                    f"{where} has maxmemory-policy {policy} ({limit}): it {what}",
                    hint,
                )
            )
    no_rdb = found.save is not None and not found.save.strip()
    if found.appendonly is False and no_rdb:
        findings.append(
            Finding(
                "outbox.W004",
                WARNING,
                f"{where} has no persistence (appendonly no, no RDB 'save' schedule): a restart of Redis "
                "deletes every message",
                "set 'appendonly yes' and 'appendfsync everysec' (at most about a second of writes lost in a crash), "
                "or 'always' to lose none",
            )
        )
    return findings


def inspect_redis(connection: Redis | None = None, *, timeout: float = INSPECT_TIMEOUT) -> RedisSettings:
    """Read the eviction and persistence settings of the outbox's Redis and judge them.

    Uses a connection of its own with short timeouts (the same host, port, database,
    credentials and TLS settings as ``connection``), so an unreachable Redis costs at most
    about ``timeout`` seconds per attempt and never hangs a ``manage.py`` command. On a
    cluster (a ``redis.cluster.RedisCluster``, the outbox's in cluster mode) every primary
    is inspected so, one after another.

    Args:
        connection: a redis-py client; the outbox's (:func:`outbox.store.client.connection.get_connection`)
            when None.
        timeout: seconds for connecting and for each reply.

    Returns:
        A :class:`RedisSettings` with its findings (codes E006, W004, W006, W007, E008;
        see the module docstring). It never raises: an unreachable Redis gives
        ``source="none"`` and one outbox.W007 finding.
    """

    quick_cluster = None
    try:
        if connection is None and outbox_settings.cluster is not None:
            # the cluster's own client with this call's timeouts, not the settings' ones
            quick_cluster = build_cluster_client(
                outbox_settings.cluster, socket_timeout=timeout, socket_connect_timeout=timeout
            )
            connection = cast(Redis, quick_cluster)
        connection = connection or get_connection()
    except Exception as exc:  # ImproperlyConfigured, an unreachable cluster: report, never raise
        found = RedisSettings(error=f"{type(exc).__name__}: {exc}")
        found.findings.append(_uninspected("the outbox's Redis", found.error))
        return found
    if not is_cluster(connection):
        found = _inspect_server(connection, timeout, "the outbox's Redis")
        if found.cluster_enabled:
            found.findings.append(_alias_on_cluster_finding())
        elif found.source != "none":
            quick = _quick_client(connection, timeout)
            try:
                found.findings += partition_findings(quick)
            finally:
                quick.close()
                quick.connection_pool.disconnect()
        return found
    try:
        found = _inspect_cluster(connection, timeout)
        if found.primaries:
            found.findings += partition_findings(connection)
        return found
    finally:
        if quick_cluster is not None:
            quick_cluster.close()


def _inspect_cluster(connection: Redis, timeout: float) -> RedisSettings:
    """:func:`inspect_redis` of every primary of the cluster client ``connection``."""
    found = RedisSettings(source="cluster")
    try:
        clients = primary_clients(connection)
    except Exception as exc:  # the cluster's client failed to list its nodes
        found.source, found.error = "none", f"{type(exc).__name__}: {exc}"
        found.findings.append(_uninspected("the outbox's Redis Cluster", found.error))
        return found
    for client in clients:
        name = _address(client)
        node = found.primaries[name] = _inspect_server(
            client, timeout, f"the outbox's cluster primary {name}"
        )
        found.findings += node.findings
    return found


def _inspect_server(connection: Redis, timeout: float, where: str) -> RedisSettings:
    """What one server (``connection``'s) says of its settings, and the findings, each
    starting with ``where``. Never raises."""
    found = RedisSettings()
    try:
        client = _quick_client(connection, timeout)
    except Exception as exc:  # a broken pool: report, never raise
        found.error = f"{type(exc).__name__}: {exc}"
    else:
        try:
            if not _read_config(client, found) and not _read_info(client, found):
                found.error = "it refused both CONFIG GET and INFO"
            found.cluster_enabled = _cluster_enabled(client)
        except (RedisError, OSError) as exc:
            found.error = f"{type(exc).__name__}: {exc}"
        finally:
            client.close()
            client.connection_pool.disconnect()
    if found.source == "none":
        found.findings.append(_uninspected(where, found.error))
    else:
        found.findings += _findings(found, where)
    return found


def _uninspected(where: str, error: str) -> Finding:
    return Finding(
        "outbox.W007",
        WARNING,
        f"could not inspect {where} for eviction and persistence settings ({error})",
        "check that Redis is reachable; the outbox needs maxmemory-policy noeviction and AOF or RDB persistence",
    )


def _cluster_enabled(client: Redis) -> bool | None:
    """Whether ``client``'s server is a cluster node (``INFO cluster``); None when it
    refuses INFO.

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: Redis is unreachable.
    """
    try:
        info = client.info("cluster")
    except ResponseError:
        return None
    return bool(int(info["cluster_enabled"])) if "cluster_enabled" in info else None


def _address(client: Redis) -> str:
    """``host:port`` (or the socket path) of ``client``'s server."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', 6379)}"


def _alias_on_cluster_finding() -> Finding:
    alias = outbox_settings.REDIS_ALIAS
    return Finding(
        "outbox.E008",
        ERROR,
        f"the outbox's Redis, the django-redis alias {alias!r}, is a Redis Cluster node (cluster_enabled:1): "
        "django-redis has no cluster client, so every command on a key of another node's slots fails (MOVED)",
        "set OUTBOX['CLUSTER'] = {'NODES': ['redis://node1:7000', ...]} for the outbox's data (docs/operations.md, "
        "'Running on a cluster'), and give RQ's queues a plain Redis: RQ_QUEUES[...] = {'URL': 'redis://rq-host:6379/0'}",
    )


def rq_server_findings(timeout: float = INSPECT_TIMEOUT) -> list[Finding]:
    """outbox.E009: in cluster mode, an outbox queue of ``RQ_QUEUES`` is on a cluster node.

    RQ cannot run on a cluster (rq#1048, rq#2021; django-rq#280): its wake-up jobs need a
    plain Redis beside the cluster. Each server the outbox's queues use is asked ``INFO
    cluster`` once, with ``timeout``-second timeouts; a server that does not answer (or a
    queue missing from ``RQ_QUEUES``, outbox.E003) is not reported here. Nothing outside
    cluster mode (there the alias check, E008, covers RQ on the alias).

    Returns:
        One :class:`Finding` per RQ server that is a cluster node.
    """
    try:
        if outbox_settings.cluster is None:
            return []
    except ImproperlyConfigured:
        return []  # outbox.E001 reports it
    import django_rq  # django_rq reads Django settings when imported

    rq_queues = getattr(settings, "RQ_QUEUES", {})
    servers: dict[str, tuple[Redis, list[str]]] = {}
    for name in outbox_settings.queue_names:
        if name not in rq_queues:
            continue
        try:
            connection = django_rq.get_connection(name)
            where = _address(connection)
        except Exception:  # a malformed queue config: django-rq's own checks report it
            continue
        servers.setdefault(where, (connection, []))[1].append(name)
    findings = []
    for where, (connection, names) in servers.items():
        try:
            client = _quick_client(connection, timeout)
        except Exception:
            continue
        try:
            enabled = _cluster_enabled(client)
        except (RedisError, OSError):
            continue  # only a server that answers is judged
        finally:
            client.close()
            client.connection_pool.disconnect()
        if enabled:
            findings.append(
                Finding(
                    "outbox.E009",
                    ERROR,
                    f"RQ_QUEUES {', '.join(map(repr, names))} use {where}, a Redis Cluster node: RQ cannot run "
                    "on a cluster (rq#1048, rq#2021; django-rq#280), so no wake-up job would reach a worker",
                    "keep OUTBOX['CLUSTER'] for the outbox's data and give every outbox queue the same plain "
                    "Redis beside it, e.g. RQ_QUEUES[name] = {'URL': 'redis://rq-host:6379/0'}",
                )
            )
    return findings


def partition_findings(connection: Redis) -> list[Finding]:
    """outbox.E011: the setting ``OUTBOX["PARTITIONS"]`` differs from the count the data
    in Redis (``connection``'s, a server or a cluster) was written with. Two reads
    (``GET`` of :attr:`~outbox.store.keys.Keys.partitions_record`, ``EXISTS`` of the
    untagged destination set). Never raises: a read that fails finds nothing.

    Returns:
        Zero or one :class:`Finding`.
    """
    keys = Keys(outbox_settings.KEY_PREFIX, outbox_settings.partitions)
    try:
        recorded = connection.get(keys.partitions_record)
        written = (
            int(recorded) if recorded else (1 if connection.exists(keys.unpartitioned_destinations) else None)
        )
    except (RedisError, OSError, ValueError):
        return []
    if written is None or written == keys.partitions:
        return []
    return [
        Finding(
            "outbox.E011",
            ERROR,
            f"OUTBOX['PARTITIONS'] is {keys.partitions} but the outbox's data in Redis was written with "
            f"{written} partition(s): every message written before would be out of sight (its keys have "
            "other names)",
            f"set OUTBOX['PARTITIONS'] = {written} again; the count of a deployment cannot change while it "
            "holds messages (docs/operations.md, 'Running on a cluster')",
        )
    ]


def _quick_client(connection: Redis, timeout: float) -> Redis:
    """A new client for the same server as ``connection``, with ``timeout``-second timeouts."""

    return client_like(
        connection,
        max_connections=1,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry_on_timeout=False,
        retry=None,
    )


def shared_alias_findings() -> list[Finding]:
    """outbox.W005: the outbox's cache alias is one that a cache ``clear()`` may empty.

    django-redis implements ``cache.clear()`` as ``FLUSHDB`` on the alias's database:
    with ``OUTBOX["REDIS_ALIAS"] == "default"`` any ``django.core.cache.cache.clear()``
    (a library, a test helper, an admin action) deletes every message; the same when
    another alias in ``CACHES`` names the same server and database. Needs no Redis.
    Nothing in cluster mode: the outbox's data is not in the alias then.

    Returns:
        Zero or one :class:`Finding`.
    """

    try:
        if outbox_settings.cluster is not None:
            return []  # the outbox's data is on the cluster, not in the alias
    except ImproperlyConfigured:
        return []  # outbox.E001 reports it
    alias = outbox_settings.REDIS_ALIAS
    caches = getattr(settings, "CACHES", {})
    hint = (
        "give the outbox a cache alias of its own on a Redis database nothing else uses, e.g. "
        "CACHES['outbox'] = {'BACKEND': 'django_redis.cache.RedisCache', 'LOCATION': 'redis://host:6379/1'}, "
        "OUTBOX['REDIS_ALIAS'] = 'outbox', and RQ_QUEUES[...]['USE_REDIS_CACHE'] = 'outbox'"
    )
    if alias == "default":
        return [
            Finding(
                "outbox.W005",
                WARNING,
                "the outbox stores its messages in the 'default' cache alias: django.core.cache.cache.clear() "
                "(FLUSHDB) deletes every message",
                hint,
            )
        ]
    mine = _locations(caches.get(alias, {}))
    others = sorted(name for name, config in caches.items() if name != alias and mine & _locations(config))
    if mine and others:
        return [
            Finding(
                "outbox.W005",
                WARNING,
                f"the outbox's cache alias {alias!r} shares its Redis database with cache alias(es) "
                f"{', '.join(map(repr, others))}: clearing those caches (FLUSHDB) deletes every message",
                hint,
            )
        ]
    return []


def _locations(config: dict[str, Any]) -> set[str]:
    """Normalised ``LOCATION`` URLs of a django-redis cache config (``/0`` when no database)."""
    if "django_redis" not in str(config.get("BACKEND", "")):
        return set()
    location = config.get("LOCATION", [])
    urls = [location] if isinstance(location, str) else list(location)
    out = set()
    for url in urls:
        url = str(url).rstrip("/")
        tail = url.rsplit("/", 1)[-1]
        if not tail.isdigit():  # no database number: redis-py's default, 0
            url += "/0"
        out.add(url)
    return out


def startup_findings() -> list[Finding]:
    """Everything a worker should warn about at start: Redis's settings, a shared alias
    and, in cluster mode, RQ on a cluster node."""
    return inspect_redis().findings + shared_alias_findings() + rq_server_findings()


def log_startup_findings(logger: logging.Logger | None = None) -> list[Finding]:
    """Log each finding about the outbox's Redis: errors at ERROR, the rest at WARNING;
    none whose id is in ``SILENCED_SYSTEM_CHECKS`` (as ``manage.py check`` does).

    Meant for ``outbox_worker`` at start-up: ``log_startup_findings(logging.getLogger("outbox"))``.
    Never raises, whatever Redis does (an unreachable Redis is logged as outbox.W007).

    Args:
        logger: where to log; ``logging.getLogger("outbox.store.client.diagnostics")`` when None.

    Returns:
        The findings logged (silenced ones left out).
    """
    logger = logger or logging.getLogger(__name__)
    try:
        findings = startup_findings()
    except Exception as exc:  # never stop a worker from starting over a health report
        logger.warning("outbox: could not check the Redis settings: %s: %s", type(exc).__name__, exc)
        return []
    silenced = set(getattr(settings, "SILENCED_SYSTEM_CHECKS", ()))
    findings = [finding for finding in findings if finding.id not in silenced]
    for finding in findings:
        level = logging.ERROR if finding.level == ERROR else logging.WARNING
        logger.log(level, "%s: %s (%s)", finding.id, finding.msg, finding.hint)
    return findings
