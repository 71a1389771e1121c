"""The registry of endpoints registered at runtime: applications, endpoints and event
types in the project's database, checked, their secrets encrypted, and the workers told
of each committed change (``docs/webhooks.md``).

The public front door is :mod:`outbox.webhooks` (it adds what needs the layers above:
pausing and resuming an endpoint's deliveries, deleting them). Here:

* validation of what customers type (:func:`clean_url` with the private-network guard
  at registration, event type names, channels, headers, limits);
* the writes, inside the caller's transaction (``transaction.atomic(using=...)``), each
  followed on commit by :func:`notify` (the change counter in Redis, and the endpoint's
  limits in its state hash);
* :func:`load`: one endpoint's configuration as a worker needs it (its secrets
  decrypted), read from the database;
* :func:`subscribers`: the endpoints of an application an event goes to.

Imports Django models: imported by :mod:`outbox.destinations.config` only inside the
functions that need it.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver
from redis.exceptions import RedisClusterException, RedisError

from outbox import headers as header_rules
from outbox.conf import endpoint_setting, outbox_settings
from outbox.destinations import kept
from outbox.destinations import secrets as secret_store
from outbox.destinations.limits import RateLimit, parse_max_concurrency
from outbox.endpoint_names import (
    application_tag,
    application_uid_tag,
    endpoint_destination,
    endpoint_id,
    event_type_tag,
    is_endpoint,
)
from outbox.events import DestinationEvent, destination_disabled, destination_enabled
from outbox.exceptions import InvalidEndpoint, InvalidMessage, UnknownApplication, UnknownEventType
from outbox.models import Application, Endpoint, EventType
from outbox.store import endpoint_versions, get_repository
from outbox.transports.endpoint import EVENT_ID_HEADER, EVENT_TYPE_HEADER
from outbox.transports.ssrf import is_public_address, resolve

logger = logging.getLogger("outbox")

#: Event type and channel names: letters, digits and ``._-:``, 1 to 200 (channels 128).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
MAX_CHANNEL = 128
MAX_CHANNELS = 10  # per endpoint and per event (Svix's limit)
#: The largest count a row holds (``max_endpoints``, ``max_concurrency``): PostgreSQL's
#: ``integer``, what Django's ``PositiveIntegerField`` is there.
MAX_COUNT = 2**31 - 1
#: Characters of ``rate_limit`` (its column's length).
MAX_RATE_LIMIT = 40
MAX_FILTER_TYPES = 500
#: Seconds the registration's name lookup may take (the private-network guard).
RESOLVE_TIMEOUT = 2.0
#: Headers of an endpoint's own that would hide what a delivery says of itself.
RESERVED_HEADERS = {EVENT_ID_HEADER.lower(), EVENT_TYPE_HEADER.lower(), "outbox-delivery-id"}


@dataclass(frozen=True)
class EndpointConfig:
    """What a worker needs of one endpoint (:func:`load`).

    Attributes:
        name: its destination name (``endpoint:<id hex>``).
        application: its application's uid (for logs and alerts).
        uid: its own uid, or None.
        url: where deliveries go.
        secrets: the secrets signing now, current first (decrypted: never log).
        headers: its fixed extra headers.
        rate_limit: ``"100/s"``-style, or "".
        max_concurrency: attempts in flight across workers at most, or None.
        disabled: True while disabled; ``disabled_reason`` says why.
    """

    name: str
    application: str
    uid: str | None
    url: str
    secrets: tuple[str, ...] = field(repr=False)
    headers: Mapping[str, str] = field(default_factory=dict)
    rate_limit: str = ""
    max_concurrency: int | None = None
    disabled: bool = False
    disabled_reason: str = ""

    @property
    def options(self) -> dict[str, Any]:
        """The options of its :class:`~outbox.transports.endpoint.EndpointTransport`."""
        options: dict[str, Any] = {
            "url": self.url,
            "headers": dict(self.headers),
            "timeout": float(endpoint_setting("TIMEOUT")),
            "allow_private_networks": bool(endpoint_setting("ALLOW_PRIVATE_NETWORKS")),
        }
        if self.secrets:
            options["secret"] = list(self.secrets)
        return options


# -- validation --------------------------------------------------------------------------


def clean_url(url: object, *, check_address: bool = True) -> str:
    """An endpoint URL as customers type it, checked: ``http``/``https``, a host, at
    most ``OUTBOX["ENDPOINTS"]["MAX_URL_LENGTH"]`` characters, no user name or password,
    no whitespace, control character or fragment; and (``check_address``), unless
    ``OUTBOX["ENDPOINTS"]["ALLOW_PRIVATE_NETWORKS"]`` or ``OUTBOX["BLOCK_PRIVATE_NETWORKS"]``
    is off, every address its host resolves to now must be public (the guard that runs
    on every connection of a delivery, :mod:`outbox.transports.ssrf`, also here: a
    customer learns at once, and an internal address never enters the table). A host
    that does not resolve now (a name not yet in DNS, a resolver down or slow, a machine
    without DNS) is accepted, with a warning logged: nothing is known to refuse, and the
    delivery's guard checks every address it connects to (as Svix and Hookdeck accept a
    URL without resolving it).

    Raises:
        InvalidEndpoint: naming the rule broken (``field="url"``).
    """
    most = int(endpoint_setting("MAX_URL_LENGTH"))
    if not isinstance(url, str) or not url:
        raise InvalidEndpoint("url must be a non-empty str", field="url")
    if len(url) > most:
        raise InvalidEndpoint(f"url is {len(url)} characters, over {most}", field="url")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise InvalidEndpoint("url must not contain whitespace or control characters", field="url")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidEndpoint(f"url is not a valid URL: {exc}", field="url") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidEndpoint("url must start with https:// (or http://)", field="url")
    if not parts.hostname:
        raise InvalidEndpoint("url names no host", field="url")
    if parts.username is not None or parts.password is not None:
        raise InvalidEndpoint(
            "url must not carry a user name or password (use the endpoint's headers for credentials)",
            field="url",
        )
    if parts.fragment:
        raise InvalidEndpoint("url must not have a #fragment", field="url")
    if (
        check_address
        and outbox_settings.BLOCK_PRIVATE_NETWORKS
        and not endpoint_setting("ALLOW_PRIVATE_NETWORKS")
    ):
        host = parts.hostname
        try:
            addresses = resolve(host, port or (443 if parts.scheme == "https" else 80), RESOLVE_TIMEOUT)
        except Exception as exc:  # httpcore's ConnectError / ConnectTimeout
            logger.warning(
                "outbox: endpoint url's host %r does not resolve now (%s): registered; every delivery's "
                "connection is checked against non-public addresses",
                host,
                exc,
            )
            return url
        private = [a for a in addresses if not is_public_address(a)]
        if private or not addresses:
            raise InvalidEndpoint(
                f"url's host {host!r} resolves to {', '.join(private) or 'no address'}: a loopback, private, "
                "link-local or otherwise non-public address (OUTBOX['ENDPOINTS']['ALLOW_PRIVATE_NETWORKS'])",
                field="url",
            )
    return url


def clean_event_type_name(name: object, what: str = "event_type") -> str:
    """``name`` if it is 1 to 200 letters, digits and ``._-:``.

    Raises:
        InvalidEndpoint: otherwise.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidEndpoint(
            f"{what} must be 1 to 200 letters, digits and ._-: (such as 'order.paid')", field=what
        )
    return name


