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
``CLUSTER``            the outbox's data on a Redis or Valkey Cluster instead of the
                       alias's server (None: a single server through ``REDIS_ALIAS``).
                       A dict: ``{"NODES": ["redis://10.0.0.1:7000", ...], "USERNAME":
                       None, "PASSWORD": None, "SSL": False, "SSL_CA_CERTS": None,
                       "SSL_CERTFILE": None, "SSL_KEYFILE": None, "SSL_CERT_REQS":
                       "required", "SOCKET_TIMEOUT": 5, "SOCKET_CONNECT_TIMEOUT": 5,
                       "MAX_CONNECTIONS": None, "OPTIONS": {}}``: startup nodes
                       (``redis://`` or ``rediss://`` URLs, or ``host:port``; one reachable
                       node is enough), credentials, TLS, timeouts in seconds, the
                       connection cap per node, and further ``redis.cluster.RedisCluster``
                       keyword arguments. Only ``NODES`` is required. RQ cannot run on a
                       cluster: its queues stay on a plain Redis (``RQ_QUEUES``; checks
                       outbox.E009, W001). See ``outbox.conf.ClusterConfig`` and
                       ``docs/operations.md``, "Running on a cluster".
``KEY_PREFIX``         prefix of every Redis key the outbox writes (``"outbox"``).
``DEPLOYMENT``         the name of this deployment, stamped on every message captured in a
                       transaction so that a relay pushes only its own deployment's rows
                       (None: derived from the Redis address, or the cluster's nodes, and
                       ``KEY_PREFIX``). 1 to 64 letters, digits and ``._:-``, the same in
                       every process of the deployment. Set it when two deployments sharing
                       a database name the same address, or to keep the identity when Redis
                       moves. See :mod:`outbox.sending.deployment`.
``PARTITIONS``         partitions of the outbox's data (1): every key of a message carries
                       its partition's hash tag, so a Redis or Valkey Cluster spreads them
                       over its primaries (``docs/architecture.md``, "Partitions"). 1
                       keeps every key name as before partitions. On a cluster it must be
                       more than 1 (check outbox.E010; 64 or more on 3 to 6 primaries); it
                       cannot change once messages are written (check outbox.E011).
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
``METRICS_ENDPOINT_LABELS`` one ``destination`` label per endpoint registered at runtime
                       (True), or every endpoint's counts under one, ``endpoint:*`` (False,
                       the default: cardinality bounded by settings, not by customers).
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
                       :mod:`outbox.store.client.durability` and docs/operations.md.
``ORDERING``           what a dead letter does to its ordering key, for every destination
                       whose ``ORDERING`` does not say (``"block"``): ``"block"`` holds
                       the key's later messages until it is requeued, cancelled or
                       deleted; ``"skip"`` sets it aside and the key goes on. See
                       ``docs/concepts.md``, "Ordered delivery".
``ENDPOINTS``          endpoints registered at runtime (webhooks for a project's
                       customers; ``docs/webhooks.md``): ``{"SECRET_KEYS": [...],
                       "CACHE_TTL": 30, "VERSION_CHECK": 1, "SECRET_OVERLAP": 86400,
                       "ALLOW_UNKNOWN_EVENT_TYPES": False, "ALLOW_PRIVATE_NETWORKS":
                       False, "MAX_PAYLOAD_BYTES": None, "MAX_URL_LENGTH": 2048,
                       "MAX_RETRIES": None, "RETRY": None, "TIMEOUT": 10}``: the Fernet
                       keys that encrypt endpoint secrets at rest (the first encrypts, all
                       decrypt: prepend a new key to rotate), the seconds a worker keeps
                       an endpoint's configuration at most and between its checks of the
                       change counter, the seconds a rotated-out secret keeps signing,
                       publishing to (and subscribing to) types not in the catalogue,
                       receivers on private networks (tests, your own network), the
                       largest payload (None: ``MAX_BODY_BYTES``), the longest URL, the
                       retry budget and policy (None: the global ones) and the request
                       timeout of every endpoint. See :func:`endpoint_setting`.
