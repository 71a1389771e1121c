"""Django system checks for the outbox's settings (``python manage.py check``).

=============  =====================================================================
id             problem
=============  =====================================================================
outbox.E001    ``OUTBOX`` has unknown keys or a value of the wrong type (also an invalid
               global ``BREAKER``, ``RATE_LIMIT``, ``MAX_CONCURRENCY``, ``DISABLE_AFTER``,
               ``DURABILITY``, ``ORDERING``, ``ORDERING_KEY_TTL``)
outbox.E002    a destination is malformed (its ``BREAKER``, ``RATE_LIMIT``... included), or
               its transport refuses its options
outbox.E003    an outbox queue is missing from ``RQ_QUEUES``
outbox.E004    ``OUTBOX["REDIS_ALIAS"]`` is not a django-redis cache (not checked in
               cluster mode, where the outbox's data is not in the alias)
outbox.E005    ``OUTBOX["RETRY"]`` or ``MAX_RETRIES`` is invalid
outbox.W001    an outbox queue in ``RQ_QUEUES`` does not use ``USE_REDIS_CACHE`` with
               the outbox's alias: workers would listen on another Redis than the
               one the outbox enqueues its wake-up jobs on. In cluster mode
               (``OUTBOX["CLUSTER"]``) RQ must have a plain Redis of its own, so that is
               expected; W001 then says when the outbox queues are not all on the same
               connection (an ``outbox_worker`` listens to its queues on one)
outbox.W002    no destinations are configured, nor endpoints (``ENDPOINTS["SECRET_KEYS"]``)
outbox.W003    a destination's attempt deadline (``Transport.longest_attempt()``, enforced
               by the transport) is longer than half the visibility timeout, or the
               transport has none, so its lease can run out mid-attempt (a duplicate
               delivery)
outbox.E006    the outbox's Redis evicts any key at its ``maxmemory`` (``allkeys-*``):
               accepted messages vanish (see :mod:`outbox.store.client.diagnostics`)
outbox.W004    the outbox's Redis has no persistence (neither AOF nor RDB)
outbox.W005    the outbox uses the ``default`` cache alias (or shares its database with
               another alias), which ``cache.clear()`` empties (not in cluster mode)
outbox.W006    the outbox's Redis has another eviction policy than ``noeviction``
outbox.W007    the outbox's Redis could not be inspected
outbox.E007    ``OUTBOX["ALERTS"]`` is invalid: unknown keys or events, ``SUPPRESS`` not
               a positive number, or a channel naming a destination that does not
               exist or has the wrong transport (see :mod:`outbox.alerts`)
outbox.W008    ``OUTBOX["ALERTS"]["EMAIL_ADMINS"]`` is set but ``settings.ADMINS`` is empty
outbox.W009    ``OUTBOX["ALERTS"]["WEBHOOK"]`` names a webhook destination without a
               ``secret``: operational webhooks would go unsigned
outbox.W010    a webhook's host is (or resolves only to) a loopback, private or other
               non-public address that ``OUTBOX["BLOCK_PRIVATE_NETWORKS"]`` refuses: every
               message to it would be a dead letter (``blocked_address``) at its first
               attempt. ``OPTIONS["allow_private_networks"] = True`` allows it
outbox.E012    ``OUTBOX["ENDPOINTS"]`` is invalid (unknown keys, ``SECRET_KEYS`` not Fernet
               keys), or endpoints exist and no key is configured
outbox.E013    an endpoint's stored secrets cannot be decrypted with ``SECRET_KEYS`` (a
               wrong key, or the key that encrypted them removed): its deliveries wait
               (the endpoint paused) until it is fixed and the endpoint enabled (a
               database check: ``manage.py check --database default``, and ``migrate``)
outbox.W011    a setting has its old name (``RECOVERY_GRACE``, now ``LATE_AFTER``)
outbox.E008    the server of ``OUTBOX["REDIS_ALIAS"]`` is a Redis Cluster node
               (``INFO cluster`` says ``cluster_enabled:1``): django-redis has no cluster
               client, so keys of other nodes' slots answer ``MOVED``. Set
               ``OUTBOX["CLUSTER"]`` instead
outbox.E009    ``OUTBOX["CLUSTER"]`` is set and an outbox queue in ``RQ_QUEUES`` is on a
               cluster node: RQ cannot run on a cluster (rq#1048, rq#2021;
               django-rq#280). Give RQ a plain Redis beside the cluster
outbox.E010    ``OUTBOX["CLUSTER"]`` is set and ``OUTBOX["PARTITIONS"]`` is 1: a cluster
               needs partitions (hash-tagged keys; docs/operations.md, "Running on a
               cluster"). ``PARTITIONS`` that is not an int from 1 to 16,384 is E001
outbox.E011    ``OUTBOX["PARTITIONS"]`` is not the count the data in Redis was written
               with (:func:`outbox.store.client.diagnostics.partition_findings`): it cannot
               change while the deployment holds messages
=============  =====================================================================

Messages never print secret values: every error text goes through
:func:`outbox.redaction.redact` with the secrets of every configured destination.

The Redis checks (tag ``outbox_redis``: E006, W004, W006, W007, E008, E009, E011) make a few
round trips of their own with 1-second timeouts, on every command that runs checks (in
cluster mode to every primary, and to RQ's Redis); an unreachable Redis gives the
warning W007, never an error, and E008/E009 are reported only by a server that answers.
Select or skip them like any tag (``manage.py check --tag outbox_redis``), or silence ids
with ``SILENCED_SYSTEM_CHECKS``.

The address check (tag ``outbox_network``: W010) judges IP literals at once and
resolves host names (``localhost`` included) as a delivery would, each lookup given at
most 1 second and all of them :data:`ADDRESS_CHECK_BUDGET` seconds together; a name
that does not resolve then (no DNS at build time) is not reported.
"""

