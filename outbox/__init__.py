"""django-redis-outbox: reliable message delivery for Django on Redis.

Quick use::

    import outbox

    message = outbox.send("orders", {"order": 42})
    outbox.get(message.id).status      # "pending", "sending", "succeeded", ...

See README.md for set-up and ``docs/architecture.md`` for the records and statuses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outbox.version import __version__ as __version__

__all__ = [
    "ActionResult",
    "Attempt",
    "DeliveryError",
    "IdempotencyConflict",
    "InvalidMessage",
    "Message",
    "MessageNotFound",
    "MessageTooLarge",
    "NotDurable",
    "OutboxError",
    "OutboxUnavailable",
    "PermanentDeliveryError",
    "SendOutcomeUnknown",
    "Status",
    "UnknownDestination",
    "SendCancelled",
    "acancel",
    "adelete",
    "aget",
    "apublish",
    "arequeue",
    "asend",
    "asend_again",
    "asend_many",
    "attempts",
    "blocked_keys",
    "cancel",
    "delete",
    "get",
    "publish",
    "release_key",
    "requeue",
    "send",
    "send_again",
    "send_many",
]

_LAZY = {
    "ActionResult": "outbox.operations.actions",
    "Attempt": "outbox.records",
    "Message": "outbox.records",
    "Status": "outbox.records",
    "DeliveryError": "outbox.exceptions",
    "IdempotencyConflict": "outbox.exceptions",
    "OutboxUnavailable": "outbox.exceptions",
    "InvalidMessage": "outbox.exceptions",
    "MessageNotFound": "outbox.exceptions",
    "MessageTooLarge": "outbox.exceptions",
    "NotDurable": "outbox.exceptions",
    "OutboxError": "outbox.exceptions",
    "PermanentDeliveryError": "outbox.exceptions",
    "SendOutcomeUnknown": "outbox.exceptions",
    "UnknownDestination": "outbox.exceptions",
    "SendCancelled": "outbox.exceptions",
    "acancel": "outbox.api",
    "adelete": "outbox.api",
    "aget": "outbox.api",
    "apublish": "outbox.webhooks",
    "arequeue": "outbox.api",
    "asend": "outbox.api",
    "asend_again": "outbox.api",
    "asend_many": "outbox.api",
    "attempts": "outbox.api",
    "blocked_keys": "outbox.operations.ordering",
    "release_key": "outbox.operations.ordering",
    "cancel": "outbox.api",
    "delete": "outbox.api",
    "get": "outbox.api",
    "publish": "outbox.webhooks",
    "requeue": "outbox.api",
    "send": "outbox.api",
    "send_again": "outbox.api",
    "send_many": "outbox.api",
}

if TYPE_CHECKING:
    from outbox.api import (
        acancel,
        adelete,
        aget,
        arequeue,
        asend,
        asend_again,
        asend_many,
        attempts,
        cancel,
        delete,
        get,
        requeue,
        send,
        send_again,
        send_many,
    )
    from outbox.exceptions import (
        DeliveryError,
        IdempotencyConflict,
        InvalidMessage,
        MessageNotFound,
        MessageTooLarge,
        NotDurable,
        OutboxError,
        OutboxUnavailable,
        PermanentDeliveryError,
        SendCancelled,
        SendOutcomeUnknown,
        UnknownDestination,
    )
    from outbox.operations.actions import ActionResult
    from outbox.operations.ordering import blocked_keys, release_key
    from outbox.records import Attempt, Message, Status
    from outbox.webhooks import apublish, publish


def __getattr__(name: str) -> Any:
    # Lazy so that ``INSTALLED_APPS = ["outbox"]`` imports no Django models before setup.
    if name in _LAZY:
        import importlib  # lazy: `import outbox` loads no Django model

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups find it without calling this function (PEP 562)
        return value
    raise AttributeError(f"module 'outbox' has no attribute {name!r}")