``ORDERING_KEY_TTL``   seconds an ordering key's state (its sequence, the last delivered)
                       is kept after its last message left it (7 days); a key sent to
                       again later starts at sequence 1.
``MODEL_EVENTS``       model label -> options: publish ``<app>.<model>.created``,
                       ``.updated`` and ``.deleted`` to each row's application when its
                       transaction commits ({}). See :mod:`outbox.model_events`.
=====================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from outbox.retry import RetryPolicy

DEFAULTS: dict[str, Any] = {
    "REDIS_ALIAS": "default",
    "CLUSTER": None,
    "KEY_PREFIX": "outbox",
    "DEPLOYMENT": None,
    "PARTITIONS": 1,
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
    "METRICS_ENDPOINT_LABELS": False,
    "TRACING": True,
    "DURABILITY": {"REPLICAS": 0, "AOF": False, "TIMEOUT": 1.0},
    "ORDERING": "block",
    "ORDERING_KEY_TTL": 7 * 24 * 3600,
    "ENDPOINTS": {},
    "MODEL_EVENTS": {},
}

#: Keys of ``OUTBOX["ENDPOINTS"]`` (webhooks for a project's customers, docs/webhooks.md)
#: and their defaults.
ENDPOINT_DEFAULTS: dict[str, Any] = {
    "SECRET_KEYS": [],
    "CACHE_TTL": 30.0,
    "VERSION_CHECK": 1.0,
    "SECRET_OVERLAP": 24 * 3600,
    "ALLOW_UNKNOWN_EVENT_TYPES": False,
    "ALLOW_PRIVATE_NETWORKS": False,
    "MAX_PAYLOAD_BYTES": None,
    "MAX_URL_LENGTH": 2048,
    "MAX_RETRIES": None,
    "RETRY": None,
    "TIMEOUT": 10.0,
}

#: Settings renamed, old name -> new name: the old name is read when the new one is not
#: set (system check outbox.W011 says to rename it), and ``outbox_settings.<old>`` reads
#: the new one.
RENAMED = {"RECOVERY_GRACE": "LATE_AFTER"}

PRIORITIES = ("high", "default", "low")

#: Keys of a django-rq queue in ``RQ_QUEUES`` that name its Redis connection (the rest,
#: ``DEFAULT_TIMEOUT``, ``ASYNC``..., are the queue's own).
RQ_CONNECTION_KEYS = frozenset(
    {
        "HOST", "PORT", "DB", "URL", "PASSWORD", "USERNAME", "UNIX_SOCKET_PATH", "SENTINELS",
        "MASTER_NAME", "SOCKET_TIMEOUT", "SSL", "SSL_CERT_REQS", "CONNECTION_KWARGS",
        "SENTINEL_KWARGS", "REDIS_CLIENT_KWARGS", "USE_REDIS_CACHE",
    }
)  # fmt: skip
MAX_RETRIES_LIMIT = 1000

#: Keys of ``OUTBOX["CLUSTER"]`` and their defaults (``NODES`` has none: it is required).
CLUSTER_DEFAULTS: dict[str, Any] = {
    "USERNAME": None,
    "PASSWORD": None,
    "SSL": False,
    "SSL_CA_CERTS": None,
    "SSL_CERTFILE": None,
    "SSL_KEYFILE": None,
    "SSL_CERT_REQS": "required",
    "SOCKET_TIMEOUT": 5.0,
    "SOCKET_CONNECT_TIMEOUT": 5.0,
    "MAX_CONNECTIONS": None,
    "OPTIONS": {},
}
CLUSTER_CERT_REQS = ("required", "optional", "none")
#: ``OUTBOX["CLUSTER"]["OPTIONS"]`` keys that other keys (or the outbox itself) set.
CLUSTER_RESERVED_OPTIONS = {
    "startup_nodes": "NODES",
    "host": "NODES",
    "port": "NODES",
    "url": "NODES",
    "db": "NODES (a cluster has database 0 only)",
    "username": "USERNAME",
    "password": "PASSWORD",
    "ssl": "SSL",
    "ssl_ca_certs": "SSL_CA_CERTS",
    "ssl_certfile": "SSL_CERTFILE",
    "ssl_keyfile": "SSL_KEYFILE",
    "ssl_cert_reqs": "SSL_CERT_REQS",
    "socket_timeout": "SOCKET_TIMEOUT",
    "socket_connect_timeout": "SOCKET_CONNECT_TIMEOUT",
    "max_connections": "MAX_CONNECTIONS",
    "decode_responses": "nothing: the outbox reads bytes",
}