from __future__ import annotations

import ipaddress
import time
from typing import Any
from urllib.parse import urlsplit

import httpcore
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from outbox.alerts import admin_addresses, channel_problems, parse_alert_settings
from outbox.conf import (
    DEFAULTS,
    PRIORITIES,
    RENAMED,
    RQ_CONNECTION_KEYS,
    ClusterConfig,
    endpoint_setting,
    outbox_settings,
    parse_cluster,
)
from outbox.destinations import secrets as secret_store
from outbox.destinations.config import (
    configuration_errors,
    parse_ordering,
    usable_destinations,
    validate_max_retries,
)
from outbox.destinations.limits import BreakerConfig, RateLimit, parse_disable_after, parse_max_concurrency
from outbox.redaction import redact, secrets_for
from outbox.retry import RetryPolicy
from outbox.store.client import diagnostics as redis_health
from outbox.store.client.connection import cluster_option_names
from outbox.store.client.durability import Durability
from outbox.transports.ssrf import environment_proxy, is_public_address, resolve
from outbox.transports.webhook import WebhookTransport, url_host

POSITIVE_NUMBERS = (
    "MAX_BODY_BYTES",
    "VISIBILITY_TIMEOUT",
    "RECOVERY_INTERVAL",
    "LATE_AFTER",
    "BATCH_SIZE",
    "ATTEMPTS_KEPT",
    "ORDERING_KEY_TTL",
)
#: Seconds outbox.W010's name lookups may take together (each at most 1 second).
ADDRESS_CHECK_BUDGET = 2.0


