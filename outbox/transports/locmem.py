"""An in-memory transport for tests of projects that use the outbox.

Delivered messages are appended to :data:`outbox` (a module-level list), as Django's
locmem email backend does with ``django.core.mail.outbox``; empty it between tests
with ``outbox.clear()``. Options:

* ``fail_with`` (str, optional): fail every delivery with
  :class:`~outbox.exceptions.DeliveryError` and this text (nothing is appended).
* ``permanent`` (bool, default False): make that failure permanent (failed at once).

Works in RQ's ``SimpleWorker`` or a burst worker in the test process; a forking worker
appends in its child process, where the test cannot see it. One attempt at a time per
worker (``max_in_flight = 1``), so :data:`outbox` holds messages in the order they were due.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from outbox.exceptions import DeliveryError
from outbox.records import Message
from outbox.transports.base import DeliveryResult, Transport

#: Messages delivered by every locmem destination in this process, oldest first.
outbox: list[Message] = []


class LocmemTransport(Transport):
    """Keeps delivered messages in :data:`outbox` (see the module docstring).

    Raises:
        ImproperlyConfigured: from ``__init__``, for a ``fail_with`` that is not a str or
            a ``permanent`` that is not a bool.
    """

    options = ("fail_with", "permanent")
    max_in_flight = 1  # appends in due order (tests compare the list with what they sent)

    def __init__(self, destination: str, **options: Any) -> None:
        super().__init__(destination, **options)
        self.fail_with = options.get("fail_with")
        if self.fail_with is not None and not isinstance(self.fail_with, str):
            raise ImproperlyConfigured(
                f"destination {destination!r}: OPTIONS['fail_with'] must be a str, not {self.fail_with!r}"
            )
        self.permanent = options.get("permanent", False)
        if not isinstance(self.permanent, bool):
            raise ImproperlyConfigured(
                f"destination {destination!r}: OPTIONS['permanent'] must be a bool, not {self.permanent!r}"
            )

    def longest_attempt(self) -> float:
        """1 s: appending to a list in memory returns at once, but its attempt thread may
        wait for a core on a loaded machine. With 0 the run's watch (0.2 s past the
        deadline) gave up attempts that had not yet run, which then ran too: the message
        was delivered twice (seen with 4 test processes on 2 cores)."""
        return 1.0

    def deliver(self, message: Message) -> DeliveryResult:
        """Append the message to :data:`outbox`, or fail as ``fail_with`` says.

        Raises:
            DeliveryError: when ``fail_with`` is set.
        """
        if self.fail_with:
            raise DeliveryError(self.fail_with, permanent=self.permanent)
        outbox.append(message)
        return DeliveryResult()
