"""One delivery attempt: a claimed message through its transport, timed, every exception
turned into an :class:`~outbox.records.Outcome` (:func:`attempt`), in an attempt thread
whose deadline the claim loop watches (:func:`watched_attempt`).

``ERROR_LIMIT`` bounds the characters of an error kept in records.
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping

from django.core.exceptions import ImproperlyConfigured

from outbox import tracing
from outbox.destinations.config import endpoint_cache, get_transport
from outbox.exceptions import DeliveryError, EndpointUnavailable, PermanentDeliveryError, UnknownDestination
from outbox.records import Message, Outcome
from outbox.redaction import redact_message_text
from outbox.store.endpoint_versions import AdminState
from outbox.transports import deadlines

logger = logging.getLogger("outbox")


ERROR_LIMIT = 1000  # characters of an error kept in records


_worker_name: tuple[int, str] = (0, "")


def worker_name() -> str:
    """``host:pid`` of this process, written on each attempt record (computed once per
    process: ``gethostname`` costs tens of microseconds)."""
    global _worker_name
    if _worker_name[0] != os.getpid():
        _worker_name = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}")
    return _worker_name[1]


@tracing.traced_attempt  # OpenTelemetry "deliver" span around each attempt
def attempt(message: Message) -> Outcome:
    """Deliver one claimed message through its transport and time it.

    Every exception of the transport becomes part of the :class:`Outcome`: a
    :class:`~outbox.exceptions.DeliveryError` as the transport described it; any other
    exception (a bug in a transport or a callable) as a retryable failure, logged with
    its traceback. Safe to call from any thread.
    """
    started_at = time.time()
    t0 = time.perf_counter()
    outcome = Outcome(message, started_at, 0.0)
    try:
        try:
            transport = get_transport(message.destination)
        except EndpointUnavailable as exc:  # disabled or its secret unreadable: it waits, parked
            raise DeliveryError(str(exc), error_class="endpoint_unavailable") from exc
        except (UnknownDestination, ImproperlyConfigured) as exc:
            raise PermanentDeliveryError(
                redact_message_text(f"destination {message.destination!r} cannot be used: {exc}", message),
                error_class="destination_config",
            ) from exc
        outcome.host = transport.host
        if message.payload_ref and not message.body:  # its payload record gone: nothing to send
            raise PermanentDeliveryError(
                f"the event's payload was purged (payload record of {message.payload_ref} not found)",
                error_class="payload_purged",
            )
        result = transport.deliver(message)
        outcome.ok = True
        outcome.status_code = result.status_code
        outcome.detail = (result.detail or "")[:ERROR_LIMIT]
    except DeliveryError as exc:
        outcome.error = str(exc) or type(exc).__name__
        outcome.status_code = exc.status_code
        outcome.permanent = exc.permanent
        outcome.retry_after = exc.retry_after
        outcome.error_class = exc.error_class
    except Exception as exc:  # a transport bug or an unexpected library error: retryable
        outcome.error = redact_message_text(f"{type(exc).__name__}: {exc}", message)
        outcome.error_class = type(exc).__name__[:64]
        logger.warning(
            "outbox attempt id=%s destination=%s raised %s (not a DeliveryError): a bug in the transport?",
            message.id,
            message.destination,
            type(exc).__name__,
            exc_info=exc,
        )
    outcome.duration_ms = (time.perf_counter() - t0) * 1000
    outcome.error = outcome.error[:ERROR_LIMIT]
    return outcome


def prepare(destinations: Iterable[str], states: Mapping[str, AdminState] | None = None) -> None:
    """Load the configurations of the endpoints among ``destinations`` (a claim's) that
    this process lacks, together: one query instead of one each, and check them against
    ``states``, their state in Redis as the claim's gate read it (``Claim.states``), with
    no read of their own
    (:meth:`~outbox.destinations.config.EndpointCache.preload`). Never raises: what is
    not loaded here is loaded when its attempt starts."""
    try:
        endpoint_cache.preload(destinations, states)
    except Exception:
        logger.debug("outbox: loading endpoint configurations together failed", exc_info=True)


def deadline_of(destination: str) -> float | None:
    """The deadline of one attempt to ``destination`` (its transport's
    ``longest_attempt()``, seconds), or None (no deadline, or no usable transport)."""
    try:
        return get_transport(destination).longest_attempt()
    except (UnknownDestination, ImproperlyConfigured, EndpointUnavailable):
        return None


def watched_attempt(message: Message, seconds: float | None, not_before: float = 0.0) -> Outcome:
    """:func:`attempt` in an attempt thread whose deadline the run watches, in a copy of
    the thread's context (context variables a transport or a callable sets do not carry
    over to the thread's next attempt).

    ``not_before`` (epoch seconds): the attempt starts no earlier (the message's due
    time, when a claim took it a moment early: :func:`early_by`)."""
    wait = not_before - time.time()
    if wait > 0:
        time.sleep(wait)
    with deadlines.watching(seconds):
        return contextvars.copy_context().run(attempt, message)


def early_by(message: Message, now: float, slack: float) -> float:
    """How many seconds before its due time (``next_attempt_at``) a claim took
    ``message``: at most ``slack``, the claim's ``DUE_SLACK``, 0 when it was due already.

    A claim takes messages due within ``DUE_SLACK`` (0.5 s) of now, so that one round
    trip serves what falls due meanwhile; the attempt itself waits for the due time, so
    a retry never starts before the delay its backoff policy (or a receiver's
    ``Retry-After``) computed. Its concurrency slot (the destination's grant, the
    worker's in-flight count) is held for that wait: at most ``slack`` seconds."""
    due = message.next_attempt_at
    if due is None:
        return 0.0
    return max(0.0, min(due - now, slack))
