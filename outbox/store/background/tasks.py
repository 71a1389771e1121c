"""The registry of the background actions the console started (``<prefix>:task:<job id>``).

Each entry is one JSON object (never a pickle), written whole with a TTL: by the
console when it enqueues the job, then by the job itself as it starts, after every
batch of ids and when it ends (:mod:`outbox.admin_views.tasks`). The console's status
page reads only this registry and, for a job that has not reported its end, the plain
``status`` field of RQ's job hash: it never fetches an RQ job, whose ``meta``, ``data``
and result RQ unpickles (a job hash planted in Redis would run code in the web process).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from redis import Redis
from rq.job import Job

from outbox.store.keys import Keys


class TaskRegistry:
    """Registry entries under one key prefix.

    Args:
        connection: a redis-py client (``decode_responses=False``); RQ's jobs live on
            the same Redis (:func:`outbox.store.background.wakeups.get_queue`) unless
            ``rq_connection`` says otherwise.
        keys: the outbox's key names.
        rq_connection: the client of RQ's Redis when it is another server than
            ``connection``'s (in cluster mode RQ has a plain Redis of its own).

    Redis errors (``redis.exceptions.RedisError``) propagate unchanged.
    """

    def __init__(self, connection: Redis, keys: Keys, rq_connection: Redis | None = None) -> None:
        self.connection = connection
        self.keys = keys
        self.rq_connection = rq_connection

    def save(self, job_id: str, entry: Mapping[str, Any], ttl: int) -> None:
        """Write the whole entry of job ``job_id`` as JSON, expiring ``ttl`` seconds from now.

        Raises:
            TypeError: a value of ``entry`` is not JSON-serializable.
        """
        self.connection.set(self.keys.task(job_id), json.dumps(dict(entry), separators=(",", ":")), ex=ttl)

    def delete(self, job_id: str) -> None:
        """Remove the entry of job ``job_id`` (nothing happens if there is none)."""
        self.connection.delete(self.keys.task(job_id))

    def load(self, job_id: str) -> dict[str, Any] | None:
        """The entry of job ``job_id``, or None if there is none (or it is not a JSON object)."""
        return _decode(self.connection.get(self.keys.task(job_id)))

    def load_with_rq_status(self, job_id: str) -> tuple[dict[str, Any] | None, str | None]:
        """The entry of job ``job_id`` and the ``status`` field of RQ's hash of that job
        (one round trip, two with an ``rq_connection``; the field is a plain string, read
        with HGET, never unpickled).

        Returns:
            (the entry or None, RQ's status such as ``"queued"``, ``"failed"`` or
            ``"stopped"``, or None when RQ has no such job).
        """
        raw: Any
        rq_status: Any
        if self.rq_connection is not None:
            raw = self.connection.get(self.keys.task(job_id))
            rq_status = self.rq_connection.hget(Job.key_for(job_id), "status")
        else:
            pipe = self.connection.pipeline(transaction=False)
            pipe.get(self.keys.task(job_id))
            pipe.hget(Job.key_for(job_id), "status")
            raw, rq_status = pipe.execute()
        return _decode(raw), rq_status.decode("utf-8", "replace") if rq_status is not None else None


def _decode(raw: bytes | str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None
