"""The outbox's ``redis.asyncio`` client, one per event loop: what ``outbox.asend()``
writes through (its steps driven by :func:`outbox.store.asteps.adrive`).

The client is built from the same settings as the synchronous one
(:func:`.connection.get_connection`): on one server, the django-redis alias's pool
options (address, database, credentials, TLS, socket timeouts, retries); with
``OUTBOX["CLUSTER"]``, a ``redis.asyncio.cluster.RedisCluster`` of its nodes and
``OPTIONS``. An asyncio connection belongs to the loop that opened it, so each event
loop gets its own client and pool (a process under uvicorn has one loop: one pool;
``async_to_sync`` makes a loop per call, whose client goes with it).

On one server, concurrent calls of one loop share round trips (:class:`Multiplexer`):
the batches submitted while a connection's previous write is in flight (at least those
of one loop iteration) go out as one pipeline, each command with its own reply read in
order, so a ``NOSCRIPT`` or a script's error is the reply of its own call only; a
connection that breaks or times out fails the calls whose commands were written on it
(each gets its own copy of the error: each write's outcome is unknown), and no other.
A caller's cancellation never interrupts a read (the connection's own task reads), so
the replies stay in step with their commands (CVE-2023-28858). With a cluster, each
call goes through ``redis.asyncio.cluster.RedisCluster`` by itself (its pool per node),
at most its ``max_connections`` in flight per loop (:func:`_cluster_batch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import math
import sys
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Hashable, Sequence
from functools import cache
from typing import Any, TypeVar, cast

import redis.asyncio as aredis
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis import connection as sync_connection
from redis.asyncio import connection as async_connection
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from outbox.conf import outbox_settings
from outbox.store.client.connection import get_connection

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:  # redis[hiredis] is a dependency; its C packer, else redis-py's own
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover
    _hiredis_pack = None

# The deadline redis-py itself uses: asyncio.timeout from Python 3.11.3 (before, it
# mishandled a cancellation), else the async-timeout package redis-py depends on there.
if sys.version_info >= (3, 11, 3):
    from asyncio import timeout as _deadline  # type: ignore[attr-defined,unused-ignore]
else:  # pragma: no cover
    from async_timeout import timeout as _deadline  # type: ignore[import-not-found,no-redef,unused-ignore]

T = TypeVar("T")

AsyncClient = aredis.Redis | AsyncRedisCluster

#: Per event loop: (what the client was built from, the client, its multiplexer).
_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[object, AsyncClient, Multiplexer | None]
] = weakref.WeakKeyDictionary()

#: Connections (each with its task) a loop's :class:`Multiplexer` writes on at most.
CONNECTIONS = 4
#: Commands written in one pipeline at most (a longer queue waits for the next write).
PIPELINE_MOST = 64
#: Calls answered in one loop step at most: each answer schedules its caller's wake-up
#: (in asyncio's debug mode a stack is extracted for each: ~0.1 ms), so a step of the
#: connection's task answering a whole pipeline of 64 took several milliseconds.
ANSWERED_PER_STEP = 4

#: The synchronous connection classes and their asyncio twins.
_CLASSES: dict[type[Any], type[Any]] = {
    sync_connection.Connection: async_connection.Connection,
    sync_connection.SSLConnection: async_connection.SSLConnection,
    sync_connection.UnixDomainSocketConnection: async_connection.UnixDomainSocketConnection,
}


#: The options of a synchronous pool that its asyncio twin takes as they are (its parser
#: class, maintenance-notification handlers and other synchronous objects are left out:
#: the asyncio client makes its own).
_COPIED = frozenset(
    {
        "host",
        "port",
        "path",
        "db",
        "username",
        "password",
        "credential_provider",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "retry_on_timeout",
        "retry_on_error",
        "retry",
        "encoding",
        "encoding_errors",
        "decode_responses",
        "client_name",
        "health_check_interval",
        "protocol",
    }
)


@cache
def _accepted(cls: Any) -> frozenset[str]:
    """The keyword arguments ``cls`` (an asyncio connection class) and its bases take."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names |= set(inspect.signature(init).parameters) - {"self", "args", "kwargs"}
    return frozenset(names)


