"""The asynchronous driver of the write steps (:mod:`.steps`), on this event loop's
``redis.asyncio`` client (:mod:`.client.aconnection`): the twin of :func:`.steps.drive`
that ``outbox.asend()`` runs, and the asynchronous read of ``outbox.aget()``."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import ResponseError

from outbox.records import Message
from outbox.store.base import RepositoryBase
from outbox.store.client.aconnection import AsyncClient, arun_batch, async_connection_for_loop, loop_client
from outbox.store.codec import message_from_redis
from outbox.store.messages import payloads_wanted, set_payloads
from outbox.store.repository import MessageRepository, get_repository
from outbox.store.steps import Batch, Blocking, Elsewhere, LoadScripts, Op, Pause, Primaries, Progress, Steps

T = TypeVar("T")


async def arepository() -> MessageRepository:
    """The process-wide repository (:func:`.connection.get_repository`): its key names
    and settings drive the steps. Built in a thread the first time (a cluster client
    asks for its slot map when it is made), once for all the calls of a loop that ask
    meanwhile: each of the first view's concurrent ``asend``s started its own build, in
    a thread of its own (the executor growing by a thread for each, ``Thread.start``
    waiting on the loop), and the threads' builds held the GIL the loop needed."""
    built = built_repository()
    if built is not None:
        return built
    return await _one_per_loop(_building, _build_repository)


#: Per event loop: the repository's build in progress (:func:`arepository`).
_building: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Any]] = (
    weakref.WeakKeyDictionary()
)
#: Per event loop: the load of the scripts in progress (:func:`_load_scripts_once`).
_loading: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Any]] = (
    weakref.WeakKeyDictionary()
)


def _one_per_loop(
    running: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Any]],
    make: Callable[[], Awaitable[T]],
) -> Awaitable[T]:
    """The task of ``make()`` this loop runs now (kept in ``running``), or a new one: one
    run for all the calls that ask meanwhile, each awaiting it shielded (a caller's
    cancellation leaves it to the others); its error is each waiting call's. Once it
    ends, the next call runs ``make()`` again."""
    loop = asyncio.get_running_loop()
    task = running.get(loop)
    if task is None:
        task = running[loop] = loop.create_task(make())  # type: ignore[arg-type]
        task.add_done_callback(partial(_ended, running))
    return asyncio.shield(task)


def _ended(
    running: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Any]], task: asyncio.Task[Any]
) -> None:
    """``task`` of :func:`_one_per_loop` ended: forget it (its error read here too, so that
    none waiting is no "never retrieved")."""
    running.pop(task.get_loop(), None)
    if not task.cancelled():
        task.exception()


async def _build_repository() -> MessageRepository:
    return await sync_to_async(get_repository, thread_sensitive=False)()


def built_repository() -> MessageRepository | None:
    """The process-wide repository when it is made already (else None: await
    :func:`arepository`): callers on the common path ask this first, and so make no
    coroutine to learn it."""
    return get_repository() if get_repository.cache_info().currsize else None


async def adrive(
    repository: RepositoryBase,
    steps: Steps[T],
    progress: Progress | None = None,
    cancelled: Callable[[], BaseException] | None = None,
) -> T:
    """Run ``steps`` (:mod:`.steps`) on this event loop's asyncio client and return their
    result: the asynchronous twin of :func:`.steps.drive`.

    A cancellation (``asyncio.CancelledError``) is not thrown into the steps: it ends the
    drive at once (the steps are closed), and ``progress.wrote`` says whether a write
    had been sent. With ``cancelled`` (and ``progress``), a cancellation after a write
    was sent raises ``cancelled()`` instead, from the ``CancelledError`` (the caller's
    "outcome unknown"; a subclass of ``CancelledError`` keeps the task cancelled): the
    caller then awaits this coroutine itself, with no coroutine of its own around it.

    Raises:
        Whatever the steps raise; ``cancelled()`` as said.
    """
    client = loop_client()
    if client is None:
        client = await async_connection_for_loop()
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                op = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            reply, error = None, None
            on_sent = None
            if progress is not None:
                progress.ops.append(type(op).__name__)
                if isinstance(op, Batch) and op.write:
                    on_sent = progress.sent
            try:
                reply = await aperform(repository, client, op, on_sent)
            except Exception as exc:  # thrown into the steps, which decide
                error = exc
    except asyncio.CancelledError as exc:
        if cancelled is None or progress is None or not progress.wrote:
            raise
        raise cancelled() from exc
    finally:
        steps.close()