def clean_channels(channels: object, what: str = "channels") -> list[str]:
    """A list of at most 10 distinct channel names (1 to 128 letters, digits, ``._-:``).

    Raises:
        InvalidEndpoint: otherwise.
    """
    if channels is None:
        return []
    if isinstance(channels, (str, bytes, Mapping)) or not isinstance(channels, Iterable):
        raise InvalidEndpoint(f"{what} must be a list of str", field=what)
    given = list(channels)
    if not all(isinstance(c, str) for c in given):
        raise InvalidEndpoint(f"{what} must be a list of str", field=what)
    found = list(dict.fromkeys(given))
    if len(found) > MAX_CHANNELS:
        raise InvalidEndpoint(f"at most {MAX_CHANNELS} {what}, not {len(found)}", field=what)
    for c in found:
        if not isinstance(c, str) or len(c) > MAX_CHANNEL or not NAME_PATTERN.fullmatch(c):
            raise InvalidEndpoint(
                f"each of {what} must be 1 to {MAX_CHANNEL} letters, digits and ._-:", field=what
            )
    return found


def check_event_types(names: Sequence[str], what: str = "filter_types") -> None:
    """Refuse event types not in the catalogue or archived (unless
    ``OUTBOX["ENDPOINTS"]["ALLOW_UNKNOWN_EVENT_TYPES"]``).

    Raises:
        UnknownEventType: naming the first such type.
    """
    if not names or endpoint_setting("ALLOW_UNKNOWN_EVENT_TYPES"):
        return
    known = dict(EventType.objects.filter(name__in=names).values_list("name", "archived"))
    for name in names:
        if name not in known:
            raise UnknownEventType(
                f"unknown event type {name!r}: create it first (outbox.webhooks.create_event_type)",
                field=what,
            )
        if known[name]:
            raise UnknownEventType(f"event type {name!r} is archived", field=what)


def clean_filter_types(names: object) -> list[str]:
    """A list of event type names (none: every type), each in the catalogue.

    Raises:
        InvalidEndpoint, UnknownEventType: as :func:`clean_event_type_name` and
            :func:`check_event_types`.
    """
    if names is None:
        return []
    if isinstance(names, (str, bytes, Mapping)) or not isinstance(names, Iterable):
        raise InvalidEndpoint("filter_types must be a list of event type names", field="filter_types")
    given = [clean_event_type_name(n, "filter_types") for n in names]
    found = list(dict.fromkeys(given))
    if len(found) > MAX_FILTER_TYPES:
        raise InvalidEndpoint(f"at most {MAX_FILTER_TYPES} filter_types", field="filter_types")
    check_event_types(found)
    return found


def clean_endpoint_headers(headers: object) -> dict[str, str]:
    """An endpoint's fixed headers by the rules of :mod:`outbox.headers` (ASCII values),
    without ``Content-Type``, ``webhook-*`` or the ``Outbox-Event-*`` ones.

    Raises:
        InvalidEndpoint: a header refused (its value never quoted).
    """
    try:
        cleaned = header_rules.clean_headers(headers, "headers", ascii_only=True)  # type: ignore[arg-type]
    except InvalidMessage as exc:
        raise InvalidEndpoint(str(exc), field="headers") from None
    for name in cleaned:
        if name.lower() == "content-type" or name.lower() in RESERVED_HEADERS:
            raise InvalidEndpoint(
                f"header {name!r} is set by the outbox, not by an endpoint", field="headers"
            )
    return cleaned


def limits_of(rate_limit: str, max_concurrency: int | None) -> list[float] | None:
    """The gate's ``[T, tau, max concurrency]`` of these limits, or None without any
    (see :func:`outbox.store.endpoint_versions.write_limits`).

    Raises:
        InvalidEndpoint: a limit that does not parse.
    """
    try:
        rl = RateLimit.parse(rate_limit or None, "rate_limit")
        mc = parse_max_concurrency(max_concurrency, "max_concurrency")
    except ValueError as exc:
        raise InvalidEndpoint(
            str(exc), field="rate_limit" if "rate" in str(exc) else "max_concurrency"
        ) from None
    if rl is None and mc is None:
        return None
    return [rl.interval if rl else 0, rl.tolerance if rl else 0, mc or 0]


