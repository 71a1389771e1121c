"""Durability of a send: wait, before ``send()`` returns, until replicas have the message
(``WAIT``) or until it is fsynced to an append-only file (``WAITAOF``).

Redis replication is asynchronous: the primary acknowledges a write before any replica
has it, so a primary that fails right after ``send()`` returned can lose the message
when a replica is promoted (Redis docs, "Redis replication":
https://redis.io/docs/latest/operate/oss_and_stack/management/replication/). The setting
``OUTBOX["DURABILITY"]`` (parsed by :meth:`Durability.parse`) makes each write of new
messages (``send()``, ``send_many()``, the on-commit push and the relay of captured
messages: :func:`outbox.sending.intake.store`) wait for:

* ``{"REPLICAS": n}``: ``WAIT n timeout``: n replicas have received the write (in
  memory). https://redis.io/docs/latest/commands/wait/
* ``{"AOF": True}``: ``WAITAOF 1 0 timeout``: the primary has fsynced it to its AOF
  (needs ``appendonly yes`` on the primary). With ``"REPLICAS": n`` too, ``WAITAOF 1 n
  timeout``: n replicas have also fsynced it to *their* AOF (a replica without
  ``appendonly yes`` never counts). Redis 7.2+ or Valkey 7.2+.
  https://redis.io/docs/latest/commands/waitaof/

Both commands count the writes *of the connection they are sent on* ("all the previous
write commands sent in the context of the current connection"): Redis remembers, per
client, the replication offset of its last write. So the wait is sent on the connection
that ran the script, in the same packet (:func:`write_then_wait`,
:func:`commands_then_wait`: one ``sendall`` of the ``EVALSHA`` and the wait, then the
replies read): no round trip beyond the wait itself.
A wait sent on another connection of the pool would count that connection's writes and
could return at once.

On a cluster (a ``redis.cluster.RedisCluster``), each primary replicates its own writes,
so the writes are grouped by the primary serving their first key's slot (redis-py's slot
map) and each group is sent with its wait on one connection to that primary
(:func:`_cluster_commands_then_wait`); the acknowledgement is met only when every
primary's is. A write that meets ``MOVED``/``ASK``/``TRYAGAIN`` (a slot moved or moving
since the map was read) is sent again where the cluster says, as redis-py's cluster client
does for one command; a primary that cannot be reached (failed over) makes redis-py read
the slot map again, and the writes go to the node that serves the slot now.

``WAITAOF 1 n`` with n > 0 is preceded by ``WAIT n`` on the same connection: a replica
answers the primary's ``REPLCONF GETACK`` (sent when a client starts waiting) as soon
as it reads it, before the fsync of a write that came in the same read, and otherwise
reports its fsynced offset only in its once-a-second ``REPLCONF ACK`` (Valkey
``replication.c``: ``replicationSendAck`` on ``GETACK`` and in ``replicationCron``).
So ``WAITAOF 1 1`` sent with the write waited about 1 s on every call (measured, Valkey
8.1, replica ``appendfsync always``); after a ``WAIT 1`` the replica has applied the
write and, with ``appendfsync always``, fsynced it before it reads anything else, so the
``GETACK`` of ``WAITAOF`` gets an up-to-date answer: 0.27 ms. (A replica with
``appendfsync everysec`` fsyncs once a second whatever is asked: up to 1 s a send.) The ``WAITAOF`` is sent once the ``WAIT`` has answered,
with what is left of ``TIMEOUT``, so the whole wait stays within ``TIMEOUT``.

A call that wrote nothing (every message was there already: a push repeated by the
relay, an idempotency key used before) has no write of its own to wait for, and its
connection's last write may be older than the message it found. Then
:func:`wait_for_earlier_writes` sends ``PUBLISH`` (which Redis propagates to replicas,
so it moves the connection's offset to the end of the replication stream) and waits
again: the wait then covers every write made before it, the message found included.

Redis checks a blocked client's timeout in its periodic timer (``hz``, 10 times a
second by default), so a wait that times out returns up to about 100 ms after
``TIMEOUT`` (measured: ``WAIT 1 200`` with the replica paused returned after 0.30 s).

What it does not do (see docs/operations.md, "Durability and failover"): make Redis
strongly consistent. Sentinel and Cluster try to promote the replica with the most
data, but "it is possible to still lose a write synchronously replicated to multiple
replicas" (WAIT's docs, "Consistency and WAIT").
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterError,
    MovedError,
    NoScriptError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from outbox.conf import outbox_settings
from outbox.exceptions import DurabilityShortfall, NotDurable
from outbox.store.client.routing import by_primary, primary_of
from outbox.store.keys import Keys
from outbox.store.scripts import sha


class Repository(Protocol):
    """What this module uses of a :class:`~outbox.store.repository.MessageRepository`
    (a protocol: the repository's modules import this one)."""

    connection: Redis
    keys: Keys
    scripts_loaded: bool

    def load_scripts(self) -> None: ...


class Written(Protocol):
    """What this module reads of a :class:`~outbox.store.messages.Created`."""

    standing_id: str
    code: str


#: The keys of ``OUTBOX["DURABILITY"]`` and their defaults (no wait).
DEFAULTS: dict[str, Any] = {"REPLICAS": 0, "AOF": False, "TIMEOUT": 1.0}


@dataclass(frozen=True)
class Durability:
    """What a write of new messages waits for before ``send()`` returns.

    Attributes:
        replicas: replicas that must acknowledge the write (0: none).
        aof: wait for an fsync of the append-only file: the primary's, and each of the
            ``replicas`` counted (``WAITAOF``) instead of their receiving it (``WAIT``).
        timeout: seconds to wait at most (> 0; Redis's 0, "block for ever", is refused:
            a down replica would hang every ``send()``).
    """

    replicas: int = 0
    aof: bool = False
    timeout: float = DEFAULTS["TIMEOUT"]

    @classmethod
    def parse(cls, value: Any, name: str = "OUTBOX['DURABILITY']") -> Durability:
        """A :class:`Durability` from the setting's value: None (no wait), or a dict of
        ``REPLICAS`` (int >= 0), ``AOF`` (bool) and ``TIMEOUT`` (seconds > 0), each
        optional (defaults: :data:`DEFAULTS`).

        Raises:
            ValueError: the value is not of that form (its text names ``name``).
        """
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a dict of REPLICAS, AOF and TIMEOUT, not {value!r}")
        unknown = set(value) - set(DEFAULTS)
        if unknown:
            raise ValueError(f"{name}: unknown key(s) {sorted(unknown)}; known: {list(DEFAULTS)}")
        merged = {**DEFAULTS, **value}
        replicas, aof, timeout = merged["REPLICAS"], merged["AOF"], merged["TIMEOUT"]
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ValueError(f"{name}['REPLICAS'] must be an int >= 0, not {replicas!r}")
        if not isinstance(aof, bool):
            raise ValueError(f"{name}['AOF'] must be True or False, not {aof!r}")
        if (
            not isinstance(timeout, (int, float))
            or isinstance(timeout, bool)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ValueError(f"{name}['TIMEOUT'] must be a number of seconds > 0, not {timeout!r}")
        return cls(replicas, aof, float(timeout))

    @property
    def waits(self) -> bool:
        """True when a write waits at all (``REPLICAS`` > 0 or ``AOF``)."""
        return self.replicas > 0 or self.aof

    @property
    def timeout_ms(self) -> int:
        """:attr:`timeout` in whole milliseconds, at least 1 (the commands take ms)."""
        return max(1, math.ceil(self.timeout * 1000))

    @property
    def receipt_first(self) -> bool:
        """True when a ``WAIT`` precedes the ``WAITAOF`` (``AOF`` with ``REPLICAS`` > 0;
        see the module docstring)."""
        return self.aof and self.replicas > 0

    def command(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The wait command: ``("WAIT", replicas, ms)`` or ``("WAITAOF", 1, replicas, ms)``,
        ms from ``timeout`` seconds (default :attr:`timeout`; at least 1 ms)."""
        ms = self.timeout_ms if timeout is None else max(1, math.ceil(timeout * 1000))
        if self.aof:
            return ("WAITAOF", 1, self.replicas, ms)
        return ("WAIT", self.replicas, ms)

    def describe(self) -> str:
        """The command as text, e.g. ``"WAIT 1 1000"``."""
        return " ".join(str(part) for part in self.command())

    def acknowledgement(self, reply: Any) -> Acknowledgement:
        """Judge the wait's reply: ``WAIT``'s integer (replicas that have the write) or
        ``WAITAOF``'s ``[local, replicas]`` (fsyncs done: 0 or 1 on the primary, and the
        replicas'), or the exception reading it raised (the wait failed: not met).
        Never raises."""
        if isinstance(reply, BaseException):
            return Acknowledgement(0, False if self.aof else None, False, f"{type(reply).__name__}: {reply}")
        try:
            if self.aof:
                local, replicas = int(reply[0]), int(reply[1])
                return Acknowledgement(replicas, local >= 1, local >= 1 and replicas >= self.replicas)
            replicas = int(reply)
        except (TypeError, ValueError, IndexError):
            return Acknowledgement(0, False if self.aof else None, False, f"unexpected reply {reply!r}")
        return Acknowledgement(replicas, None, replicas >= self.replicas)


@dataclass(frozen=True)
class Acknowledgement:
    """What Redis acknowledged of a write, per its wait's reply.

    Attributes:
        replicas: replicas that acknowledged it (received it for ``WAIT``, fsynced it to
            their AOF for ``WAITAOF``).
        local: ``WAITAOF``: True when the primary fsynced it to its AOF; None for ``WAIT``.
        met: True when the :class:`Durability` asked for is met.
        error: why the wait itself failed ("" when Redis answered it): an error reply
            (``WAITAOF`` on a primary with ``appendonly no``) or a connection error or
            socket timeout while waiting (the alias's ``SOCKET_TIMEOUT`` must be longer
            than ``TIMEOUT``).
    """

    replicas: int
    local: bool | None
    met: bool
    error: str = ""


@cache
def configured() -> Durability:
    """``OUTBOX["DURABILITY"]`` parsed (cached; dropped when settings change).

    Raises:
        ImproperlyConfigured: the setting is invalid (also the system check outbox.E001).
    """
    try:
        return Durability.parse(outbox_settings.DURABILITY)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from exc


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "OUTBOX":
        configured.cache_clear()


@contextlib.contextmanager
def _one_connection(client: Redis) -> Iterator[Redis]:
    """``client`` when it holds a connection of its own (``single_connection_client``,
    as :mod:`.thread_client` makes them), else a client holding one connection of its
    pool for the time of the block.

    Raises:
        ImproperlyConfigured: ``client`` is not a ``redis.Redis`` (a ``RedisCluster`` is
            split by node first: :func:`_cluster_commands_then_wait`).
    """
    if not isinstance(client, Redis):
        raise ImproperlyConfigured(
            f"OUTBOX['DURABILITY'] needs a redis.Redis client, not {type(client).__name__}"
        )
    if client.connection is not None:
        yield client
        return
    held = Redis(connection_pool=client.connection_pool, single_connection_client=True)
    try:
        yield held
    finally:
        held.close()


def _send_and_read(client: Redis, commands: Sequence[Sequence[Any]], *, needed: int = 1) -> list[Any]:
    """Send ``commands`` in one write on ``client``'s own connection and read their
    replies in order (as a pipeline without MULTI does). A reply is its value, or the
    ``ResponseError`` Redis answered, or, once one reply could not be read (a socket
    timeout, a closed connection), that exception for it and for every reply after it
    (the connection is then closed: replies may still be on the way).

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: the commands could not be sent,
            or one of the first ``needed`` replies could not be read (nothing is known of
            what those commands did).
    """
    # redis-py's Connection methods and parse_response carry no annotations.
    connection: Any = client.connection
    parse: Any = client.parse_response
    assert connection is not None
    lock = getattr(client, "single_connection_lock", None)  # redis-py >= 5.1
    with lock if lock is not None else contextlib.nullcontext():
        connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        failure: BaseException | None = None
        for args in commands:
            if failure is not None:
                replies.append(failure)
                continue
            try:
                replies.append(parse(connection, str(args[0])))
            except ResponseError as exc:
                replies.append(exc)
            except BaseException as exc:
                connection.disconnect()
                if len(replies) < needed:
                    raise
                failure = exc
                replies.append(exc)
    return replies


def _writes_and_wait(
    held: Redis, writes: Sequence[Sequence[Any]], durability: Durability
) -> tuple[list[Any], Any]:
    """Send ``writes`` and ``durability``'s wait together on ``held``'s connection (for
    :attr:`Durability.receipt_first`: ``WAIT`` with them, then ``WAITAOF`` with the time
    left). Returns (each write's reply or ``ResponseError``, the wait's reply or the
    exception that ended it).

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: a write's reply could not be read.
    """
    started = time.monotonic()
    first = (
        ("WAIT", durability.replicas, durability.timeout_ms)
        if durability.receipt_first
        else durability.command()
    )
    *replies, waited = _send_and_read(held, [*writes, first], needed=len(writes))
    if not durability.receipt_first or isinstance(waited, BaseException):
        return replies, waited
    left = durability.timeout - (time.monotonic() - started)
    try:
        (waited,) = _send_and_read(held, [durability.command(left)])
    except (RedisError, OSError) as exc:
        waited = exc
    return replies, waited


def commands_then_wait(
    repository: Repository,
    client: Redis,
    writes: Sequence[Sequence[Any]],
    durability: Durability,
) -> tuple[list[Any], Acknowledgement]:
    """Send ``writes`` (Redis commands: ``EVALSHA`` of this repository's scripts, or any
    other) and then ``durability``'s wait on one connection, in one write (and, for
    ``WAITAOF`` with replicas, the ``WAITAOF`` after the ``WAIT``'s reply: see the module
    docstring). The wait covers every write of the connection, so it comes last, after
    all of them: what a create split over several scripts (partitions) needs.

    Args:
        repository: whose scripts are loaded first, and again after ``NOSCRIPT``
            (the writes that met it are sent again, with the wait after them).
        client: the client to run on: its own connection if it holds one
            (``send()``'s thread client), else one connection of its pool.
        writes: the commands, e.g. ``("EVALSHA", sha, numkeys, *keys, *args)``.
        durability: the wait (``durability.waits`` must be True).

    Returns:
        (each write's reply, a ``ResponseError`` for one Redis refused; the
        :class:`Acknowledgement` of the wait). A wait that failed (an error reply, a
        timeout reading it) is an acknowledgement not met, never an exception: the
        writes ran by then.

    Raises:
        redis.exceptions.ConnectionError, TimeoutError: the commands could not be sent
            or a write's reply could not be read.
        ImproperlyConfigured: ``client`` is not a ``redis.Redis``.
    """
    if not repository.scripts_loaded:
        repository.load_scripts()
    if isinstance(client, RedisCluster):
        return _cluster_commands_then_wait(repository, client, writes, durability)
    with _one_connection(client) as held:
        replies, waited = _writes_and_wait(held, writes, durability)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:  # Redis lost its scripts (a restart, SCRIPT FLUSH): those did not run
            repository.load_scripts()
            again, waited = _writes_and_wait(held, [writes[i] for i in missing], durability)
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
    return replies, durability.acknowledgement(waited)


def _cluster_commands_then_wait(
    repository: Repository,
    cluster: RedisCluster,
    writes: Sequence[Sequence[Any]],
    durability: Durability,
) -> tuple[list[Any], Acknowledgement]:
    """:func:`commands_then_wait` on a cluster, following redirects as redis-py's cluster
    client does for one command (its ``RedisCluster._execute_command``), since the writes
    and their wait go on connections of their own here:

    * ``MOVED`` (the slot has another owner now): the slot map is read again and the
      writes go to the new owner, with their wait;
    * ``ASK`` (a legacy migration under way, the keys already on the target): the writes
      go to the node the error names, each after ``ASKING``, with their wait;
    * ``TRYAGAIN`` (a legacy migration split the call's keys): sent again after
      :data:`TRYAGAIN_DELAY` seconds.

    At most :data:`REDIRECTS` rounds (redis-py's ``RedisCluster.RedisClusterRequestTTL``
    is 16); a write still redirected after them gets redis-py's answer then,
    ``ClusterError("TTL exhausted.")``, as its reply (the caller falls over to another
    partition, or refuses a keyed message: during a legacy migration a script whose keys
    are split between the two nodes is refused by both until the migration ends). A redirected
    write did not run, so sending it again cannot write it twice. Returns the replies in
    ``writes`` order and every primary's acknowledgement combined (:func:`combined`).
    """
    replies, acknowledgements = _cluster_round(repository, cluster, writes, durability)
    for _ in range(REDIRECTS):
        redirected = [i for i, reply in enumerate(replies) if isinstance(reply, (AskError, TryAgainError))]
        if not redirected:
            break
        if any(isinstance(replies[i], TryAgainError) for i in redirected):
            time.sleep(TRYAGAIN_DELAY)
        asked = [i for i in redirected if type(replies[i]) is AskError]  # ASK, not MOVED
        again = [i for i in redirected if i not in asked]
        if again:
            if any(isinstance(replies[i], MovedError) for i in again):
                _read_slot_map(cluster)
            got, acks = _cluster_round(repository, cluster, [writes[i] for i in again], durability)
            acknowledgements += acks
            for i, reply in zip(again, got, strict=True):
                replies[i] = reply
        by_target: dict[tuple[str, int], list[int]] = {}
        for i in asked:
            host, port = replies[i].node_addr
            by_target.setdefault((host, int(port)), []).append(i)
        for (host, port), positions in by_target.items():
            node = cluster.get_node(host=host, port=port)  # type: ignore[no-untyped-call]
            if node is None:  # a node this client does not know yet
                _read_slot_map(cluster)
                node = cluster.get_node(host=host, port=port)  # type: ignore[no-untyped-call]
            if node is None:
                continue  # the ASK stays the reply
            commands = [part for i in positions for part in (("ASKING",), writes[i])]
            try:
                got, acknowledged = commands_then_wait(
                    repository, cluster.get_redis_connection(node), commands, durability
                )
            except (RedisConnectionError, RedisTimeoutError) as exc:
                got, acknowledged = [exc] * len(commands), durability.acknowledgement(exc)
            acknowledgements.append(acknowledged)
            for i, reply in zip(positions, got[1::2], strict=True):  # each write's, not ASKING's
                replies[i] = reply
    if any(isinstance(reply, AskError) for reply in replies):  # MovedError is an AskError
        _read_slot_map(cluster)
    # still redirected: redis-py's own answer after its redirects ("TTL exhausted."), a
    # cluster in flux (outages.CLUSTER_IN_FLUX) that the caller handles as such
    replies = [
        ClusterError(f"TTL exhausted. ({type(reply).__name__}: {reply})")
        if isinstance(reply, (AskError, TryAgainError))
        else reply
        for reply in replies
    ]
    return replies, combined(acknowledgements)


#: Rounds of redirected writes :func:`_cluster_commands_then_wait` follows (redis-py's
#: cluster client follows 16 redirects of one command).
REDIRECTS = 16
#: Seconds before writes answered ``TRYAGAIN`` are sent again (redis-py waits 0.05 s).
TRYAGAIN_DELAY = 0.05


def _cluster_round(
    repository: Repository,
    cluster: RedisCluster,
    writes: Sequence[Sequence[Any]],
    durability: Durability,
) -> tuple[list[Any], list[Acknowledgement]]:
    """One round of :func:`_cluster_commands_then_wait`: the writes grouped by the primary serving
    the slot of their first key (``EVALSHA sha numkeys key ...``; every key of a script
    call is of one slot), each group and its wait sent on that primary's connection
    (:meth:`redis.cluster.RedisCluster.get_redis_connection`), one primary after another.
    Returns the replies in ``writes`` order and each primary's acknowledgement. A
    primary unreachable makes redis-py read the slot map again, and when
    another node serves the slot now (a replica promoted), the group is sent there once
    more (the writes must be safe to run twice, as ``create.lua`` is). A primary that
    cannot be reached, with no other serving its slot, gives its writes that error as
    their replies: the other primaries' writes stand (the caller sees which).
    """
    routes = [str(write[3]) if len(write) > 3 and int(write[2]) > 0 else "" for write in writes]  # "": slot 0
    replies: list[Any] = [None] * len(writes)
    acknowledgements = []
    for name, (node, positions) in by_primary(cluster, routes).items():
        slot = cluster.keyslot(routes[positions[0]])  # type: ignore[no-untyped-call]
        group = [writes[i] for i in positions]
        node_client = cluster.get_redis_connection(node)
        try:
            got, acknowledged = commands_then_wait(repository, node_client, group, durability)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            # A primary gone (failed over)? Ask who serves the slot now; if another node
            # does, send there once more (the writes are safe to run twice: create.lua).
            _read_slot_map(cluster)
            now_serving = cluster.nodes_manager.get_node_from_slot(slot)
            # unless another node serves the slot now, this primary's writes fail alone
            got, acknowledged = [exc] * len(group), durability.acknowledgement(exc)
            if now_serving.name != name:
                node_client = cluster.get_redis_connection(now_serving)
                try:
                    got, acknowledged = commands_then_wait(repository, node_client, group, durability)
                except (RedisConnectionError, RedisTimeoutError) as again:
                    got, acknowledged = [again] * len(group), durability.acknowledgement(again)
        for i, reply in zip(positions, got, strict=True):
            replies[i] = reply
        acknowledgements.append(acknowledged)
    return replies, acknowledgements


def _read_slot_map(cluster: RedisCluster) -> None:
    """Have redis-py read the cluster's slot map again (``CLUSTER SLOTS``); an error doing
    so is left for the next command, which redis-py routes and retries itself."""
    with contextlib.suppress(RedisError):
        cluster.nodes_manager.initialize()


def combined(acknowledgements: Sequence[Acknowledgement]) -> Acknowledgement:
    """One acknowledgement for waits on several primaries: met when every one is, with
    the fewest replicas any of them reported and every error."""
    if not acknowledgements:
        return Acknowledgement(0, None, False, "no primary to wait on")
    if len(acknowledgements) == 1:
        return acknowledgements[0]
    locals_ = [a.local for a in acknowledgements]
    return Acknowledgement(
        min(a.replicas for a in acknowledgements),
        None if all(v is None for v in locals_) else all(bool(v) for v in locals_),
        all(a.met for a in acknowledgements),
        "; ".join(a.error for a in acknowledgements if a.error),
    )


def write_then_wait(
    repository: Repository,
    client: Redis,
    name: str,
    args: Sequence[Any],
    keys: Sequence[str],
    durability: Durability,
) -> tuple[Any, Acknowledgement]:
    """Run script ``lua/<name>.lua`` (ARGV ``args``, KEYS ``keys``) and then
    ``durability``'s wait on one connection: :func:`commands_then_wait` of one
    ``EVALSHA``.

    Returns:
        (the script's reply, the :class:`Acknowledgement` of the wait).

    Raises:
        redis.exceptions.RedisError: the script failed, or its reply could not be read
            (as :meth:`~outbox.store.base.RepositoryBase.run_script`).
        ImproperlyConfigured: ``client`` is not a ``redis.Redis``.
    """
    (reply,), acknowledged = commands_then_wait(
        repository, client, [("EVALSHA", sha(name), len(keys), *keys, *args)], durability
    )
    if isinstance(reply, BaseException):
        raise reply
    return reply, acknowledged


def wait_for_earlier_writes(repository: Repository, durability: Durability) -> Acknowledgement:
    """Wait until every write made on the primary so far is acknowledged as
    ``durability`` asks: ``PUBLISH <prefix>:durability ""`` and the wait, in one write on
    one connection. For a call that wrote nothing (see the module docstring): the
    ``PUBLISH`` is propagated to the replicas, so the wait after it counts everything
    before it. On a cluster, where a ``PUBLISH`` goes to the other nodes over the
    cluster bus and not down the replication stream (Valkey ``pubsub.c``,
    ``publishCommand``), a replicated write instead, on each primary serving a
    partition: ``SET <prefix>:{p<k>}:durability "" PX 60000`` in the first of its
    partitions. Never raises: a failure is an acknowledgement not met, with its error.
    """
    connection: Any = repository.connection
    writes: list[tuple[Redis, tuple[Any, ...]]]
    if isinstance(connection, RedisCluster):  # every primary: the messages found may be on any
        try:
            first: dict[str, tuple[Any, str]] = {}
            for k in repository.keys.partition_numbers():
                key = repository.keys.sync(k)
                node = primary_of(connection, key)
                first.setdefault(node.name, (node, key))
            writes = [
                (connection.get_redis_connection(node), ("SET", key, "", "PX", 60000))
                for node, key in first.values()
            ]
        except RedisError as exc:
            return durability.acknowledgement(exc)
    else:
        writes = [(connection, ("PUBLISH", repository.keys.sync(), ""))]
    acknowledgements = []
    for client, write in writes:
        try:
            with _one_connection(client) as held:
                (written,), waited = _writes_and_wait(held, [write], durability)
        except (RedisError, OSError) as exc:
            return durability.acknowledgement(exc)
        acknowledgements.append(
            durability.acknowledgement(written if isinstance(written, BaseException) else waited)
        )
    return combined(acknowledgements)


def confirm(
    repository: Repository,
    durability: Durability,
    created: Sequence[Written],
    acknowledged: Acknowledgement | None,
) -> None:
    """Raise :class:`~outbox.exceptions.NotDurable` unless the messages ``created`` by
    :meth:`~outbox.store.messages.MessageStore.create` with ``durability``, whose wait
    got ``acknowledged`` (:attr:`~outbox.store.messages.CreateResult.acknowledged`), are
    acknowledged as ``durability`` asks. Nothing to confirm when nothing waits, or when
    a message was refused for an idempotency conflict (then nothing was written, and
    the caller raises ``IdempotencyConflict``). When every message was there already,
    waits for the earlier writes (:func:`wait_for_earlier_writes`) if the call's own wait
    was met, which then proved nothing about them.

    Raises:
        NotDurable: fewer acknowledgements than asked for within the timeout, or the
            wait failed; the messages are written on the primary.
    """
    if not durability.waits:
        return
    created = [c for c in created if c.code != "unstored"]  # not written: nothing to wait for
    codes = [c.code for c in created]
    if any(code in ("conflict", "refused") for code in codes):
        return
    if acknowledged is not None and acknowledged.met and "new" not in codes:
        acknowledged = wait_for_earlier_writes(repository, durability)
    if acknowledged is None or not acknowledged.met:
        raise not_durable(durability, acknowledged, [c.standing_id for c in created], created)


def not_durable(
    durability: Durability,
    acknowledged: Acknowledgement | None,
    ids: Sequence[str],
    created: Sequence[Any] = (),
) -> NotDurable:
    """The :class:`~outbox.exceptions.NotDurable` for messages ``ids`` whose wait got
    ``acknowledged`` (None: no wait was made)."""
    ack = acknowledged or Acknowledgement(0, False if durability.aof else None, False, "no wait was made")
    asked = f"{durability.replicas} replica(s)" if durability.replicas else ""
    if durability.aof:
        asked = "an AOF fsync on the primary" + (f" and on {asked}" if asked else "")
        got = f"primary fsynced: {'yes' if ack.local else 'no'}, replicas fsynced: {ack.replicas}"
    else:
        got = f"replicas acknowledged: {ack.replicas}"
    text = (
        f"{len(ids)} message(s) ({', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''}) written on the "
        f"Redis primary but not acknowledged as durable: asked for {asked} within {durability.timeout:g} s "
        f"({durability.describe()}), got {got}" + (f" ({ack.error})" if ack.error else "")
    )
    return NotDurable(
        text,
        DurabilityShortfall(
            ids=list(ids),
            replicas=ack.replicas,
            required=durability.replicas,
            aof=durability.aof,
            local=ack.local,
            timeout=durability.timeout,
            error=ack.error,
            created=list(created),
        ),
    )
