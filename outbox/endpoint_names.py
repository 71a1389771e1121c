"""Destination names of endpoints registered at runtime (``docs/webhooks.md``).

An :class:`~outbox.models.Endpoint` is a destination named ``endpoint:<id hex>`` (its
UUID's 32 hex digits): every message of it and its state in Redis go by that name. The
prefix is reserved: a name in ``OUTBOX["DESTINATIONS"]`` cannot start with it (system
check ``outbox.E012``), so a name is a settings destination or an endpoint, never both.
"""

from __future__ import annotations

import re
import uuid

#: The reserved prefix of endpoint destination names.
ENDPOINT_PREFIX = "endpoint:"
_NAME = re.compile(r"endpoint:([0-9a-f]{32})")


def endpoint_destination(endpoint_id: uuid.UUID | str) -> str:
    """The destination name of the endpoint with this id (a UUID or its text).

    Raises:
        ValueError: ``endpoint_id`` is not a UUID.
    """
    value = endpoint_id if isinstance(endpoint_id, uuid.UUID) else uuid.UUID(str(endpoint_id))
    return f"{ENDPOINT_PREFIX}{value.hex}"


def is_endpoint(name: object) -> bool:
    """True when ``name`` is in the reserved endpoint namespace (``endpoint:...``),
    whether or not such an endpoint exists."""
    return isinstance(name, str) and name.startswith(ENDPOINT_PREFIX)


def endpoint_id(name: str) -> uuid.UUID | None:
    """The endpoint id a destination name carries, or None when it is not a well-formed
    endpoint name."""
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    return uuid.UUID(match.group(1)) if match else None


# Names announced beside endpoint names (outbox.store.endpoint_versions.bump) for the
# copies outbox.publish keeps (outbox.destinations.config.EndpointCache.view): never an
# endpoint's or a settings destination's name (no "endpoint:" prefix; a settings name may
# look like one, but only endpoint copies and views are forgotten by name).


def application_tag(pk: object) -> str:
    """The name announced when the application with this primary key, or one of its
    endpoints, changes."""
    return f"application:{pk}"


def application_uid_tag(uid: str) -> str:
    """The name announced when an application with this uid is created, renamed or deleted."""
    return f"application-uid:{uid}"


def event_type_tag(name: str) -> str:
    """The name announced when the event type ``name`` changes or is deleted."""
    return f"event-type:{name}"
