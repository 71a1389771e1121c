"""Exceptions raised by the outbox.

Every error the outbox raises on purpose derives from :class:`OutboxError`, so a
caller can catch one class. Invalid settings are reported as Django's
``ImproperlyConfigured`` (and as system checks, see :mod:`outbox.checks`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any


class OutboxError(Exception):
    """Base class of every exception the outbox raises on purpose."""


class InvalidMessage(OutboxError, ValueError):
    """``send()`` was given input it cannot accept; nothing was written to Redis.

    Attributes:
        field: the argument at fault (``"body"``, ``"headers"``, ``"destination"``...).
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnknownDestination(InvalidMessage):
    """The destination name is not a key of ``OUTBOX["DESTINATIONS"]``."""


class EndpointDeleted(UnknownDestination):
    """A delivery's endpoint was deleted: it cannot be requeued (raised by
    :func:`outbox.requeue`, naming the deliveries; nothing was requeued).

    Attributes:
        message_ids: the deliveries whose endpoint is gone.
    """

    def __init__(self, text: str, message_ids: list[str]) -> None:
        super().__init__(text, field="destination")
        self.message_ids = message_ids


class InvalidEndpoint(InvalidMessage):
    """An application, endpoint or event type given to :mod:`outbox.webhooks` is not
    acceptable (a bad URL, an address the private-network guard refuses, an unknown or
    archived event type, a bad secret...); nothing was written. ``field`` names the
    attribute at fault. Its text never quotes a secret."""


class UnknownApplication(InvalidMessage):
    """No :class:`~outbox.models.Application` has this uid (``outbox.publish``)."""


class UnknownEventType(InvalidMessage):
    """The event type is not in the catalogue, or is archived (and
    ``OUTBOX["ENDPOINTS"]["ALLOW_UNKNOWN_EVENT_TYPES"]`` is off)."""


class EndpointUnavailable(OutboxError):
    """An endpoint registered at runtime exists but cannot take deliveries now: it is
    disabled, or its secrets cannot be decrypted (a wrong ``OUTBOX["ENDPOINTS"]
    ["SECRET_KEYS"]``). A worker that meets one of its deliveries records a retryable
    failure that parks the delivery with no retry charged (the endpoint's state in Redis
    is disabled or paused first): its deliveries wait, they do not become dead letters."""


class MessageTooLarge(InvalidMessage):
    """The encoded body is larger than ``OUTBOX["MAX_BODY_BYTES"]`` (a published event's
    payload: than ``OUTBOX["ENDPOINTS"]["MAX_PAYLOAD_BYTES"]`` when that is set).

    Attributes:
        size: the encoded body size in bytes.
        limit: the configured limit in bytes.
        setting: the setting that holds the limit, as written in settings.py.
    """

    def __init__(
        self, size: int, limit: int, setting: str = "OUTBOX['MAX_BODY_BYTES']", field: str = "body"
    ) -> None:
        what = "message body" if field == "body" else field
        super().__init__(f"{what} is {size} bytes, over the limit of {limit} bytes ({setting})", field=field)
        self.size = size
        self.limit = limit
        self.setting = setting


