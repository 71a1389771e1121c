"""The worker process: an RQ worker on the outbox queues that outlives Redis outages,
and the housekeeping thread that every ``outbox_worker`` runs beside it.

Housekeeping (:class:`Housekeeper`), in every worker process, each on its own interval:

* **wake** (``WAKE_INTERVAL``): enqueue a wake-up job for each queue with a due
  message and no waiting job (:func:`outbox.dispatch.wake_due`): delayed messages,
  retries, and work whose job was lost with a killed worker; first, parked messages
  whose time has come go back to their due index (the probe of an open circuit
  breaker, what waited behind one that closed: :func:`outbox.health.release_parked_due`);
* **relay** (``RELAY_INTERVAL``): push messages captured in the database that missed
  the on-commit fast path (:func:`outbox.capture.relay`);
* **alerts** (``WAKE_INTERVAL``): report what ended alert suppression windows counted
  (:func:`outbox.alerts.flush_due`; nothing to do without ``OUTBOX["ALERTS"]`` channels);
* **recovery sweep** (``RECOVERY_INTERVAL``, one process per interval through a Redis
  lock): take back expired leases, purge finished messages (:mod:`outbox.recovery`).

Each step is independent (one failing does not stop the others) and logs one line
when its dependency (Redis, the database) becomes unreachable and one when it is back.

:func:`run_worker` runs RQ's worker loop and, when that loop ends because Redis went
away (RQ's worker then quits), waits for Redis with backoff and starts a new one.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, cast

from redis.exceptions import RedisError

from .conf import outbox_settings

logger = logging.getLogger("outbox")

RECONNECT_BACKOFF = (0.5, 30.0)  # seconds: first and longest wait between reconnection tries


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
        from .connection import get_repository
        from .recovery import recover

        if get_repository().acquire_lock("recovery", self.token, interval * 0.9):
            recover()

    def stop(self) -> None:
        self._stop_event.set()


def heartbeat_ttl(recovery_interval: float) -> float:
    """Seconds the housekeeping heartbeat lives: two sweeps and a margin."""
    return 2 * recovery_interval + 5.0


def beat(recovery_interval: float) -> None:
    """Say that this process runs the housekeeping (wake-ups, relay, recovery sweep), for
    :func:`heartbeat_ttl` seconds: the shared heartbeat :func:`housekeeping_seen` reads,
    and this process's own (``host:pid``, as RQ registers the worker's hostname and pid),
    by which the console and the metrics tell a live worker from one killed whose RQ key
    has not expired yet (:mod:`outbox.liveness`).

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    from .connection import get_repository
    from .delivery import worker_name

    get_repository().beat(worker_name(), heartbeat_ttl(recovery_interval), time.time())


def housekeeping_seen() -> str | None:
    """The ``host:pid`` of an ``outbox_worker`` whose housekeeping ran lately (within
    two recovery intervals and 5 s), or None when none did: then retries and delays wait
    for a wake-up job of a new send, attempts lost with a crashed worker are not taken
    back, and captured messages are not relayed.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    from .connection import get_repository

    repo = get_repository()
    value = cast("bytes | None", repo.connection.get(repo.keys.heartbeat()))
    return value.decode() if value else None


def _wake() -> None:
    from .dispatch import wake_due

    wake_due()


def _flush_alerts() -> None:
    from .alerts import flush_due

    flush_due()


def _relay() -> None:
    from django.db import close_old_connections

    from .capture import relay

    try:
        relay()
    finally:
        close_old_connections()


def wait_for_redis(stop: threading.Event | None = None) -> None:
    """Block until the outbox's Redis answers PING, retrying with exponential backoff."""
    from .connection import get_connection

    delay = RECONNECT_BACKOFF[0]
    while stop is None or not stop.is_set():
        try:
            get_connection().ping()
            return
        except RedisError:
            time.sleep(delay)
            delay = min(delay * 2, RECONNECT_BACKOFF[1])


def redis_reachable() -> bool:
    from .connection import get_connection

    try:
        get_connection().ping()
        return True
    except RedisError:
        return False


def run_worker(
    queues: Sequence[str],
    *,
    burst: bool = False,
    fork: bool = False,
    name: str | None = None,
    with_scheduler: bool = False,
    max_jobs: int | None = None,
    logging_level: str = "INFO",
    recovery_interval: float | None = None,
    housekeeping: bool = True,
    relay: bool = True,
) -> None:
    """Run an RQ worker on ``queues`` until it is stopped, riding out Redis outages.

    Args:
        queues: django-rq queue names, in priority order.
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
    import django_rq
    from rq.worker import SimpleWorker

    kwargs: dict[str, Any] = {"name": name} if name else {}
    if not fork:
        kwargs["worker_class"] = SimpleWorker
    keeper = None
    if burst:
        run_housekeeping_once(relay=relay)
    elif housekeeping:
        keeper = Housekeeper(recovery_interval, relay=relay)
        keeper.start()
    jobs_left = max_jobs
    try:
        while True:
            try:
                worker = django_rq.get_worker(*queues, **kwargs)
                worker.work(
                    burst=burst,
                    with_scheduler=with_scheduler,
                    logging_level=logging_level,
                    max_jobs=jobs_left,
                )
            except RedisError as exc:
                logger.debug("outbox worker: RQ's loop raised %s", exc, exc_info=True)
                worker = None
            stopped = worker is not None and (worker._stop_requested or burst)  # noqa: SLF001 (RQ's flag)
            if jobs_left is not None and worker is not None:
                jobs_left -= worker.successful_job_count + worker.failed_job_count
                if jobs_left <= 0:
                    return
            if stopped or redis_reachable() and worker is not None:
                return  # stopped on request, burst done, or RQ quit for a reason other than Redis
            logger.warning("outbox worker: Redis unreachable; waiting for it, then starting a new RQ worker")
            wait_for_redis()
            logger.warning("outbox worker: Redis reachable again; worker restarting")
            kwargs.pop("name", None)  # the old name may still be registered until its key expires
    finally:
        if keeper is not None:
            keeper.stop()


def run_housekeeping_once(*, relay: bool = True) -> None:
    """One relay, recovery, alerts and wake pass, each step's errors logged (``--burst``, tests)."""
    from .recovery import recover

    def beat_now() -> None:
        beat(float(outbox_settings.RECOVERY_INTERVAL))

    steps: list[tuple[str, Callable[[], object]]] = [("relay", _relay)] if relay else []
    steps += [("recovery", recover), ("alerts", _flush_alerts), ("wake", _wake), ("heartbeat", beat_now)]
    for label, action in steps:
        try:
            action()
        except Exception:
            logger.exception("outbox %s failed", label)
