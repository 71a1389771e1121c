"""Running a piece of work with a deadline in a helper thread (transports whose library
cannot be interrupted: a callable, SMTP, name resolution)."""

from __future__ import annotations

import contextvars
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from .exceptions import DeliveryError

T = TypeVar("T")


class _DaemonThreads:
    """Reusable daemon threads for :func:`call_with_deadline`.

    Starting a thread per attempt costs about 100 µs; these threads wait for the next
    piece of work instead (at most ``keep_idle`` idle ones are kept). They are daemon
    threads, unlike ``concurrent.futures``' workers, so a piece of work that never
    returns does not keep the process from exiting.
    """

    def __init__(self, keep_idle: int = 64) -> None:
        self._keep_idle = keep_idle
        self.reset()

    def reset(self) -> None:
        """Forget every thread: a forked child (RQ's work horse) inherits the counts but
        none of the threads."""
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, function: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        self._tasks.put((function, future))
        if start:
            threading.Thread(target=self._work, name="outbox-deadline", daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            function, future = self._tasks.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as exc:  # handed to the waiting thread
                    future.set_exception(exc)
            with self._lock:
                if self._idle >= self._keep_idle:
                    return
                self._idle += 1


_threads = _DaemonThreads()
os.register_at_fork(after_in_child=_threads.reset)


def call_with_deadline(function: Callable[[], T], seconds: float, what: str) -> T:
    """Run ``function()`` in a helper thread and wait for it at most ``seconds``.

    Python cannot stop a thread: past the deadline the attempt is given up and the
    thread is left to finish (or fail) on its own; its result is ignored. The thread
    closes the database connections ``function`` opened. Helper threads are reused.
    ``function`` runs in a copy of the caller's ``contextvars`` context, so the current
    OpenTelemetry span of the attempt is current there too.

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

    def run() -> T:
        try:
            return function()
        finally:
            try:
                from django.db import connections

                connections.close_all()
            except Exception:  # pragma: no cover - closing is best effort
                pass

    context = contextvars.copy_context()  # the caller's context vars (its trace span) go along
    future = _threads.submit(lambda: context.run(run))
    try:
        return future.result(timeout=seconds)
    except FutureTimeout:
        future.cancel()
        raise DeliveryError(
            f"{what} did not finish within its {seconds:g}s deadline; the attempt was given up "
            "(the work may still complete in the background)",
            error_class="deadline",
        ) from None