def _async_retry(retry: Any) -> AsyncRetry | None:
    """The asyncio twin of a synchronous ``redis.retry.Retry`` (same backoff, count and errors)."""
    backoff, retries = getattr(retry, "_backoff", None), getattr(retry, "_retries", None)
    if backoff is None or retries is None:
        return None
    errors = getattr(retry, "_supported_errors", None)
    return AsyncRetry(backoff, retries, errors) if errors else AsyncRetry(backoff, retries)


def build_async_client() -> tuple[object, AsyncClient]:
    """A new asyncio client of the outbox's Redis and the settings object it was built
    from (the sync pool, or the ``OUTBOX["CLUSTER"]`` config), without I/O.

    Raises:
        ImproperlyConfigured: as :func:`.connection.get_connection`.
    """
    config = outbox_settings.cluster
    if config is not None:
        allowed = set(inspect.signature(AsyncRedisCluster.__init__).parameters) - {"self", "kwargs"}
        kwargs = {k: v for k, v in config.client_kwargs().items() if k in allowed}
        if "retry" in kwargs:
            kwargs["retry"] = _async_retry(kwargs["retry"])
        nodes = [AsyncClusterNode(host, port) for host, port in config.nodes]
        return config, AsyncRedisCluster(startup_nodes=nodes, **kwargs)
    pool = get_connection().connection_pool
    connection_class: type[Any] = _CLASSES.get(pool.connection_class, async_connection.Connection)
    given = dict(pool.connection_kwargs)
    # redis-py 8 keeps the timeouts a pool was made with as orig_* (maintenance notifications)
    given.setdefault("socket_timeout", given.get("orig_socket_timeout"))
    given.setdefault("socket_connect_timeout", given.get("orig_socket_connect_timeout"))
    kwargs = {
        k: v
        for k, v in given.items()
        if k in _COPIED or (k.startswith("ssl_") and k in _accepted(cast(Hashable, connection_class)))
    }
    if "retry" in kwargs:
        retry = _async_retry(kwargs["retry"])
        if retry is None:
            del kwargs["retry"]
        else:
            kwargs["retry"] = retry
    async_pool = aredis.ConnectionPool(
        connection_class=connection_class, max_connections=pool.max_connections, **kwargs
    )
    return pool, aredis.Redis(connection_pool=async_pool)


def loop_client() -> AsyncClient | None:
    """This event loop's asyncio client when it is made and was checked against the
    current settings, else None (then await :func:`async_connection_for_loop`): the
    common path, without a coroutine of its own.

    Raises:
        RuntimeError: no event loop runs in this thread.
    """
    loop = asyncio.get_running_loop()
    held = _clients.get(loop)
    if held is not None and _checked.get(loop) == _settings_version[0]:
        return held[1]
    return None


async def async_connection_for_loop() -> AsyncClient:
    """This event loop's asyncio client of the outbox's Redis (built on first use in the
    loop, and again after the settings changed). A cluster client reads the slot map
    the first time.

    Raises:
        ImproperlyConfigured: as :func:`.connection.get_connection`.
        redis.exceptions.RedisError: a cluster client could not read the slot map.
    """
    client = loop_client()
    if client is not None:
        return client  # the settings did not change since the client was checked
    loop = asyncio.get_running_loop()
    held = _clients.get(loop)
    source: object = outbox_settings.cluster
    if source is None:
        source = get_connection().connection_pool
    if held is not None and held[0] is source:
        _checked[loop] = _settings_version[0]
        return held[1]
    version = _settings_version[0]
    built, client = build_async_client()
    if isinstance(client, AsyncRedisCluster):
        await client.initialize()
    _clients[loop] = (built, client, None if isinstance(client, AsyncRedisCluster) else Multiplexer(client))
    _checked[loop] = version
    return client


