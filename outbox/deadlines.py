"""Running a piece of work with a deadline in a helper thread (transports whose library
cannot be interrupted: a callable, SMTP, name resolution)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .exceptions import DeliveryError

T = TypeVar("T")


def call_with_deadline(function: Callable[[], T], seconds: float, what: str) -> T:
    """Run ``function()`` in a new daemon thread and wait for it at most ``seconds``.

    Python cannot stop a thread: past the deadline the attempt is given up and the
    thread is left to finish (or fail) on its own; its result is ignored. The thread
    closes the database connections it opened.

    Args:
        function: what to run, without arguments.
        seconds: the deadline.
        what: how errors name it (``"the callable 'app.f'"``).

    Returns:
        What ``function`` returned.

    Raises:
        DeliveryError: retryable, the deadline passed (the work may still complete:
            delivery is at least once).
        BaseException: whatever ``function`` raised, re-raised in the calling thread.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            try:
                from django.db import connections

                connections.close_all()
            except Exception:  # pragma: no cover - closing is best effort
                pass

    thread = threading.Thread(target=run, name=f"outbox-deadline:{what}"[:60], daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise DeliveryError(
            f"{what} did not finish within its {seconds:g}s deadline; the attempt was given up "
            "(the work may still complete in the background)"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