@register()
def check_outbox_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every ``outbox.*`` problem of the settings (see the module docstring), secrets redacted."""
    return _redacted(_check())


def _redacted(errors: list[CheckMessage]) -> list[CheckMessage]:
    """``errors`` with the configured secrets masked in their texts (changed in place)."""
    secrets = _configured_secrets()
    for error in errors:
        error.msg = redact(str(error.msg), secrets=secrets)
        if error.hint:
            error.hint = redact(str(error.hint), secrets=secrets)
    return errors


def _configured_secrets() -> list[str]:
    """The secrets of every destination in the settings (never raises)."""
    destinations = outbox_settings.DESTINATIONS
    found: list[str] = []
    if isinstance(destinations, dict):
        for config in destinations.values():
            if isinstance(config, dict):
                found += secrets_for(None, config.get("OPTIONS"))
    return found


def _partition_errors() -> list[CheckMessage]:
    """outbox.E001 for a ``PARTITIONS`` that is not an int from 1 to 16,384; outbox.E010
    for cluster mode with one partition (see the module docstring)."""
    try:
        partitions = outbox_settings.partitions
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="outbox.E001")]
    if partitions == 1 and outbox_settings.CLUSTER is not None:
        return [
            Error(
                "OUTBOX['CLUSTER'] is set and OUTBOX['PARTITIONS'] is 1: with one partition the keys carry "
                "no hash tag, so a script's keys fall in many slots and the cluster refuses it (CROSSSLOT)",
                hint="set OUTBOX['PARTITIONS'] (64 or more on 3 to 6 primaries: docs/operations.md, "
                "'Running on a cluster') before the first message is written; it cannot change afterwards",
                id="outbox.E010",
            )
        ]
    return []


def _check() -> list[CheckMessage]:
    """Every ``outbox.*`` problem of the settings, in the order the checks run (unredacted)."""
    user = getattr(settings, "OUTBOX", {})
    if not isinstance(user, dict):
        return [Error("settings.OUTBOX must be a dict", id="outbox.E001")]
    errors = _key_errors(user) + _partition_errors()
    not_positive = [name for name in POSITIVE_NUMBERS if not _positive_number(getattr(outbox_settings, name))]
    errors += [
        Error(
            f"OUTBOX['{name}'] must be a positive number, not {getattr(outbox_settings, name)!r}",
            id="outbox.E001",
        )
        for name in not_positive
    ]
    if not _queues_valid():
        errors.append(
            Error("OUTBOX['QUEUES'] must map 'high', 'default' and 'low' to queue names", id="outbox.E001")
        )
        return errors
    errors += _retention_errors()
    policy_errors = _policy_errors()
    if policy_errors:
        return errors + policy_errors
    errors += _protection_errors()
    errors += [Error(message, id="outbox.E002") for message in configuration_errors()]
    errors += _alert_checks()
    if "VISIBILITY_TIMEOUT" not in not_positive:
        errors += _lease_warnings()  # of the destinations that build, beside the others' errors
    if not outbox_settings.DESTINATIONS and not _endpoints_configured():
        errors.append(
            Warning(
                "OUTBOX['DESTINATIONS'] is empty and OUTBOX['ENDPOINTS'] has no SECRET_KEYS: "
                "send() and publish() have nowhere to deliver",
                id="outbox.W002",
            )
        )
    cluster, cluster_errors = _cluster_setting()
    errors += cluster_errors
    if cluster is not None:
        return errors + _cluster_queue_checks()
    return errors + _cache_errors() + _queue_checks()


def _endpoints_configured() -> bool:
    """Whether the project registers endpoints (``OUTBOX["ENDPOINTS"]["SECRET_KEYS"]``
    set, as docs/webhooks.md's set-up says): then no settings destination is fine."""
    endpoints = outbox_settings.ENDPOINTS
    return isinstance(endpoints, dict) and bool(endpoints.get("SECRET_KEYS"))


def _key_errors(user: dict[str, Any]) -> list[CheckMessage]:
    """outbox.W011 for each setting under its old name, outbox.E001 for unknown keys."""
    errors: list[CheckMessage] = [
        Warning(
            f"OUTBOX[{old!r}] is renamed {new!r}"
            + (f" and {new!r} is set too: {old!r} is ignored" if new in user else ""),
            hint=f"rename it {new!r}; the old name is read until 0.3",
            id="outbox.W011",
        )
        for old, new in RENAMED.items()
        if old in user
    ]
    unknown = set(user) - set(DEFAULTS) - set(RENAMED)
    if unknown:
        errors.append(
            Error(
                f"unknown OUTBOX key(s): {', '.join(sorted(unknown))}",
                hint=f"known keys: {', '.join(DEFAULTS)}",
                id="outbox.E001",
            )
        )
    return errors


def _queues_valid() -> bool:
    """Whether ``OUTBOX["QUEUES"]`` maps each priority to a queue name."""
    queues = outbox_settings.QUEUES
    return (
        isinstance(queues, dict)
        and set(queues) == set(PRIORITIES)
        and all(isinstance(q, str) and q for q in queues.values())
    )


def _retention_errors() -> list[CheckMessage]:
    """outbox.E001 for a ``RETENTION`` that is not finished statuses mapped to seconds or None."""
    retention = outbox_settings.RETENTION
    if isinstance(retention, dict) and not any(
        k not in ("succeeded", "cancelled", "failed") or not (v is None or _positive_number(v))
        for k, v in retention.items()
    ):
        return []
    return [
        Error(
            "OUTBOX['RETENTION'] must map 'succeeded', 'cancelled' or 'failed' to seconds (> 0) or None",
            id="outbox.E001",
        )
    ]


def _policy_errors() -> list[CheckMessage]:
    """outbox.E001 for an invalid global ``ORDERING``, else outbox.E005 for an invalid
    ``RETRY`` or ``MAX_RETRIES``: the first found (the checks after them stop there)."""
    try:
        parse_ordering(outbox_settings.ORDERING, "OUTBOX['ORDERING']")
    except ValueError as exc:
        return [Error(str(exc), id="outbox.E001")]
    try:
        RetryPolicy.from_value(outbox_settings.RETRY)
        validate_max_retries(outbox_settings.MAX_RETRIES, "OUTBOX['MAX_RETRIES']")
    except ValueError as exc:
        return [Error(str(exc), id="outbox.E005")]
    return []


def _cache_errors() -> list[CheckMessage]:
    """outbox.E004 when ``OUTBOX["REDIS_ALIAS"]`` is not a django-redis cache (not in cluster mode)."""
    alias = outbox_settings.REDIS_ALIAS
    cache = getattr(settings, "CACHES", {}).get(alias)
    if cache and "django_redis" in str(cache.get("BACKEND", "")):
        return []
    return [
        Error(
            f"OUTBOX['REDIS_ALIAS'] = {alias!r} is not a django-redis cache in CACHES",
            hint="add CACHES[alias] = {'BACKEND': 'django_redis.cache.RedisCache', 'LOCATION': 'redis://...'}",
            id="outbox.E004",
        )
    ]


def _queue_checks() -> list[CheckMessage]:
    """outbox.E003 and W001 on a single server: every outbox queue in ``RQ_QUEUES``, on the outbox's alias."""
    alias = outbox_settings.REDIS_ALIAS
    rq_queues = getattr(settings, "RQ_QUEUES", {})
    errors: list[CheckMessage] = []
    for name in outbox_settings.queue_names:
        config = rq_queues.get(name)
        if config is None:
            errors.append(
                Error(
                    f"outbox queue {name!r} is not in RQ_QUEUES",
                    hint=f"add RQ_QUEUES[{name!r}] = {{'USE_REDIS_CACHE': {alias!r}}}",
                    id="outbox.E003",
                )
            )
        elif config.get("USE_REDIS_CACHE") != alias:
            errors.append(
                Warning(
                    f"RQ_QUEUES[{name!r}] does not set USE_REDIS_CACHE = {alias!r}",
                    hint="the outbox enqueues on its own connection; point django-rq at the same Redis so its "
                    "dashboard and workers see these jobs",
                    id="outbox.W001",
                )
            )
    return errors


def _cluster_setting() -> tuple[ClusterConfig | None, list[CheckMessage]]:
    """``OUTBOX["CLUSTER"]`` parsed, and outbox.E001 errors when it is invalid (then None,
    as if unset: the checks of a single server apply)."""
    try:
        config = parse_cluster(outbox_settings.CLUSTER)
    except ValueError as exc:
        return None, [Error(str(exc), id="outbox.E001")]
    if config is not None:
        unknown = sorted(set(config.options) - cluster_option_names())
        if unknown:
            return None, [
                Error(
                    "OUTBOX['CLUSTER']['OPTIONS'] has key(s) that redis.cluster.RedisCluster does not take: "
                    + ", ".join(map(repr, unknown)),
                    id="outbox.E001",
                )
            ]
    return config, []


def _cluster_queue_checks() -> list[CheckMessage]:
    """outbox.E003 and W001 in cluster mode: every outbox queue in ``RQ_QUEUES``, all on
    one connection (RQ's plain Redis beside the cluster; outbox.E009 checks it is not a
    cluster node)."""
    hint = "add RQ_QUEUES[{name!r}] = {{'URL': 'redis://rq-host:6379/0'}}: a plain Redis, since RQ cannot run on a cluster"
    rq_queues = getattr(settings, "RQ_QUEUES", {})
    errors: list[CheckMessage] = []
    connections: dict[str, list[str]] = {}
    for name in outbox_settings.queue_names:
        config = rq_queues.get(name)
        if config is None:
            errors.append(
                Error(
                    f"outbox queue {name!r} is not in RQ_QUEUES",
                    hint=hint.format(name=name),
                    id="outbox.E003",
                )
            )
            continue
        given = {k: v for k, v in config.items() if k in RQ_CONNECTION_KEYS}
        connections.setdefault(repr(sorted(given.items(), key=lambda kv: kv[0])), []).append(name)
    if len(connections) > 1:
        groups = "; ".join(", ".join(map(repr, names)) for names in connections.values())
        errors.append(
            Warning(
                f"the outbox queues in RQ_QUEUES are on different connections ({groups}): an outbox_worker listens "
                "to all its queues on one connection, so a worker of several of them cannot start",
                hint="in cluster mode give every outbox queue the same plain Redis beside the cluster, e.g. "
                "RQ_QUEUES[name] = {'URL': 'redis://rq-host:6379/0'} (or 'USE_REDIS_CACHE' of one plain alias)",
                id="outbox.W001",
            )
        )
    return errors


def _alert_checks() -> list[CheckMessage]:
    """outbox.E007, W008, W009: ``OUTBOX["ALERTS"]`` (see :mod:`outbox.alerts`)."""
    try:
        config = parse_alert_settings(outbox_settings.ALERTS)
    except ValueError as exc:
        return [Error(str(exc), id="outbox.E007")]
    problems = channel_problems(config)
    if problems:
        return [Error(p, id="outbox.E007") for p in problems]
    found: list[CheckMessage] = []
    if config.email_admins and not admin_addresses():
        found.append(
            Warning(
                f"OUTBOX['ALERTS']['EMAIL_ADMINS'] = {config.email_admins!r} but settings.ADMINS is empty: "
                "no alert email can be sent",
                hint="set ADMINS = ['ops@example.com'] (or ('Ops', 'ops@example.com') pairs before Django 6.0), or EMAIL_ADMINS = None",
                id="outbox.W008",
            )
        )
    if config.webhook:
        options = outbox_settings.DESTINATIONS[config.webhook].get("OPTIONS") or {}
        if not options.get("secret"):
            found.append(
                Warning(
                    f"OUTBOX['ALERTS']['WEBHOOK'] = {config.webhook!r} has no OPTIONS['secret']: "
                    "operational webhooks would go unsigned",
                    hint="give the destination a 'whsec_...' secret so the receiver can verify alerts",
                    id="outbox.W009",
                )
            )
    return found


def _protection_errors() -> list[CheckMessage]:
    """outbox.E001: the global ``BREAKER``, ``RATE_LIMIT``, ``MAX_CONCURRENCY``,
    ``DISABLE_AFTER`` or ``DURABILITY`` is invalid (each destination's own are reported as E002)."""
    errors: list[CheckMessage] = []
    for parse in (
        lambda: BreakerConfig.parse(outbox_settings.BREAKER, {}, "OUTBOX['BREAKER']"),
        lambda: RateLimit.parse(outbox_settings.RATE_LIMIT, "OUTBOX['RATE_LIMIT']"),
        lambda: parse_max_concurrency(outbox_settings.MAX_CONCURRENCY, "OUTBOX['MAX_CONCURRENCY']"),
        lambda: parse_disable_after(outbox_settings.DISABLE_AFTER, "OUTBOX['DISABLE_AFTER']"),
        lambda: Durability.parse(outbox_settings.DURABILITY),
    ):
        try:
            parse()
        except ValueError as exc:
            errors.append(Error(str(exc), id="outbox.E001"))
    return errors


def _positive_number(value: Any) -> bool:
    """An int or float above 0 (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _lease_warnings() -> list[CheckMessage]:
    """outbox.W003: destinations whose attempts may outlive their lease.

    A worker starts no attempt once half the lease (``VISIBILITY_TIMEOUT``) is spent
    (``outbox.delivery.deliver_batch``), so an attempt that may take longer than half of
    it can still be running when the lease runs out and the recovery sweep takes the
    message back.
    """
    budget = outbox_settings.VISIBILITY_TIMEOUT / 2
    warnings: list[CheckMessage] = []
    for name, destination in usable_destinations().items():
        transport = destination.build_transport()
        longest = transport.longest_attempt()
        if longest is None:
            warnings.append(
                Warning(
                    f"destination {name!r}: its transport {type(transport).__name__} enforces no deadline on an "
                    "attempt (longest_attempt() is None), so an attempt may outlive its lease",
                    hint="implement longest_attempt() in the transport and enforce that deadline, or a lease "
                    "may run out mid-attempt and the message be delivered twice",
                    id="outbox.W003",
                )
            )
        elif longest > budget:
            warnings.append(
                Warning(
                    f"destination {name!r}: one attempt may take {longest:g} s (its deadline), more than half of "
                    f"OUTBOX['VISIBILITY_TIMEOUT'] ({outbox_settings.VISIBILITY_TIMEOUT:g} s)",
                    hint="lower the destination's OPTIONS['deadline'] (or its timeouts) or raise VISIBILITY_TIMEOUT, "
                    "or a lease may run out mid-attempt and the message be delivered twice",
                    id="outbox.W003",
                )
            )
    return warnings


def _as_check_messages(findings: list[redis_health.Finding]) -> list[CheckMessage]:
    """System check messages (Error or Warning, same id) for :mod:`outbox.store.client.diagnostics` findings."""
    kinds = {redis_health.ERROR: Error, redis_health.WARNING: Warning}
    return [kinds[f.level](f.msg, hint=f.hint or None, id=f.id) for f in findings]


@register("outbox_redis")
def check_redis_safety(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """outbox.E006, W004, W006, W007, E008, E009, E011: the outbox's Redis may evict or forget
    messages, or cannot work (the alias on a cluster node; RQ on a cluster).

    A few round trips (CONFIG GET, or INFO where CONFIG is disabled; INFO cluster) on a
    connection of its own with 1-second timeouts, to every primary in cluster mode; an
    unreachable Redis is a warning (W007), not an error, so commands that do not need
    Redis still run. Skipped when OUTBOX['REDIS_ALIAS'] is not a django-redis cache
    (outbox.E004 reports that) or OUTBOX['CLUSTER'] is invalid (outbox.E001).
    """
    cluster, invalid = _cluster_setting()
    if invalid:
        return []
    if cluster is not None:
        return _as_check_messages(redis_health.inspect_redis().findings + redis_health.rq_server_findings())
    alias = outbox_settings.REDIS_ALIAS
    if "django_redis" not in str(getattr(settings, "CACHES", {}).get(alias, {}).get("BACKEND", "")):
        return []
    return _as_check_messages(redis_health.inspect_redis().findings)


@register()
def check_shared_cache_alias(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """outbox.W005: ``cache.clear()`` on a shared alias would delete every message (no Redis needed)."""
    return _as_check_messages(redis_health.shared_alias_findings())


@register()
def check_endpoint_keys(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """outbox.E012 (see the module docstring): ``OUTBOX["ENDPOINTS"]`` and its keys, when
    set (no database read)."""
    try:
        endpoint_setting("SECRET_KEYS")
        if not endpoint_keys_given():
            return []
        secret_store.fernet()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="outbox.E012")]
    return []


@register(Tags.database)
def check_endpoint_secrets(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """outbox.E013 (see the module docstring): every endpoint's secrets are decrypted, at
    most :data:`ENDPOINTS_CHECKED` of them, none shown. A database check: run by
    ``manage.py check --database default`` and by ``migrate``."""
    from outbox.models import Endpoint  # Django models: `import outbox.checks` must not load them

    unreadable = []
    for alias in databases or ():
        try:
            rows = list(
                Endpoint.objects.using(alias)
                .exclude(secrets="")
                .values_list("pk", "secrets")[:ENDPOINTS_CHECKED]
            )
        except DatabaseError:  # not migrated yet
            continue
        if rows and not endpoint_keys_given():
            return [
                Error("endpoints exist and OUTBOX['ENDPOINTS']['SECRET_KEYS'] is empty", id="outbox.E012")
            ]
        for pk, token in rows:
            try:
                secret_store.decrypt(token)
            except secret_store.SecretUnreadable:
                unreadable.append(str(pk))
    if not unreadable:
        return []
    return [
        Error(
            f"{len(unreadable)} endpoint(s) have secrets no key of OUTBOX['ENDPOINTS']['SECRET_KEYS'] decrypts "
            f"(first: {', '.join(unreadable[:5])}): their deliveries wait (paused) instead of being sent",
            hint="put back the key that encrypted them (first in SECRET_KEYS to encrypt with it, anywhere to "
            "decrypt), then enable the endpoints (outbox.webhooks.enable_endpoint); rotate SECRET_KEYS by adding "
            "the new key first and running outbox.webhooks.reencrypt_secrets() before removing the old one",
            id="outbox.E013",
        )
    ]


#: Endpoints whose secrets :func:`check_endpoint_secrets` decrypts at most.
ENDPOINTS_CHECKED = 10_000


def endpoint_keys_given() -> bool:
    """True when ``OUTBOX["ENDPOINTS"]["SECRET_KEYS"]`` is set at all."""
    value = outbox_settings.ENDPOINTS
    return isinstance(value, dict) and bool(value.get("SECRET_KEYS"))


@register("outbox_network")
def check_webhook_addresses(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """outbox.W010: webhook destinations whose host the SSRF guard (:mod:`outbox.transports.ssrf`)
    would refuse at every attempt, so every message would be a dead letter with
    ``error_class`` ``blocked_address``.

    The host is judged as a delivery judges it: refused when every address it resolves
    to is non-public. Destinations that allow private networks, or that send through an
    environment proxy (``trust_env``), are not checked; nor is a malformed one
    (outbox.E002 reports it), while the others are. See the module docstring for the lookups'
    time limits.
    """
    deadline = time.monotonic() + ADDRESS_CHECK_BUDGET
    found: list[CheckMessage] = []
    for name, destination in usable_destinations().items():
        transport = destination.build_transport()
        if not isinstance(transport, WebhookTransport) or not transport.block_private_networks:
            continue
        if transport.trust_env and environment_proxy(transport.url):
            continue
        addresses = _addresses(transport.url, deadline - time.monotonic())
        if addresses and not any(is_public_address(a) for a in addresses):
            found.append(
                Warning(
                    f"destination {name!r}: its host {url_host(transport.url)} is {', '.join(addresses)}, a "
                    "loopback, private or otherwise non-public address that OUTBOX['BLOCK_PRIVATE_NETWORKS'] "
                    "refuses: every message to it would fail at its first attempt as a dead letter "
                    "(error_class blocked_address)",
                    hint=f"if the receiver is on your own network, set OUTBOX['DESTINATIONS'][{name!r}]"
                    "['OPTIONS']['allow_private_networks'] = True (or OUTBOX['BLOCK_PRIVATE_NETWORKS'] = False "
                    "for every destination)",
                    id="outbox.W010",
                )
            )
    return _redacted(found)


def _addresses(url: str, seconds_left: float) -> list[str]:
    """The addresses ``url``'s host resolves to, or [] when unknown (a lookup that
    failed or would exceed ``seconds_left``, a malformed port)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return []
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass  # a name: resolve it
    if seconds_left <= 0:
        return []
    try:
        return resolve(host, port, timeout=min(1.0, seconds_left))
    except (httpcore.ConnectError, httpcore.ConnectTimeout):
        return []
