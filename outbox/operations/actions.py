"""The work of each bulk operation on messages: requeue, retry now, cancel, delete,
applied in chunks of ids (:data:`CHUNK`, one Lua call each).

Each works on any iterable of ids (a selection, or every id matching a filter from
:meth:`~outbox.store.MessageRepository.iter_ids`), 1,000 ids per Lua call, never one
round trip per message. Naming the operations, who may run them and what they act on
is :mod:`outbox.operations.operation`'s. Every change is a compare-and-set: ids that changed meanwhile
are counted as skipped, not forced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice

from outbox.events import send_bulk_signal
from outbox.records import CANCELLABLE_STATUSES, DELETABLE_STATUSES, REQUEUEABLE_STATUSES, Status
from outbox.store import BulkChange, get_repository
from outbox.store.background import wakeups
from outbox.store.base import IDS_PER_CALL

CHUNK = IDS_PER_CALL
# Seconds between the index scores of messages changed in one chunk: distinct scores
# keep walks by score (MessageRepository.iter_ids) free of large ties. 1 microsecond is
# 4 ULPs of an epoch time near 1.8e9, so the scores stay distinct.
TIE_BREAK_US = 1
TIE_BREAK = TIE_BREAK_US / 1e6


class ScoreClock:
    """Hands out the first index score for each chunk so chunks never overlap.

    A chunk of n messages takes the scores ``now, now + 1 µs, ... now + (n - 1) µs``
    (``lua/bulk.lua``). Chunks are prepared faster than 1 µs per message, so reading
    ``time.time()`` per chunk would hand the next chunk scores the previous one already
    used; this clock starts each chunk at or after the previous chunk's end, counting in
    whole microseconds (exact as floats near today's epoch). Thread-safe, one per process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_us = 0

    def reserve(self, count: int) -> float:
        """Epoch seconds to use as ``now`` for a chunk of ``count`` messages."""
        with self._lock:
            start_us = max(time.time_ns() // 1000, self._next_us)
            self._next_us = start_us + max(count, 1) * TIE_BREAK_US
        return start_us / 1e6


score_clock = ScoreClock()

#: The changes of :func:`cancel` and :func:`cancel_dead_letters` (those of requeue and
#: retry now set ``next_attempt_at`` to the chunk's time: built per chunk).
CANCEL = BulkChange("cancelled", CANCELLABLE_STATUSES, Status.CANCELLED.value, unset=("next_attempt_at",))
CANCEL_DEAD_LETTERS = BulkChange("cancelled", (Status.FAILED.value,), Status.CANCELLED.value)
logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (acted so far, skipped so far)
Applied = Callable[[list[str]], None]  # the ids one chunk acted on (e.g. a batch recorder)


@dataclass
class ActionResult:
    """How many messages an action changed, and how many it skipped (wrong status or gone).

    ``payload_purged``: of the skipped, the deliveries of a published event a requeue
    refused because the event's payload record is gone (purged): there is nothing to send.
    """

    acted: int = 0
    skipped: int = 0
    payload_purged: int = 0

    def add(self, other: ActionResult) -> None:
        self.acted += other.acted
        self.skipped += other.skipped
        self.payload_purged += other.payload_purged


class Acted(list[str]):
    """The ids one chunk acted on (what an :data:`Execute` returns), with those a requeue
    refused because their event's payload was purged (``purged``)."""

    purged: list[str]

    def __init__(self, ids: list[str], purged: list[str] | None = None) -> None:
        super().__init__(ids)
        self.purged = purged or []


def chunks(ids: Iterable[str], size: int = CHUNK) -> Iterator[list[str]]:
    """Split any iterable of ids into lists of at most ``size``.

    (:meth:`~outbox.store.MessageRepository.iter_ids` yields lists: flatten it with
    ``itertools.chain.from_iterable`` first.)

    Raises:
        TypeError: an item is not a str (e.g. a list of ids was passed unflattened).
    """
    it = iter(ids)
    while True:
        chunk = list(islice(it, size))
        if not chunk:
            return
        if not all(isinstance(i, str) for i in chunk):
            raise TypeError("message ids must be str; flatten lists of ids (e.g. from iter_ids) first")
        yield chunk


Execute = Callable[[], list[str]]  # writes one prepared chunk; returns the ids acted on


class PartlyApplied(Exception):
    """Raised by an :data:`Execute` whose chunk applied in some partitions while another
    partition's call failed: ``applied``, the ids acted on (signalled and counted by
    :func:`_run` before it raises ``error``, the first partition's error)."""

    def __init__(self, applied: list[str], error: Exception) -> None:
        super().__init__(str(error))
        self.applied = applied
        self.error = error


def _run(
    ids: Iterable[str],
    action: str,
    prepare: Callable[[list[str]], Execute],
    progress: Progress | None,
    applied: Applied | None = None,
) -> ActionResult:
    """Prepare each chunk in this thread while a helper thread writes the previous one.

    Python's share of a bulk action (building the changes, reading each chunk's queues)
    then overlaps Redis's share (running the script) instead of adding to it; redis-py
    releases the GIL while it waits on the socket. Signals are sent from this thread.
    """
    total = ActionResult()
    in_flight: tuple[int, Future[list[str]]] | None = None

    def collect(size: int, future: Future[list[str]]) -> None:
        error: Exception | None = None
        try:
            done = future.result()
        except PartlyApplied as exc:  # signal and count what applied, then fail as before
            done, error = exc.applied, exc.error
        send_bulk_signal(action, done)
        if applied is not None:
            applied(done)
        purged = getattr(done, "purged", [])
        if purged:
            logger.warning(
                "outbox: %d message(s) not %s: the event's payload was purged (%s)",
                len(purged),
                action,
                ", ".join(purged[:5]) + (", ..." if len(purged) > 5 else ""),
            )
        total.add(ActionResult(len(done), size - len(done), len(purged)))
        if progress:
            progress(total.acted, total.skipped)
        if error is not None:
            raise error

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-bulk") as writer:
        for chunk in chunks(ids):
            execute = prepare(chunk)
            if in_flight is not None:
                collect(*in_flight)
            in_flight = (len(chunk), writer.submit(execute))
        if in_flight is not None:
            collect(*in_flight)
    return total


def _writer(ids: list[str], change: BulkChange, now: float) -> Execute:
    """The write of one chunk (``lua/bulk.lua``); the returned callable sends it, wakes
    the queues that got due messages, and returns the ids acted on (raises
    :class:`PartlyApplied` when a partition's call failed while others applied)."""
    if not ids:
        return list
    repo = get_repository()

    def execute() -> list[str]:
        result = repo.bulk_transition(ids, change, now, step=TIE_BREAK)
        wakeups.enqueue_wakeups(result.woken)
        if result.errors:
            raise PartlyApplied(result.applied, next(iter(result.errors.values())))
        return Acted(result.applied, result.purged)

    return execute


def requeue(
    ids: Iterable[str], *, progress: Progress | None = None, applied: Applied | None = None
) -> ActionResult:
    """Send failed, cancelled or succeeded messages again.

    Each goes back to ``pending``, due now, with its retry count reset to 0 (a fresh
    retry budget), and its queue is woken; its attempt history is kept. ``applied`` is
    called with the ids of each chunk acted on (all actions here take it).
    """
    return _run(ids, "requeued", _prepare_requeue, progress, applied)


def retry_now(
    ids: Iterable[str],
    *,
    progress: Progress | None = None,
    applied: Applied | None = None,
    due_by: float | None = None,
) -> ActionResult:
    """Make retrying messages due now, keeping their retry budget.

    Each stays ``retrying`` with its retry count unchanged; its ``next_attempt_at``
    becomes now (its backoff wait is skipped) and its queue is woken. Messages in any
    other status are skipped.

    Args:
        due_by: when set (epoch seconds), the messages are made due at or before it
            (from ``due_by - 10`` up, a microsecond apart, counting up across chunks),
            not at the time each chunk is written. A walk of the ``retrying`` index from
            just after ``due_by`` (:class:`outbox.operations.Selection` does this for
            "all matching") then never meets a message it already moved. Up to 10
            million messages keep distinct scores below ``due_by``.
    """
    if due_by is None:
        return _run(ids, "retried_now", _prepare_retry_now, progress, applied)
    clock = {"next": due_by - 10.0}

    def prepare(chunk: list[str]) -> Execute:
        now = min(clock["next"], due_by)
        clock["next"] = now + len(chunk) * TIE_BREAK
        return _retry_now_writer(chunk, now)

    return _run(ids, "retried_now", prepare, progress, applied)


def _prepare_retry_now(ids: list[str]) -> Execute:
    return _retry_now_writer(ids, score_clock.reserve(len(ids)))


def _retry_now_writer(ids: list[str], now: float) -> Execute:
    change = BulkChange(
        "retried_now", (Status.RETRYING.value,), Status.RETRYING.value, set={"next_attempt_at": repr(now)}
    )
    return _writer(ids, change, now)


def _prepare_requeue(ids: list[str]) -> Execute:
    now = score_clock.reserve(len(ids))
    change = BulkChange(
        "requeued",
        REQUEUEABLE_STATUSES,
        Status.PENDING.value,
        set={"next_attempt_at": repr(now)},
        # retry_count back to 0: a field at its default is left out of the record
        unset=("retry_count", "last_error", "last_error_class", "last_status_code", "lease"),
    )
    return _writer(ids, change, now)


def cancel(
    ids: Iterable[str], *, progress: Progress | None = None, applied: Applied | None = None
) -> ActionResult:
    """Withdraw pending or retrying messages (-> ``cancelled``): they leave their queue's due index."""
    return _run(ids, "cancelled", _prepare_cancel, progress, applied)


def _prepare_cancel(ids: list[str]) -> Execute:
    return _writer(ids, CANCEL, score_clock.reserve(len(ids)))


def cancel_dead_letters(
    ids: Iterable[str], *, progress: Progress | None = None, applied: Applied | None = None
) -> ActionResult:
    """Cancel dead letters (``failed`` -> ``cancelled``): the head of a blocked ordering
    key, which releases the key (its next message becomes the head). Messages in any
    other status are skipped."""
    return _run(ids, "cancelled", _prepare_cancel_dead_letters, progress, applied)


def _prepare_cancel_dead_letters(ids: list[str]) -> Execute:
    return _writer(ids, CANCEL_DEAD_LETTERS, score_clock.reserve(len(ids)))


def delete(
    ids: Iterable[str], *, progress: Progress | None = None, applied: Applied | None = None
) -> ActionResult:
    """Delete messages and their history for good (any status but ``sending``)."""
    return _run(ids, "deleted", _prepare_delete, progress, applied)


def _prepare_delete(ids: list[str]) -> Execute:
    repo = get_repository()
    return lambda: [
        message_id for message_id, ok in zip(ids, repo.delete(ids, DELETABLE_STATUSES), strict=True) if ok
    ]