def aperform(
    repository: RepositoryBase, client: AsyncClient, op: Op, on_sent: Callable[[], None] | None = None
) -> Awaitable[Any]:
    """One operation (:mod:`.steps`) on the asyncio client ``client``, to await
    (``on_sent``: called when a :class:`.steps.Batch` is written, see
    :func:`.aconnection.arun_batch`): a batch's awaitable as it is (on one server the
    call itself, a future of its own: no coroutine around it), the other operations' coroutine."""
    if isinstance(op, Batch):
        return arun_batch(client, op.commands, on_sent)
    return _aperform_other(repository, client, op)


async def _aperform_other(repository: RepositoryBase, client: AsyncClient, op: Op) -> Any:
    """:func:`aperform` of an operation other than a :class:`.steps.Batch`."""
    if isinstance(op, LoadScripts):  # rare (a restarted Redis): the synchronous loader, in a thread
        await _load_scripts_once(repository)
        return None
    if isinstance(op, Pause):
        await asyncio.sleep(op.seconds)
        return None
    if isinstance(op, Primaries):
        if isinstance(client, AsyncRedisCluster):
            return [str(getattr(client.get_node_from_key(key), "name", "")) for key in op.keys]
        return ["" for _ in op.keys]
    if isinstance(op, Elsewhere):  # the synchronous client's slot map, read without I/O
        return repository.partition_elsewhere(set(op.avoid))
    assert isinstance(op, Blocking)
    return await sync_to_async(op.call, thread_sensitive=op.thread_sensitive)()


def _load_scripts_once(repository: RepositoryBase) -> Awaitable[None]:
    """Load the scripts (:meth:`RepositoryBase.load_scripts`, in a thread), once for all
    the calls of this loop that met ``NOSCRIPT`` meanwhile (:func:`_one_per_loop`): after
    Redis lost its script cache, each concurrent ``asend`` of a view loaded every script
    in a thread of its own (fifty threads holding the GIL the loop needed). A call that
    meets ``NOSCRIPT`` after a load ended starts another (Redis may have lost them again)."""
    return _one_per_loop(_loading, sync_to_async(repository.load_scripts, thread_sensitive=False))


def as_hash(reply: Any) -> dict[bytes, bytes]:
    """An ``HGETALL`` reply as a dict: redis-py parses it into one (its response callback),
    but a reply read without the callback (redis-py 5.0's asyncio client for a command
    given by name) is the flat list ``[field, value, ...]`` RESP2 sends."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


async def aget_many(repository: RepositoryBase, ids: Sequence[str]) -> list[Message | None]:
    """:meth:`~outbox.store.messages.MessageStore.get_many` on this loop's asyncio client:
    one round trip (``GET`` and ``HGETALL`` per id), and one more for the bodies of a
    published event's deliveries (``HGET`` of each payload record, as ``get_many``);
    records an older version wrote (hashes, ``WRONGTYPE``) are read by the synchronous
    method, in a thread.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    if not ids:
        return []
    client = await async_connection_for_loop()
    commands = []
    for message_id in ids:
        commands += [
            ("GET", repository.keys.message(message_id)),
            ("HGETALL", repository.keys.resend(message_id)),
        ]
    replies = await arun_batch(client, commands)
    if any(isinstance(reply, ResponseError) for reply in replies):
        found: list[Message | None] = await sync_to_async(
            repository.get_many,  # type: ignore[attr-defined]
            thread_sensitive=False,
        )(ids)
        return found
    out = [
        message_from_redis(record, as_hash(resend), ids[i]) if record and resend else None
        for i, (record, resend) in enumerate(zip(replies[::2], replies[1::2], strict=True))
    ]
    wanted = payloads_wanted(repository.keys, out)  # a published event's deliveries
    if wanted:
        bodies = await arun_batch(client, [("HGET", key, "body") for key in wanted])
        for body in bodies:
            if isinstance(body, Exception):
                raise body
        set_payloads(wanted, bodies)
    return out
