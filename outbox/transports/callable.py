"""Deliver by calling a Python function.

Options:

* ``path`` (str, required): dotted path of a function ``f(message)`` taking a
  :class:`~outbox.records.Message`. Returning means delivered (a returned
  :class:`~outbox.transports.DeliveryResult` is recorded, any other value ignored);
  raising means failed: a :class:`~outbox.exceptions.DeliveryError` keeps its
  ``permanent``, ``retry_after`` and ``status_code``; any other exception is a
  retryable failure, recorded as ``"<type>: <text>"``. Either text is recorded with the
  message's secrets (sensitive header values, Authorization-style values) redacted.
* ``deadline`` (seconds, default 30): the hard limit of one call. The function runs in
  a thread of the worker process; when the deadline passes the attempt fails
  (retryable) and the thread is abandoned to finish on its own, so a function that may
  outlive its deadline must be idempotent (delivery is at least once anyway). System
  check ``outbox.W003`` compares it with half of ``VISIBILITY_TIMEOUT``.

The function runs in the worker process, once per attempt; it must be importable there.
It runs in its own thread: thread-locals of the worker are not visible, and database
connections it opens are closed when it returns.
"""

from __future__ import annotations

import inspect
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string
from rq.timeouts import JobTimeoutException

from outbox.exceptions import DeliveryError
from outbox.records import Message
from outbox.redaction import redact, secrets_for
from outbox.transports.base import DeliveryResult, Transport, positive_seconds
from outbox.transports.deadlines import call_with_deadline

DEFAULT_DEADLINE = 30.0  # seconds


class CallableTransport(Transport):
    """Calls the function at ``OPTIONS["path"]`` with the message.

    Raises:
        ImproperlyConfigured: from ``__init__``, when ``path`` is missing, cannot be
            imported, or is not a function of one argument.
    """

    options = ("path", "deadline")
    # In the worker's own process: with no MAX_IN_FLIGHT, attempts may use every slot of
    # the worker (CONCURRENCY), see Transport.in_process. A function that is not
    # thread-safe sets its destination's MAX_IN_FLIGHT to 1.
    in_process = True

    def __init__(self, destination: str, **options: Any) -> None:
        super().__init__(destination, **options)
        where = f"destination {destination!r}"
        path = options.get("path")
        if not isinstance(path, str) or not path:
            raise ImproperlyConfigured(
                f"{where}: the callable transport needs OPTIONS['path'], a dotted path"
            )
        try:
            self.function = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(f"{where}: cannot import OPTIONS['path'] {path!r}: {exc}") from exc
        if not callable(self.function) or inspect.isclass(self.function):
            raise ImproperlyConfigured(f"{where}: OPTIONS['path'] {path!r} is not a function")
        try:
            inspect.signature(self.function).bind(None)
        except TypeError as exc:
            raise ImproperlyConfigured(
                f"{where}: OPTIONS['path'] {path!r} must take one argument, the message ({exc})"
            ) from exc
        except ValueError:  # no signature to inspect (some builtins): trust it
            pass
        self.path = path
        self.deadline = positive_seconds(
            options.get("deadline", DEFAULT_DEADLINE), f"{where}: OPTIONS['deadline']"
        )

    def longest_attempt(self) -> float:
        """The ``deadline`` option (seconds)."""
        return self.deadline

    def deliver(self, message: Message) -> DeliveryResult:
        """Call the function with the message.

        Returns:
            The function's :class:`DeliveryResult` if it returned one, else an empty one.

        Raises:
            DeliveryError: retryable, the function did not return within ``deadline``.
            DeliveryError: what the function raised; another exception becomes a retryable
                ``DeliveryError("<type>: <text>")``. Texts are redacted.
        """
        secrets = secrets_for(message.headers, None)
        try:
            result = call_with_deadline(
                lambda: self.function(message), self.deadline, f"the callable {self.path!r}"
            )
        except DeliveryError as exc:
            exc.args = (redact(str(exc), secrets=secrets), *exc.args[1:])
            raise
        except JobTimeoutException:  # RQ's job timeout, raised while waiting: not the message's fault
            raise
        except Exception as exc:  # recorded as "<type>: <text>", secrets redacted
            raise DeliveryError(redact(f"{type(exc).__name__}: {exc}", secrets=secrets)) from exc
        return result if isinstance(result, DeliveryResult) else DeliveryResult()
