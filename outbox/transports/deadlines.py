"""Running work with a deadline: in a helper thread that is given up at the deadline
(transports whose library cannot be interrupted: a callable, SMTP, name resolution), or,
in a worker's attempt thread, directly, while the worker's run watches the deadline.

A worker runs each attempt in a thread of :data:`attempt_threads` inside
:func:`watching`, and gives the attempt up when its transport's deadline passes
(:mod:`outbox.delivery`). :func:`call_with_deadline` called there with a deadline no
shorter than the watched one runs the work directly: handing it to another thread and
back costs two thread wake-ups per attempt (about 100 µs on a small VM) and buys nothing
the watch does not already give.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from django.db import connections

from outbox.exceptions import DeliveryError

T = TypeVar("T")


class DaemonThreads:
    """A pool of reusable daemon threads that grows as needed.

    Starting a thread per piece of work costs about 100 µs; these threads wait for the
    next piece instead (at most ``keep_idle`` idle ones are kept). A piece submitted
    while none is idle starts a new thread, so work that was given up at its deadline
    and still runs never holds up later work. They are daemon threads, unlike
    ``concurrent.futures``' workers, so a piece of work that never returns does not keep
    the process from exiting. How many pieces run at once is the caller's to bound.

    Args:
        name: the threads' name (shown by ``py-spy``, faulthandler and logs).
        keep_idle: most idle threads kept waiting for work.
    """

    def __init__(self, name: str, keep_idle: int = 64) -> None:
        self._name = name
        self._keep_idle = keep_idle
        self.reset()
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        """Forget every thread: a forked child (RQ's work horse) inherits the counts but
        none of the threads."""
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, function: Callable[[], T]) -> Future[T]:
        """Run ``function()`` in one of the threads; its result or exception goes to the
        returned future."""
        future: Future[T] = Future()
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        self._tasks.put((function, future))
        if start:
            threading.Thread(target=self._work, name=self._name, daemon=True).start()
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


_helpers = DaemonThreads("outbox-deadline")
#: The threads a worker runs its attempts in (:mod:`outbox.delivery`).
attempt_threads = DaemonThreads("outbox-attempt")
_watched = threading.local()


@contextlib.contextmanager
def watching(seconds: float | None) -> Iterator[None]:
    """Mark the current thread as watched: its caller gives the work up ``seconds`` after
    it started (None: nothing is watched). Inside, :func:`call_with_deadline` with a
    deadline of at least ``seconds`` runs its work directly."""
    before = getattr(_watched, "seconds", None)
    _watched.seconds = seconds
    try:
        yield
    finally:
        _watched.seconds = before


def deadline_error(what: str, seconds: float) -> DeliveryError:
    """The retryable :class:`DeliveryError` of work given up at its deadline."""
    return DeliveryError(
        f"{what} did not finish within its {seconds:g}s deadline; the attempt was given up "
        "(the work may still complete in the background)",
        error_class="deadline",
    )


def _closing_connections(function: Callable[[], T]) -> T:
    """``function()``, then close the database connections it opened in this thread."""
    try:
        return function()
    finally:
        with contextlib.suppress(Exception):  # closing is best effort
            connections.close_all()


def call_with_deadline(function: Callable[[], T], seconds: float, what: str) -> T:
    """Run ``function()`` in a helper thread and wait for it at most ``seconds``.

    Python cannot stop a thread: past the deadline the attempt is given up and the
    thread is left to finish (or fail) on its own; its result is ignored. The thread
    closes the database connections ``function`` opened. Helper threads are reused.
    ``function`` runs in a copy of the caller's ``contextvars`` context, so the current
    OpenTelemetry span of the attempt is current there too.

    In a thread :func:`watching` a deadline of at most ``seconds`` (a worker's attempt),
    ``function`` runs directly in the calling thread, and the watcher gives it up.

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
    watched = getattr(_watched, "seconds", None)
    if watched is not None and watched <= seconds:
        return _closing_connections(function)
    context = contextvars.copy_context()  # the caller's context vars (its trace span) go along
    future = _helpers.submit(lambda: context.run(_closing_connections, function))
    try:
        return future.result(timeout=seconds)
    except FutureTimeout:
        future.cancel()
        raise deadline_error(what, seconds) from None
