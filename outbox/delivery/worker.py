"""The worker process: an RQ worker on the outbox queues that outlives Redis outages,
and the housekeeping thread that every ``outbox_worker`` runs beside it.

Housekeeping (:class:`Housekeeper`), in every worker process, each on its own interval:

* **wake** (``WAKE_INTERVAL``): enqueue a wake-up job for each queue with a due
  message and no waiting job (:func:`outbox.delivery.recovery.wake_due`): delayed messages,
  retries, and work whose job was lost with a killed worker; first, parked messages
  whose time has come go back to their due index (the probe of an open circuit
  breaker, what waited behind one that closed: :func:`outbox.destinations.controls.release_parked_due`);
* **relay** (``RELAY_INTERVAL``): push messages captured in the database that missed
  the on-commit fast path (:func:`outbox.sending.capture.relay`);
* **alerts** (``WAKE_INTERVAL``): report what ended alert suppression windows counted
  (:func:`outbox.alerts.flush_due`; nothing to do without ``OUTBOX["ALERTS"]`` channels);
* **recovery sweep** (``RECOVERY_INTERVAL``, one process per interval through a Redis
  lock): take back expired leases, purge finished messages (:mod:`outbox.delivery.recovery`).

Each step is independent (one failing does not stop the others) and logs one line
when its dependency (Redis, the database) becomes unreachable and one when it is back.

:func:`run_worker` runs RQ's worker loop and, when that loop ends because Redis went
away (RQ's worker then quits), waits for Redis with backoff and starts a new one.

Two things about the process that RQ alone gets wrong for the outbox:

* **RQ's blocking wait gets a connection of its own** (:func:`rq_worker`). RQ's
  ``Worker._set_connection`` raises ``socket_timeout`` above its blocking wait
  (``dequeue_timeout`` + 10 s) in the ``connection_kwargs`` of the pool it is given. Given
  the alias's pool, that reached only connections made afterwards: one the outbox had
  made before (start-up checks, housekeeping) kept the alias's ``SOCKET_TIMEOUT``, RQ's
  ``BLPOP`` on it timed out, and RQ backed off 1, 2, 4 ... 60 s with wake-ups waiting; and
  it removed the alias's bound for every other outbox command in the process. RQ now
  waits on a pool of its own over the same server and options, and the alias keeps its
  bound.
* **A stop request is never lost** (:class:`StopRequest`). SIGTERM or SIGINT, whether
  RQ's loop runs, retries a Redis that went away, or has quit and the outbox waits for
  Redis: the worker claims nothing more, lets the attempts in flight finish (each bounded
  by its transport's deadline) and exits; what RQ does after that (unregistering itself)
  gets :data:`STOP_GRACE` seconds, so a Redis that hangs cannot hold the process. A
  second signal stops it at once, in one log line (the attempts in flight are abandoned:
  their messages come back after their lease).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from django.db import close_old_connections
from redis import Redis
from redis.exceptions import RedisClusterException, RedisError

from outbox.alerts import flush_due
from outbox.conf import outbox_settings
from outbox.delivery.attempts import worker_name
from outbox.delivery.loop import STOPPING
from outbox.delivery.recovery import recover, wake_due
from outbox.sending.capture import relay
from outbox.store import get_repository
from outbox.store.background.rq_workers import housekeeping_heartbeat
from outbox.store.background.wakeups import get_queue
from outbox.store.client.connection import client_like, clock_offsets, ping

logger = logging.getLogger("outbox")

if TYPE_CHECKING:  # type-only: RQ is imported where a worker is made
    from rq.worker import Worker

RECONNECT_BACKOFF = (0.5, 30.0)  # seconds: first and longest wait between reconnection tries
STOP_GRACE = (
    10.0  # seconds a stopping worker may take once no job runs (RQ's teardown) before it exits anyway
)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Seconds an idle worker may take to stop before its stop signal is sent to the main thread
#: once more. RQ stops an idle worker by raising ``StopRequested`` from its signal handler,
#: wherever the main thread is; raised inside a ``logging`` call (RQ logs right before its
#: blocking wait), the logging module swallows it ("--- Logging error ---") and RQ waits for
#: a job (up to its dequeue timeout, minutes) as if no stop had come. The repeated signal
#: ends the process as stopped (exit status 0): no job runs.
STOP_REPEAT = 2.0


#: Seconds this host's clock may be off the Redis server's before a starting worker warns
#: (:func:`check_clock`; docs/operations.md, "Clocks").
CLOCK_SKEW_LIMIT = 1.0


def check_clock(limit: float = CLOCK_SKEW_LIMIT, clock: Callable[[], float] = time.time) -> float | None:
    """Compare this host's ``clock`` with the Redis server's (``TIME``; each primary of a
    cluster) and log a warning when they differ by more than ``limit`` seconds beyond the
    error bar (half the round trip).

    The outbox's due times and lease deadlines are written and compared with the clock of
    whichever worker runs (no script reads ``TIME``): a worker whose clock runs ahead of
    another's takes back that worker's live attempts as expired that much early (a second
    attempt while the first may still run: out of order for an ordering key); one behind
    claims late. Comparing every worker with Redis at
    start bounds the skew between two of them by twice ``limit`` (while their clocks hold).

    Returns:
        The largest skew found, in seconds (0 within the error bar), or None when Redis
        could not be asked (logged at DEBUG: the worker waits for Redis anyway).
    """
    try:
        offsets = clock_offsets(clock)
    except (RedisError, RedisClusterException) as exc:
        logger.debug("outbox worker: could not compare clocks with Redis (%s)", exc)
        return None
    name, offset, error = max(offsets, key=lambda o: abs(o[1]) - o[2])
    skew = max(0.0, abs(offset) - error)
    if skew > limit:
        logger.warning(
            "outbox worker: this host's clock is %.3f s %s the Redis server's (%s, within %.3f s); "
            "due times and lease deadlines use each worker's clock, so a worker whose clock runs "
            "ahead of another's takes back that worker's live attempts that much early "
            '(VISIBILITY_TIMEOUT %.0f s). Synchronise the clocks (NTP); see docs/operations.md, "Clocks"',
            abs(offset),
            "behind" if offset > 0 else "ahead of",
            name,
            error,
            outbox_settings.VISIBILITY_TIMEOUT,
        )
    return skew


class _Step:
    """One periodic step: its interval, when it runs next, and whether it last failed."""

    def __init__(self, name: str, interval: float, action: Callable[[], Any], what: str) -> None:
        self.name, self.interval, self.action, self.what = name, max(0.05, float(interval)), action, what
        self.next_at = 0.0
        self.failing = False

    def run(self, now: float) -> None:
        if now < self.next_at:
            return
        self.next_at = now + self.interval
        try:
            self.action()
        except Exception as exc:
            if not self.failing:
                logger.warning(
                    "outbox %s: %s unreachable or failing (%s: %s); will keep trying",
                    self.name,
                    self.what,
                    type(exc).__name__,
                    exc,
                )
                logger.debug("outbox %s failure", self.name, exc_info=True)
                self.failing = True
            return
        if self.failing:
            logger.warning("outbox %s: %s reachable again", self.name, self.what)
            self.failing = False


class Housekeeper(threading.Thread):
    """A daemon thread running wake, relay and recovery steps (see the module docstring).

    Args:
        recovery_interval: seconds between recovery sweeps (``RECOVERY_INTERVAL`` by default).
        relay: run the relay of captured messages (needs the database).
    """

    def __init__(self, recovery_interval: float | None = None, *, relay: bool = True) -> None:
        super().__init__(name="outbox-housekeeping", daemon=True)
        self.token = uuid.uuid4().hex
        self._stop_event = threading.Event()
        interval = float(recovery_interval or outbox_settings.RECOVERY_INTERVAL)
        self.steps = [
            _Step("wake", outbox_settings.WAKE_INTERVAL, _wake, "Redis"),
            _Step("alerts", outbox_settings.WAKE_INTERVAL, _flush_alerts, "Redis"),
        ]
        if relay:
            self.steps.append(_Step("relay", outbox_settings.RELAY_INTERVAL, _relay, "the database or Redis"))
        self.steps.append(_Step("recovery", interval, lambda: self._sweep(interval), "Redis"))
        self.steps.append(_Step("heartbeat", min(interval / 2, 10.0), lambda: beat(interval), "Redis"))

    def run(self) -> None:
        tick = min(step.interval for step in self.steps)
        while not self._stop_event.is_set():
            now = time.monotonic()
            for step in self.steps:
                step.run(now)
            self._stop_event.wait(tick)

    def _sweep(self, interval: float) -> None:
        if get_repository().acquire_lock("recovery", self.token, interval * 0.9):
            recover()

    def stop(self) -> None:
        self._stop_event.set()


def _sweep_once() -> None:
    """The recovery sweep of :func:`run_housekeeping_once`, under the sweeps' lock (see there)."""
    repo, token = get_repository(), uuid.uuid4().hex
    if not repo.acquire_lock("recovery", token, float(outbox_settings.RECOVERY_INTERVAL) * 0.9):
        logger.info("outbox: recovery sweep skipped: another process swept within RECOVERY_INTERVAL")
        return
    try:
        recover()
    finally:
        repo.release_lock("recovery", token)


