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
=============  ======================================================================
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from redis import Redis
from redis.exceptions import RedisError, ResponseError

from outbox.conf import outbox_settings
from outbox.store.connection import client_like, get_connection

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
        source: ``"config"`` (``CONFIG GET`` answered), ``"info"`` (the fallback), or
            ``"none"`` (Redis could not be inspected).
        error: why Redis could not be inspected, when ``source`` is ``"none"``.
        findings: what is wrong, see the module docstring.
    """

    maxmemory_policy: str | None = None
    maxmemory: int | None = None
    appendonly: bool | None = None
    save: str | None = None
    source: str = "none"
    error: str = ""
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
    about ``timeout`` seconds per attempt and never hangs a ``manage.py`` command.

    Args:
        connection: a redis-py client; the outbox's (:func:`outbox.store.connection.get_connection`)
            when None.
        timeout: seconds for connecting and for each reply.

    Returns:
        A :class:`RedisSettings` with its findings (codes E006, W004, W006, W007; see the
        module docstring). It never raises: an unreachable Redis gives ``source="none"``
        and one outbox.W007 finding.
    """

    found = RedisSettings()
    try:
        client = _quick_client(connection or get_connection(), timeout)
    except Exception as exc:  # ImproperlyConfigured, a broken pool: report, never raise
        found.error = f"{type(exc).__name__}: {exc}"
    else:
        try:
            if not _read_config(client, found) and not _read_info(client, found):
                found.error = "it refused both CONFIG GET and INFO"
        except (RedisError, OSError) as exc:
            found.error = f"{type(exc).__name__}: {exc}"
        finally:
            client.close()
            client.connection_pool.disconnect()
    where = "the outbox's Redis"
    if found.source == "none":
        found.findings.append(
            Finding(
                "outbox.W007",
                WARNING,
                f"could not inspect {where} for eviction and persistence settings ({found.error})",
                "check that Redis is reachable; the outbox needs maxmemory-policy noeviction and AOF or RDB persistence",
            )
        )
    else:
        found.findings += _findings(found, where)
    return found


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

    Returns:
        Zero or one :class:`Finding`.
    """

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
    """Everything a worker should warn about at start: Redis's settings and a shared alias."""
    return inspect_redis().findings + shared_alias_findings()


def log_startup_findings(logger: logging.Logger | None = None) -> list[Finding]:
    """Log each finding about the outbox's Redis: errors at ERROR, the rest at WARNING;
    none whose id is in ``SILENCED_SYSTEM_CHECKS`` (as ``manage.py check`` does).

    Meant for ``outbox_worker`` at start-up: ``log_startup_findings(logging.getLogger("outbox"))``.
    Never raises, whatever Redis does (an unreachable Redis is logged as outbox.W007).

    Args:
        logger: where to log; ``logging.getLogger("outbox.store.diagnostics")`` when None.

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