class MessageNotFound(OutboxError, KeyError):
    """No message record exists under this id (never sent, or deleted)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else "message not found"


class DeliveryError(OutboxError):
    """A transport failed to deliver a message.

    Transports raise it (or a subclass) from ``deliver()``. The worker records it as
    a failed delivery attempt and decides: retry with backoff, or dead letter.

    Args:
        message: what went wrong, for the attempt history (kept to 1,000 chars).
        status_code: the receiver's HTTP status, when there was a response.
        retry_after: seconds the receiver asked us to wait (``Retry-After``), or None.
        permanent: True when retrying cannot help (HTTP 400, bad address...):
            the message is failed at once, whatever retries are left.
        error_class: a short name for the kind of failure, used to group errors in
            the console and to filter lists (at most 64 characters). Default:
            ``"http"`` when there was a response (``status_code`` set), else the name
            of the exception this one was raised from (``raise ... from exc``:
            ``ConnectError``, ``ReadTimeout``, ``SMTPServerDisconnected`` ...), else
            ``"error"``. The built-in transports use ``"timeout"`` (no answer within
            the timeout), ``"deadline"`` (the attempt's hard deadline passed) and
            ``"blocked_address"`` (``BLOCK_PRIVATE_NETWORKS`` refused the address).
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retry_after: float | None = None,
        permanent: bool = False,
        error_class: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after
        self.permanent = permanent
        self._error_class = error_class

    @property
    def error_class(self) -> str:
        """The kind of failure (see the class docstring); never empty."""
        if self._error_class:
            return self._error_class[:64]
        if self.status_code is not None:
            return "http"
        cause = self.__cause__
        if isinstance(cause, DeliveryError):
            return cause.error_class
        if cause is not None:
            return type(cause).__name__[:64]
        return "error"


class PermanentDeliveryError(DeliveryError):
    """A delivery failure that retrying cannot fix; the message becomes a dead letter."""

    def __init__(
        self, message: str, *, status_code: int | None = None, error_class: str | None = None
    ) -> None:
        super().__init__(message, status_code=status_code, permanent=True, error_class=error_class)


class IdempotencyConflict(InvalidMessage):
    """The idempotency key was already used for this destination with another body.

    As Stripe does with a reused key and different parameters: the first message stands
    and nothing is written for this one.

    With more than one partition, ``send_many()`` is atomic per partition only: the
    messages of the other partitions are written (:attr:`stored`).

    Attributes:
        existing_id: the id of the message already sent under the key.
        stored: the messages of the same ``send_many()`` call that were written (those of
            other partitions; empty with one partition).
    """

    def __init__(self, message: str, *, existing_id: str, stored: list[Any] | None = None) -> None:
        super().__init__(message, field="idempotency_key")
        self.existing_id = existing_id
        self.stored = stored or []


class OutboxUnavailable(OutboxError):
    """Redis could not be reached to store a message (outside a transaction); nothing
    was stored. When the write was sent and only its reply is missing (a timeout), the
    subclass :class:`SendOutcomeUnknown` is raised instead: then the messages may be
    stored. Inside ``transaction.atomic`` this is not raised: the message is
    captured in the database and reaches Redis later (see :mod:`outbox.sending.capture`).

    On a cluster, ``send_many()`` may store the messages of some partitions and not of
    others (one primary down): then :attr:`stored` lists the messages that were stored
    (they will be delivered; sending them again without an idempotency key makes a
    second copy) and :attr:`unstored` those that were not. Both are empty lists when
    nothing was stored.

    Attributes:
        stored: the messages stored (with the ids they were stored under).
        unstored: the messages not stored.
    """

    def __init__(
        self, message: str, *, stored: list[Any] | None = None, unstored: list[Any] | None = None
    ) -> None:
        super().__init__(message)
        self.stored = stored or []
        self.unstored = unstored or []


class SendOutcomeUnknown(OutboxUnavailable):
    """The write of ``send()`` or ``send_many()`` (outside a transaction) reached Redis, or
    may have, but its reply did not come back: a read timed out, or the connection broke
    after the command was sent. Redis may have stored the messages (and a worker may
    deliver them) or not: the outcome is **unknown**, not "nothing was stored".

    A subclass of :class:`OutboxUnavailable`, so an ``except OutboxUnavailable`` still
    catches it. Sending the same content again with ``send()`` would make a second
    message when the first write did land; instead call
    ``outbox.send_again(exc.unknown)``, which stores these messages under the ids they
    already have and leaves a message that is already stored as it is (the write is
    idempotent on the message id), so the pair never makes two messages. Do it soon: a
    message that was stored, delivered and then purged by retention would be stored
    again. A message with an idempotency key is safe to send again with ``send()`` too.

    Attributes:
        unknown: the messages whose outcome is unknown (with the ids they were sent under).
        stored: the messages known to be stored (``send_many()`` on a cluster, where
            other partitions answered).
        unstored: the messages known not to be stored.
    """

    def __init__(
        self,
        message: str,
        *,
        unknown: list[Any],
        stored: list[Any] | None = None,
        unstored: list[Any] | None = None,
    ) -> None:
        super().__init__(message, stored=stored, unstored=unstored)
        self.unknown = unknown

    @property
    def ids(self) -> list[str]:
        """The ids of :attr:`unknown`, in order."""
        return [m.id for m in self.unknown]


class SendCancelled(SendOutcomeUnknown, asyncio.CancelledError):
    """An ``asend()`` (or ``asend_many()``, ``asend_again()``) whose task was cancelled
    (a client that went away, ``asyncio.timeout``, a task group ending) after its write
    was sent: like a timeout, the outcome is unknown. A :class:`SendOutcomeUnknown`
    (``exc.unknown``; ``outbox.send_again(exc.unknown)`` stores them once) and an
    ``asyncio.CancelledError``, so the task still ends cancelled: ``except
    SendOutcomeUnknown`` sees the messages, and asyncio sees the cancellation.

    A cancellation before the write was sent raises a plain ``asyncio.CancelledError``:
    then nothing was stored.
    """


class NotDurable(OutboxError):
    """The messages were written on the Redis primary, but not acknowledged as durable
    as ``OUTBOX["DURABILITY"]`` asks (replicas with ``WAIT``, AOF fsyncs with
    ``WAITAOF``) within its ``TIMEOUT``, or the wait failed.

    Raised by ``send()`` and ``send_many()`` outside a transaction, after the wake-up
    jobs are enqueued: the messages exist and will be delivered unless the primary
    fails before a replica (or its disk) has them. So, unlike
    :class:`OutboxUnavailable`, it does not mean "nothing was stored": sending again
    without an idempotency key makes a second message. It is raised rather than logged
    because the caller asked for a guarantee that did not hold; a caller that accepts the
    weaker one catches it and goes on with :attr:`messages`. Inside
    ``transaction.atomic`` it is never raised to the caller: the captured row is kept
    until a push is acknowledged (see ``docs/operations.md``, "Durability and failover").

    Attributes:
        ids: the ids of the messages the call stands for, in order (an idempotency key
            used before: the earlier message's id).
        messages: what ``send()`` (one) or ``send_many()`` would have returned; empty
            when raised below them (:func:`outbox.sending.intake.store`).
        replicas: replicas that acknowledged (received the write for ``WAIT``, fsynced
            it for ``WAITAOF``); 0 when the wait failed.
        required: replicas asked for (``DURABILITY["REPLICAS"]``).
        aof: True when the wait was ``WAITAOF`` (``DURABILITY["AOF"]``).
        local: ``WAITAOF``: whether the primary fsynced its AOF; None for ``WAIT``.
        timeout: the wait's limit in seconds (``DURABILITY["TIMEOUT"]``).
        error: why the wait itself failed ("" when Redis answered it in time).
        created: per message, what the write did (:class:`outbox.store.Created`), for
            the sending side.
    """

    def __init__(self, message: str, shortfall: DurabilityShortfall) -> None:
        super().__init__(message)
        self.ids = shortfall.ids
        self.messages: list[Any] = []
        self.replicas = shortfall.replicas
        self.required = shortfall.required
        self.aof = shortfall.aof
        self.local = shortfall.local
        self.timeout = shortfall.timeout
        self.error = shortfall.error
        self.created = shortfall.created or []


@dataclasses.dataclass(frozen=True)
class DurabilityShortfall:
    """What a durability wait asked for and got: the facts of a :class:`NotDurable`
    (see its attributes, which take these values)."""

    ids: list[str]
    replicas: int
    required: int
    aof: bool = False
    local: bool | None = None
    timeout: float = 0.0
    error: str = ""
    created: list[Any] = dataclasses.field(default_factory=list)
