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