def clean_json(value: object, what: str) -> Any:
    """``value`` if JSON holds it as it is: it survives ``json.dumps`` (RFC 8259: no NaN
    or infinity, ``allow_nan=False``) and ``json.loads`` unchanged (str keys only, lists
    not tuples, no bytes, sets or other objects), so the database's JSON column stores
    what was given, not a coerced copy.

    Raises:
        InvalidEndpoint: otherwise, naming ``what``.
    """
    try:
        same = json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError, RecursionError):
        same = False
    if not same:
        raise InvalidEndpoint(
            f"{what} must be JSON: str keys, lists, str, finite numbers, true/false/null (no NaN, bytes, "
            "tuples or other objects)",
            field=what,
        )
    return value


def clean_metadata(value: object, what: str = "metadata") -> dict[str, Any]:
    """A JSON object (dict) of the project's, or {} for None (:func:`clean_json`).

    Raises:
        InvalidEndpoint: not a dict, or not JSON as it is.
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidEndpoint(f"{what} must be a dict", field=what)
    clean_json(value, what)
    return value


def clean_count(value: object, what: str, least: int) -> int | None:
    """None, or an int from ``least`` to :data:`MAX_COUNT` (not a bool).

    Raises:
        InvalidEndpoint: otherwise.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_COUNT:
        raise InvalidEndpoint(f"{what} must be None or an integer from {least} to {MAX_COUNT}", field=what)
    return value


def clean_flag(value: object, what: str) -> bool:
    """``value`` if it is a bool (a str such as "false" is refused, not read as true).

    Raises:
        InvalidEndpoint: otherwise.
    """
    if not isinstance(value, bool):
        raise InvalidEndpoint(f"{what} must be True or False", field=what)
    return value


def clean_text(value: object, what: str, most: int) -> str:
    """A str of at most ``most`` characters without control characters.

    Raises:
        InvalidEndpoint: otherwise.
    """
    if not isinstance(value, str) or len(value) > most or not value.isprintable():
        raise InvalidEndpoint(f"{what} must be a str of at most {most} printable characters", field=what)
    return value


# -- telling the workers -----------------------------------------------------------------


def notify(
    changes: Sequence[tuple[str, list[float] | None]], *, deleted: bool = False, tags: Sequence[str] = ()
) -> None:
    """After a commit that changed endpoints (``(destination name, limits)`` each): this
    process's copies of them forgotten at once (and :func:`outbox.publish`'s views
    tagged with ``tags``: their applications, an event type); their limits to their
    state hashes (not when ``deleted``) and the change counter bumped with their names
    and the tags, so every worker (and every publishing process) forgets its copy within
    ``VERSION_CHECK`` seconds. Redis unreachable: logged; the others learn of the change
    within ``CACHE_TTL`` instead (their copies expire), and the limits are written again
    by the first worker that loads the endpoint."""
    names = [name for name, _ in changes]
    kept.forget([*names, *tags])
    try:
        repo = get_repository()
        if not deleted:
            for name, limits in changes:
                endpoint_versions.write_limits(repo, name, limits)
        endpoint_versions.bump(repo, [*names, *tags])
    except (RedisError, RedisClusterException) as exc:
        logger.warning(
            "outbox: could not tell the workers of a change of %d endpoint(s) (%s: %s); they learn of it "
            "within OUTBOX['ENDPOINTS']['CACHE_TTL'] seconds",
            len(changes),
            type(exc).__name__,
            exc,
        )


class _Announce:
    """The on-commit step of a change of the registry: :func:`notify` (``local``: only
    this process's views forgotten, for a row created: nothing elsewhere can hold a copy
    of what did not exist). While it waits in a transaction's on-commit list, it tells
    :func:`changed_in_transaction` that this transaction changed the registry."""

    changes_registry = True

    def __init__(
        self,
        changes: Sequence[tuple[str, list[float] | None]],
        tags: Sequence[str],
        *,
        deleted: bool = False,
        local: bool = False,
    ) -> None:
        self.changes, self.tags, self.deleted, self.local = changes, tags, deleted, local

    def __call__(self) -> None:
        if self.local:
            kept.forget([*(name for name, _ in self.changes), *self.tags])
        else:
            notify(self.changes, deleted=self.deleted, tags=self.tags)


def on_commit(
    endpoints: Sequence[Endpoint], using: str, *, deleted: bool = False, tags: Iterable[str] = ()
) -> None:
    """:func:`notify` of ``endpoints`` (as they are now) and of their applications (and
    of ``tags``) once the current transaction on ``using`` commits (at once outside a
    transaction); nothing on a rollback."""
    snapshot = [
        (e.destination, None if deleted else limits_of(e.rate_limit, e.max_concurrency)) for e in endpoints
    ]
    names = dict.fromkeys([*(application_tag(e.application_id) for e in endpoints), *tags])
    transaction.on_commit(_Announce(snapshot, list(names), deleted=deleted), using=using)


def announce(tags: Sequence[str], using: str, *, local: bool = False) -> None:
    """Tell the publishing processes, when the current transaction on ``using`` commits,
    that what ``tags`` name changed (an application, an event type): see :func:`on_commit`."""
    transaction.on_commit(_Announce([], list(tags), local=local), using=using)


def transaction_state(using: str) -> tuple[bool, bool]:
    """Whether a transaction is open on ``using`` (``in_atomic_block``), and whether it
    changed endpoints, applications or event types through this module (or
    :func:`outbox.webhooks.changed`): their rows are uncommitted, so
    :func:`outbox.publish` reads the database rather than this process's views of
    committed rows, and keeps nothing it reads. (A savepoint rolled back takes its
    changes' on-commit steps, hence their mark, with it.) One look at the connection
    for both: Django's ``connections[using]`` costs about 1.5 µs per look (asgiref's
    ``Local``), and ``publish()`` needs both answers."""
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        return False, False
    return True, any(getattr(step[1], "changes_registry", False) for step in connection.run_on_commit)


