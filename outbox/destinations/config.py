"""Destinations: named places messages go, from ``OUTBOX["DESTINATIONS"]``.

Each entry::

    "orders": {
        "TRANSPORT": "webhook",                 # alias or dotted path to a Transport class
        "OPTIONS": {"url": "https://...", "secret": "whsec_..."},
        "MAX_RETRIES": 5,                       # optional; else OUTBOX["MAX_RETRIES"]
        "RETRY": {"base": 2, "max_delay": 600}, # optional; over OUTBOX["RETRY"]
        "MAX_IN_FLIGHT": 8,                     # optional; else OUTBOX["MAX_IN_FLIGHT"] (a callable: CONCURRENCY)
        "BREAKER": {"FAILURES": 5},             # optional; over OUTBOX["BREAKER"]; False = none
        "RATE_LIMIT": "100/s",                  # optional; across all workers (GCRA)
        "MAX_CONCURRENCY": 4,                   # optional; attempts in flight across all workers
        "DISABLE_AFTER": 3 * 24 * 3600,         # optional; seconds failing before auto-disable
        "ORDERING": "skip",                     # optional; else OUTBOX["ORDERING"] ("block")
    }

The last four are parsed by :mod:`outbox.destinations.limits` and enforced in Redis (see
:mod:`outbox.destinations.health` and ``docs/destinations.md``).

Transports are built once per process and reused (:func:`get_transport`), so HTTP
connections to a receiver stay open across attempts.

Retry settings resolve message -> destination -> global default, as Dramatiq's
retries middleware resolves message -> actor -> default.

Endpoints registered at runtime (``endpoint:<id hex>``, :mod:`outbox.endpoint_names`)
are destinations too: :func:`get_destination` and :func:`get_transport` resolve them from
the database through a per-process cache (:class:`EndpointCache`): a copy is used at most
``OUTBOX["ENDPOINTS"]["CACHE_TTL"]`` seconds (30) and is forgotten sooner, within
``VERSION_CHECK`` seconds (1), after a committed change announced in Redis
(:mod:`outbox.store.endpoint_versions`). Their transports share one HTTP client pool
(:mod:`outbox.transports.endpoint`). They are never listed by :func:`usable_destinations`:
what the scripts take for every destination (:func:`breaker_config_json`,
:func:`limits_json`) does not grow with the endpoints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.exceptions import RedisClusterException, RedisError

from outbox import redaction
from outbox.conf import MAX_RETRIES_LIMIT, endpoint_setting, outbox_settings
from outbox.destinations import kept
from outbox.destinations.limits import BreakerConfig, RateLimit, parse_disable_after, parse_max_concurrency
from outbox.destinations.secrets import SecretUnreadable
from outbox.endpoint_names import ENDPOINT_PREFIX, is_endpoint
from outbox.exceptions import EndpointUnavailable, UnknownDestination
from outbox.forks import renew_lock_after_fork
from outbox.retry import RetryPolicy
from outbox.store import endpoint_versions, get_repository
from outbox.store.background import wakeups
from outbox.store.endpoint_versions import AdminState
from outbox.transports import Transport, transport_class
from outbox.transports.endpoint import EndpointTransport, close_shared_pools

DESTINATION_KEYS = {
    "TRANSPORT",
    "OPTIONS",
    "MAX_RETRIES",
    "RETRY",
    "MAX_IN_FLIGHT",
    "BREAKER",
    "RATE_LIMIT",
    "MAX_CONCURRENCY",
    "DISABLE_AFTER",
    "ORDERING",
}

#: What a dead letter does to its ordering key (``OUTBOX["ORDERING"]``, a destination's
#: ``ORDERING``): ``block`` holds the key's later messages until it is requeued,
#: cancelled or deleted; ``skip`` sets it aside and the key goes on.
ORDERING_POLICIES = ("block", "skip")

logger = logging.getLogger("outbox")
T = TypeVar("T")
_transports: dict[str, Transport] = {}


#: Not a destination name: the caps entry of every destination a claim does not name
#: (``outbox.store.exchange.OTHERS``, kept equal by a test).
RESERVED_NAME = "*"


@dataclass(frozen=True)
class Destination:
    """A configured destination.

    Attributes:
        name: the key in ``OUTBOX["DESTINATIONS"]``.
        transport_path: the ``TRANSPORT`` value.
        options: the ``OPTIONS`` dict.
        max_retries: retries after the first attempt.
        retry_policy: the destination's resolved :class:`RetryPolicy`.
        max_in_flight: most attempts to it in flight at once in one worker process (its
            share of the worker's slots when ``max_in_flight_default``).
        breaker: its circuit breaker, or None (``BREAKER: False``).
        rate_limit: its rate limit across all workers, or None.
        max_concurrency: most attempts to it in flight across all workers, or None.
        disable_after: seconds of continuous failure before it is disabled, or None.
        max_in_flight_default: ``max_in_flight`` is ``OUTBOX``'s built-in default (set
            neither by the destination, nor by ``OUTBOX["MAX_IN_FLIGHT"]``, nor by its
            transport): a share of the worker's slots while destinations compete, and a
            run may lend it idle slots when it alone is busy (:mod:`outbox.delivery`). A
            ``MAX_IN_FLIGHT`` someone set is a hard limit.
        ordering: what a dead letter does to its ordering key, ``"block"`` or ``"skip"``
            (:data:`ORDERING_POLICIES`).
    """

    name: str
    transport_path: str
    options: dict[str, Any]
    max_retries: int
    retry_policy: RetryPolicy
    max_in_flight: int = 16
    breaker: BreakerConfig | None = BreakerConfig()
    rate_limit: RateLimit | None = None
    max_concurrency: int | None = None
    disable_after: float | None = None
    max_in_flight_default: bool = False
    ordering: str = "block"

    def build_transport(self) -> Transport:
        """A new transport instance for this destination.

        Raises:
            ImproperlyConfigured: the transport refuses the options.
        """
        return transport_class(self.transport_path)(self.name, **self.options)


def validate_max_retries(value: object, where: str) -> int:
    """Check a max_retries value: an int from 0 to 1000.

    Raises:
        ValueError: not such an int.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES_LIMIT:
        raise ValueError(f"{where} must be an integer from 0 to {MAX_RETRIES_LIMIT}, not {value!r}")
    return value


