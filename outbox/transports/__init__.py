"""Transports, chosen per destination by alias or dotted path.

============ ================================================================
alias        class
============ ================================================================
``webhook``  :class:`outbox.transports.webhook.WebhookTransport`
``email``    :class:`outbox.transports.email.EmailTransport`
``callable`` :class:`outbox.transports.callable.CallableTransport`
``locmem``   :class:`outbox.transports.locmem.LocmemTransport`
============ ================================================================
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from outbox.transports.base import DeliveryResult, Transport

ALIASES = {
    "webhook": "outbox.transports.webhook.WebhookTransport",
    "email": "outbox.transports.email.EmailTransport",
    "callable": "outbox.transports.callable.CallableTransport",
    "locmem": "outbox.transports.locmem.LocmemTransport",
}


def transport_class(name: str) -> type[Transport]:
    """The transport class for an alias or a dotted path.

    Raises:
        ImproperlyConfigured: it cannot be imported or is not a :class:`Transport`.
    """
    path = ALIASES.get(name, name)
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"transport {name!r} is neither an alias ({', '.join(ALIASES)}) nor an importable class: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Transport)):
        raise ImproperlyConfigured(
            f"transport {name!r} ({path}) is not a subclass of outbox.transports.Transport"
        )
    return cls


__all__ = ["ALIASES", "DeliveryResult", "Transport", "transport_class"]