def changed_in_transaction(using: str) -> bool:
    """The second answer of :func:`transaction_state`: the transaction open on ``using``
    changed the registry (False outside a transaction)."""
    return transaction_state(using)[1]


# -- applications ------------------------------------------------------------------------


def clean_uid(uid: object, what: str = "uid") -> str:
    """A uid: 1 to 200 printable characters.

    Raises:
        InvalidEndpoint: otherwise.
    """
    if not isinstance(uid, str) or not uid.strip() or len(uid) > 200 or not uid.isprintable():
        raise InvalidEndpoint(f"{what} must be 1 to 200 printable characters, not only spaces", field=what)
    return uid


def get_application(application: Application | str, using: str = DEFAULT_DB_ALIAS) -> Application:
    """The application given, or the one with this uid.

    Raises:
        UnknownApplication: no application has this uid.
    """
    if isinstance(application, Application):
        # read again: a row deleted since the object was read (or never saved) must not
        # come back through it, nor a change refused on it be saved by a later call
        try:
            return Application.objects.using(using).get(pk=application.pk)
        except Application.DoesNotExist:
            raise UnknownApplication(
                f"application {application.uid[:200]!r} was deleted or never saved", field="application"
            ) from None
    if not isinstance(application, str):
        raise UnknownApplication(
            f"application must be an Application or its uid (str), not {type(application).__name__}",
            field="application",
        )
    try:
        return Application.objects.using(using).get(uid=application)
    except Application.DoesNotExist:
        raise UnknownApplication(
            f"no application has uid {application[:200]!r} (create it with outbox.webhooks.create_application)",
            field="application",
        ) from None


def save_application(
    application: Application | None,
    *,
    uid: str | None = None,
    name: str | None = None,
    metadata: dict[str, Any] | None = None,
    max_endpoints: Any = ...,
    using: str = DEFAULT_DB_ALIAS,
) -> Application:
    """Create (``application`` None) or update an application; see
    :func:`outbox.webhooks.create_application`.

    Raises:
        InvalidEndpoint: a bad field, or the uid is taken.
    """
    app = application or Application()
    if uid is not None or application is None:
        app.uid = clean_uid(uid)
    if name is not None:
        app.name = clean_text(name, "name", 200)
    if metadata is not None or application is None:
        app.metadata = clean_metadata(metadata)
    if max_endpoints is not ...:
        app.max_endpoints = clean_count(max_endpoints, "max_endpoints", 0)
    with transaction.atomic(using=using):
        if Application.objects.using(using).filter(uid=app.uid).exclude(pk=app.pk).exists():
            raise InvalidEndpoint(f"an application with uid {app.uid!r} exists", field="uid")
        app.save(using=using)
        if application is not None:
            on_commit(list(app.endpoints.using(using).all()), using)  # their alerts name it
    return app


# -- event types -------------------------------------------------------------------------


def save_event_type(
    name: str,
    *,
    description: str | None = None,
    schema: Any = ...,
    example: Any = ...,
    archived: bool | None = None,
    create: bool,
    using: str = DEFAULT_DB_ALIAS,
) -> EventType:
    """Create or update the event type ``name``; see :func:`outbox.webhooks.create_event_type`.

    Raises:
        InvalidEndpoint: a bad name or field, the name taken (create), or none such (update).
    """
    clean_event_type_name(name, "name")
    manager = EventType.objects.using(using)
    if create:
        if manager.filter(name=name).exists():
            raise InvalidEndpoint(f"event type {name!r} exists", field="name")
        event_type = EventType(name=name)
    else:
        try:
            event_type = manager.get(name=name)
        except EventType.DoesNotExist:
            raise UnknownEventType(f"unknown event type {name!r}", field="name") from None
    if description is not None:
        if not isinstance(description, str):
            raise InvalidEndpoint("description must be a str", field="description")
        event_type.description = description
    if schema is not ...:
        if schema is not None and not isinstance(schema, dict):
            raise InvalidEndpoint("schema must be a JSON Schema (a dict) or None", field="schema")
        event_type.schema = clean_json(schema, "schema")
    if example is not ...:
        event_type.example = clean_json(example, "example")
    if archived is not None:
        event_type.archived = clean_flag(archived, "archived")
    event_type.save(using=using)
    return event_type


# -- endpoints ---------------------------------------------------------------------------

#: The fields :func:`save_endpoint` changes, as keyword arguments.
ENDPOINT_FIELDS = (
    "url",
    "uid",
    "description",
    "filter_types",
    "channels",
    "rate_limit",
    "max_concurrency",
    "headers",
    "metadata",
)


def check_room(app: Application, endpoints: int) -> None:
    """Refuse one more endpoint of ``app``, which has ``endpoints``, at its ``max_endpoints``.

    Raises:
        InvalidEndpoint: ``field="application"``.
    """
    if app.max_endpoints is not None and endpoints >= app.max_endpoints:
        raise InvalidEndpoint(
            f"application {app.uid!r} has {app.max_endpoints} endpoint(s), its most (max_endpoints)",
            field="application",
        )


