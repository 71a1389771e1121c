"""The base of the repository (:class:`~outbox.store.repository.MessageRepository`): its
Redis client, key names (:class:`~outbox.store.keys.Keys`) and settings, and how it runs
the Lua scripts of ``lua/`` (by SHA1, with their KEYS and ARGV). Every part of the
repository (messages, indexes, destination state, alerts, maintenance) extends it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from outbox.records import partition_of
from outbox.store.client.outages import PARTITION_UNAVAILABLE
from outbox.store.client.routing import by_primary, primary_of
from outbox.store.client.thread_client import ThreadClients
from outbox.store.keys import Keys
from outbox.store.payload_bodies import PayloadBodies
from outbox.store.scripts import names, sha, source

logger = logging.getLogger("outbox")

T = TypeVar("T")

#: Ids (or index entries) one call reads or acts on: a bulk action's Lua call, a
#: filtered scan's round trip, a partition's share of a merged scan. Bounded so one
#: script call stays short (Redis serves nothing else meanwhile).
IDS_PER_CALL = 1000

#: With more than one partition: seconds after which a process adds a destination's
#: name to the destinations set again with its next message
#: (``creating.register_steps``, a command of its own: the set is a key
#: of its own slot). Adding it once per process for good would leave a name unlisted
#: after Redis lost its data (a restart without persistence, ``FLUSHALL``) until the
#: process restarts; this bounds that: what reads the set (lists and counts over every
#: destination, retention, the index repair, the release of every parked message, the
#: gauges; never the claim) sees a name again at most this long after its first message
#: since. On one server ``lua/create.lua`` adds the names with every call (about 0.2 µs).
REGISTER_AGAIN = 10.0

# Replies as this repository's connection returns them (``decode_responses=False``): bytes.
# redis-py's own types also allow str (``decode_responses=True``) and give one type to
# sorted-set reads with and without WITHSCORES, so replies are cast to these where parsed.
Members = list[bytes]
ScoredMembers = list[tuple[bytes, float]]

#: One call of :meth:`MessageRepository.run_scripts`: (script name in ``lua/``, ARGV) or
#: (script name, ARGV, KEYS).
ScriptCall = tuple[str, Sequence[Any]] | tuple[str, Sequence[Any], Sequence[str]]


def script_call(call: ScriptCall) -> tuple[str, Sequence[Any], Sequence[str]]:
    """A :data:`ScriptCall` as (name, ARGV, KEYS)."""
    if len(call) == 3:
        return call
    return call[0], call[1], ()


def queue_first(pipe: Any, key: str) -> None:
    """Queue ``ZRANGE key 0 0 WITHSCORES`` on ``pipe`` as a raw command; read its reply with
    :func:`first_of`. Raw, because redis-py 5.0's cluster pipeline follows an ``ASK``
    redirect (a slot moving) by parsing ``ASKING``'s reply with the command's options,
    and ``withscores=True`` there raises ``TypeError`` (``bool_ok()`` got an unexpected
    keyword argument), which ended a worker's run while a slot moved."""
    pipe.execute_command("ZRANGE", key, 0, 0, "WITHSCORES")


def first_of(reply: Any) -> tuple[bytes, float] | None:
    """The (member, score) of a :func:`queue_first` reply (RESP2's flat ``[member, score]``
    or RESP3's ``[[member, score]]``), or None for an empty sorted set."""
    if not reply:
        return None
    if isinstance(reply[0], (list, tuple)):
        member, score = reply[0]
    else:
        member, score = reply[0], reply[1]
    return member, float(score)


@dataclass(frozen=True)
class RepositorySettings:
    """What a repository is set up with besides its Redis client (built from ``OUTBOX`` by
    :func:`~outbox.store.repository.get_repository`).

    Attributes:
        prefix: key prefix (``OUTBOX["KEY_PREFIX"]``).
        attempts_kept: attempt records kept per message.
        events_channel: Pub/Sub channel for events, or "" for none.
        idempotency_ttl: seconds an idempotency key is remembered (0 = for ever).
        wake_ttl: seconds a queue's wake-up flag lives (see ``lua/wake.lua``).
        partitions: partitions of the data (``OUTBOX["PARTITIONS"]``; see
            :class:`~outbox.store.keys.Keys`): reads across messages read every one.
        ordering_key_ttl: seconds an ordering key's state is kept after its last
            message left it (``OUTBOX["ORDERING_KEY_TTL"]``).
    """

    prefix: str = "outbox"
    attempts_kept: int = 50
    events_channel: str = ""
    idempotency_ttl: int = 0
    wake_ttl: float = 60.0
    partitions: int = 1
    ordering_key_ttl: int = 7 * 24 * 3600