def parse_ordering(value: object, where: str) -> str:
    """Check an ordering policy: one of :data:`ORDERING_POLICIES`.

    Raises:
        ValueError: anything else.
    """
    if value not in ORDERING_POLICIES:
        raise ValueError(f"{where} must be one of {', '.join(ORDERING_POLICIES)}, not {value!r}")
    return str(value)


def _build(name: str, config: Any) -> Destination:
    """The :class:`Destination` of ``OUTBOX["DESTINATIONS"][name]``.

    Raises:
        ImproperlyConfigured: its first problem (:func:`_parse` lists them all).
    """
    destination, problems = _parse(name, config)
    if problems or destination is None:
        raise ImproperlyConfigured(problems[0])
    return destination


def _parse(name: str, config: Any) -> tuple[Destination | None, list[str]]:
    """The destination of ``config`` and every problem found in it, each checked on its
    own: an unknown key does not hide a bad ``MAX_RETRIES`` nor a typo in ``OPTIONS`` (the
    transport refuses its options when it is built). The destination is None when there
    is any problem."""
    where = f"OUTBOX['DESTINATIONS'][{name!r}]"
    if not isinstance(config, dict):
        return None, [f"{where} must be a dict with at least 'TRANSPORT'"]
    problems = _key_problems(where, config)
    options = config.get("OPTIONS", {})
    max_in_flight, max_in_flight_default = _max_in_flight(config)
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        problems.append(f"{where}['MAX_IN_FLIGHT'] must be a positive integer, not {max_in_flight!r}")
    policies = _policies(where, config, problems)
    if "TRANSPORT" in config and isinstance(options, dict):
        try:  # refuses bad options now, not at the first delivery
            transport_class(config["TRANSPORT"])(name, **options)
        except ImproperlyConfigured as exc:
            problems.append(str(exc))
    if problems:
        return None, problems
    return (
        Destination(
            name,
            config["TRANSPORT"],
            dict(options),
            policies.max_retries,
            policies.retry_policy,
            max_in_flight,
            policies.breaker,
            policies.rate_limit,
            policies.max_concurrency,
            policies.disable_after,
            max_in_flight_default,
            policies.ordering,
        ),
        [],
    )


