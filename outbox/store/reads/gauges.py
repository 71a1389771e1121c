"""Levels read at one moment for monitoring (:mod:`outbox.metrics`): message counts per
destination and status, the depth of each queue's due index, and each destination's
blocked ordering keys.

Everything is read from the indexes of :mod:`outbox.store.keys` with O(1) or O(log N)
commands (ZCARD, ZCOUNT, ZRANGE of one entry), in one pipeline; two smaller ones only
when a destination that is no longer configured still has messages (it is found in the
``destinations`` set, read in the first). So a scrape costs the same whatever the number
of messages and ordering keys, and every process that reads reports the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from outbox.endpoint_names import is_endpoint
from outbox.records import STATUSES
from outbox.store.base import first_of, queue_first
from outbox.store.reads import summary
from outbox.store.repository import MessageRepository, sum_counts

#: The name every endpoint's counts are added up under (not a destination name: names
#: starting with ``endpoint:`` are reserved for endpoints, and this is none).
ENDPOINTS_LABEL = "endpoint:*"


@dataclass(frozen=True)
class QueueDepth:
    """One queue's due index (``pending`` and ``retrying`` messages, by due time).

    Attributes:
        queue: the django-rq queue name.
        due: messages due now (next attempt at or before the time read), not yet claimed.
        scheduled: messages due later (delayed sends, retries waiting out their backoff).
        oldest_due_at: epoch seconds the earliest due message became due, or None when
            none is due.
        quarantined: suspects waiting in the queue's quarantine index (taken back from
            lost workers, each attempted alone), due or not; not counted in ``due`` or
            ``scheduled``.
    """

    queue: str
    due: int
    scheduled: int
    oldest_due_at: float | None
    quarantined: int = 0


@dataclass(frozen=True)
class Gauges:
    """What :func:`read_gauges` read.

    Attributes:
        at: epoch seconds of the read (what "due" is measured against).
        messages: destination -> status -> message count, every status present (zeros
            included), for the configured destinations and every other destination that
            has messages.
        queues: one :class:`QueueDepth` per queue asked for, in order.
        blocked: destination -> how many of its ordering keys are blocked (a dead letter
            at their head), for the same destinations as ``messages``.
        endpoints_age: seconds since the :data:`ENDPOINTS_LABEL` counts were made (0: read
            now; None: there are none).
    """

    at: float
    messages: dict[str, dict[str, int]]
    queues: list[QueueDepth]
    blocked: dict[str, int] = field(default_factory=dict)
    endpoints_age: float | None = None


def read_gauges(
    repo: MessageRepository,
    destinations: Iterable[str],
    queues: Sequence[str],
    now: float,
    endpoint_labels: bool = False,
) -> Gauges:
    """Message counts per destination and status, each queue's due depth, and each
    destination's blocked ordering keys.

    Args:
        repo: the repository to read.
        destinations: names always reported (the configured destinations), with zeros
            when they have no messages.
        queues: the queue names whose due index is read.
        now: epoch seconds: messages scored at or before it are due.
        endpoint_labels: each endpoint registered at runtime under its own name (True), or
            all of them added up under :data:`ENDPOINTS_LABEL` (False: the number of series
            does not grow with the endpoints, ``OUTBOX["METRICS_ENDPOINT_LABELS"]``).

    Returns:
        :class:`Gauges`.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached or refused a command.
    """
    names = list(dict.fromkeys(destinations))
    pipe = repo.connection.pipeline(transaction=False)
    pipe.smembers(repo.keys.destinations)
    parts = repo.keys.partitions
    for queue in queues:
        for k in repo.keys.partition_numbers():
            part = repo.keys.partition(k)
            key = part.due(queue)
            pipe.zcount(key, "-inf", repr(now))
            pipe.zcount(key, f"({now!r}", "+inf")
            queue_first(pipe, key)
            pipe.zcard(part.quarantine(queue))
    repo.queue_status_counts(pipe, names)
    repo.queue_blocked_counts(pipe, names)
    replies = pipe.execute()
    known, replies = replies[0], replies[1:]
    depths = []
    for i, queue in enumerate(queues):
        rows = [replies[4 * (i * parts + k) : 4 * (i * parts + k) + 4] for k in range(parts)]
        scored = [first_of(row[2]) for row in rows]
        firsts = [f[1] for f in scored if f and f[1] <= now]
        depths.append(
            QueueDepth(
                queue,
                sum(int(row[0]) for row in rows),
                sum(int(row[1]) for row in rows),
                min(firsts) if firsts else None,
                sum(int(row[3]) for row in rows),
            )
        )
    counted = 4 * len(queues) * parts
    status_cards = len(names) * len(STATUSES) * parts
    messages = repo.parse_status_counts(names, replies[counted : counted + status_cards])
    blocked = repo.parse_blocked_counts(names, replies[counted + status_cards :])
    others = sorted({raw.decode() for raw in known} - set(names))
    endpoints: list[str] = []
    if not endpoint_labels:
        endpoints = [d for d in others if is_endpoint(d)]
        others = [d for d in others if not is_endpoint(d)]
    if others:
        messages.update(repo.counts_by_destination(others))
        blocked.update(repo.blocked_key_counts(others))
    age = _endpoints_added_up(repo, endpoints, now, messages, blocked) if endpoints else None
    return Gauges(now, messages, depths, blocked, age)


def _endpoints_added_up(
    repo: MessageRepository,
    endpoints: Sequence[str],
    now: float,
    messages: dict[str, dict[str, int]],
    blocked: dict[str, int],
) -> float | None:
    """Every endpoint's counts and blocked keys under one name, :data:`ENDPOINTS_LABEL`,
    added to ``messages`` and ``blocked``: read now up to ``LIVE_DESTINATIONS`` endpoints,
    else the destination summary's. Returns their age in seconds (None: left out, no
    summary was made yet)."""
    if len(endpoints) <= summary.LIVE_DESTINATIONS:
        messages[ENDPOINTS_LABEL] = sum_counts(repo.counts_by_destination(endpoints).values())
        blocked[ENDPOINTS_LABEL] = sum(repo.blocked_key_counts(endpoints).values())
        return 0.0
    made = summary.read(repo)
    if made is None:
        return None
    messages[ENDPOINTS_LABEL] = dict(made.endpoint_counts)
    blocked[ENDPOINTS_LABEL] = made.endpoint_blocked
    return made.age(now)
