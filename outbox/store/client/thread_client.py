"""One redis-py client per thread that keeps its connection: the client ``send()`` writes
through.

Every command a ``redis.Redis`` client runs takes a connection from its pool and gives it
back afterwards. In redis-py 5 to 8 that costs, per command, a ``poll`` (the pool checks
the connection has no unread data), two ``getpid`` (fork checks) and the pool's lock and
bookkeeping: about 15 to 50 µs on the machines this project is measured on, as much as
Redis takes to run ``create.lua`` itself. A client made with
``single_connection_client=True`` (a redis-py option: "the client uses a single
connection, not a pool") takes one connection from the same pool when it is made and
keeps it, so a thread that sends one message per request pays only for the command.

A held connection is per thread (one client is not safe to share: its lock would
serialize the threads) and per process: after ``fork()`` the child makes its own, never
using the socket it inherited (redis-py's pools make the same check). When a thread ends,
its client is garbage and :meth:`redis.Redis.close` gives the connection back to the pool.
A pooled connection is checked before each command (a ``poll`` for unread data or a
closed socket). A held one is not: a connection the server closed while it sat idle (a
restart, ``CLIENT KILL``, ``timeout``) fails its next command with ``ConnectionError``,
and :meth:`ThreadClients.run` runs the command once more on a new connection. So only a
command that is safe to run twice may go through it (``create.lua`` is: a second run of
the same call writes nothing).

Held connections come out of the pool's ``max_connections`` (redis-py 8's default: 100;
a ``ConnectionPool`` refuses more with "Too many connections"). So at most a quarter of
them are held at once; threads beyond that, and every thread of a pool of another class
(a ``BlockingConnectionPool`` would make others wait for a connection parked here), use
the pooled client. This is the model of Django's own database connections: one per
thread, kept between requests.

:meth:`ThreadClients.execute` runs one command on a held connection without
``Redis.execute_command``'s wrapper. redis-py 8.1's wrapper makes, per command, two
closures, a metrics record and a ``monotonic`` pair (its observability), looks for its
``HIMPORT SET`` form and filters the arguments again: about 25 to 35 µs a command on this
project's 2-core benchmark machine, an eighth of a whole ``send()``
(``benchmarks.compare --send``; docs/benchmarks.md, "The send path"). What it keeps of
redis-py: the connection, its socket and reply parser (``send_packed_command``,
``read_response``: a timeout or a broken socket disconnects it and raises redis-py's
errors), the connection's ``Retry`` (what the pool was configured with: none by
default), its health check, its reconnection after a maintenance notice, and its
metrics record (a no-op unless redis-py's observability is configured).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from redis import ConnectionPool, Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from outbox.store.client.outages import may_have_run

_pack_words: Callable[[tuple[Any, ...]], bytes] | None
try:  # redis[hiredis] is a dependency; its C packer, else the connection's own
    from hiredis import pack_command as _pack_words
except ImportError:  # pragma: no cover
    _pack_words = None
_record: Callable[..., None] | None
try:  # redis-py 7+: its client metrics (a no-op unless its observability is configured)
    from redis.observability.recorder import record_operation_duration as _record

    # without the wrapper that warns of a deprecated argument this call does not pass
    # (``batch_size``): that wrapper inspects the call's arguments, about 1 to 5 µs
    _record = getattr(_record, "__wrapped__", _record)
except ImportError:  # redis-py 5 and 6
    _record = None

T = TypeVar("T")

#: The share of a pool's ``max_connections`` that threads may hold.
HELD_SHARE = 4

_instances: weakref.WeakSet[ThreadClients] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The child never sends on a socket it inherited (redis-py's pools make the same
    # check): its threads start with no held client. Another thread may have held the
    # lock when the process forked; that thread is gone here, so the lock is made anew.
    for instance in list(_instances):
        instance.forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


class ThreadClients:
    """Hands each thread of each process its own single-connection client over the pool
    of ``client`` (a ``redis.Redis``), or ``client`` itself where that is not possible.

    Args:
        client: the pooled client; its pool, and so its connection settings, are shared.
    """

    def __init__(self, client: Redis) -> None:
        self.client = client
        pool = getattr(client, "connection_pool", None)
        plain = type(client) is Redis and type(pool) is ConnectionPool
        #: How many clients may hold a connection at once (0: none, always the pooled one).
        self.limit = int(pool.max_connections) // HELD_SHARE if plain else 0  # type: ignore[union-attr]
        self.held: weakref.WeakSet[Redis] = weakref.WeakSet()  # a thread's ends with it
        self.lock = threading.Lock()
        self.local = threading.local()
        _instances.add(self)

    def get(self) -> Redis:
        """This thread's client (made on first use in this thread and process).

        Raises:
            redis.exceptions.ConnectionError: the first connection of this thread could
                not be made.
        """
        held: Redis | None = getattr(self.local, "client", None)
        if held is not None:
            return held
        with self.lock:
            if len(self.held) >= self.limit:
                self.local.client = self.client  # this thread uses the pool from now on
                return self.client
            held = Redis(connection_pool=self.client.connection_pool, single_connection_client=True)
            self.held.add(held)
        self.local.client = held
        return held

    def run(self, command: Callable[[Redis], T]) -> T:
        """``command(client)`` on this thread's client; once more on a new connection when
        a held one turns out to be closed (``ConnectionError``). ``command`` must be safe
        to run twice: the first run may have reached Redis before the connection broke.

        Raises:
            redis.exceptions.RedisError: what ``command`` raised (the second time, for a
                held connection, unless the first may have run and the second did not:
                then the first, see :func:`_once_more`).
        """
        client = self.get()
        try:
            return command(client)
        except RedisConnectionError as first:
            if client is self.client:
                raise
            # redis-py disconnected it on the error; the next command connects again.
            return _once_more(first, lambda: command(client))

    def execute(self, command: tuple[Any, ...]) -> Any:
        """``command`` (its words: ``("EVALSHA", sha, ...)``) on this thread's client, its
        reply, as ``client.execute_command(*command)`` returns it (decoded as the
        client's ``decode_responses`` says, through its response callbacks), in one
        round trip on a held connection without the client's per-command wrapper (see
        the module docstring); once more on a new connection when a held one turns out
        to be closed, as :meth:`run`. ``command`` must be safe to run twice.

        Raises:
            redis.exceptions.ResponseError: the command's error reply (``NoScriptError``
                ...), as ``execute_command`` raises it.
            redis.exceptions.RedisError: the connection failed or timed out (a write
                that may have run: :func:`outbox.store.client.outages.may_have_run`).
        """
        client = self.get()
        if client is self.client:
            return client.execute_command(*command)  # type: ignore[no-untyped-call]
        try:
            return _round_trip(client, command)
        except RedisConnectionError as first:  # the connection was disconnected on the error
            return _once_more(first, lambda: _round_trip(client, command))

    def forget(self) -> None:
        """Drop every thread's client without closing its connection (in a child after
        ``fork()``: the sockets are the parent's)."""
        for held in list(self.held):
            held.connection = None
        self.held = weakref.WeakSet()
        self.local = threading.local()
        self.lock = threading.Lock()