def _key_problems(where: str, config: dict[str, Any]) -> list[str]:
    """The problems of a destination's keys: unknown ones, no ``TRANSPORT``, ``OPTIONS`` not a dict."""
    problems: list[str] = []
    unknown = set(config) - DESTINATION_KEYS
    if unknown:
        problems.append(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if "TRANSPORT" not in config:
        problems.append(f"{where} has no 'TRANSPORT'")
    if not isinstance(config.get("OPTIONS", {}), dict):
        problems.append(f"{where}['OPTIONS'] must be a dict")
    return problems


def _max_in_flight(config: dict[str, Any]) -> tuple[Any, bool]:
    """A destination's ``MAX_IN_FLIGHT`` as given (not checked yet), else its transport's
    default, else ``OUTBOX``'s; and whether it is the built-in default (:attr:`Destination.max_in_flight_default`)."""
    try:
        cls = transport_class(config["TRANSPORT"])
        transport_default = cls.max_in_flight or (outbox_settings.CONCURRENCY if cls.in_process else None)
    except Exception:  # reported by _parse, when it builds the transport
        transport_default = None
    max_in_flight = config.get("MAX_IN_FLIGHT", transport_default or outbox_settings.MAX_IN_FLIGHT)
    is_default = (
        "MAX_IN_FLIGHT" not in config
        and not transport_default
        and "MAX_IN_FLIGHT" not in outbox_settings.user_settings
    )
    return max_in_flight, is_default


@dataclass(frozen=True)
class _Policies:
    """A destination's retry, protection and ordering settings, each its own or the
    global one, parsed by :func:`_policies` (a value with a problem is None: the
    destination is then not built)."""

    max_retries: int
    retry_policy: RetryPolicy
    breaker: BreakerConfig | None
    rate_limit: RateLimit | None
    max_concurrency: int | None
    disable_after: float | None
    ordering: str


def _policies(where: str, config: dict[str, Any], problems: list[str]) -> _Policies:
    """Parse a destination's retry, protection and ordering settings, each on its own, adding their problems to ``problems``."""

    def parsed(parse: Callable[[], Any]) -> Any:
        try:
            return parse()
        except ValueError as exc:
            problems.append(str(exc) if str(exc).startswith(where) else f"{where}: {exc}")
            return None

    return _Policies(
        max_retries=parsed(
            lambda: validate_max_retries(
                config.get("MAX_RETRIES", outbox_settings.MAX_RETRIES), f"{where}['MAX_RETRIES']"
            )
        ),
        retry_policy=parsed(
            lambda: RetryPolicy.from_value(config.get("RETRY"), default=outbox_settings.retry_policy)
        ),
        breaker=parsed(
            lambda: BreakerConfig.parse(
                config.get("BREAKER", outbox_settings.BREAKER), outbox_settings.BREAKER, f"{where}['BREAKER']"
            )
        ),
        rate_limit=parsed(
            lambda: RateLimit.parse(
                config.get("RATE_LIMIT", outbox_settings.RATE_LIMIT), f"{where}['RATE_LIMIT']"
            )
        ),
        max_concurrency=parsed(
            lambda: parse_max_concurrency(
                config.get("MAX_CONCURRENCY", outbox_settings.MAX_CONCURRENCY), f"{where}['MAX_CONCURRENCY']"
            )
        ),
        disable_after=parsed(
            lambda: parse_disable_after(
                config.get("DISABLE_AFTER", outbox_settings.DISABLE_AFTER), f"{where}['DISABLE_AFTER']"
            )
        ),
        ordering=parsed(
            lambda: parse_ordering(config.get("ORDERING", outbox_settings.ORDERING), f"{where}['ORDERING']")
        ),
    )


def get_destination(name: str) -> Destination:
    """The destination called ``name``: a settings destination, or an endpoint
    registered at runtime (``endpoint:<id hex>``, from :data:`endpoint_cache`).

    Raises:
        UnknownDestination: no such key in ``OUTBOX["DESTINATIONS"]``, or no such
            endpoint (deleted).
        ImproperlyConfigured: the entry is malformed.
        EndpointUnavailable: an endpoint disabled, or whose secrets cannot be decrypted
            (logged as an error; the endpoint paused: its deliveries wait).
    """
    if is_endpoint(name):
        return endpoint_cache.get(name)[0]
    return _settings_destination(name)


@cache
def _settings_destination(name: str) -> Destination:
    """The destination ``OUTBOX["DESTINATIONS"][name]``, built once.

    Raises:
        UnknownDestination, ImproperlyConfigured: as :func:`get_destination`.
    """
    destinations = outbox_settings.DESTINATIONS
    if not isinstance(name, str) or name not in destinations:
        known = ", ".join(sorted(destinations)) or "none configured"
        raise UnknownDestination(f"unknown destination {name!r} (known: {known})", field="destination")
    return _build(name, destinations[name])


def usable_destinations() -> dict[str, Destination]:
    """Every configured destination that builds, by name. A broken entry is left out: its
    attempts fail at once (permanently) and the system checks report it."""
    found = {}
    for name in outbox_settings.DESTINATIONS:
        if is_endpoint(name) or name == RESERVED_NAME:  # reserved (a configuration error)
            continue
        try:
            found[name] = get_destination(name)
        except Exception:
            continue
    return found


def configuration_errors() -> list[str]:
    """Every problem with ``OUTBOX["DESTINATIONS"]``, as messages (for system checks),
    each naming its destination: all of each destination's, not only its first."""
    errors = []
    destinations = outbox_settings.DESTINATIONS
    if not isinstance(destinations, dict):
        return ["OUTBOX['DESTINATIONS'] must be a dict of name -> destination settings"]
    for name, config in destinations.items():
        if is_endpoint(name):
            errors.append(
                f"OUTBOX['DESTINATIONS'][{name!r}]: names starting with {ENDPOINT_PREFIX!r} are reserved for "
                "endpoints registered at runtime (rename it)"
            )
            continue
        if name == RESERVED_NAME:
            errors.append(
                f"OUTBOX['DESTINATIONS'][{name!r}]: the name {RESERVED_NAME!r} is reserved (a claim's cap of "
                "every destination not named; rename it)"
            )
            continue
        for text in _parse(name, config)[1]:
            # every message names its destination (a transport's own may not)
            errors.append(text if repr(name) in text else f"OUTBOX['DESTINATIONS'][{name!r}]: {text}")
    return errors


def get_transport(destination: str) -> Transport:
    """The transport of a destination, built once per process and reused (connection reuse).

    Raises:
        UnknownDestination: the destination is not (or no longer) in settings.
        ImproperlyConfigured: its settings are invalid.
    """
    if is_endpoint(destination):
        return endpoint_cache.get(destination)[1]
    transport = _transports.get(destination)
    if transport is None:
        transport = get_destination(destination).build_transport()
        _transports[destination] = transport
    return transport


def close_transports() -> None:
    """Close and forget every cached transport (closing is best effort: errors are logged),
    the endpoints' shared pool and copies included."""
    endpoint_cache.clear()
    close_shared_pools()
    while _transports:
        _, transport = _transports.popitem()
        try:
            transport.close()
        except Exception:
            logger.exception("closing transport failed")


def clear_cache() -> None:
    """Forget built destinations, the scripts' views of them, and close their transports."""
    _settings_destination.cache_clear()
    breaker_config_json.cache_clear()
    limits_json.cache_clear()
    endpoint_template.cache_clear()
    close_transports()


# -- settings as the scripts take them ------------------------------------------------------
@cache
def breaker_config_json() -> str:
    """JSON destination -> ``[failures (0 = no breaker), failure rate, min attempts, window,
    cool-down, max cool-down, disable after (0 = never)]`` for ``lua/health.lua``."""
    config = {}
    for name, d in usable_destinations().items():
        config[name] = _breaker_fields(d.breaker, d.disable_after)
    # one entry for every endpoint ("endpoint:" alone: lua/health.lua's config_of); an
    # invalid BREAKER or DISABLE_AFTER is reported by the system checks
    with contextlib.suppress(ImproperlyConfigured, ValueError):
        config[ENDPOINT_PREFIX] = _breaker_fields(*_endpoint_protection())
    return json.dumps(config, separators=(",", ":"))


def _breaker_fields(b: BreakerConfig | None, disable_after: float | None) -> list[Any]:
    return [
        b.failures if b else 0,
        b.failure_rate if b else 1.0,
        b.min_attempts if b else 1,
        b.window if b else 60,
        b.cooldown if b else 1.0,
        b.max_cooldown if b else 1.0,
        disable_after or 0,
    ]


def _endpoint_protection() -> tuple[BreakerConfig | None, float | None]:
    """The breaker and disable-after of every endpoint: ``OUTBOX["BREAKER"]`` and
    ``OUTBOX["DISABLE_AFTER"]``.

    Raises:
        ValueError: either is invalid.
    """
    return (
        BreakerConfig.parse(outbox_settings.BREAKER, outbox_settings.BREAKER, "OUTBOX['BREAKER']"),
        parse_disable_after(outbox_settings.DISABLE_AFTER, "OUTBOX['DISABLE_AFTER']"),
    )


@cache
def limits_json() -> str:
    """JSON destination -> ``[emission interval T, tolerance tau, max concurrency]``
    (0 = none) for ``lua/claim.lua``; only destinations with a limit."""
    config = {}
    for name, d in usable_destinations().items():
        if d.rate_limit or d.max_concurrency:
            rl = d.rate_limit
            config[name] = [rl.interval if rl else 0, rl.tolerance if rl else 0, d.max_concurrency or 0]
    return json.dumps(config, separators=(",", ":"))


# -- endpoints registered at runtime ---------------------------------------------------------
#: A key of :meth:`EndpointCache.view`: a tuple, its kind first.
ViewKey = tuple[Hashable, ...]
#: The transport of every endpoint (they share one HTTP client pool).
ENDPOINT_TRANSPORT = "outbox.transports.endpoint.EndpointTransport"
#: Most endpoint configurations one process keeps (the oldest loaded is dropped first).
ENDPOINT_CACHE_SIZE = 20_000
#: Most endpoints of the applications a claim met loaded with the claim's own
#: (:meth:`EndpointCache.preload`): an application's endpoints together, once per
#: ``CACHE_TTL``, instead of a query for the few each claim names.
SIBLINGS_MOST = 1_000
#: Reason of the pause of an endpoint whose secrets cannot be decrypted.
UNREADABLE_REASON = "secret cannot be decrypted (OUTBOX['ENDPOINTS']['SECRET_KEYS'])"


def endpoint_as_destination(config: Any) -> Destination:
    """The :class:`Destination` of an endpoint's configuration
    (:class:`outbox.destinations.endpoints.EndpointConfig`): the global retry budget and
    policy (or ``OUTBOX["ENDPOINTS"]``'s), breaker, disable-after and ordering policy,
    ``MAX_IN_FLIGHT`` per worker as a share (all of these from :func:`endpoint_template`,
    read from the settings once, not per endpoint), its own rate and concurrency limits.

    Raises:
        ImproperlyConfigured: a setting, or the endpoint's stored options, are invalid.
    """
    template = endpoint_template()
    try:
        rate_limit = RateLimit.parse(config.rate_limit or None, f"endpoint {config.name!r} rate_limit")
        max_concurrency = parse_max_concurrency(
            config.max_concurrency, f"endpoint {config.name!r} max_concurrency"
        )
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    return Destination(
        config.name,
        ENDPOINT_TRANSPORT,
        config.options,
        template.max_retries,
        template.retry_policy,
        template.max_in_flight,
        template.breaker,
        rate_limit,
        max_concurrency,
        template.disable_after,
        template.max_in_flight_default,
        template.ordering,
    )


@cache
def endpoint_template() -> Destination:
    """The :class:`Destination` every endpoint's is built from (:func:`endpoint_as_destination`
    replaces its name, options and limits): the settings' retry budget and policy,
    breaker, disable-after, ordering policy and ``MAX_IN_FLIGHT`` share, built once per
    settings (:func:`clear_cache` on a change).

    Raises:
        ImproperlyConfigured: a setting is invalid.
    """
    try:
        max_retries = endpoint_setting("MAX_RETRIES")
        max_retries = validate_max_retries(
            outbox_settings.MAX_RETRIES if max_retries is None else max_retries,
            "OUTBOX['ENDPOINTS']['MAX_RETRIES']",
        )
        policy = RetryPolicy.from_value(endpoint_setting("RETRY"), default=outbox_settings.retry_policy)
        breaker, disable_after = _endpoint_protection()
        ordering = parse_ordering(outbox_settings.ORDERING, "OUTBOX['ORDERING']")
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    return Destination(
        ENDPOINT_PREFIX,
        ENDPOINT_TRANSPORT,
        {},
        max_retries,
        policy,
        int(outbox_settings.MAX_IN_FLIGHT),
        breaker,
        None,
        None,
        disable_after,
        "MAX_IN_FLIGHT" not in outbox_settings.user_settings,
        ordering,
    )


class EndpointCache:
    """This process's copies of endpoint configurations: name -> (destination, transport).

    The bound: a copy is used at most ``CACHE_TTL`` seconds after it was read from the
    database; and at most every ``VERSION_CHECK`` seconds a lookup reads the change
    counter (:func:`outbox.store.endpoint_versions.changes_since`, one round trip) and
    forgets the copies of the endpoints changed since (every copy when the names are no
    longer all known). So a committed change reaches every worker within
    ``VERSION_CHECK`` seconds (plus the attempt in flight), and within ``CACHE_TTL`` when
    the counter was never bumped (the process that changed it died right after its
    commit, or Redis was unreachable then).

    Each copy also brings the endpoint's state in Redis in line with the database (a
    disabled endpoint's messages parked; its limits), so a change whose on-commit step
    was lost is applied by the first worker that meets its deliveries: checked against
    the state a claim's gate read (:meth:`preload`), or read when it is loaded alone
    (:meth:`get`). Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Destination | None, Transport | None, Exception | None]] = {}
        self._version = 0
        self._checked = 0.0
        # publish()'s copies (:meth:`view`): kind -> key -> (read at, value, tags), and
        # tag -> keys
        self._views: dict[Hashable, dict[ViewKey, tuple[float, Any, Sequence[str]]]] = {}
        self._tagged: dict[str, set[ViewKey]] = {}
        self._generation = 0  # moved by every forgetting: a read that spans one is not kept
        # applications whose endpoints preload() loaded together: uid -> when (monotonic)
        self._applications: dict[str, float] = {}
        # copies preload() kept before a claim reported their state: name -> (config, limits)
        self._unchecked: dict[str, tuple[Any, list[float] | None]] = {}

    def clear(self) -> None:
        """Forget every copy (and the counter: the next lookup reads it)."""
        with self._lock:
            self._entries.clear()
            self._views.clear()
            self._tagged.clear()
            self._applications.clear()
            self._unchecked.clear()
            self._generation += 1
            self._version = 0
            self._checked = 0.0

    def options(self, name: str) -> dict[str, Any]:
        """The transport options of the copy of ``name`` this process holds (its secrets
        included: for redaction only), or {}; never reads the database."""
        entry = self._entries.get(name)
        return dict(entry[1].options) if entry is not None and entry[1] is not None else {}

    def forget(self, names: Any) -> None:
        """Forget the copies of these endpoint names, and the views tagged with any of
        them (:meth:`view`)."""
        with self._lock:
            self._forget_locked(names)

    def _forget_locked(self, names: Any) -> None:
        self._generation += 1
        for name in names:
            self._entries.pop(name, None)
            self._unchecked.pop(name, None)
            for key in self._tagged.pop(name, ()):
                pool = self._views.get(key[0])
                old = pool.pop(key, None) if pool is not None else None
                if old is not None:
                    self._untag(key, old[2])  # its other tags

    def view(
        self,
        key: ViewKey,
        load: Callable[[], tuple[T, Sequence[str]] | tuple[T, Sequence[str], float]],
        *,
        keep: bool = True,
        read_at: list[float] | None = None,
    ) -> T:
        """A value :func:`outbox.publish` reads from the database (an application, its
        enabled endpoints, an event type's state, the subscribers of an event), kept by
        this process under ``key`` with the bound of the endpoints' copies: at most
        ``CACHE_TTL`` seconds, and forgotten within ``VERSION_CHECK`` seconds of an
        announced change of one of the names ``load`` tags it with
        (:func:`outbox.store.endpoint_versions.bump`; at once for a change committed by
        this process).

        ``key`` is a tuple whose first item names its kind: each kind keeps at most
        ``ENDPOINT_CACHE_SIZE`` values (the oldest kept is dropped first), so one kind
        never pushes out another's. ``load()`` returns ``(value, tags)``, or ``(value,
        tags, read_at)`` for a value built from other kept values (``time.monotonic()``
        when the oldest of them was read: a value is as old as its oldest part); an
        exception it raises is not kept. ``keep=False``: the value read is not kept (a
        read inside a transaction that changed endpoints: uncommitted rows). ``read_at``:
        a list the value's read time is appended to (for such a ``load``)."""
        now = time.monotonic()
        self._check_version(now)
        pool = self._views.get(key[0])
        entry = pool.get(key) if pool is not None else None
        if entry is not None and now - entry[0] < float(endpoint_setting("CACHE_TTL")):
            if read_at is not None:
                read_at.append(entry[0])
            return cast(T, entry[1])
        generation = self._generation
        loaded = load()
        value, tags = loaded[0], loaded[1]
        at = min(now, loaded[2]) if len(loaded) > 2 else now
        if read_at is not None:
            read_at.append(at)
        if keep:
            with self._lock:
                if generation == self._generation:  # nothing was forgotten while it was read
                    self._keep_view(key, at, value, tags)
        return value

    def _keep_view(self, key: ViewKey, at: float, value: Any, tags: Sequence[str]) -> None:
        pool = self._views.setdefault(key[0], {})
        old = pool.pop(key, None)
        if old is not None:
            self._untag(key, old[2])
        elif len(pool) >= ENDPOINT_CACHE_SIZE:  # the oldest kept of its kind makes room
            oldest = next(iter(pool))
            self._untag(oldest, pool.pop(oldest)[2])
        pool[key] = (at, value, tags)
        for tag in tags:
            self._tagged.setdefault(tag, set()).add(key)

    def _untag(self, key: ViewKey, tags: Sequence[str]) -> None:
        """Forget ``key`` under its tags (a view dropped: its tags must not keep it)."""
        for tag in tags:
            keys = self._tagged.get(tag)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._tagged[tag]

    def get(self, name: str) -> tuple[Destination, Transport]:
        """The destination and transport of endpoint ``name``.

        Raises:
            UnknownDestination: no such endpoint (deleted).
            ImproperlyConfigured: its configuration cannot be used.
            EndpointUnavailable: it is disabled, or its secrets cannot be decrypted
                (logged as an error, the endpoint paused).
        """
        now = time.monotonic()
        self._check_version(now)
        entry = self._entries.get(name)
        if entry is None or now - entry[0] >= float(endpoint_setting("CACHE_TTL")):
            entry = self._load(name, now)
        _, destination, transport, error = entry
        if error is not None:
            raise error
        assert destination is not None and transport is not None
        return destination, transport

    def _check_version(self, now: float) -> None:
        if now - self._checked < float(endpoint_setting("VERSION_CHECK")):
            return
        self._checked = now
        try:
            version, names = endpoint_versions.changes_since(get_repository(), self._version)
        except (RedisError, RedisClusterException):
            return  # copies still expire after CACHE_TTL
        with self._lock:
            if version != self._version:
                if names is None:
                    self._entries.clear()
                    self._unchecked.clear()
                    self._views.clear()
                    self._tagged.clear()
                    self._generation += 1
                else:
                    self._forget_locked(names)
                self._version = version

    def _load(
        self, name: str, now: float
    ) -> tuple[float, Destination | None, Transport | None, Exception | None]:
        from outbox.destinations import (
            endpoints,  # Django models: `import outbox.destinations` must not load them
        )

        try:
            config: Any = endpoints.load(name)
        except SecretUnreadable as exc:
            config = exc
        return self._keep(name, config, now)

    def preload(self, names: Iterable[str], states: Mapping[str, AdminState] | None = None) -> None:
        """Load the copies of the endpoints among ``names`` that this process lacks (or
        whose copy expired) together: their rows in one query (a worker's claim names
        many endpoints; one by one, each cost a query in the run's loop). With them, the
        other enabled endpoints of their applications that this process has not loaded
        in the last ``CACHE_TTL`` seconds, up to :data:`SIBLINGS_MOST` (one query more,
        once per application and ``CACHE_TTL``): a published event's deliveries fan out
        to an application's endpoints, and the claims after this one meet them.

        ``states``: the state in Redis of the endpoints the claim's gate read
        (``Claim.states``: name -> ``(admin state, its reason, limits field or None)``).
        Each copy is checked against its endpoint's state there once (:meth:`_reconcile`),
        when a claim first reports that state: no read of its own (a pipelined read of
        every loaded endpoint's state cost a command per endpoint and ``CACHE_TTL``; at
        2 deliveries per endpoint, half a command per delivery). An endpoint the gate
        found not active (parked, paused) is loaded too, so an enable whose on-commit
        step was lost is applied when its next delivery meets the gate. Best effort:
        what fails here is loaded by :meth:`get` as before, one at a time."""
        now = time.monotonic()
        self._check_version(now)
        ttl = float(endpoint_setting("CACHE_TTL"))
        states = states or {}
        met = [*names, *(name for name, state in states.items() if state[0] != "active")]
        wanted = [
            name for name in dict.fromkeys(met) if is_endpoint(name) and not self._fresh(name, now, ttl)
        ]
        if wanted:
            self._load_together(wanted, now, ttl, states)
        for name, state in states.items():  # copies loaded before a claim reported their state
            if name not in self._unchecked:
                continue
            with self._lock:
                unchecked = self._unchecked.pop(name, None)
            if unchecked is not None:
                self._reconcile(name, *unchecked, state)

    def _load_together(
        self, wanted: Sequence[str], now: float, ttl: float, states: Mapping[str, AdminState]
    ) -> None:
        """:meth:`preload`'s load of ``wanted`` (and their siblings), one query each; a
        copy whose state ``states`` lacks is checked when a claim reports it."""
        from django.db import DatabaseError  # Django's database layer: only when endpoints are loaded

        from outbox.destinations import endpoints  # Django models (see _load)

        try:
            configs: dict[str, Any] = endpoints.load_many(wanted)
            applications = {
                c.application
                for c in configs.values()
                if isinstance(c, endpoints.EndpointConfig)
                and now - self._applications.get(c.application, float("-inf")) >= ttl
            }
            if applications:
                for name, config in endpoints.load_siblings(applications, SIBLINGS_MOST, wanted).items():
                    if name not in configs and not self._fresh(name, now, ttl):
                        configs[name] = config
                if len(self._applications) >= ENDPOINT_CACHE_SIZE:
                    self._applications.clear()
                for uid in applications:
                    self._applications[uid] = now
        except DatabaseError:
            return
        asked = set(wanted)
        for name in [*wanted, *(name for name in configs if name not in asked)]:
            self._keep(name, configs.get(name), now, states.get(name), later=True)

    def _fresh(self, name: str, now: float, ttl: float) -> bool:
        entry = self._entries.get(name)
        return entry is not None and now - entry[0] < ttl

    def _keep(
        self, name: str, config: Any, now: float, state: AdminState | None = None, *, later: bool = False
    ) -> tuple[float, Destination | None, Transport | None, Exception | None]:
        """Keep the copy of endpoint ``name`` made from ``config`` (its
        :class:`~outbox.destinations.endpoints.EndpointConfig`, None: no such endpoint,
        or the :class:`SecretUnreadable` its secrets raised), checked against its admin
        state in Redis: ``state`` when read already; else read now, or (``later``) when
        a claim reports it (:meth:`preload`)."""
        from outbox.destinations import endpoints  # Django models (see _load)

        destination: Destination | None = None
        transport: Transport | None = None
        error: Exception | None = None
        with self._lock:  # an older copy's check waiting for a claim's report is this copy's now
            self._unchecked.pop(name, None)
        try:
            if isinstance(config, SecretUnreadable):
                raise config
            if config is None:
                raise UnknownDestination(
                    f"unknown destination {name!r}: no such endpoint (deleted?)", field="destination"
                )
            destination = endpoint_as_destination(config)
            transport = EndpointTransport(name, **destination.options)
            limits = endpoints.limits_of(config.rate_limit, config.max_concurrency)
            if state is None and later:
                with self._lock:
                    if len(self._unchecked) >= ENDPOINT_CACHE_SIZE:
                        self._unchecked.pop(next(iter(self._unchecked)))
                    self._unchecked[name] = (config, limits)
            else:
                self._reconcile(name, config, limits, state)
            if config.disabled:
                error = EndpointUnavailable(
                    f"endpoint {name} is disabled ({config.disabled_reason or 'manual'})"
                )
        except SecretUnreadable as exc:
            error = EndpointUnavailable(f"endpoint {name}: {exc}")
            logger.error("outbox: endpoint %s cannot be used: %s; its deliveries wait (paused)", name, exc)
            self._pause_unreadable(name)
        except (UnknownDestination, ImproperlyConfigured) as exc:
            error = exc
        entry = (now, destination, transport, error)
        with self._lock:
            if len(self._entries) >= ENDPOINT_CACHE_SIZE:
                self._entries.pop(next(iter(self._entries)))
            self._entries[name] = entry
        return entry

    @staticmethod
    def _reconcile(
        name: str, config: Any, limits: list[float] | None, state: AdminState | None = None
    ) -> None:
        """Bring ``name``'s state in Redis (``state``: as read already, else read now) in
        line with ``config`` (best effort)."""
        try:
            repo = get_repository()
            admin, reason, stored = state or endpoint_versions.admin_state(repo, name)
            wanted = None if limits is None else json.dumps(limits, separators=(",", ":"))
            if stored != wanted:
                endpoint_versions.write_limits(repo, name, limits)
            if config.disabled and admin == "active":
                repo.destination_action(name, "disable", time.time(), config.disabled_reason or "manual")
            elif not config.disabled and (
                admin == "disabled" or (admin == "paused" and reason == UNREADABLE_REASON)
            ):
                repo.destination_action(name, "enable" if admin == "disabled" else "resume", time.time(), "")
                _unpark(name)
        except (RedisError, RedisClusterException):
            pass

    @staticmethod
    def _pause_unreadable(name: str) -> None:
        with contextlib.suppress(RedisError, RedisClusterException):
            get_repository().destination_action(name, "pause", time.time(), UNREADABLE_REASON)


def _unpark(name: str) -> None:
    """Put the parked messages of ``name`` back (as ``controls.unpark_all``, which this
    module cannot import)."""
    repo = get_repository()
    while True:
        moved, woken, left = repo.unpark(name, time.time(), 1000)
        wakeups.enqueue_wakeups(woken)
        if moved < 1000 or not left:
            return


#: This process's endpoint configurations.
endpoint_cache = EndpointCache()
renew_lock_after_fork(endpoint_cache, "_lock")
redaction.register_options_source(endpoint_cache.options)
kept.register(endpoint_cache)  # reached by outbox.destinations.endpoints, which this module imports


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("OUTBOX", "EMAIL_BACKEND", "EMAIL_TIMEOUT", "MAILERS"):
        clear_cache()
