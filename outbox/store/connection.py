"""The outbox's Redis connection and repository, from the django-redis alias in settings."""

from __future__ import annotations

from functools import cache
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django_redis import get_redis_connection
from redis import ConnectionPool, Redis
from redis.exceptions import ClusterDownError, ReadOnlyError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from outbox.conf import outbox_settings
from outbox.store import MessageRepository

IDEMPOTENCY_TTL = 24 * 3600  # seconds; as long as Stripe keeps idempotency keys
WAKE_TTL = 60.0  # seconds a queue's wake-up flag lives if no job clears it

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
)


def get_connection() -> Redis:
    """The redis-py client of the django-redis cache alias ``OUTBOX["REDIS_ALIAS"]``.

    Raises:
        ImproperlyConfigured: the alias is not a django-redis cache.
    """

    alias = outbox_settings.REDIS_ALIAS
    try:
        connection: Redis = get_redis_connection(alias)  # django-redis ships no types
    except (NotImplementedError, KeyError) as exc:
        raise ImproperlyConfigured(
            f"OUTBOX['REDIS_ALIAS'] = {alias!r} must name a django-redis cache in CACHES"
        ) from exc
    return connection


def client_like(client: Redis, *, max_connections: int | None = None, **overrides: Any) -> Redis:
    """A new client on a connection pool of its own, to the server of ``client``'s pool with
    its options (``connection_kwargs``: address, credentials, TLS, timeouts), ``overrides``
    replacing some of them (``socket_timeout=None``: no read timeout).

    For connections whose options must differ from the alias's without changing the
    alias's pool: RQ's blocking wait (:func:`outbox.delivery.worker.waiting_connection`), quick
    inspections (:mod:`outbox.store.diagnostics`).

    Returns:
        A :class:`redis.Redis`; close its pool (``connection_pool.disconnect()``) when done.
    """
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, **overrides}
    own = ConnectionPool(connection_class=pool.connection_class, max_connections=max_connections, **kwargs)
    return Redis(connection_pool=own)


def ping() -> None:
    """Send PING to the outbox's Redis (the alias's client and its timeouts).

    Raises:
        redis.exceptions.RedisError: Redis did not answer.
    """
    get_connection().ping()


def empty_database() -> Redis:
    """Empty the outbox's Redis database (``FLUSHDB``) and return its client: for tests
    only (:func:`outbox.testing.state.empty_outbox`)."""
    connection = get_connection()
    connection.flushdb()
    return connection


@cache
def get_repository() -> MessageRepository:
    """The process-wide :class:`MessageRepository` built from settings (cached)."""
    return MessageRepository(
        get_connection(),
        outbox_settings.KEY_PREFIX,
        attempts_kept=outbox_settings.ATTEMPTS_KEPT,
        events_channel=outbox_settings.EVENTS_CHANNEL or "",
        idempotency_ttl=IDEMPOTENCY_TTL,
        wake_ttl=WAKE_TTL,
        partitions=outbox_settings.partitions,
    )


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("OUTBOX", "CACHES"):
        get_repository.cache_clear()


def redis_location() -> str:
    """``host:port/db`` of the outbox's Redis (from ``CACHES``), without credentials."""
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
