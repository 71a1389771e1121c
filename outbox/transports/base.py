"""The transport interface: how a message reaches its destination.

A transport is a class built once per destination per worker process with the
destination's ``OPTIONS`` as keyword arguments, in the manner of django-anymail's
backends. Subclasses implement :meth:`Transport.deliver`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from outbox.records import Message

T = TypeVar("T")


def positive_seconds(value: Any, where: str) -> float:
    """A positive, finite number of seconds from an option.

    Raises:
        django.core.exceptions.ImproperlyConfigured: anything else.
    """

    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ImproperlyConfigured(f"{where} must be a positive number of seconds, not {value!r}"[:300])
    return float(value)


@dataclass
class DeliveryResult:
    """What a successful delivery returns.

    Attributes:
        status_code: the receiver's HTTP status code, if the transport speaks HTTP.
        detail: a short note for the attempt history (e.g. the SMTP server's reply).
    """

    status_code: int | None = None
    detail: str = ""


class Transport:
    """Base class of transports.

    Args:
        destination: the destination name this instance serves.
        **options: the destination's ``OPTIONS``.

    Raises:
        django.core.exceptions.ImproperlyConfigured: from ``__init__`` when the options
            are wrong (unknown keys, missing URL...); surfaced as system check
            ``outbox.E002`` at startup.
    """

    #: Names of the options this transport accepts; others are refused.
    options: tuple[str, ...] = ()
    #: Attempts of one destination in flight at once per worker process when the
    #: destination sets no ``MAX_IN_FLIGHT`` (None: ``OUTBOX["MAX_IN_FLIGHT"]``).
    #: ``deliver()`` is called from a pool of threads; a transport that is not safe to
    #: call concurrently says 1.
    max_in_flight: int | None = None
    #: The transport does its work in the worker's own process (a callable): there is no
    #: receiver for a per-worker cap to shield, so when neither the destination nor
    #: ``max_in_flight`` sets a cap its attempts may take every slot of the worker
    #: (``OUTBOX["CONCURRENCY"]``) instead of ``OUTBOX["MAX_IN_FLIGHT"]``. A cap below the
    #: pool makes each round trip (outcomes written, next messages claimed) carry fewer
    #: messages: one busy no-op callable drained at about 1,400/s with a cap of 1 and
    #: about 8,400/s with 32 (issue 20, item 13).
    in_process: bool = False
    #: The host (``name`` or ``name:port``) this transport sends to, recorded on each
    #: attempt and named in the console; "" when it has none to name (a callable...).
    host: str = ""

    def __init__(self, destination: str, **options: Any) -> None:
        unknown = set(options) - set(self.options)
        if unknown:
            raise ImproperlyConfigured(
                f"destination {destination!r}: unknown option(s) for {type(self).__name__}: "
                f"{', '.join(sorted(unknown))} (accepted: {', '.join(self.options) or 'none'})"
            )
        self.destination = destination

    def deliver(self, message: Message) -> DeliveryResult:
        """Deliver one message.

        Returns:
            A :class:`DeliveryResult` on success.

        Raises:
            outbox.exceptions.DeliveryError: the delivery failed; ``permanent=True``
                means retrying cannot help. Any other exception is taken as a
                retryable failure too, recorded with its type and text.
        """
        raise NotImplementedError

    def longest_attempt(self) -> float | None:
        """The hard deadline of one delivery attempt in seconds, enforced by the transport,
        or None when it has none.

        Built-in transports enforce theirs (webhook: every socket operation is cut to the
        time left; email and callable: the work runs in a thread that is given up at the
        deadline). A worker also watches every attempt: one still running
        ``outbox.delivery.WATCH_GRACE`` (0.2 s) after this deadline is given up as a
        retryable ``deadline`` failure, its thread left to finish. System check
        ``outbox.W003`` warns when it is over half of ``OUTBOX["VISIBILITY_TIMEOUT"]``, or
        None: an attempt that outlives its lease lets the recovery sweep hand the message
        to another worker while the first is still delivering it (a duplicate delivery).
        Override it in your own transports.
        """
        return None

    def check_message(self, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        """Refuse, at ``send()`` time, a message this transport could never deliver.

        Args:
            body: the encoded body (bytes); content_type: its MIME type; headers: extra headers.

        Raises:
            outbox.exceptions.InvalidMessage: the message cannot be delivered this way.
        """

    def close(self) -> None:
        """Release connections or other resources. Called when a worker shuts down."""