#: Bumped by every ``setting_changed``: a loop's client is checked against the settings
#: (django-redis's pool, ``OUTBOX["CLUSTER"]``) again after one, not on every call (that
#: look-up cost a tenth of an ``asend``).
_settings_version = [0]
#: Per event loop: the settings version its client was last checked against.
_checked: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()


@receiver(setting_changed)
def _settings_changed(**kwargs: Any) -> None:
    _settings_version[0] += 1


async def aclose() -> None:
    """Close this event loop's client and its connections (tests, and a loop about to
    end: ``async_to_sync`` callers need not, its loop's client is garbage with it)."""
    held = _clients.pop(asyncio.get_running_loop(), None)
    if held is not None:
        if held[2] is not None:
            await held[2].aclose()
        await held[1].aclose()


def arun_batch(
    client: AsyncClient,
    commands: Sequence[tuple[Any, ...]],
    on_sent: Callable[[], None] | None = None,
) -> Awaitable[list[Any]]:
    """``commands`` on ``client`` (await the result): one command as itself, several in
    a pipeline without ``MULTI`` (a cluster client's routes each command by its keys and
    follows redirects); a ``ResponseError`` is that command's reply. On one server,
    through this loop's :class:`Multiplexer` (the round trip shared with concurrent
    calls): then the awaitable is the call itself (a future of its own, :class:`_Call`),
    no coroutine around it (each layer of one is an object for the collector and, in
    asyncio's debug mode, a frame of every stack extracted below it). ``on_sent`` is
    called once the commands are (about to be) written: a cancellation before it means
    they never were.

    Raises:
        redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: as redis-py
            (a connection that could not be made: nothing was written).
    """
    held = _clients.get(asyncio.get_running_loop())
    if held is not None and held[1] is client and held[2] is not None:
        return held[2].submit(commands, on_sent)
    if isinstance(client, AsyncRedisCluster):
        return _cluster_batch(client, commands, on_sent)
    return _direct_batch(client, commands, on_sent)


async def _direct_batch(
    client: AsyncClient, commands: Sequence[tuple[Any, ...]], on_sent: Callable[[], None] | None
) -> list[Any]:
    if on_sent is not None:
        on_sent()
    if len(commands) == 1:
        try:
            return [await client.execute_command(*commands[0])]
        except ResponseError as exc:
            return [exc]
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    replies: list[Any] = await pipe.execute(raise_on_error=False)
    return replies


#: Per cluster client: its calls in flight at most (:func:`_cluster_batch`).
_cluster_gates: weakref.WeakKeyDictionary[AsyncRedisCluster, asyncio.Semaphore] = weakref.WeakKeyDictionary()


async def _cluster_batch(
    client: AsyncRedisCluster, commands: Sequence[tuple[Any, ...]], on_sent: Callable[[], None] | None
) -> list[Any]:
    """A batch through ``redis.asyncio``'s ``RedisCluster``, with two guards its client
    lacks under concurrency (seen in the ``cluster`` fault scenario run through ``asend``,
    docs/faults.md):

    * at most its ``max_connections`` calls in flight (each holds at most one connection
      per node): past that a node's pool raises ``MaxConnectionsError`` (a
      ``ConnectionError``), and redis-py answers a ``ConnectionError`` by disconnecting
      the node's connections and reading the slot map again, under the other calls'
      feet. The calls past the bound wait here, before anything is sent (a cancellation
      while waiting is "nothing written").
    * a call whose connection was disconnected under it by another call's error meets
      ``AttributeError`` (its writer is gone) instead of a Redis error: raised as a
      ``ConnectionError`` whose write may have run (the steps answer "outcome unknown",
      as for a broken connection), never as an ``AttributeError`` out of ``asend``.
    """
    gate = _cluster_gates.get(client)
    if gate is None:
        most = int(client.nodes_manager.connection_kwargs.get("max_connections") or 100)
        gate = _cluster_gates[client] = asyncio.Semaphore(max(1, most))
    async with gate:
        try:
            return await _direct_batch(client, commands, on_sent)
        except AttributeError as exc:
            raise RedisConnectionError(
                f"the cluster connection was closed during the write ({type(exc).__name__}: {exc})"
            ) from exc


