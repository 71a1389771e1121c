"""What workers learn of endpoint changes: a counter and the names changed, in Redis
(``docs/webhooks.md``, "How workers learn of changes").

After a transaction that changed endpoints commits, :func:`bump` increments
``outbox:endpoints:version`` and records each changed destination name in
``outbox:endpoints:changed`` scored by the new value (one round trip). A worker process
reads both every ``OUTBOX["ENDPOINTS"]["VERSION_CHECK"]`` seconds at most
(:func:`changes_since`: one round trip, whatever the number of endpoints) and forgets the
configurations of the names changed since its last read. The set keeps the newest
:data:`KEPT` names; a process further behind forgets every configuration it holds.

:func:`forget_destination` removes a deleted endpoint's state (its hash, rate-limit
TAT, in-flight grants, health minutes and error hours, parked set, probe and its entry in
the destination set).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from outbox.store.base import RepositoryBase

#: An endpoint's state in Redis, as :func:`admin_state` and a claim's gate
#: (``Claim.states``) read it: (admin state, its reason, limits field or None).
AdminState = tuple[str, str, str | None]
#: Changed names kept in ``outbox:endpoints:changed``.
KEPT = 10_000
#: Health minutes and error hours a destination's state spans (lua/health.lua expires
#: them after 2 hours and 25 hours).
HEALTH_MINUTES = 125
ERROR_HOURS = 26


def bump(repo: RepositoryBase, names: Sequence[str]) -> int:
    """Record a committed change of the endpoints ``names`` (destination names); returns
    the counter's new value.

    Raises:
        redis.exceptions.RedisError: Redis unreachable (workers then learn of the change
            within ``CACHE_TTL``, when their copies expire).
    """
    keys = repo.keys
    version = int(repo.connection.incr(keys.endpoints_version))
    if names:
        pipe = repo.connection.pipeline(transaction=False)
        pipe.zadd(keys.endpoints_changed, dict.fromkeys(names, version))
        pipe.zremrangebyrank(keys.endpoints_changed, 0, -KEPT - 1)
        pipe.execute()
    return version


def changes_since(repo: RepositoryBase, seen: int) -> tuple[int, list[str] | None]:
    """``(version, names)``: the counter now and the names changed after ``seen`` (a
    value :func:`changes_since` returned before; 0 at first), or None for the names when
    they are no longer all known (more than :data:`KEPT` changes since, or the counter
    went back: Redis emptied). One round trip.

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    keys = repo.keys
    pipe = repo.connection.pipeline(transaction=False)
    pipe.get(keys.endpoints_version)
    pipe.zrangebyscore(keys.endpoints_changed, f"({seen}", "+inf")
    pipe.zcard(keys.endpoints_changed)
    pipe.zrange(keys.endpoints_changed, 0, 0, withscores=True)
    raw, changed, size, lowest = pipe.execute()
    version = int(raw or 0)
    if version == seen:
        return version, []
    if version < seen:
        return version, None
    # Trimming drops the lowest scores first: every name changed after `seen` is still
    # listed when nothing was ever trimmed, or when one of score <= seen is left.
    complete = size < KEPT or (bool(lowest) and lowest[0][1] <= seen)
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in changed]
    return version, names if complete else None


def forget_destination(repo: RepositoryBase, name: str, now: float | None = None) -> None:
    """Delete the Redis state of destination ``name`` (a deleted endpoint): its state
    hash, GCRA TAT, in-flight grants, health minutes, error hours and parked set, its
    probe entry and its name in the destination set. Its messages must be gone first
    (the status indexes are left: empty ones take no memory).

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    keys = repo.keys
    now = time.time() if now is None else now
    minute, hour = int(now // 60), int(now // 3600)
    doomed = [keys.dest(name), keys.gcra(name), keys.inflight(name)]
    doomed += [keys.health(name, m) for m in range(minute - HEALTH_MINUTES, minute + 2)]
    doomed += [keys.errors(name, h) for h in range(hour - ERROR_HOURS, hour + 2)]
    pipe = repo.connection.pipeline(transaction=False)
    for key in doomed:
        pipe.unlink(key)  # one command each: on a cluster the keys share the home slot only
    for k in keys.partition_numbers():
        pipe.unlink(keys.partition(k).parked(name) if keys.partitioned else keys.parked(name))
    pipe.zrem(keys.probes, name)
    pipe.srem(keys.destinations, name)
    pipe.execute()
    repo.registered.pop(name, None)


def write_limits(repo: RepositoryBase, name: str, limits: Sequence[float] | None) -> None:
    """Keep the rate and concurrency limits of endpoint ``name`` in its state hash, where
    the claim's gate reads them (``lua/lib/gate.lua``, field ``limits``): ``[emission
    interval T (0 = no rate limit), tolerance tau, max concurrency (0 = none)]``, or None
    for no limit (the field is removed).

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    key = repo.keys.dest(name)
    if limits is None:
        repo.connection.hdel(key, "limits")
    else:
        repo.connection.hset(key, "limits", json.dumps(list(limits), separators=(",", ":")))


def admin_state(repo: RepositoryBase, name: str) -> AdminState:
    """``(admin state, its reason, limits field)`` of destination ``name``: ``"active"``,
    ``"paused"`` or ``"disabled"`` (``lua/admin.lua``).

    Raises:
        redis.exceptions.RedisError: Redis unreachable.
    """
    admin, reason, limits = repo.connection.hmget(repo.keys.dest(name), "admin", "admin_reason", "limits")
    text = [v.decode() if isinstance(v, bytes) else v for v in (admin, reason, limits)]
    return text[0] or "active", text[1] or "", text[2]
