"""Maintenance in Redis: the schema upgrade of records written by older versions
(``lua/backfill.lua``), the repair of index entries whose record disagrees
(``lua/repair.lua``), short locks, and the ``outbox_worker`` heartbeats.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import cast

from redis.exceptions import LockNotOwnedError

from outbox.records import STATUSES, partition_of
from outbox.store.base import RepositoryBase, ScoredMembers
from outbox.store.scripts import named

#: The statuses whose messages belong in a queue's due and quarantine indexes and in a
#: destination's parked index.
DUE_STATUSES = "pending,retrying"

#: Seconds an ``outbox:workers`` entry is kept after its heartbeat expired: longer than
#: RQ keeps a dead worker's key (its ``worker_ttl``, 420 s, + 60), so a killed worker
#: still listed by RQ is found stale, not unknown.
WORKER_HEARTBEAT_KEPT = 3600.0


class Maintenance(RepositoryBase):
    """The maintenance part of :class:`~outbox.store.repository.MessageRepository`."""

    SCHEMA = 3  # 2: per-queue due indexes; 3: no index across destinations, message record a string

    def upgrade(self, batch: int = 1000) -> int:
        """Bring records written by an older version up to :attr:`SCHEMA` (idempotent).

        Version 0.1 kept no due index: its ``pending`` and ``retrying`` messages are put
        in their queue's due index (``lua/backfill.lua``). Older versions (schema < 3)
        also kept indexes across destinations (``outbox:created``,
        ``outbox:status:<status>``): every id in them is in its destination's index too,
        so they are deleted (``UNLINK``: freed in the background). Message records
        written as hashes by older versions stay as they are: every reader accepts them.
        Returns how many messages were put in a due index (0 when every one already was,
        as on a new Redis).
        """
        key = self.keys.schema
        schema = int(self.connection.get(key) or 0)
        if schema >= self.SCHEMA:
            return 0
        added = 0
        if schema < 2:
            for status in ("pending", "retrying"):
                first = 0
                while True:
                    reply = self.run_script(
                        "backfill", [self.keys.prefix, first, batch], keys=[self.keys.legacy_status(status)]
                    )
                    read, put = (int(x) for x in reply)
                    added += put
                    first += batch
                    if read < batch:
                        break
        self.connection.unlink(*self.keys.legacy_indexes(STATUSES))
        self.connection.set(key, self.SCHEMA)
        return added

    def repair_indexes(
        self, destinations: Sequence[str], queues: Sequence[str], batch: int = 500
    ) -> Counter[str]:
        """Take out of every index the entries whose message's record disagrees with it
        (``lua/repair.lua``): the message is gone, or its status (or destination) is not
        the index's. Each destination's status and parked indexes and each queue's due and
        quarantine indexes, in every partition, are read in batches (``ZSCAN``); each
        batch is checked and repaired in one script call, atomic against the writes that
        move messages. O(entries): a maintenance command's work, not a sweep's.

        Returns:
            How many entries were taken out, by kind of index (a status name,
            ``"parked"``, ``"due"``, ``"quarantine"``); none when every index was true.
        """
        targets: list[tuple[int, str, str, str, str]] = []  # (partition, index, statuses, destination, kind)
        for k in self.keys.partition_numbers():
            part = self.keys.partition(k)
            for d in destinations:
                targets += [(k, part.status(s, d), s, d, s) for s in STATUSES]
                targets.append((k, part.parked(d), DUE_STATUSES, d, "parked"))
            for q in queues:
                targets.append((k, part.due(q), DUE_STATUSES, "", "due"))
                targets.append((k, part.quarantine(q), DUE_STATUSES, "", "quarantine"))
        repaired: Counter[str] = Counter()
        for k, key, statuses, destination, kind in targets:
            cursor = 0
            while True:
                cursor, rows = cast(
                    tuple[int, ScoredMembers], self.connection.zscan(key, cursor, count=batch)
                )
                ids = [raw.decode() for raw, _ in rows]
                if self.keys.partitioned:
                    # an id of another partition never belongs here (its record is in
                    # another slot, which the script may not read): taken out as it is
                    foreign = {i for i in ids if partition_of(i) != k}
                    if foreign:
                        repaired[kind] += int(self.connection.zrem(key, *foreign))
                        ids = [i for i in ids if i not in foreign]
                if ids:
                    args = [*named(statuses=statuses, destination=destination), *ids]
                    keys = [key, *(self.keys.resend(i) for i in ids)]
                    removed = self.run_scripts([("repair", args, keys)])[0]
                    if removed:
                        repaired[kind] += len(removed)
                if not cursor:
                    break
        return repaired

    def acquire_lock(self, name: str, token: str, ttl: float) -> bool:
        """Take a short lock (``SET NX PX``); True if this caller holds it now."""
        return bool(self.connection.set(self.keys.lock(name), token, nx=True, px=max(1, int(ttl * 1000))))

    def release_lock(self, name: str, token: str) -> bool:
        """Let go of a lock taken with :meth:`acquire_lock` under ``token``, only if this
        caller still holds it (compare and delete in one script: redis-py's
        :class:`redis.lock.Lock` release, the pattern of https://redis.io/docs/latest/commands/set/).
        Returns False when it lapsed or another caller holds it now.

        Raises:
            redis.exceptions.RedisError: Redis could not be reached."""
        lock = self.connection.lock(self.keys.lock(name), thread_local=False)
        lock.local.token = token.encode()
        try:
            lock.release()
        except LockNotOwnedError:
            return False
        return True

    def beat(self, member: str, ttl: float, now: float) -> None:
        """Say that the ``outbox_worker`` ``member`` (``host:pid``) runs its housekeeping,
        for ``ttl`` seconds from ``now`` (epoch seconds): the shared heartbeat
        (``outbox:housekeeping``, expiring) and its own entry in ``outbox:workers`` (scored
        by when it expires); entries expired over :data:`WORKER_HEARTBEAT_KEPT` seconds ago
        are dropped. One round trip.

        Raises:
            redis.exceptions.RedisError: Redis could not be reached.
        """
        pipe = self.connection.pipeline(transaction=False)
        pipe.set(self.keys.heartbeat(), member, px=max(1, int(ttl * 1000)))
        pipe.zadd(self.keys.workers, {member: now + ttl})
        pipe.zremrangebyscore(self.keys.workers, "-inf", repr(now - WORKER_HEARTBEAT_KEPT))
        pipe.execute()

    def worker_heartbeats(self) -> dict[str, float]:
        """``host:pid`` of each ``outbox_worker`` that beat lately -> when its heartbeat
        expires (or expired), epoch seconds (one ``ZRANGE``; see :meth:`beat`).

        Raises:
            redis.exceptions.RedisError: Redis could not be reached.
        """
        rows = cast(ScoredMembers, self.connection.zrange(self.keys.workers, 0, -1, withscores=True))
        return {raw.decode(): score for raw, score in rows}