_PENDING, _DONE, _CANCELLED = 0, 1, 2


class _Call:
    """One caller's commands in a :class:`Multiplexer`, and the awaitable of their replies.

    A future of its own, not an ``asyncio.Future``: what a Task needs of a future-like
    object to await it (``_asyncio_future_blocking``, ``get_loop``,
    ``add_done_callback``, ``result``, ``cancel``: the protocol of
    ``asyncio.futures.Future`` that ``asyncio.Task`` and ``asyncio.isfuture`` read,
    CPython's ``Modules/_asynciomodule.c``), the multiplexer's ``set_result`` and
    ``set_exception``, and ``__await__``. Every ``asend`` makes one, and in asyncio's
    debug mode an ``asyncio.Future`` extracts its creator's stack when it is made (about
    a dozen objects for the collector per call in flight: ``docs/benchmarks.md``, "Async
    views"); this one keeps nothing but its state. Callbacks run as a Future's do: each
    scheduled with ``call_soon`` in its context when the call is done (issue 33).
    """

    __slots__ = (
        "_asyncio_future_blocking",
        "_callbacks",
        "_loop",
        "_message",
        "_state",
        "_value",
        "commands",
        "on_sent",
    )

    def __init__(
        self,
        commands: Sequence[tuple[Any, ...]],
        loop: asyncio.AbstractEventLoop,
        on_sent: Callable[[], None] | None,
    ) -> None:
        self.commands = commands
        self.on_sent = on_sent
        self._loop = loop
        self._state = _PENDING
        self._value: Any = None  # the replies, or the exception
        self._message: Any = None  # a cancellation's message
        self._callbacks: list[tuple[Callable[[Any], Any], Any]] = []
        self._asyncio_future_blocking = False

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def done(self) -> bool:
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def cancel(self, msg: Any = None) -> bool:
        """Cancel the call (its awaiter was cancelled): a connection's task that has not
        taken it skips it; one that has reads its replies for nothing. False when done."""
        if self._state != _PENDING:
            return False
        self._state, self._message = _CANCELLED, msg
        self._schedule()
        return True

    def set_result(self, replies: list[Any]) -> None:
        self._state, self._value = _DONE, replies
        self._schedule()

    def set_exception(self, exc: BaseException) -> None:
        self._state, self._value = _DONE, exc
        self._schedule()

    def result(self) -> list[Any]:
        """The replies; raises the call's exception, or ``CancelledError`` when cancelled
        (``InvalidStateError`` while pending)."""
        exc = self.exception()
        if exc is not None:
            raise exc
        return cast(list[Any], self._value)

    def exception(self) -> BaseException | None:
        """The call's exception, or None (``CancelledError`` when cancelled,
        ``InvalidStateError`` while pending)."""
        if self._state == _CANCELLED:
            raise asyncio.CancelledError(*(() if self._message is None else (self._message,)))
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("the call is not done")
        return self._value if isinstance(self._value, BaseException) else None

    def add_done_callback(self, fn: Callable[[Any], Any], *, context: Any = None) -> None:
        if self._state != _PENDING:
            self._loop.call_soon(fn, self, context=context)
        else:
            self._callbacks.append((fn, context))

    def remove_done_callback(self, fn: Callable[[Any], Any]) -> int:
        kept = [(f, c) for f, c in self._callbacks if f != fn]
        removed = len(self._callbacks) - len(kept)
        self._callbacks[:] = kept
        return removed

    def _schedule(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for fn, context in callbacks:
            self._loop.call_soon(fn, self, context=context)

    def __await__(self) -> Generator[Any, None, list[Any]]:
        if self._state == _PENDING:
            self._asyncio_future_blocking = True
            yield self  # the Task adds its wake-up as a done callback
        if self._state == _PENDING:
            raise RuntimeError("await wasn't used with the call")
        return self.result()

    __iter__ = __await__


class Multiplexer:
    """Concurrent callers of one event loop sharing round trips on one server (see the
    module docstring): a queue of calls, and up to :data:`CONNECTIONS` tasks, each on a
    connection of the client's pool, that take every queued call (up to
    :data:`PIPELINE_MOST` commands), write them as one pipeline and read the replies in
    order. A task ends, giving its connection back, when the queue is empty.

    A call is sent once a task took it; a caller cancelled before that is dropped from
    the write (nothing of it reaches Redis); after that its commands are written and
    their replies read, and go nowhere. No command is retried: a write whose reply did
    not come (a timeout, a broken connection) fails with redis-py's error, which
    :func:`.outages.may_have_run` reads as "may have run"; a connection that cannot be
    made fails the calls not yet written with its "connecting to" error ("did not run").
    """

    def __init__(self, client: aredis.Redis, connections: int = CONNECTIONS) -> None:
        self.pool = client.connection_pool
        self.encoder = client.get_encoder()  # type: ignore[no-untyped-call]
        self.most = connections
        self.queue: deque[_Call] = deque()
        self.tasks: set[asyncio.Task[None]] = set()
        self.busy = 0  # tasks in a round trip (the others are about to take from the queue)

    def submit(self, commands: Sequence[tuple[Any, ...]], on_sent: Callable[[], None] | None) -> _Call:
        """Queue ``commands``; the awaitable of their replies (see :func:`arun_batch`). A
        cancellation of its awaiter cancels it: a task that has not taken the call yet
        skips it."""
        call = _Call(commands, asyncio.get_running_loop(), on_sent)
        self.queue.append(call)
        self._spawn()
        return call

    def _spawn(self) -> None:
        """A new connection's task when calls are queued, no task is about to take them
        and fewer than :data:`CONNECTIONS` run."""
        if self.queue and len(self.tasks) == self.busy and len(self.tasks) < self.most:
            task = asyncio.get_running_loop().create_task(self._serve())
            self.tasks.add(task)

    def _take(self) -> list[_Call]:
        """The queued calls of the next write (not cancelled), at most :data:`PIPELINE_MOST`
        commands (always at least one call), each told it is sent."""
        taken: list[_Call] = []
        count = 0
        while self.queue and (not taken or count + len(self.queue[0].commands) <= PIPELINE_MOST):
            call = self.queue.popleft()
            if call.done():
                continue
            taken.append(call)
            count += len(call.commands)
            if call.on_sent is not None:
                call.on_sent()
        return taken

    def _pack(self, calls: list[_Call]) -> list[bytes]:
        if _hiredis_pack is not None:
            try:
                return [_hiredis_pack(command) for call in calls for command in call.commands]
            except TypeError:  # an argument hiredis does not take: redis-py's encoder
                pass
        packed: list[bytes] = []
        for call in calls:
            for command in call.commands:
                words = [self.encoder.encode(word) for word in command]
                packed.append(
                    b"".join([b"*%d\r\n" % len(words)] + [b"$%d\r\n%s\r\n" % (len(w), w) for w in words])
                )
        return packed

    @staticmethod
    def _fail(calls: Sequence[_Call], exc: BaseException) -> None:
        for call in calls:
            if not call.done():
                call.set_exception(copy.copy(exc))

    async def _serve(self) -> None:
        """A connection's task: write and read until the queue is empty. It leaves
        :attr:`tasks` the moment it stops taking (not when its task is done: a call
        queued in between would wait for a task that will not take it)."""
        me = asyncio.current_task()
        connection = None
        try:
            connection = await _get_connection(self.pool)
            while self.queue:
                if not connection.is_connected:
                    await connection.connect()
                calls = self._take()
                if calls:
                    self.busy += 1
                    self._spawn()  # for what is left queued
                    try:
                        await self._round_trip(connection, calls)
                    finally:
                        self.busy -= 1
        except Exception as exc:  # could not connect: nothing of the queued calls was written
            calls = [call for call in self.queue if not call.done()]
            self.queue.clear()
            self._fail(calls, _not_connected(exc))
        finally:
            self.tasks.discard(me)  # type: ignore[arg-type]
            if connection is not None:
                await self.pool.release(connection)

    async def _round_trip(self, connection: Any, calls: list[_Call]) -> None:
        """Write ``calls`` as one pipeline on ``connection`` and give each its replies."""
        try:
            await connection.send_packed_command(self._pack(calls), check_health=False)
            await _read_replies(connection, calls)
        except asyncio.CancelledError:  # the loop is ending: the written calls' outcome is unknown
            await connection.disconnect(nowait=True)
            self._fail(calls, RedisConnectionError("the outbox's connection task was cancelled"))
            raise
        except Exception as exc:  # a timeout, a broken connection: every call written on it
            await connection.disconnect(nowait=True)
            self._fail(calls, exc)

    async def aclose(self) -> None:
        """End the connections' tasks (their calls fail as written and unanswered)."""
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _read_replies(connection: Any, calls: list[_Call]) -> None:
    """Read the replies of ``calls`` (written as one pipeline on ``connection``) in
    order, giving each call its own, under one deadline of the connection's socket
    timeout for them all: redis-py times each reply (a timer made and cancelled per
    reply, and in asyncio's debug mode a stack extracted for each), so its reads are
    asked for without one (``timeout=math.inf``: redis-py 8.1's "no timeout"; an older
    redis-py makes a timer that never fires). A deadline passed is redis-py's
    ``TimeoutError`` (the calls' outcome is unknown); the connection is then
    disconnected by redis-py's guard around the read."""
    timeout = connection.socket_timeout
    try:
        async with _deadline(timeout if timeout else None):
            for number, call in enumerate(calls, 1):
                if number % ANSWERED_PER_STEP == 0:
                    await asyncio.sleep(0)  # let the answered callers run: a step stays short
                replies: list[Any] = []
                for _ in call.commands:
                    try:
                        replies.append(await connection.read_response(timeout=math.inf))
                    except ResponseError as exc:  # this command's reply
                        replies.append(exc)
                if not call.done():
                    call.set_result(replies)
    except asyncio.TimeoutError as exc:
        raise RedisTimeoutError(
            f"Timeout reading the replies of {len(calls)} call(s) written together ({timeout} s socket timeout)"
        ) from exc


def _not_connected(exc: Exception) -> Exception:
    """``exc``, raised while a connection was made ready for a write (its connect, or a
    reply of its handshake timing out: "Timeout reading from ..."), as the "connecting
    to" error that :func:`.outages.may_have_run` reads as "did not run": none of the
    queued calls was written. As it was, a handshake's timeout made each of them an
    unknown outcome."""
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError)) and "connecting to" not in str(exc).lower():
        return RedisConnectionError(
            f"Error connecting to Redis before the write ({type(exc).__name__}: {exc})"
        )
    return exc


async def _get_connection(pool: Any) -> Any:
    """A connected connection of ``pool`` (redis-py 5 wants a command name, 8 warns about one)."""
    if _pool_takes_name(cast(Hashable, type(pool))):
        return await pool.get_connection("EVALSHA")
    return await pool.get_connection()


@cache
def _pool_takes_name(cls: Any) -> bool:
    parameter = inspect.signature(cls.get_connection).parameters.get("command_name")
    return parameter is not None and parameter.default is inspect.Parameter.empty