def heartbeat_ttl(recovery_interval: float) -> float:
    """Seconds the housekeeping heartbeat lives: two sweeps and a margin."""
    return 2 * recovery_interval + 5.0


def beat(recovery_interval: float) -> None:
    """Say that this process runs the housekeeping (wake-ups, relay, recovery sweep), for
    :func:`heartbeat_ttl` seconds: the shared heartbeat :func:`housekeeping_seen` reads,
    and this process's own (``host:pid``, as RQ registers the worker's hostname and pid),
    by which the console and the metrics tell a live worker from one killed whose RQ key
    has not expired yet (:mod:`outbox.delivery.liveness`).

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """

    get_repository().beat(worker_name(), heartbeat_ttl(recovery_interval), time.time())


def housekeeping_seen() -> str | None:
    """The ``host:pid`` of an ``outbox_worker`` whose housekeeping ran lately (within
    two recovery intervals and 5 s), or None when none did: then retries and delays wait
    for a wake-up job of a new send, attempts lost with a crashed worker are not taken
    back, and captured messages are not relayed.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """

    return housekeeping_heartbeat(get_repository())


def _wake() -> None:
    wake_due()


def _flush_alerts() -> None:
    flush_due()


def _relay() -> None:
    try:
        relay()
    finally:
        close_old_connections()