@dataclass(frozen=True)
class ClusterConfig:
    """``OUTBOX["CLUSTER"]``, checked (:func:`parse_cluster`).

    Attributes:
        nodes: startup nodes, (host, port); one reachable node is enough, the client
            learns the others from it.
        username: ACL user name, or None (``default``).
        password: password, or None.
        ssl: TLS to every node (a ``rediss://`` node URL sets it).
        ssl_ca_certs: CA bundle path to verify the nodes' certificates, or None (the
            system's).
        ssl_certfile: client certificate path (mutual TLS), or None.
        ssl_keyfile: the client certificate's key path, or None.
        ssl_cert_reqs: ``"required"``, ``"optional"`` or ``"none"`` (no verification).
        socket_timeout: seconds to wait for a reply, or None (for ever).
        socket_connect_timeout: seconds to wait for a connection, or None (for ever).
        max_connections: connections at most per node, or None (redis-py's default).
        options: further keyword arguments of ``redis.cluster.RedisCluster``.
    """

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_cert_reqs: str = "required"
    socket_timeout: float | None = 5.0
    socket_connect_timeout: float | None = 5.0
    max_connections: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``redis.cluster.RedisCluster`` but its startup nodes
        (``decode_responses=False``: the outbox reads bytes); TLS arguments only with TLS."""
        kwargs: dict[str, Any] = {
            "username": self.username,
            "password": self.password,
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "decode_responses": False,
        }
        if self.max_connections is not None:
            kwargs["max_connections"] = self.max_connections
        if self.ssl:
            kwargs.update(
                ssl=True,
                ssl_ca_certs=self.ssl_ca_certs,
                ssl_certfile=self.ssl_certfile,
                ssl_keyfile=self.ssl_keyfile,
                ssl_cert_reqs=self.ssl_cert_reqs,
            )
        return {**kwargs, **self.options}

    @property
    def where(self) -> str:
        """The startup nodes as ``host:port, ...``, without credentials (for messages)."""
        return ", ".join(f"{host}:{port}" for host, port in self.nodes)


def parse_cluster(value: Any) -> ClusterConfig | None:
    """Check ``OUTBOX["CLUSTER"]`` (see the settings table) and return it as a
    :class:`ClusterConfig`; None for None (no cluster). No error text shows a password.

    Raises:
        ValueError: a key is unknown or has a wrong value; the message names it
            (``OUTBOX['CLUSTER']['NODES'][1]: ...``).
    """
    if value is None:
        return None
    name = "OUTBOX['CLUSTER']"
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict such as {{'NODES': ['redis://host:7000']}}, or None")
    unknown = sorted(set(value) - set(CLUSTER_DEFAULTS) - {"NODES"})
    if unknown:
        raise ValueError(
            f"{name} has unknown key(s) {', '.join(map(repr, unknown))}; known keys: NODES, "
            + ", ".join(CLUSTER_DEFAULTS)
        )
    merged = {**CLUSTER_DEFAULTS, **value}
    for key in ("USERNAME", "PASSWORD", "SSL_CA_CERTS", "SSL_CERTFILE", "SSL_KEYFILE"):
        if merged[key] is not None and not (isinstance(merged[key], str) and merged[key]):
            raise ValueError(f"{name}[{key!r}] must be a non-empty string or None")
    if not isinstance(merged["SSL"], bool):
        raise ValueError(f"{name}['SSL'] must be True or False, not {merged['SSL']!r}")
    if merged["SSL_CERT_REQS"] not in CLUSTER_CERT_REQS:
        raise ValueError(
            f"{name}['SSL_CERT_REQS'] must be one of {', '.join(map(repr, CLUSTER_CERT_REQS))}, "
            f"not {merged['SSL_CERT_REQS']!r}"
        )
    for key in ("SOCKET_TIMEOUT", "SOCKET_CONNECT_TIMEOUT"):
        seconds = merged[key]
        if seconds is not None and not (
            isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0
        ):
            raise ValueError(f"{name}[{key!r}] must be seconds (a number > 0) or None, not {seconds!r}")
    cap = merged["MAX_CONNECTIONS"]
    if cap is not None and not (isinstance(cap, int) and not isinstance(cap, bool) and cap > 0):
        raise ValueError(f"{name}['MAX_CONNECTIONS'] must be an int > 0 or None, not {cap!r}")
    options = merged["OPTIONS"]
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ValueError(f"{name}['OPTIONS'] must be a dict of RedisCluster keyword arguments")
    for key in options:
        if key in CLUSTER_RESERVED_OPTIONS:
            raise ValueError(
                f"{name}['OPTIONS'][{key!r}] is not allowed: set {CLUSTER_RESERVED_OPTIONS[key]}"
            )
    nodes, scheme, username, password = _parse_nodes(value.get("NODES"), f"{name}['NODES']")
    if scheme == "rediss" and value.get("SSL") is False:
        raise ValueError(f"{name}['SSL'] is False but NODES are rediss:// URLs (TLS)")
    return ClusterConfig(
        nodes=nodes,
        username=merged["USERNAME"] if merged["USERNAME"] is not None else username,
        password=merged["PASSWORD"] if merged["PASSWORD"] is not None else password,
        ssl=merged["SSL"] or scheme == "rediss",
        ssl_ca_certs=merged["SSL_CA_CERTS"],
        ssl_certfile=merged["SSL_CERTFILE"],
        ssl_keyfile=merged["SSL_KEYFILE"],
        ssl_cert_reqs=merged["SSL_CERT_REQS"],
        socket_timeout=merged["SOCKET_TIMEOUT"],
        socket_connect_timeout=merged["SOCKET_CONNECT_TIMEOUT"],
        max_connections=cap,
        options=dict(options),
    )


def _parse_nodes(value: Any, name: str) -> tuple[tuple[tuple[str, int], ...], str, str | None, str | None]:
    """(nodes, URL scheme or "", username, password) of ``NODES``: a non-empty list of
    ``redis://[user:password@]host[:port][/0]``, ``rediss://...`` or ``host:port``, all
    of one scheme and one set of credentials.

    Raises:
        ValueError: naming the bad item (its credentials masked).
    """
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{name} is required: a non-empty list such as ['redis://10.0.0.1:7000']")
    nodes: list[tuple[str, int]] = []
    seen: set[tuple[str, str | None, str | None]] = set()
    for i, item in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(item, str) or not item.strip():
            raise ValueError(
                f"{where} must be a string such as 'redis://10.0.0.1:7000', not {type(item).__name__}"
            )
        text = item.strip() if "://" in item else f"//{item.strip()}"
        try:
            parts = urlsplit(text)
            port = parts.port or 6379
        except ValueError as exc:
            raise ValueError(f"{where} = {_masked(item)!r} is not a node address: {exc}") from None
        if parts.scheme not in ("", "redis", "rediss"):
            raise ValueError(
                f"{where} = {_masked(item)!r}: use redis:// or rediss:// (TLS), not {parts.scheme}://"
            )
        if not parts.hostname:
            raise ValueError(f"{where} = {_masked(item)!r} names no host")
        if parts.path not in ("", "/", "/0"):
            raise ValueError(f"{where} = {_masked(item)!r}: a cluster has database 0 only")
        if parts.query or parts.fragment:
            raise ValueError(
                f"{where} = {_masked(item)!r}: options go in other OUTBOX['CLUSTER'] keys, not the URL"
            )
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        seen.add((parts.scheme, username, password))
        if len(seen) > 1:
            raise ValueError(f"{where} = {_masked(item)!r}: every node needs the same scheme and credentials")
        nodes.append((parts.hostname, port))
    scheme, username, password = seen.pop()
    return tuple(dict.fromkeys(nodes)), scheme, username, password


def _masked(url: str) -> str:
    """``url`` with the password of its user part replaced by ``***``."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, userinfo = head.rpartition("//")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}//{user}:***@{tail}" if scheme else f"{user}:***@{tail}"


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

    def __getattr__(self, asked: str) -> Any:
        # Called only for a name not in the instance's __dict__: the value found is put
        # there too, so the next read of it is a plain attribute read (send() reads
        # several settings per call); :meth:`reload` takes them out again.
        name = RENAMED.get(asked, asked)
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(asked)
        if name not in self._cache:
            user = self.user_settings
            old = [o for o, new in RENAMED.items() if new == name and o in user]
            value = user.get(name, user[old[0]] if old else DEFAULTS[name])
            if name == "EVENTS_CHANNEL" and value == "":
                value = f"{self.KEY_PREFIX}:events"
            self._cache[name] = value
        value = self._cache[name]
        self.__dict__[asked] = value
        return value

    @property
    def partitions(self) -> int:
        """``PARTITIONS``, checked: an int from 1 to 16,384 (one hash slot each at most).

        Raises:
            ImproperlyConfigured: it is not such an int.
        """
        value = self.PARTITIONS
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 16384:
            raise ImproperlyConfigured(f"OUTBOX['PARTITIONS'] must be an int from 1 to 16384, not {value!r}")
        return int(value)

    @property
    def cluster(self) -> ClusterConfig | None:
        """``OUTBOX["CLUSTER"]`` checked (:func:`parse_cluster`), or None: no cluster.

        Raises:
            ImproperlyConfigured: the setting is invalid; the message names the bad key.
        """
        if "_cluster" not in self._cache:
            try:
                self._cache["_cluster"] = parse_cluster(self.CLUSTER)
            except ValueError as exc:
                raise ImproperlyConfigured(str(exc)) from exc
        config: ClusterConfig | None = self._cache["_cluster"]
        return config

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
        for name in [n for n in self.__dict__ if n != "_cache"]:
            del self.__dict__[name]


