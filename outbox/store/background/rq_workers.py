"""Which workers are registered, read without changing anything: RQ's registration of
the workers on some queues, and the outbox's own housekeeping heartbeat
(:func:`housekeeping_heartbeat`).

RQ keeps, per queue, the set of worker keys registered on it
(``rq:workers:<queue>``) and, per worker, a hash that expires when the worker stops
refreshing it (RQ's ``worker_ttl``, 420 s, + 60 s). These are raw ``SMEMBERS`` and
``HMGET`` reads: unlike RQ's own ``Worker.all`` nothing is cleaned up on read, so a page
view or a scrape never changes state. RQ's key names come from RQ's own constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from rq.worker import Worker
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from outbox.store.repository import MessageRepository

#: The fields of RQ's worker hash that are read.
WORKER_FIELDS = ("state", "queues", "hostname", "pid", "last_heartbeat", "current_job")


def registered_workers(
    connection: Any, queues: Sequence[str]
) -> tuple[list[set[str]], dict[str, dict[str, str]]]:
    """The workers RQ has registered on ``queues``. Two round trips (one when none is).

    Args:
        connection: the redis-py client of RQ's Redis.
        queues: RQ queue names.

    Returns:
        (per queue, in order, the worker names registered on it; worker name (RQ's key
        without its ``rq:worker:`` prefix) -> its fields of :data:`WORKER_FIELDS` as
        text, "" when absent, for the workers whose key has not expired).

    Raises:
        redis.exceptions.RedisError: RQ's Redis could not be reached.
    """
    prefix = Worker.redis_worker_namespace_prefix
    pipe = connection.pipeline(transaction=False)
    for name in queues:
        pipe.smembers(WORKERS_BY_QUEUE_KEY % name)
    keys_per_queue = [{m.decode() for m in members} for members in cast(list[set[bytes]], pipe.execute())]
    keys = sorted(set().union(*keys_per_queue))
    found: dict[str, dict[str, str]] = {}
    if keys:
        pipe = connection.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, WORKER_FIELDS)
        for key, values in zip(keys, pipe.execute(), strict=True):
            if any(values):  # else the key expired: the worker is gone
                found[key.removeprefix(prefix)] = {
                    f: (v.decode() if v else "") for f, v in zip(WORKER_FIELDS, values, strict=True)
                }
    return [{k.removeprefix(prefix) for k in ks} for ks in keys_per_queue], found


def housekeeping_heartbeat(repo: MessageRepository) -> str | None:
    """The ``host:pid`` of the ``outbox_worker`` whose housekeeping beat last, while its
    heartbeat lives (``MessageRepository.beat``), else None. One GET.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    value = cast("bytes | None", repo.connection.get(repo.keys.heartbeat()))
    return value.decode() if value else None