def save_endpoint(
    endpoint: Endpoint,
    changes: Mapping[str, Any],
    *,
    secrets: secret_store.SecretSet | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Endpoint:
    """Check ``changes`` (keyword -> value of :data:`ENDPOINT_FIELDS`, ``disabled``,
    ``disabled_reason``), apply them to ``endpoint`` (new or existing), encrypt
    ``secrets`` if given, save inside a transaction on ``using`` and tell the workers on
    commit.

    Raises:
        InvalidEndpoint, UnknownEventType: a bad field (nothing saved).
        SecretUnreadable: no encryption key configured (nothing saved).
    """
    unknown = set(changes) - set(ENDPOINT_FIELDS) - {"disabled", "disabled_reason"}
    if unknown:
        raise InvalidEndpoint(
            f"unknown endpoint field(s) {', '.join(sorted(unknown))}", field=sorted(unknown)[0]
        )
    if "url" in changes:
        endpoint.url = clean_url(changes["url"])
    if "uid" in changes:
        endpoint.uid = None if changes["uid"] is None else clean_uid(changes["uid"])
    if "description" in changes:
        if not isinstance(changes["description"], str):
            raise InvalidEndpoint("description must be a str", field="description")
        endpoint.description = changes["description"]
    if "filter_types" in changes:
        endpoint.filter_types = clean_filter_types(changes["filter_types"])
    if "channels" in changes:
        endpoint.channels = clean_channels(changes["channels"])
    if "rate_limit" in changes:
        rate = changes["rate_limit"]
        if rate is not None and (not isinstance(rate, str) or len(rate) > MAX_RATE_LIMIT):
            raise InvalidEndpoint(
                f"rate_limit must be a str such as '100/s' (at most {MAX_RATE_LIMIT} characters)",
                field="rate_limit",
            )
        endpoint.rate_limit = rate or ""
    if "max_concurrency" in changes:
        endpoint.max_concurrency = clean_count(changes["max_concurrency"], "max_concurrency", 1)
    if "rate_limit" in changes or "max_concurrency" in changes:
        limits_of(endpoint.rate_limit, endpoint.max_concurrency)  # refuses a bad limit
    if "headers" in changes:
        endpoint.headers = clean_endpoint_headers(changes["headers"])
    if "metadata" in changes:
        endpoint.metadata = clean_metadata(changes["metadata"])
    if "disabled" in changes:
        endpoint.disabled = clean_flag(changes["disabled"], "disabled")
        reason = changes.get("disabled_reason") or ("manual" if endpoint.disabled else "")
        endpoint.disabled_reason = clean_text(reason, "reason", 200)
    if secrets is not None:
        endpoint.secrets = secret_store.encrypt(secrets)
    with transaction.atomic(using=using):
        app = Application.objects.using(using).select_for_update().get(pk=endpoint.application_id)
        others = Endpoint.objects.using(using).filter(application_id=app.pk).exclude(pk=endpoint.pk)
        if endpoint._state.adding:
            check_room(app, others.count())
        if endpoint.uid is not None and others.filter(uid=endpoint.uid).exists():
            raise InvalidEndpoint(
                f"application {app.uid!r} has an endpoint with uid {endpoint.uid!r}", field="uid"
            )
        endpoint.save(using=using)
        on_commit([endpoint], using)
    return endpoint


def get_endpoint(endpoint: Endpoint | str | uuid.UUID, using: str = DEFAULT_DB_ALIAS) -> Endpoint:
    """The endpoint given, or the one with this id (UUID, its text, or its destination name).

    Raises:
        InvalidEndpoint: no such endpoint.
    """
    if isinstance(endpoint, Endpoint):
        # read again (as get_application): a deleted row must not come back through an
        # object read before, nor a change refused on it be saved by a later call
        endpoint = endpoint.pk
        if endpoint is None:
            raise InvalidEndpoint("the endpoint given was never saved", field="endpoint")
    key: Any = (
        endpoint_id(endpoint) if isinstance(endpoint, str) and endpoint.startswith("endpoint:") else endpoint
    )
    try:
        return Endpoint.objects.using(using).select_related("application").get(pk=key)
    except (Endpoint.DoesNotExist, ValueError, TypeError, ImproperlyConfigured):
        raise InvalidEndpoint(f"no endpoint {str(endpoint)[:100]!r}", field="endpoint") from None
    except Exception as exc:  # a malformed UUID string (django.core.exceptions.ValidationError)
        raise InvalidEndpoint(f"no endpoint {str(endpoint)[:100]!r}", field="endpoint") from exc


# -- what workers and publish() read ------------------------------------------------------


def load(name: str, using: str = DEFAULT_DB_ALIAS) -> EndpointConfig | None:
    """The configuration of the endpoint whose destination name is ``name``, read from
    the database now, or None when no such endpoint exists (deleted).

    Raises:
        SecretUnreadable: its secrets cannot be decrypted (a wrong key).
    """
    found = load_many([name], using).get(name)
    if isinstance(found, secret_store.SecretUnreadable):
        raise found
    return found


def load_many(
    names: Sequence[str], using: str = DEFAULT_DB_ALIAS
) -> dict[str, EndpointConfig | secret_store.SecretUnreadable]:
    """:func:`load` of each of ``names`` in one query: name -> its configuration, or the
    :class:`~outbox.destinations.secrets.SecretUnreadable` its secrets raised; a name
    with no such endpoint is left out."""
    ids = {pk: name for name in names if (pk := endpoint_id(name)) is not None}
    keys = list(ids)
    rows = [
        row
        for i in range(0, len(keys), 500)  # within every database's limit of query parameters
        for row in _config_rows(using).filter(pk__in=keys[i : i + 500])
    ]
    return _configs_of(rows, ids)


def load_siblings(
    applications: Collection[str], most: int, besides: Sequence[str] = (), using: str = DEFAULT_DB_ALIAS
) -> dict[str, EndpointConfig | secret_store.SecretUnreadable]:
    """The enabled endpoints of the applications whose uids are ``applications``, but
    those named in ``besides`` (destination names, loaded already), at most ``most`` of
    them, in one query (as :func:`load_many` gives them): a worker that meets an endpoint
    of an application loads the others with it, since the deliveries of one published
    event fan out to an application's endpoints and its claims meet them one after
    another (each claim's load of the few it names was a query of its own)."""
    if not applications or most <= 0:
        return {}
    known = [pk for name in besides[:500] if (pk := endpoint_id(name)) is not None]
    rows = (
        _config_rows(using)
        .filter(application__uid__in=list(applications)[:500], disabled=False)
        .exclude(pk__in=known)[:most]
    )
    return _configs_of(rows, {})


def _config_rows(using: str) -> Any:
    """Endpoint rows as :data:`_CONFIG_FIELDS` tuples, in no order (the model's ordering
    left out: an ``ORDER BY`` the reader does not need)."""
    return Endpoint.objects.using(using).order_by().values_list(*_CONFIG_FIELDS)


def _configs_of(
    rows: Iterable[tuple[Any, ...]], names: Mapping[Any, str]
) -> dict[str, EndpointConfig | secret_store.SecretUnreadable]:
    """Name -> the configuration of each row (``names``: pk -> destination name, where
    known), or the :class:`~outbox.destinations.secrets.SecretUnreadable` its secrets
    raised."""
    found: dict[str, EndpointConfig | secret_store.SecretUnreadable] = {}
    for row in rows:
        name = names.get(row[0]) or endpoint_destination(row[0])
        try:
            found[name] = _config_of(name, row)
        except secret_store.SecretUnreadable as exc:
            found[name] = exc
    return found


#: The columns of an endpoint (and its application's uid) :func:`_config_of` reads: only
#: those, as a tuple (no model instance, no other JSON column decoded: a worker loads
#: them for every endpoint it meets).
_CONFIG_FIELDS = (
    "pk",
    "application__uid",
    "uid",
    "url",
    "secrets",
    "headers",
    "rate_limit",
    "max_concurrency",
    "disabled",
    "disabled_reason",
)


def _config_of(name: str, row: tuple[Any, ...]) -> EndpointConfig:
    """The configuration of endpoint ``row`` (its :data:`_CONFIG_FIELDS`; destination
    name ``name``).

    Raises:
        SecretUnreadable: its secrets cannot be decrypted (a wrong key).
    """
    _, application, uid, url, secrets, headers, rate_limit, max_concurrency, disabled, reason = row
    signing: tuple[str, ...] = ()
    if secrets:
        signing = tuple(secret_store.decrypt(secrets).signing(time.time()))
    return EndpointConfig(
        name=name,
        application=application,
        uid=uid,
        url=url,
        secrets=signing,
        headers=dict(headers or {}),
        rate_limit=rate_limit,
        max_concurrency=max_concurrency,
        disabled=disabled,
        disabled_reason=reason,
    )


def matches(endpoint: Endpoint, event_type: str, channels: Sequence[str]) -> bool:
    """Whether ``endpoint`` subscribes to an event of ``event_type`` with ``channels``:
    its ``filter_types`` empty or naming the type, and its ``channels`` empty or sharing
    one with the event (an event without channels reaches only endpoints without
    channels), as Svix filters."""
    if endpoint.filter_types and event_type not in endpoint.filter_types:
        return False
    return not endpoint.channels or bool(set(endpoint.channels) & set(channels))


def subscribers(
    application: Application, event_type: str, channels: Sequence[str], using: str = DEFAULT_DB_ALIAS
) -> list[Endpoint]:
    """The enabled endpoints of ``application`` subscribed to ``event_type`` with
    ``channels`` (:func:`matches`), oldest first: one query, in the caller's transaction
    (an endpoint created earlier in it is among them)."""
    rows = (
        Endpoint.objects.using(using)
        .filter(application_id=application.pk, disabled=False)
        .order_by("created_at", "id")
    )
    return [
        e
        for e in rows.only("id", "filter_types", "channels", "application_id")
        if matches(e, event_type, channels)
    ]


def destinations_of(application: Application, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The destination names of every endpoint of ``application``."""
    return [
        endpoint_destination(pk)
        for pk in Endpoint.objects.using(using)
        .filter(application_id=application.pk)
        .values_list("pk", flat=True)
    ]


# -- what pages and alerts say of an endpoint ---------------------------------------------


@dataclass(frozen=True)
class EndpointLabel:
    """What alerts and the console say of an endpoint (no secret).

    Attributes:
        name: its destination name (``endpoint:<id hex>``).
        id: its id. uid: its application's own id of it, or None.
        url: its URL; host: the URL's host (and port).
        application_uid, application_name: its application's.
        application_pk: its application's primary key (the admin's link).
        disabled, disabled_reason: its state in the database.
    """

    name: str
    id: uuid.UUID
    uid: str | None
    url: str
    host: str
    application_uid: str
    application_name: str
    application_pk: int
    disabled: bool = False
    disabled_reason: str = ""

    def text(self) -> str:
        """``endpoint main (acme.example) of application customer-42 (ACME)``: one line
        for subjects and logs."""
        who = self.uid or self.id.hex[:12]
        app = self.application_uid + (f" ({self.application_name})" if self.application_name else "")
        return f"endpoint {who} ({self.host}) of application {app}"

    def as_dict(self) -> dict[str, Any]:
        """The fields an operational webhook carries (``data.endpoint``)."""
        return {
            "id": str(self.id),
            "uid": self.uid,
            "url_host": self.host,
            "application": {"uid": self.application_uid, "name": self.application_name},
        }


def describe(names: Iterable[str], using: str = DEFAULT_DB_ALIAS) -> dict[str, EndpointLabel]:
    """The label of each endpoint among ``names`` that exists (one query, whatever the
    number of names; names not of an endpoint, or deleted, are left out)."""
    ids = {pk: name for name in names if (pk := endpoint_id(name)) is not None}
    if not ids:
        return {}
    rows = (
        Endpoint.objects.using(using)
        .filter(pk__in=list(ids))
        .select_related("application")
        .only("id", "uid", "url", "disabled", "disabled_reason", "application__uid", "application__name")
    )
    found = {}
    for row in rows:
        parts = urlsplit(row.url)
        found[ids[row.pk]] = EndpointLabel(
            name=ids[row.pk],
            id=row.pk,
            uid=row.uid,
            url=row.url,
            host=parts.netloc.rpartition("@")[2],
            application_uid=row.application.uid,
            application_name=row.application.name,
            application_pk=row.application_id,
            disabled=row.disabled,
            disabled_reason=row.disabled_reason,
        )
    return found


def record_automatic_disable(name: str, reason: str, using: str = DEFAULT_DB_ALIAS) -> bool:
    """The database's copy of an automatic disable (``410 Gone``, ``DISABLE_AFTER``)
    that a worker wrote in Redis: the endpoint's row becomes disabled with that reason,
    so a worker that loads it later does not enable it again (its row is the source of
    truth), the admin shows it disabled and :func:`outbox.publish` leaves it out. True
    when a row changed (an endpoint already disabled keeps its own reason)."""
    pk = endpoint_id(name)
    if pk is None:
        return False
    changed = (
        Endpoint.objects.using(using)
        .filter(pk=pk, disabled=False)
        .update(disabled=True, disabled_reason=(reason or "automatic")[:200])
    )
    if changed:  # the workers forget their copies (limits unchanged: not written again)
        _announce_row_change(name, pk, using)
    return bool(changed)


def _announce_row_change(name: str, pk: uuid.UUID, using: str) -> None:
    """On commit: endpoint ``name`` (id ``pk``) changed by an update of its row, its
    application's publishing views with it (limits unchanged: not written again)."""
    tags = [
        application_tag(app)
        for app in Endpoint.objects.using(using).filter(pk=pk).values_list("application_id", flat=True)
    ]
    transaction.on_commit(_Announce([(name, None)], tags, deleted=True), using=using)


def record_enable(name: str, using: str = DEFAULT_DB_ALIAS) -> bool:
    """The database's copy of an endpoint enabled in Redis by an operator (the console,
    ``manage.py outbox_destination``): its row becomes enabled, so a worker that loads it
    does not disable it again. True when a row changed."""
    pk = endpoint_id(name)
    if pk is None:
        return False
    changed = (
        Endpoint.objects.using(using).filter(pk=pk, disabled=True).update(disabled=False, disabled_reason="")
    )
    if changed:
        _announce_row_change(name, pk, using)
    return bool(changed)


@receiver(destination_disabled)
def _on_disabled(*, event: DestinationEvent, **kwargs: Any) -> None:
    """An endpoint disabled in Redis (``410 Gone``, ``DISABLE_AFTER``, an operator) is
    disabled in its row too (:func:`record_automatic_disable`). Connected when this module
    is imported (the app's ``ready()``)."""
    if is_endpoint(event.destination):
        record_automatic_disable(event.destination, str(event.detail.get("reason") or "automatic"))


@receiver(destination_enabled)
def _on_enabled(*, event: DestinationEvent, **kwargs: Any) -> None:
    """An endpoint enabled in Redis by an operator is enabled in its row too (:func:`record_enable`)."""
    if is_endpoint(event.destination):
        record_enable(event.destination)


# -- what publish() reads, kept by this process ---------------------------------------------
#
# outbox.publish() runs as often as send(): the application, its enabled endpoints and the
# event type's state are read from the database once and kept in this process's versioned
# cache (EndpointCache.view), forgotten at once when this process commits a change of them
# and within VERSION_CHECK seconds of another process's announced change (CACHE_TTL at most
# when the announcement was lost). A transaction that changed them itself reads the
# database (changed_in_transaction), so its uncommitted rows are seen and never kept.


@dataclass(frozen=True)
class Subscriber:
    """An enabled endpoint as :func:`outbox.publish` fans out to it.

    Attributes:
        pk: the endpoint's id. destination: its destination name.
        filter_types: the event types it subscribes to (empty: every type).
        channels: its channels (empty: events whatever their channels).
    """

    pk: uuid.UUID
    destination: str
    filter_types: frozenset[str] = frozenset()
    channels: frozenset[str] = frozenset()

    @classmethod
    def of(cls, endpoint: Endpoint) -> Subscriber:
        return cls(
            endpoint.pk,
            endpoint.destination,
            frozenset(endpoint.filter_types or ()),
            frozenset(endpoint.channels or ()),
        )

    def matches(self, event_type: str, channels: Sequence[str]) -> bool:
        """As :func:`matches`."""
        if self.filter_types and event_type not in self.filter_types:
            return False
        return not self.channels or not self.channels.isdisjoint(channels)


def publication(
    application: Application | str,
    event_type: str,
    channels: Sequence[str],
    using: str = DEFAULT_DB_ALIAS,
    *,
    fresh: bool = False,
) -> tuple[Application, tuple[Subscriber, ...]]:
    """What :func:`outbox.publish` resolves before its fan-out: the application and its
    enabled endpoints subscribed to ``event_type`` and ``channels`` (cleaned: a list of
    distinct names), oldest first, after refusing a malformed, unknown or archived type.

    Kept by this process per (application uid, type, channels) as one value built from the
    three kept below (:func:`publishing_application`, :func:`check_published_type`,
    :func:`audience`), tagged with their tags and as old as the oldest of them: a warm
    publish looks up one value, not three, and filters nothing. Each kind keeps its own
    values (``EndpointCache.view``), so an application with many types and channels does
    not push out the applications and endpoints the other values are built from.
    ``fresh`` (or an :class:`Application` given): the three, each as it says.

    Raises:
        UnknownApplication, InvalidEndpoint, UnknownEventType: as the three.
    """

    def resolve(read_at: list[float] | None = None) -> tuple[Application, tuple[Subscriber, ...]]:
        app = publishing_application(application, using, fresh=fresh, read_at=read_at)
        check_published_type(event_type, using, fresh=fresh, read_at=read_at)
        found = audience(app, using, fresh=fresh, read_at=read_at)
        return app, tuple([s for s in found if s.matches(event_type, channels)])

    if fresh or not isinstance(application, str):
        return resolve()

    def load() -> tuple[tuple[Application, tuple[Subscriber, ...]], list[str], float]:
        parts: list[float] = []
        app, found = resolve(parts)
        tags = [application_tag(app.pk), application_uid_tag(app.uid), event_type_tag(event_type)]
        return (app, found), tags, min(parts, default=time.monotonic())

    return kept.view(("publication", using, application, event_type, tuple(channels)), load)


def publishing_application(
    application: Application | str,
    using: str = DEFAULT_DB_ALIAS,
    *,
    fresh: bool = False,
    read_at: list[float] | None = None,
) -> Application:
    """:func:`get_application`, kept by this process (``fresh``: read now, not kept;
    ``read_at``: as ``EndpointCache.view``'s).

    Raises:
        UnknownApplication: no application has this uid.
    """
    if isinstance(application, Application) and not fresh:
        pk = application.pk  # kept by pk: read again (deleted, renamed) like a uid's

        def by_pk() -> tuple[Application, list[str]]:
            app = get_application(application, using)
            return app, [application_tag(app.pk), application_uid_tag(app.uid)]

        return kept.view(("application-pk", using, pk), by_pk, read_at=read_at)
    if fresh or not isinstance(application, str):
        return get_application(application, using)

    def load() -> tuple[Application, list[str]]:
        app = get_application(application, using)
        return app, [application_tag(app.pk), application_uid_tag(app.uid)]

    return kept.view(("application", using, application), load, read_at=read_at)


def check_published_type(
    event_type: str,
    using: str = DEFAULT_DB_ALIAS,
    *,
    fresh: bool = False,
    read_at: list[float] | None = None,
) -> None:
    """Refuse a malformed, unknown or archived event type (see :func:`outbox.publish`);
    the catalogue's answer kept by this process (``fresh``: read now, not kept;
    ``read_at``: as ``EndpointCache.view``'s).

    Raises:
        InvalidEndpoint, UnknownEventType: as said.
    """
    clean_event_type_name(event_type)
    if endpoint_setting("ALLOW_UNKNOWN_EVENT_TYPES"):
        return

    def load() -> tuple[bool, list[str]]:
        archived = (
            EventType.objects.using(using).filter(name=event_type).values_list("archived", flat=True).first()
        )
        if archived is None:
            raise UnknownEventType(
                f"unknown event type {event_type!r} (create it with webhooks.create_event_type)",
                field="event_type",
            )
        return bool(archived), [event_type_tag(event_type)]

    archived = load()[0] if fresh else kept.view(("event-type", using, event_type), load, read_at=read_at)
    if archived:
        raise UnknownEventType(f"event type {event_type!r} is archived", field="event_type")


def audience(
    application: Application,
    using: str = DEFAULT_DB_ALIAS,
    *,
    fresh: bool = False,
    read_at: list[float] | None = None,
) -> tuple[Subscriber, ...]:
    """The enabled endpoints of ``application``, oldest first (one query, without model
    instances), kept by this process (``fresh``: read now, in the caller's transaction,
    not kept; ``read_at``: as ``EndpointCache.view``'s)."""

    def load() -> tuple[tuple[Subscriber, ...], list[str]]:
        rows = (
            Endpoint.objects.using(using)
            .filter(application_id=application.pk, disabled=False)
            .order_by("created_at", "id")
            .values_list("id", "filter_types", "channels")
        )
        found = tuple(
            Subscriber(pk, endpoint_destination(pk), frozenset(types or ()), frozenset(channels or ()))
            for pk, types, channels in rows
        )
        return found, [application_tag(application.pk)]

    if fresh:
        return load()[0]
    return kept.view(("audience", using, application.pk), load, read_at=read_at)


# Applications and event types changed by any means that saves or deletes a model (the
# admin, the ORM, model events' catalogue entries) are announced: publish() keeps them.


@receiver(pre_save, sender=Application, dispatch_uid="outbox.application.pre_save")
def _application_before(sender: Any, instance: Application, raw: bool = False, **kwargs: Any) -> None:
    if raw or instance._state.adding or instance.pk is None:
        return
    using = kwargs.get("using") or DEFAULT_DB_ALIAS
    instance._outbox_uid_before = (  # type: ignore[attr-defined]
        Application.objects.using(using).filter(pk=instance.pk).values_list("uid", flat=True).first()
    )


@receiver(post_save, sender=Application, dispatch_uid="outbox.application.post_save")
def _application_saved(sender: Any, instance: Application, created: bool = False, **kwargs: Any) -> None:
    before = getattr(instance, "_outbox_uid_before", None)
    tags = [application_tag(instance.pk), application_uid_tag(instance.uid)]
    if before and before != instance.uid:
        tags.append(application_uid_tag(before))
    announce(tags, kwargs.get("using") or DEFAULT_DB_ALIAS, local=created)


@receiver(post_delete, sender=Application, dispatch_uid="outbox.application.post_delete")
def _application_deleted(sender: Any, instance: Application, **kwargs: Any) -> None:
    tags = [application_tag(instance.pk), application_uid_tag(instance.uid)]
    announce(tags, kwargs.get("using") or DEFAULT_DB_ALIAS)


@receiver(post_save, sender=EventType, dispatch_uid="outbox.event_type.post_save")
def _event_type_saved(sender: Any, instance: EventType, created: bool = False, **kwargs: Any) -> None:
    announce([event_type_tag(instance.name)], kwargs.get("using") or DEFAULT_DB_ALIAS, local=created)


@receiver(post_delete, sender=EventType, dispatch_uid="outbox.event_type.post_delete")
def _event_type_deleted(sender: Any, instance: EventType, **kwargs: Any) -> None:
    announce([event_type_tag(instance.name)], kwargs.get("using") or DEFAULT_DB_ALIAS)