outbox_settings = OutboxSettings()


def endpoint_setting(name: str) -> Any:
    """``OUTBOX["ENDPOINTS"][name]``, else its default (:data:`ENDPOINT_DEFAULTS`).

    Raises:
        ImproperlyConfigured: ``OUTBOX["ENDPOINTS"]`` is not a dict, or has a key
            :data:`ENDPOINT_DEFAULTS` does not know.
        KeyError: ``name`` is not such a key (a bug of the caller).
    """
    value = outbox_settings.ENDPOINTS
    if value is _endpoints_checked[0] and len(value) == _endpoints_checked[1]:
        return value.get(name, ENDPOINT_DEFAULTS[name])  # publish() reads several per call
    if not isinstance(value, dict):
        raise ImproperlyConfigured("OUTBOX['ENDPOINTS'] must be a dict")
    unknown = sorted(set(value) - set(ENDPOINT_DEFAULTS))
    if unknown:
        raise ImproperlyConfigured(
            f"OUTBOX['ENDPOINTS'] has unknown key(s) {', '.join(map(repr, unknown))}; known: "
            + ", ".join(ENDPOINT_DEFAULTS)
        )
    _endpoints_checked[:] = [value, len(value)]
    return value.get(name, ENDPOINT_DEFAULTS[name])


#: The ``OUTBOX["ENDPOINTS"]`` dict :func:`endpoint_setting` checked last, and its size.
_endpoints_checked: list[Any] = [None, -1]


@receiver(setting_changed)
def _reload_settings(*, setting: str, **kwargs: Any) -> None:
    if setting in ("OUTBOX", "CACHES", "RQ_QUEUES", "RQ"):
        outbox_settings.reload()