def wake_flags_unavailable(queues: Sequence[str], exc: BaseException) -> list[str]:
    """What a write does when the wake-up flags' node cannot be reached after its messages
    were written (``exc``, one of :data:`.outages.PARTITION_UNAVAILABLE`): log a warning
    and wake no queue (returns ``[]``); the workers' wake-up check (``wake_due``, every
    housekeeping pass) finds the due messages instead. Shared by
    :meth:`RepositoryBase.raise_wake_flags` and its steps (``creating.wake_flag_steps``)."""
    logger.warning(
        "outbox: messages written, but the wake-up flags of %s could not be set (%s: %s); "
        "the workers' wake-up check will find them",
        ", ".join(queues),
        type(exc).__name__,
        exc,
    )
    return []


class RepositoryBase:
    """Messages in Redis under one key prefix: the connection, key names and settings
    every part of the repository shares, and the running of scripts. Arguments: see
    :class:`~outbox.store.repository.MessageRepository`.

    Scripts are called by SHA1 (``EVALSHA``) and loaded again after a ``NOSCRIPT``
    reply (a restarted Redis forgets them). Redis errors (``redis.exceptions.RedisError``)
    propagate unchanged.
    """

    def __init__(self, connection: Redis, settings: RepositorySettings = RepositorySettings()) -> None:
        self.connection = connection
        #: send()'s client: one connection held per thread (see :mod:`.thread_client`).
        self.thread_clients = ThreadClients(connection)
        self.keys = Keys(settings.prefix, settings.partitions)
        self.attempts_kept = settings.attempts_kept
        self.events_channel = settings.events_channel or ""
        self.idempotency_ttl = settings.idempotency_ttl
        self.ordering_key_ttl = max(1, int(settings.ordering_key_ttl))
        self.wake_ttl_ms = max(1, int(settings.wake_ttl * 1000))
        self.scripts_loaded = False
        #: destinations this process added to the destinations set -> when (monotonic)
        self.registered: dict[str, float] = {}
        #: published events' payload bodies this process's claims read lately
        self.payload_bodies = PayloadBodies()
        self._cluster_of: object = None
        self._cluster = False

    @property
    def cluster(self) -> bool:
        """Whether :attr:`connection` is a ``RedisCluster``, checked once per connection
        (``isinstance`` against it costs about 2 µs, a metaclass check: send() asks per
        call)."""
        connection = self.connection
        if connection is not self._cluster_of:
            self._cluster_of, self._cluster = connection, isinstance(connection, RedisCluster)
        return self._cluster

    def by_partition(self, ids: Sequence[str]) -> list[list[int]]:
        """The positions in ``ids`` of the ids of each partition they are in (in order of
        first appearance; one list of every position with one partition): a script acts on
        one partition's messages per call, as a cluster requires."""
        if not self.keys.partitioned:
            return [list(range(len(ids)))]
        groups: dict[int, list[int]] = {}
        for i, message_id in enumerate(ids):
            groups.setdefault(partition_of(message_id), []).append(i)
        return list(groups.values())

    def holding(self, destinations: Sequence[str]) -> set[str]:
        """Those of ``destinations`` that hold their messages now (paused, disabled, circuit
        breaker not closed): one round trip (each state hash in its home slot)."""
        if not destinations:
            return set()
        pipe = self.connection.pipeline(transaction=False)
        for d in destinations:
            pipe.hmget(self.keys.dest(d), "admin", "breaker")
        return {
            d
            for d, (admin, breaker) in zip(destinations, pipe.execute(), strict=True)
            if admin in (b"paused", b"disabled") or breaker in (b"open", b"half_open")
        }

    def unregistered(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` this process has not added to the destinations set in the
        last :data:`REGISTER_AGAIN` seconds, sorted (``creating.register_steps``)."""
        now = time.monotonic()
        return sorted(n for n in names if now - self.registered.get(n, -REGISTER_AGAIN) >= REGISTER_AGAIN)

    def mark_registered(self, names: Iterable[str]) -> None:
        """Note that ``names`` were just added to the destinations set."""
        now = time.monotonic()
        for n in names:
            self.registered[n] = now

    def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of ``keys`` (None for a missing key), in order: ``MGET``, or on a
        cluster redis-py's ``mget_nonatomic`` (one ``MGET`` per slot, pipelined), since
        the keys may be of several slots. Not atomic across slots."""
        if isinstance(self.connection, RedisCluster):
            return cast("list[bytes | None]", self.connection.mget_nonatomic(list(keys)))
        return cast("list[bytes | None]", self.connection.mget(keys))

    def partition_elsewhere(self, avoid: set[int]) -> int | None:
        """A partition, at random, other than those of ``avoid`` and, on a cluster, served
        by a primary that serves none of them (as this process's slot map says): where a
        fresh message without a key goes when its partition could not be written (an
        outage of its primary, a slot stuck half moved). None when there is none (one
        primary serves them all, or every partition is in ``avoid``)."""
        numbers = [k for k in self.keys.partition_numbers() if k not in avoid]
        if isinstance(self.connection, RedisCluster):
            cluster = self.connection

            def node(k: int) -> str:
                return str(primary_of(cluster, self.keys.tag_prefix(k)).name)

            down = {node(k) for k in avoid}
            numbers = [k for k in numbers if node(k) not in down]
        return random.choice(numbers) if numbers else None

    def raise_wake_flags(self, queues: Sequence[str], now: float) -> list[str]:
        """Set the wake-up flag of each of ``queues`` that has none (``SET NX PX``): the
        queues whose flag this set (the caller enqueues one wake-up job for each). With
        one partition the scripts set the flags themselves and ``queues`` are those
        already: returned as they are. One queue (every ``send()``) is one command, not a
        pipeline: a cluster client's pipeline costs it more than a command does.

        The messages are written by then: when the flags' node cannot be reached (an
        outage, :data:`.outages.PARTITION_UNAVAILABLE`), no queue is woken and a warning
        is logged; the workers' wake-up check (``wake_due``, every housekeeping pass)
        finds the due messages instead."""
        if not queues or not self.keys.partitioned:
            return list(queues)
        try:
            if len(queues) == 1:
                key = self.keys.wake(queues[0])

                def set_flag(c: Any) -> Any:
                    return c.set(key, repr(now), nx=True, px=self.wake_ttl_ms)

                connection: Any = self.connection
                cluster = isinstance(connection, RedisCluster)
                replies = [on_primary(connection, key, set_flag) if cluster else set_flag(connection)]
            else:
                pipe = self.connection.pipeline(transaction=False)
                for queue in queues:
                    pipe.set(self.keys.wake(queue), repr(now), nx=True, px=self.wake_ttl_ms)
                replies = pipe.execute()
        except PARTITION_UNAVAILABLE as exc:
            return wake_flags_unavailable(queues, exc)
        return [q for q, was_set in zip(queues, replies, strict=True) if was_set]

    def load_scripts(self) -> None:
        """Load every Lua script into Redis's script cache (one round trip, ``SCRIPT LOAD``;
        on a cluster, one round trip per primary: each node has its own script cache).

        Raises:
            redis.exceptions.RedisError: Redis (a primary) could not be reached.
        """
        if isinstance(self.connection, RedisCluster):
            primaries = self.connection.get_primaries()
            clients = [self.connection.get_redis_connection(node) for node in primaries]
        else:
            clients = [self.connection]
        for client in clients:
            pipe = client.pipeline(transaction=False)
            for name in names():
                pipe.script_load(source(name))
            pipe.execute()
        self.scripts_loaded = True

    def run_scripts(
        self, calls: Sequence[ScriptCall], client: Redis | None = None, *, errors: bool = False
    ) -> list[Any]:
        """Run Lua scripts in one round trip (a pipeline without MULTI), in order.

        Each script is atomic by itself; the calls are not atomic together. Every script
        is loaded before the first call (:meth:`load_scripts`), so the calls run in order.
        Only when Redis lost its script cache between two calls (a restart, ``SCRIPT
        FLUSH``) do the calls that met ``NOSCRIPT`` run again after the others: the
        scripts are written so that this costs time, never a message (a claim that runs
        before an outcome write only misses a retry due at once until the next claim).

        On a cluster (a ``redis.cluster.RedisCluster`` connection) redis-py's cluster
        pipeline sends each call to the primary of its KEYS' slot (one round trip per
        node), in order per node; every call must declare its keys, all of one slot.

        Args:
            calls: (script name in ``lua/``, ARGV) or (name, ARGV, KEYS) per call.
            client: the redis-py client to run them on (default: the repository's pooled one).
            errors: return the exception a call met as its reply instead of raising it
                (the other calls' replies stand). On a cluster the calls then go in one
                pipeline per primary (:meth:`_run_by_node`), so that a primary that
                cannot be reached fails its own calls only.

        Returns:
            The raw reply of each call, in order.

        Raises:
            redis.exceptions.RedisError: a call failed (after loading the scripts and
                running the calls that hit ``NOSCRIPT`` once more).
            redis.exceptions.RedisClusterException: on a cluster, a call declares no KEYS
                (it would run on a random primary) or KEYS of several slots.
        """
        if not self.scripts_loaded:
            self.load_scripts()
        parts = [script_call(call) for call in calls]
        client = client or self.connection
        if errors and isinstance(client, RedisCluster):
            return self._run_by_node(client, parts)
        replies = self._run_pipelined(parts, range(len(parts)), client)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            self.load_scripts()
            for i, reply in zip(missing, self._run_pipelined(parts, missing, client), strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception) and not errors:
                raise reply
        return replies

    def _run_pipelined(
        self,
        parts: Sequence[tuple[str, Sequence[Any], Sequence[str]]],
        which: Sequence[int],
        client: Redis | None = None,
    ) -> list[Any]:
        """The calls ``parts[i]`` for ``i`` in ``which`` in one pipeline: their replies,
        errors included. On a cluster ``EVALSHA`` goes through ``execute_command``:
        redis-py 8.1's cluster pipeline refuses ``pipe.evalsha`` (redis-py PR #4206).
        Each call names its primary (``target_nodes``, from the client's slot map), since
        redis-py 8's cluster pipeline otherwise asks the server for the keys of every
        ``EVALSHA`` it routes (``COMMAND GETKEYS``, one round trip per call, the keys
        being in the call already). A call redirected (``MOVED``, ``ASK``, ``TRYAGAIN``)
        is sent again by redis-py without that name, routed by its keys."""
        client = client or self.connection
        pipe = client.pipeline(transaction=False)
        if isinstance(client, RedisCluster):
            for i in which:
                name, args, keys = parts[i]
                _need_keys(name, keys)
                pipe.execute_command(
                    "EVALSHA",
                    sha(name),
                    len(keys),
                    *keys,
                    *args,
                    target_nodes=_primary_of(client, name, keys),
                )
        else:
            for i in which:
                name, args, keys = parts[i]
                pipe.evalsha(sha(name), len(keys), *keys, *args)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        return replies

    def _run_by_node(
        self, cluster: RedisCluster, parts: Sequence[tuple[str, Sequence[Any], Sequence[str]]]
    ) -> list[Any]:
        """:meth:`run_scripts` with ``errors`` on a cluster: the calls of each primary (by
        the slot of their first key) in one pipeline on that node's own client, in
        order, and each call's reply or error. (redis-py's cluster pipeline raises a
        node's connection error for the whole pipeline, though other nodes ran theirs.) A
        call answered ``MOVED``/``ASK``/``TRYAGAIN`` or ``NOSCRIPT`` did not run: it is
        sent again alone through the cluster client, which follows the redirection
        (after loading the scripts, for ``NOSCRIPT``)."""
        for name, _args, keys in parts:
            _need_keys(name, keys)
            _one_slot(cluster, name, keys)
        replies: list[Any] = [None] * len(parts)
        for node, positions in by_primary(cluster, [keys[0] for _, _, keys in parts]).values():
            try:
                got = self._run_pipelined(parts, positions, cluster.get_redis_connection(node))
            except PARTITION_UNAVAILABLE as exc:
                got = [exc] * len(positions)
            for i, reply in zip(positions, got, strict=True):
                replies[i] = reply
        for i, reply in enumerate(replies):
            if isinstance(reply, (MovedError, AskError, TryAgainError, NoScriptError)):
                name, args, keys = parts[i]
                try:
                    replies[i] = self.run_script(name, args, cast(Redis, cluster), keys=keys)
                except (RedisError, RedisClusterException) as exc:
                    replies[i] = exc
        return replies

    def run_script(
        self, name: str, args: Sequence[Any], client: Redis | None = None, *, keys: Sequence[str] = ()
    ) -> Any:
        """Run one Lua script by SHA1 (loading the scripts first, and after ``NOSCRIPT``)
        and return its reply. ``client``: the redis-py client to run it on (default: the
        repository's pooled one); ``keys``: its KEYS (names from :attr:`keys`).

        Raises:
            redis.exceptions.RedisError: the call failed.
            redis.exceptions.RedisClusterException: on a cluster, the call declares no
                KEYS or KEYS of several slots.
        """
        client = client or self.connection
        cluster = isinstance(client, RedisCluster)  # about 2 µs (a metaclass check): once
        if cluster:
            _need_keys(name, keys)
        if not self.scripts_loaded:
            self.load_scripts()

        def call(c: Any) -> Any:
            return c.evalsha(sha(name), len(keys), *keys, *args)

        try:
            return on_primary(cast(RedisCluster, client), keys[0], call) if cluster else call(client)
        except NoScriptError:
            self.load_scripts()
            return on_primary(cast(RedisCluster, client), keys[0], call) if cluster else call(client)


#: What a node's plain client answers when the slot map this process holds is out of
#: date (a slot moved, a primary gone): :func:`on_primary` then asks the cluster client.
STALE_ROUTE: tuple[type[Exception], ...] = (
    MovedError,
    AskError,
    TryAgainError,
    RedisConnectionError,
    ClusterDownError,
)


def on_primary(cluster: RedisCluster, key: str, call: Callable[[Any], T]) -> T:
    """``call(client)`` with the plain ``redis.Redis`` client of the primary that serves
    ``key``'s slot (by redis-py's slot map), else with the cluster client.

    A command through redis-py's cluster client costs about 70 µs more than through the
    node's own client (its routing and command-policy work: 175 against 105 µs for an
    ``EVALSHA`` on loopback, measured here). So the hot calls (``send()``'s create, its
    wake-up flag) go straight to the node. When the node answers that the map is out of
    date (:data:`STALE_ROUTE`: ``MOVED``, ``ASK``, ``TRYAGAIN``, a connection error: a
    slot moved, a primary gone), ``call`` runs again through the cluster client, which
    follows redirections, reads the slot map again and retries; ``call`` must be safe
    to run twice (every script is).
    """
    try:
        direct = cluster.get_redis_connection(primary_of(cluster, key))
    except RedisClusterException:  # no node known for the slot: the cluster client decides
        return call(cluster)
    try:
        return call(direct)
    except STALE_ROUTE:
        return call(cluster)


def _one_slot(client: RedisCluster, name: str, keys: Sequence[str]) -> None:
    """Refuse a script call whose ``keys`` are of several slots, as redis-py does when it
    routes such a call itself.

    Raises:
        redis.exceptions.RedisClusterException: ``keys`` are of several slots.
    """
    if len({client.keyslot(key) for key in keys}) != 1:  # type: ignore[no-untyped-call]
        raise RedisClusterException(f"script {name!r}: EVALSHA - all keys must map to the same key slot")


def _primary_of(client: RedisCluster, name: str, keys: Sequence[str]) -> Any:
    """The primary (a ``redis.cluster.ClusterNode``) that serves ``keys``' slot in
    ``client``'s slot map (:func:`.routing.primary_of`).

    Raises:
        redis.exceptions.RedisClusterException: ``keys`` are of several slots.
        redis.exceptions.SlotNotCoveredError: no node serves the slot.
    """
    _one_slot(client, name, keys)
    return primary_of(client, keys[0])


def _need_keys(name: str, keys: Sequence[str]) -> None:
    """Refuse, on a cluster, a script call without KEYS: redis-py would send it to a random
    primary, where it would fail (or write) on keys of slots that node does not serve.

    Raises:
        redis.exceptions.RedisClusterException: ``keys`` is empty.
    """
    if not keys:
        raise RedisClusterException(
            f"script {name!r} is called without KEYS: on a Redis Cluster every script must declare "
            "the keys it touches (all in one hash slot)"
        )
