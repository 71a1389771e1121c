"""The I/O-free core of the write path, and its synchronous driver.

``send()`` and ``asend()`` store a message with the same code: the steps of a write
(:mod:`.creating`: the create script, the reload after ``NOSCRIPT``, the cluster's
redirects and ``TRYAGAIN``, the idempotency reservations, the wake-up flags, the fall-over
to another partition in :mod:`outbox.sending.intake`) are generators that *yield* what
they need done on Redis, as values of the classes below, and receive the replies. They
never touch a socket. Two drivers run them: :func:`drive` here, on the synchronous
redis-py client (this thread's held connection, :mod:`.thread_client`), and
:func:`outbox.store.asteps.adrive`, on ``redis.asyncio``. So a decision (is this
write's outcome unknown? move it to another partition? load the scripts again?) is
written once, and both twins take it the same way.

The protocol: a step generator yields an operation; the driver performs it and sends
back its result (``generator.send``), or throws in the exception it raised
(``generator.throw``); the generator's return value is the result of the whole write.

* :class:`Batch`: commands sent in one write and read in order (a pipeline without
  ``MULTI``): the result is one reply per command, a ``ResponseError`` (``NOSCRIPT``,
  ``MOVED``, ``ASK``, ``TRYAGAIN``, a script's error) as that command's reply. A connection
  error or timeout is thrown in. On a cluster, a batch with a ``key`` goes to the primary
  serving that key's slot (as this process's slot map says) on that node's own client:
  every command of such a batch is of that one node; without a ``key``, through the
  cluster client, which routes each command by its keys and follows redirects.
* :class:`LoadScripts`: every Lua script into every primary's script cache.
* :class:`Pause`: wait (``TRYAGAIN``'s delay).
* :class:`Primaries`: the name of the primary serving each key (``""`` on one server).
* :class:`Elsewhere`: a partition on another primary (:meth:`.base.RepositoryBase.partition_elsewhere`).
* :class:`Blocking`: a synchronous call that is not Redis I/O of the hot path (the
  ``DURABILITY`` wait, RQ's wake-up job, the eager delivery): the synchronous driver
  calls it, the asynchronous one runs it in a thread (Django's ``sync_to_async``), so it
  never blocks an event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ResponseError

from outbox.store.client.routing import primary_of

if TYPE_CHECKING:
    from outbox.store.base import RepositoryBase

T = TypeVar("T")


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs send() about 0.4 µs
class Batch:
    """Commands sent in one write, replies read in order (see the module docstring).

    Attributes:
        commands: each a tuple of a Redis command's words (``("EVALSHA", sha, 1, key, ...)``).
        key: on a cluster, the key whose slot's primary takes the batch on its own client;
            None: through the cluster client (or the one server's client).
        write: the commands write: a driver that is interrupted (a timeout, a cancelled
            task) after sending it cannot know what they did.
    """

    commands: tuple[tuple[Any, ...], ...]
    key: str | None = None
    write: bool = False


@dataclass(frozen=True)
class LoadScripts:
    """Load every script (``SCRIPT LOAD``) on every primary; the result is None."""


@dataclass(frozen=True)
class Pause:
    """Wait ``seconds``; the result is None."""

    seconds: float


@dataclass(frozen=True)
class Primaries:
    """The name of the primary serving each of ``keys``' slots (``""`` each on one server).

    A ``SlotNotCoveredError`` (no node serves a slot) is thrown in."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class Elsewhere:
    """A partition number on a primary serving none of ``avoid``'s partitions, or None."""

    avoid: frozenset[int]


@dataclass(frozen=True)
class Blocking:
    """``call()``, synchronous: run in a thread by the asynchronous driver
    (``thread_sensitive``: in Django's one thread for code that uses the ORM)."""

    call: Callable[[], Any]
    thread_sensitive: bool = False


Op = Batch | LoadScripts | Pause | Primaries | Elsewhere | Blocking
#: A step generator: yields operations, receives their results, returns ``T``.
Steps = Generator[Op, Any, T]


@dataclass
class Progress:
    """What a driver saw of one write: whether a :class:`Batch` that writes was sent (or
    was being sent when the driver was interrupted). The asynchronous twins read it
    when their task is cancelled: before a write was sent nothing can be stored."""

    wrote: bool = False
    ops: list[str] = field(default_factory=list)

    def sent(self) -> None:
        """A driver wrote (or began to write) a :class:`Batch` that writes."""
        self.wrote = True


def drive(repository: RepositoryBase, steps: Steps[T], progress: Progress | None = None) -> T:
    """Run ``steps`` on ``repository``'s synchronous redis-py client and return their result.

    Raises:
        Whatever the steps raise: ``redis.exceptions.RedisError`` for a write that could not
        be made, :class:`~outbox.exceptions.OutboxError` subclasses.
    """
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        reply, error = None, None
        if progress is not None and isinstance(op, Batch) and op.write:
            progress.wrote = True
        try:
            reply = perform(repository, op)
        except Exception as exc:  # thrown into the steps, which decide
            error = exc


def perform(repository: RepositoryBase, op: Op) -> Any:
    """One operation on the synchronous client (see the module docstring)."""
    connection: Any = repository.connection
    if isinstance(op, Batch):
        if repository.cluster:
            if op.key is not None:
                return run_batch(connection.get_redis_connection(primary_of(connection, op.key)), op.commands)
            return run_batch(connection, op.commands, cluster=True)
        if len(op.commands) == 1:  # every send(): no client wrapper (see thread_client)
            try:
                return [repository.thread_clients.execute(op.commands[0])]
            except ResponseError as exc:  # that command's reply, as run_batch gives it
                return [exc]
        return repository.thread_clients.run(lambda client: run_batch(client, op.commands))
    if isinstance(op, LoadScripts):
        repository.load_scripts()
        return None
    if isinstance(op, Pause):
        time.sleep(op.seconds)
        return None
    if isinstance(op, Primaries):
        if repository.cluster:
            return [str(primary_of(connection, key).name) for key in op.keys]
        return ["" for _ in op.keys]
    if isinstance(op, Elsewhere):
        return repository.partition_elsewhere(set(op.avoid))
    return op.call()


def run_batch(client: Any, commands: Sequence[tuple[Any, ...]], *, cluster: bool = False) -> list[Any]:
    """``commands`` on ``client`` (a ``redis.Redis``, or with ``cluster`` a
    ``RedisCluster``): one command as itself, several in a pipeline without ``MULTI``;
    a ``ResponseError`` is that command's reply."""
    if len(commands) == 1 or cluster:
        out: list[Any] = []
        for command in commands:  # the cluster client routes each by its keys
            try:
                out.append(client.execute_command(*command))
            except ResponseError as exc:
                out.append(exc)
        return out
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    replies: list[Any] = pipe.execute(raise_on_error=False)
    return replies