def wait_for_redis(stop: threading.Event | None = None, rq_connection: Redis | None = None) -> None:
    """Block until the outbox's Redis answers PING (every primary of a cluster), and
    ``rq_connection``'s server too when given (RQ's own Redis in cluster mode), retrying
    with exponential backoff (:data:`RECONNECT_BACKOFF`), or until ``stop`` is set."""

    delay = RECONNECT_BACKOFF[0]
    while stop is None or not stop.is_set():
        if redis_reachable(rq_connection):
            return
        if stop is None:
            time.sleep(delay)
        else:
            stop.wait(delay)
        delay = min(delay * 2, RECONNECT_BACKOFF[1])


def redis_reachable(rq_connection: Redis | None = None) -> bool:
    """Whether the outbox's Redis (every primary of a cluster) answers PING, and
    ``rq_connection``'s server when given."""
    try:
        ping(rq_connection)
        return True
    except RedisError:
        return False


class StopRequest:
    """A stop asked of this worker process (SIGTERM or SIGINT), wherever it arrives.

    RQ's own handlers see a signal only while RQ's loop runs, and RQ's loop may have quit
    (Redis went away) or not started yet; :func:`run_worker` installs :meth:`handle` for
    the time between, and RQ's handlers report to :meth:`request` through
    :func:`rq_worker`'s class. Setting it also tells delivery runs to claim nothing more
    (:data:`outbox.delivery.loop.STOPPING`). Once no job runs, the process gets
    :data:`STOP_GRACE` seconds to end before a watchdog ends it (RQ's teardown on a Redis
    that hangs could otherwise hold it for RQ's whole read timeout).
    """

    def __init__(self) -> None:
        self.job_running = threading.Event()
        #: Stop signals this process was started ignoring (POSIX shells start background
        #: commands with SIGINT ignored): they stay ignored, RQ's handlers too.
        self.ignored: frozenset[int] = frozenset()
        #: The watchdog sent the stop signal again (:data:`STOP_REPEAT`): the second one
        #: is not the operator's "stop at once", and the process ends as stopped.
        self.repeated = False

    @staticmethod
    def reset() -> None:
        STOPPING.clear()

    @staticmethod
    def is_set() -> bool:
        return STOPPING.is_set()

    @staticmethod
    def event() -> threading.Event:
        """The event set by the request (:func:`wait_for_redis` waits on it)."""

        return STOPPING.event

    def request(self, signum: int) -> None:
        """Record a stop request (idempotent): delivery runs stop claiming; the watchdog starts."""

        if STOPPING.set():
            logger.warning(
                "outbox worker: %s received; claiming nothing more, finishing the attempts in flight, "
                "then stopping (send it again to stop at once)",
                signal.Signals(signum).name,
            )
            threading.Thread(
                target=self._watch, args=(signum,), name="outbox-stop-watchdog", daemon=True
            ).start()

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler outside RQ's loop: the first signal asks for a stop, a second
        one ends the process at once."""
        if self.is_set():
            if self.repeated and not self.job_running.is_set():
                logger.warning("outbox worker: stopped")
                raise SystemExit(0)
            logger.warning("outbox worker: %s received again; stopping now", signal.Signals(signum).name)
            raise SystemExit(128 + signum)
        self.request(signum)

    def _watch(self, signum: int = signal.SIGTERM) -> None:
        """End the process once no job has run for :data:`STOP_GRACE` seconds in a row;
        after :data:`STOP_REPEAT` seconds of that, send ``signum`` to the main thread once
        more (see :data:`STOP_REPEAT`)."""
        idle_since: float | None = None
        repeated = False
        while idle_since is None or time.monotonic() - idle_since < STOP_GRACE:
            if self.job_running.is_set():
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif not repeated and time.monotonic() - idle_since >= STOP_REPEAT:
                repeated = self.repeated = True
                logger.info(
                    "outbox worker: still running %.0f s after its stop request with no job running; "
                    "repeating the stop signal",
                    STOP_REPEAT,
                )
                with suppress(ValueError, OSError):  # the main thread is gone: the process is ending
                    signal.pthread_kill(threading.main_thread().ident or 0, signum)
            time.sleep(0.1)
        logger.error(
            "outbox worker: still running %.0f s after its stop request with no job running "
            "(Redis unreachable or hanging?); exiting now",
            STOP_GRACE,
        )
        logging.shutdown()
        os._exit(0)


#: The stop request of this process (one worker loop per process).
stop_request = StopRequest()


@contextmanager
def stop_signals_handled() -> Iterator[None]:
    """Route SIGTERM and SIGINT to :data:`stop_request` while the block runs (outside RQ's
    loop, which installs its own handlers); the previous handlers come back after. A no-op
    off the main thread, where Python cannot install signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stop_request.ignored = frozenset(sig for sig in STOP_SIGNALS if signal.getsignal(sig) is signal.SIG_IGN)
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    _take_over_signals()
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _take_over_signals() -> None:
    """Route the stop signals to :data:`stop_request` (main thread only), leaving the ones
    the process was started ignoring ignored."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN if sig in stop_request.ignored else stop_request.handle)


def waiting_connection(client: Redis) -> Redis:
    """A client over a pool of its own with the server and options of ``client``'s pool
    but no read timeout, for RQ's worker: RQ sets that pool's ``socket_timeout`` above its
    blocking wait (``Worker._set_connection``: ``dequeue_timeout`` + 10 s, which every
    connection it makes inherits), and ``client``'s pool keeps its bound.

    Args:
        client: the alias's redis-py client (django-redis).

    Returns:
        A new :class:`redis.Redis`; close its pool (``connection_pool.disconnect()``) when done.
    """

    return client_like(client, socket_timeout=None)


def _rq_connection(queues: Sequence[str]) -> Redis | None:
    """The client of RQ's Redis for ``queues`` (django-rq's), or None when there is none
    (a queue missing from ``RQ_QUEUES``)."""
    try:
        return get_queue(queues[0]).connection
    except (KeyError, IndexError):
        return None


@cache
def _stop_aware(base: type[Worker]) -> type[Worker]:
    """``base`` (an RQ worker class) whose stop handlers also report to :data:`stop_request`,
    that stops before its first wait when a stop came before its handlers were in place,
    and whose jobs mark :attr:`StopRequest.job_running`."""
    rq_base: Any = base

    class OutboxStopAware(rq_base):  # type: ignore[misc]
        def request_stop(self, signum: int, frame: FrameType | None) -> None:
            stop_request.request(signum)
            super().request_stop(signum, frame)

        def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
            """The second stop signal: stop at once, said in one line. RQ's own cold
            shutdown raises ``SystemExit`` wherever the main thread is, in a job's
            delivery run too, which RQ then records as a failed job with its
            traceback. The attempts in flight are abandoned: their messages go back to
            their queue when their lease runs out (at-least-once)."""
            if stop_request.repeated and not stop_request.job_running.is_set():
                logger.warning("outbox worker: stopped")  # the watchdog's repeat: nothing runs
                logging.shutdown()
                os._exit(0)
            requested = getattr(self, "_shutdown_requested_date", None)
            with suppress(TypeError):  # RQ ignores a second signal within 1 s of the first
                if requested is not None and (datetime.now(timezone.utc) - requested).total_seconds() < 1:
                    return
            logger.warning(
                "outbox worker: %s received again; stopping now (attempts in flight are abandoned: "
                "their messages are delivered again once their lease runs out)",
                signal.Signals(signum).name,
            )
            if getattr(self, "horse_pid", 0):  # a forking worker's job: taken down with it
                self.kill_horse()
                self.wait_for_horse()
            logging.shutdown()
            os._exit(128 + signum)

        def _install_signal_handlers(self) -> None:
            super()._install_signal_handlers()
            for sig in stop_request.ignored:  # e.g. SIGINT of a command a shell runs in the background
                signal.signal(sig, signal.SIG_IGN)
            if stop_request.is_set():  # asked before RQ's handlers were in place
                self._stop_requested = True

        def execute_job(self, job: Any, queue: Any) -> Any:
            stop_request.job_running.set()
            try:
                return super().execute_job(job, queue)
            finally:
                stop_request.job_running.clear()

    OutboxStopAware.__name__ = OutboxStopAware.__qualname__ = f"Outbox{base.__name__}"
    return cast("type[Worker]", OutboxStopAware)


def rq_worker(queues: Sequence[str], *, fork: bool = False, name: str | None = None) -> Worker:
    """The RQ worker of an ``outbox_worker`` process on ``queues`` (django-rq names, in
    priority order): RQ's ``SimpleWorker`` (``RQ["WORKER_CLASS"]`` or RQ's ``Worker`` with
    ``fork``), django-rq's job class and exception handlers, waiting for wake-up jobs on
    :func:`waiting_connection` (not on the alias's pool: see the module docstring), and
    reporting stop requests to :data:`stop_request`.

    Raises:
        ImproperlyConfigured: a queue name is not in ``RQ_QUEUES``.
    """
    from django_rq.jobs import get_job_class  # django_rq reads Django settings when imported
    from django_rq.queues import get_queues  # django_rq reads Django settings when imported
    from django_rq.workers import (  # django_rq reads Django settings when imported
        get_exception_handlers,
        get_worker_class,
    )
    from rq.worker import SimpleWorker  # beside django_rq's, which reads Django settings when imported

    job_class = get_job_class()
    rq_queues = get_queues(*queues, job_class=job_class)  # type: ignore[no-untyped-call]  # django-rq has no types
    base = get_worker_class() if fork else SimpleWorker  # type: ignore[no-untyped-call]
    kwargs: dict[str, Any] = {"name": name} if name else {}
    return _stop_aware(base)(
        rq_queues,
        connection=waiting_connection(rq_queues[0].connection),
        exception_handlers=get_exception_handlers() or None,  # type: ignore[no-untyped-call]
        job_class=job_class,
        queue_class=type(rq_queues[0]),
        **kwargs,
    )


@dataclass(frozen=True)
class WorkerOptions:
    """How :func:`run_worker` runs (``manage.py outbox_worker``'s options).

    Attributes:
        burst: deliver what is due now, then return (housekeeping runs once first).
        fork: RQ's forking ``Worker`` (a work horse per job) instead of ``SimpleWorker``.
        name: worker name (RQ's default otherwise).
        with_scheduler: run RQ's scheduler too (the outbox does not need it).
        max_jobs: return after this many jobs.
        logging_level: RQ's logging level name.
        recovery_interval: seconds between recovery sweeps.
        housekeeping: run the :class:`Housekeeper` thread (wake, relay, recovery).
        relay: include the relay of captured messages in housekeeping (needs the database).
    """

    burst: bool = False
    fork: bool = False
    name: str | None = None
    with_scheduler: bool = False
    max_jobs: int | None = None
    logging_level: str = "INFO"
    recovery_interval: float | None = None
    housekeeping: bool = True
    relay: bool = True


def run_worker(queues: Sequence[str], options: WorkerOptions = WorkerOptions()) -> None:
    """Run an RQ worker on ``queues`` (django-rq queue names, in priority order) as
    ``options`` say until it is stopped, riding out Redis outages.

    A stop request (SIGTERM, SIGINT) ends it wherever it arrives: no new claim, the
    attempts in flight finish, then it returns; see :class:`StopRequest` and
    docs/operations.md ("Stopping a worker").
    """
    stop_request.reset()
    check_clock()
    keeper = None
    with stop_signals_handled():
        try:
            keeper = _start_housekeeping(options)
            _run_rq_workers(queues, options)
        finally:
            if keeper is not None:
                keeper.stop()
            if stop_request.is_set():
                logger.warning("outbox worker: stopped")


def _start_housekeeping(options: WorkerOptions) -> Housekeeper | None:
    """Run housekeeping once (burst), or start its thread and return it (None: not asked)."""
    if options.burst:
        run_housekeeping_once(relay=options.relay)
    elif options.housekeeping:
        keeper = Housekeeper(options.recovery_interval, relay=options.relay)
        keeper.start()
        return keeper
    return None


def _run_rq_workers(queues: Sequence[str], options: WorkerOptions) -> None:
    """Run RQ's worker loop, and a new one each time it ended because Redis went away
    and came back, until a stop, the end of a burst, ``max_jobs`` or RQ quitting."""
    name, jobs_left = options.name, options.max_jobs
    while not stop_request.is_set():
        worker = _run_rq_worker(queues, options, name, jobs_left)
        if stop_request.is_set() or options.burst or (worker is not None and worker._stop_requested):  # noqa: SLF001 (RQ's flag)
            return
        if jobs_left is not None and worker is not None:
            jobs_left -= worker.successful_job_count + worker.failed_job_count
            if jobs_left <= 0:
                return
        if not _redis_back(queues):
            return
        name = None  # the old name may still be registered until its key expires


def _run_rq_worker(
    queues: Sequence[str], options: WorkerOptions, name: str | None, jobs_left: int | None
) -> Worker | None:
    """One RQ worker's loop until it ends (None: the worker could not be made)."""
    worker: Worker | None = None
    try:
        worker = rq_worker(queues, fork=options.fork, name=name)
        worker.work(
            burst=options.burst,
            with_scheduler=options.with_scheduler,
            logging_level=options.logging_level,
            max_jobs=jobs_left,
        )
    except RedisError as exc:
        logger.debug("outbox worker: RQ's loop raised %s", exc, exc_info=True)
    finally:
        _take_over_signals()  # RQ's handlers name a worker that is gone
        if worker is not None:
            worker.connection.connection_pool.disconnect()
    return worker


def _redis_back(queues: Sequence[str]) -> bool:
    """After RQ's loop ended: wait for Redis when it is unreachable; True once it is back
    (start a new worker), False when RQ quit for another reason or a stop came."""
    # In cluster mode RQ has a Redis of its own (its queues' connection): both must answer.
    rq_connection = _rq_connection(queues) if outbox_settings.cluster is not None else None
    if redis_reachable(rq_connection):
        return False  # RQ quit for a reason other than Redis
    logger.warning("outbox worker: Redis unreachable; waiting for it, then starting a new RQ worker")
    wait_for_redis(stop_request.event(), rq_connection)
    if stop_request.is_set():
        return False
    logger.warning("outbox worker: Redis reachable again; worker restarting")
    return True


def run_housekeeping_once(*, relay: bool = True) -> None:
    """One relay, recovery, alerts and wake pass, each step's errors logged (``--burst``, tests).

    The recovery sweep takes the lock a long-running worker's sweep takes
    (:meth:`Housekeeper._sweep`), and is skipped while another process holds it (that
    process swept within its interval, or is sweeping now); this one lets go of it when
    done, so the next ``--burst`` worker sweeps again."""

    def beat_now() -> None:
        beat(float(outbox_settings.RECOVERY_INTERVAL))

    steps: list[tuple[str, Callable[[], object]]] = [("relay", _relay)] if relay else []
    steps += [("recovery", _sweep_once), ("alerts", _flush_alerts), ("wake", _wake), ("heartbeat", beat_now)]
    for label, action in steps:
        try:
            action()
        except Exception:
            logger.exception("outbox %s failed", label)