_NO_LOCK = contextlib.nullcontext()


def _once_more(first: RedisConnectionError, call: Callable[[], T]) -> T:
    """``call()``, the second run of a command whose first run on a held connection failed
    with ``first``. When that run may have reached Redis (the connection broke after the
    write: :func:`.outages.may_have_run`) and the second cannot have (it could not
    connect, or the server was still loading), the second's error says nothing of the
    first write, which may have landed: ``first`` is raised instead (the second as its
    cause), so the caller hears "outcome unknown", never "nothing was stored" of a write
    that ran. An error reply of the second run (``NOSCRIPT`` after a restart ...) is
    raised as it is: the steps answer it (load the scripts, run once more), and that
    run's answer is the outcome.

    Raises:
        redis.exceptions.RedisError: as said above.
    """
    try:
        return call()
    except (RedisConnectionError, RedisTimeoutError) as second:
        if may_have_run(first) and not may_have_run(second):
            raise first from second
        raise


def _round_trip(client: Redis, command: tuple[Any, ...]) -> Any:
    """``command`` written and its reply read on ``client``'s own connection (a client
    made with ``single_connection_client=True``), under the connection's ``Retry`` as
    ``Redis.execute_command`` runs it (a failure disconnects the connection; a
    reconnection asked by a maintenance notice is made after the reply). When that
    ``Retry`` ran the write more than once, an earlier run's error that may have run is
    raised rather than a last one that cannot have (see :func:`_once_more`)."""
    connection: Any = client.connection
    packed = None
    if _pack_words is not None:
        with contextlib.suppress(TypeError):  # an argument hiredis does not take: redis-py's encoder
            packed = [_pack_words(command)]
    if packed is None:
        packed = connection.pack_command(*command)
    started = time.monotonic()

    def write_and_read() -> Any:
        connection.send_packed_command(packed)
        return connection.read_response()

    ran: list[Exception] = []  # the first error of this call's runs whose write may have run

    def failed(error: Exception) -> None:
        if not ran and may_have_run(error):
            ran.append(error)
        connection.disconnect()

    lock = getattr(client, "single_connection_lock", None) or _NO_LOCK  # redis-py 5 has none
    with lock:
        try:
            reply = connection.retry.call_with_retry(write_and_read, failed)
        except (RedisConnectionError, RedisTimeoutError) as last:
            # a Retry configured on the pool ran the write again: its last failure (could
            # not connect) says nothing of an earlier run's write (as _once_more)
            if ran and not may_have_run(last):
                raise ran[0] from last
            raise
        finally:
            if getattr(connection, "should_reconnect", None) is not None and connection.should_reconnect():
                connection.disconnect()
                connection.connect()
    callbacks: Any = client.response_callbacks
    callback = callbacks.get(command[0])  # as Redis.parse_response
    if callback is not None:
        reply = callback(reply)
    if _record is not None:
        _record(
            command_name=command[0],
            duration_seconds=time.monotonic() - started,
            server_address=getattr(connection, "host", None),
            server_port=getattr(connection, "port", None),
            db_namespace=str(connection.db),
        )
    return reply
