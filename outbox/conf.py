"""The outbox's settings: one object over the ``OUTBOX`` dict in Django settings.

Read settings as ``from outbox.conf import outbox_settings; outbox_settings.MAX_RETRIES``.
Values are read lazily and cached; the cache is dropped on Django's
``setting_changed`` signal (so ``override_settings`` works in tests).

Keys of ``OUTBOX`` (all optional but ``DESTINATIONS``):

=====================  ==========================================================
``REDIS_ALIAS``        django-redis cache alias whose connection the outbox uses
                       (default ``"default"``; a dedicated alias is better, see
                       ``outbox.W005``). Point django-rq's queues at the same alias with
                       ``USE_REDIS_CACHE``: workers listen where the wake-up jobs go.
``KEY_PREFIX``         prefix of every Redis key the outbox writes (``"outbox"``).
``QUEUES``             priority -> django-rq queue name
                       (``{"high": "outbox_high", "default": "outbox", "low": "outbox_low"}``).
``DESTINATIONS``       name -> ``{"TRANSPORT": alias or dotted path, "OPTIONS": {...},
                       "MAX_RETRIES": n, "RETRY": policy, "MAX_IN_FLIGHT": n,
                       "BREAKER": ..., "RATE_LIMIT": ..., "MAX_CONCURRENCY": n,
                       "DISABLE_AFTER": seconds}`` (see :mod:`outbox.destinations`).
``MAX_RETRIES``        retries after the first attempt before a message is failed (10).
``RETRY``              default retry policy, see :mod:`outbox.retry`.
``MAX_BODY_BYTES``     largest accepted body in bytes (1 MiB).
``VISIBILITY_TIMEOUT`` seconds a claimed message may stay ``sending`` before the
                       recovery sweep takes it back (300): the lease. A worker starts
                       no attempt it could not finish within half of it.
``RECOVERY_INTERVAL``  seconds between recovery sweeps in ``outbox_worker`` (30).
``LATE_AFTER``         seconds a due message may wait before the dashboard shows it
                       as late (60). Its old name ``RECOVERY_GRACE`` (before 0.2) is
                       still read when ``LATE_AFTER`` is not set (check outbox.W011).
``BATCH_SIZE``         most messages one claim takes (100).
``CONCURRENCY``        attempts in flight at once per worker process (32; threads).
``MAX_IN_FLIGHT``      cap of attempts in flight per destination per worker process;
                       a destination's ``MAX_IN_FLIGHT`` overrides it. Unset (16), it
                       is a share, so one slow receiver cannot take the whole pool: a
                       destination alone busy in a run, whose attempts succeed within
                       1 s, borrows the idle slots up to ``CONCURRENCY`` minus a
                       quarter (24 of 32), and gives them back at the first claim that
                       meets another destination's message. Set (here or per
                       destination), it is a hard limit. A callable destination (no
                       receiver: it runs in the worker) defaults to ``CONCURRENCY``.
``WAKE_INTERVAL``      seconds between checks, in each ``outbox_worker``, for due
                       messages (retries, delays) whose queue has no wake-up job (1).
``RELAY_INTERVAL``     seconds between relay passes in each ``outbox_worker``, pushing
                       messages captured in the database that did not reach Redis (1).
``RELAY_AFTER``        seconds a captured message is left to the on-commit fast path
                       before the relay pushes it (5).
``ATTEMPTS_KEPT``      attempt records kept per message on its list, newest first (50);
                       the first success is kept in the resend record besides.
``EVENTS_CHANNEL``     Redis Pub/Sub channel for outcome events (``"<prefix>:events"``),
                       or None to publish nothing.
``RETENTION``          status -> seconds a finished message is kept before the recovery
                       sweep deletes it (None = for ever). Default: succeeded 7 days,
                       cancelled 30 days, failed (dead letters) for ever.
``BREAKER``            default circuit breaker of every destination (see
                       ``docs/destinations.md``): ``{"FAILURES": 5, "FAILURE_RATE": 0.5,
                       "MIN_ATTEMPTS": 20, "WINDOW": 300, "COOLDOWN": 15,
                       "MAX_COOLDOWN": 600}``; a destination's ``BREAKER`` dict overrides
                       keys of it, ``False`` turns its breaker off.
``RATE_LIMIT``         default rate limit per destination across all workers (None):
                       ``"100/s"``, ``"6000/m"`` or ``{"RATE": 100, "PER": 1.0, "BURST": 10}``.
``MAX_CONCURRENCY``    default cap of attempts in flight per destination across all
                       workers (None = no cap).
``DISABLE_AFTER``      seconds a destination may fail continuously before it is disabled
                       (3 days; None = never).
``ALERTS``             alerts about destination events (see ``docs/destinations.md``, "Alerts"):
                       ``{"SUPPRESS": 900, "EMAIL_ADMINS": None, "WEBHOOK": None,
                       "EVENTS": None}``: seconds between two alerts of one event about
                       one destination, the email destination that mails ``ADMINS``, the
                       webhook destination of operational webhooks, the events alerted
                       (None = all). Unset: Django signals only (:mod:`outbox.alerts`).
``BLOCK_PRIVATE_NETWORKS``
                       refuse webhook connections to loopback, private, link-local
                       (cloud metadata) and other non-public addresses, checked after
                       name resolution on every connection (True). A webhook destination
                       opts out with ``OPTIONS["allow_private_networks"] = True``.
``EAGER``              a test setting: ``send()`` and ``send_many()`` deliver inside the
                       call, in the calling process, with the worker's code (False).
                       Inside ``transaction.atomic`` too: the message is written and
                       delivered at once, not captured until commit (as Celery's
                       ``task_always_eager`` runs a task at call time). A failure is
                       recorded and its retry left waiting. Never in production.
``METRICS_TOKEN``      bearer token (str, or a list while rotating) that lets a scraper
                       read ``outbox.metrics.views.metrics``; staff users always may (None).
``METRICS_REGISTER``   register the Prometheus collector on ``prometheus_client.REGISTRY``
                       when Django starts, for django-prometheus's ``/metrics`` (False).
``TRACING``            OpenTelemetry spans around ``send()`` and each delivery attempt,
                       when ``opentelemetry-api`` is installed (True); see :mod:`outbox.tracing`.
``DURABILITY``         what a write of new messages (``send()``, ``send_many()``, the push of
                       captured messages) waits for before it returns (no wait):
                       ``{"REPLICAS": n, "AOF": False, "TIMEOUT": 1.0}``. ``REPLICAS`` n > 0:
                       ``WAIT n``, n replicas received it; ``AOF``: ``WAITAOF 1 n``, the
                       primary (``appendonly yes``) and n replicas fsynced it to their AOF
                       (Redis/Valkey 7.2+); ``TIMEOUT``: seconds at most. Not met in time:
                       ``send()`` raises ``NotDurable`` (the message is written); inside a
                       transaction the captured row stays for the relay. See
                       :mod:`outbox.store.durability` and docs/operations.md.
=====================  ==========================================================
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from outbox.retry import RetryPolicy

DEFAULTS: dict[str, Any] = {
    "REDIS_ALIAS": "default",
    "KEY_PREFIX": "outbox",
    "QUEUES": {"high": "outbox_high", "default": "outbox", "low": "outbox_low"},
    "DESTINATIONS": {},
    "MAX_RETRIES": 10,
    "RETRY": {"strategy": "exponential", "base": 10, "factor": 2, "max_delay": 6 * 3600, "jitter": "equal"},
    "MAX_BODY_BYTES": 1024 * 1024,
    "VISIBILITY_TIMEOUT": 300,
    "RECOVERY_INTERVAL": 30,
    "LATE_AFTER": 60,
    "BATCH_SIZE": 100,
    "CONCURRENCY": 32,
    "MAX_IN_FLIGHT": 16,
    "WAKE_INTERVAL": 1.0,
    "RELAY_INTERVAL": 1.0,
    "RELAY_AFTER": 5.0,
    "ATTEMPTS_KEPT": 50,
    "EVENTS_CHANNEL": "",  # "" means "<KEY_PREFIX>:events"
    "RETENTION": {"succeeded": 7 * 24 * 3600, "cancelled": 30 * 24 * 3600, "failed": None},
    "BLOCK_PRIVATE_NETWORKS": True,
    "BREAKER": {
        "FAILURES": 5,
        "FAILURE_RATE": 0.5,
        "MIN_ATTEMPTS": 20,
        "WINDOW": 300,
        "COOLDOWN": 15,
        "MAX_COOLDOWN": 600,
    },
    "RATE_LIMIT": None,
    "MAX_CONCURRENCY": None,
    "DISABLE_AFTER": 3 * 24 * 3600,
    "ALERTS": {},
    "EAGER": False,
    "METRICS_TOKEN": None,
    "METRICS_REGISTER": False,
    "TRACING": True,
    "DURABILITY": {"REPLICAS": 0, "AOF": False, "TIMEOUT": 1.0},
}

#: Settings renamed, old name -> new name: the old name is read when the new one is not
#: set (system check outbox.W011 says to rename it), and ``outbox_settings.<old>`` reads
#: the new one.
RENAMED = {"RECOVERY_GRACE": "LATE_AFTER"}

PRIORITIES = ("high", "default", "low")
MAX_RETRIES_LIMIT = 1000


class OutboxSettings:
    """Attribute access to ``settings.OUTBOX`` merged over :data:`DEFAULTS`.

    Raises:
        AttributeError: for a name that is not a setting.
    """

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(settings, "OUTBOX", {})
        if not isinstance(value, dict):
            raise ImproperlyConfigured("settings.OUTBOX must be a dict")
        return value

    def __getattr__(self, name: str) -> Any:
        name = RENAMED.get(name, name)
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(name)
        if name not in self._cache:
            user = self.user_settings
            old = [o for o, new in RENAMED.items() if new == name and o in user]
            value = user.get(name, user[old[0]] if old else DEFAULTS[name])
            if name == "EVENTS_CHANNEL" and value == "":
                value = f"{self.KEY_PREFIX}:events"
            self._cache[name] = value
        return self._cache[name]

    @property
    def retry_policy(self) -> RetryPolicy:
        """The global default :class:`RetryPolicy`.

        Raises:
            ImproperlyConfigured: ``OUTBOX["RETRY"]`` is not a valid policy.
        """
        policy = self._cache.get("_retry_policy")
        if not isinstance(policy, RetryPolicy):
            try:
                policy = self._cache["_retry_policy"] = RetryPolicy.from_value(self.RETRY)
            except ValueError as exc:
                raise ImproperlyConfigured(f"OUTBOX['RETRY']: {exc}") from exc
        return policy

    def queue_name(self, priority: str | None) -> str:
        """The django-rq queue name for a priority (None means ``"default"``).

        Raises:
            ValueError: the priority is not one of ``high``, ``default``, ``low``.
        """
        priority = priority or "default"
        names: dict[str, str] | None = self._cache.get("_queue_names")
        if names is None:
            names = self._cache["_queue_names"] = {p: self.QUEUES[p] for p in PRIORITIES}
        try:
            return names[priority]
        except KeyError:
            raise ValueError(f"priority must be one of {PRIORITIES}, not {priority!r}") from None

    @property
    def queue_names(self) -> list[str]:
        """Queue names in the order workers listen to them: high, default, low."""
        seen: list[str] = []
        for priority in PRIORITIES:
            name = self.QUEUES[priority]
            if name not in seen:
                seen.append(name)
        return seen

    def reload(self) -> None:
        """Drop cached values. Modules that derive state from settings drop theirs on
        ``setting_changed`` with receivers of their own."""
        self._cache.clear()


outbox_settings = OutboxSettings()


@receiver(setting_changed)
def _reload_settings(*, setting: str, **kwargs: Any) -> None:
    if setting in ("OUTBOX", "CACHES", "RQ_QUEUES", "RQ"):
        outbox_settings.reload()
