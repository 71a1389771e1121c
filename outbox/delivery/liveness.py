"""Which RQ workers of the outbox queues are alive, by the outbox's own heartbeat.

RQ lists a worker as long as its key lives: a worker killed with SIGKILL (or on a host
that died) stays listed for up to 8 minutes (RQ's ``worker_ttl``, 420 s, + 60 s). Every
``outbox_worker`` also beats in the outbox's Redis (:func:`outbox.delivery.worker.beat`, each
``min(RECOVERY_INTERVAL / 2, 10)`` s, valid :func:`outbox.delivery.worker.heartbeat_ttl` s:
65 s by default), as ``host:pid``, RQ's hostname and pid of the worker. A worker RQ
lists is then, by :func:`liveness`:

* ``live``: its outbox heartbeat is fresh, or RQ heard from it within that TTL (a
  ``--burst`` run beats once, at its start, and RQ beats at every job);
* ``stale``: it beat once, but neither it nor RQ has heard from it within the TTL:
  killed or hung; RQ will drop it when its key expires;
* ``no_heartbeat``: it never beat: not an ``outbox_worker`` (a plain ``rqworker``, which
  delivers but runs no housekeeping); as alive as RQ's key says.

The dashboard and the ``outbox_workers`` metric count the same way (:func:`workers`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from outbox.conf import outbox_settings
from outbox.delivery.worker import heartbeat_ttl
from outbox.store import get_repository
from outbox.store.background.rq_workers import registered_workers
from outbox.store.background.wakeups import get_queue

#: Values of :attr:`WorkerInfo.liveness`, in this order on pages and in metrics.
LIVENESS = ("live", "stale", "no_heartbeat")


@dataclass
class WorkerInfo:
    """A worker RQ lists on an outbox queue (fields as RQ stores them) and its liveness.

    Attributes:
        liveness: one of :data:`LIVENESS` (see the module docstring).
        heartbeat_until: epoch seconds its outbox heartbeat expires (or expired); None
            when it never beat.
    """

    name: str
    state: str = ""
    queues: list[str] = field(default_factory=list)
    hostname: str = ""
    pid: str = ""
    last_heartbeat: str = ""
    current_job: str = ""
    liveness: str = "no_heartbeat"
    heartbeat_until: float | None = None

    @property
    def heartbeat_until_at(self) -> datetime | None:
        """:attr:`heartbeat_until` as an aware UTC datetime, for pages."""
        return (
            None
            if self.heartbeat_until is None
            else datetime.fromtimestamp(self.heartbeat_until, timezone.utc)
        )

    @property
    def live(self) -> bool:
        """Counted as a live worker: anything but ``stale``."""
        return self.liveness != "stale"


def _rq_time(text: str) -> float | None:
    """Epoch seconds of one of RQ's UTC timestamps (``2026-11-25T21:50:01.123456Z``)."""
    for pattern in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, pattern).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    return None


def liveness(heartbeat_until: float | None, rq_heartbeat: float | None, now: float, ttl: float) -> str:
    """One worker's liveness (:data:`LIVENESS`; see the module docstring).

    Args:
        heartbeat_until: when its outbox heartbeat expires, epoch seconds; None if it never beat.
        rq_heartbeat: RQ's ``last_heartbeat`` of it, epoch seconds, or None.
        now: epoch seconds.
        ttl: seconds an outbox heartbeat is valid (:func:`outbox.delivery.worker.heartbeat_ttl`).
    """
    if heartbeat_until is None:
        return "no_heartbeat"
    if heartbeat_until > now or (rq_heartbeat is not None and now - rq_heartbeat <= ttl):
        return "live"
    return "stale"


def workers(queues: Sequence[str], now: float | None = None) -> tuple[list[int], list[WorkerInfo]]:
    """The workers RQ lists on ``queues`` with their liveness. Three round trips (two to
    RQ's Redis, one to the outbox's), none with a write.

    Returns:
        (per queue, in order, how many of its workers are live; every worker listed,
        sorted by name).

    Raises:
        redis.exceptions.RedisError: a Redis could not be reached.
    """

    if not queues:
        return [], []
    now = time.time() if now is None else now
    per_queue, found = registered_workers(get_queue(queues[0]).connection, queues)
    beats: Mapping[str, float] = get_repository().worker_heartbeats() if found else {}
    ttl = heartbeat_ttl(float(outbox_settings.RECOVERY_INTERVAL))
    listed: dict[str, WorkerInfo] = {}
    for name, data in sorted(found.items()):
        until = beats.get(f"{data['hostname']}:{data['pid']}")
        listed[name] = WorkerInfo(
            name=name,
            state=data["state"],
            queues=[q for q in data["queues"].split(",") if q],
            hostname=data["hostname"],
            pid=data["pid"],
            last_heartbeat=data["last_heartbeat"],
            current_job=data["current_job"],
            liveness=liveness(until, _rq_time(data["last_heartbeat"]), now, ttl),
            heartbeat_until=until,
        )
    live = [sum(1 for name in names if name in listed and listed[name].live) for names in per_queue]
    return live, list(listed.values())
