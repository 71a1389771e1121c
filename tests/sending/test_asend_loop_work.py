"""Issue 33's loop-blocking target: what ``asend()`` does on the event loop beyond the
write itself. Each item here was a slow callback's cause in ``benchmarks.bench_async``
(docs/benchmarks.md, "Async views"). Real Redis, no mocks."""

from __future__ import annotations

import asyncio
import contextvars
import signal
import threading
import time

import pytest
import redis
from django.db import connections, transaction

import outbox
from outbox.store import get_repository
from outbox.store.client.aconnection import aclose
from outbox.testing import RedisServer
from tests.support import redis_at


@pytest.mark.asyncio
async def test_asend_makes_no_database_connection_in_a_task_that_had_none():
    """Django keeps a database connection per asyncio task: asking a fresh task's
    connection whether it is in an atomic block built one (a ``DatabaseWrapper`` and a
    dozen objects in cycles) for every task that called ``asend``."""

    async def in_a_fresh_task() -> list[str]:
        await outbox.asend("mem", "x")
        return [c.alias for c in connections.all(initialized_only=True)]

    made = await contextvars.Context().run(asyncio.create_task, in_a_fresh_task())
    assert made == []
    await aclose()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_asend_inside_an_atomic_block_of_the_loop_thread_is_captured(monkeypatch):
    """With ``DJANGO_ALLOW_ASYNC_UNSAFE`` a coroutine may open ``transaction.atomic`` on
    the loop's thread: ``asend`` inside it captures the message in that transaction (as
    ``send``), so a rollback sends nothing."""
    from outbox.models import CapturedMessage

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        message = await outbox.asend("mem", "rolled back")
        assert CapturedMessage.objects.filter(id=message.id).exists()
        raise Rollback
    assert not CapturedMessage.objects.filter(id=message.id).exists()
    with pytest.raises(outbox.MessageNotFound):
        await outbox.aget(message.id)
    connections.close_all()
    await aclose()


@pytest.mark.single_server("the round trips shared by concurrent asends (the Multiplexer) are of one server")
@pytest.mark.skipif(
    tuple(int(p) for p in redis.__version__.split(".")[:2]) < (8, 1),
    reason="redis-py before 8.1 makes a timer for every read (timeout=math.inf is its 'no timeout' since 8.1)",
)
@pytest.mark.asyncio
async def test_the_replies_of_one_write_are_read_under_one_timer():
    """redis-py times each reply it reads: a timer made and cancelled per ``asend`` (in
    asyncio's debug mode a stack extracted for each, the longest part of the loop's
    slowest callbacks). The replies of one pipelined write share one deadline."""
    await outbox.asend("mem", "warm")  # the loop's client and connections made
    loop = asyncio.get_running_loop()
    call_at = loop.call_at
    timers = 0

    def counted(*args, **kwargs):
        nonlocal timers
        timers += 1
        return call_at(*args, **kwargs)

    loop.call_at = counted  # type: ignore[method-assign]
    try:
        sent = await asyncio.gather(*(outbox.asend("mem", {"i": i}) for i in range(200)))
    finally:
        del loop.call_at
    assert len({m.id for m in sent}) == 200
    assert timers < 100, f"{timers} timers for 200 asends"
    await aclose()


def test_the_write_steps_make_no_closure_cells_per_call():
    """A name a nested function or comprehension reads is a cell made at every call of
    its function, whichever branch runs: an object for the collector per send. The
    write path's functions keep such names in functions of their own (the rare paths:
    the cluster's fall-over, the read-back, the durability wait)."""
    from outbox import api
    from outbox.sending import intake
    from outbox.store import asteps, creating

    hot = [
        api.asend,
        api._acapture_or_store,
        api._store_steps,
        intake.store_steps,
        intake._create_steps,
        creating.create_steps,
        creating.script_steps,
        asteps.adrive,
    ]
    assert {f.__qualname__: f.__code__.co_cellvars for f in hot if f.__code__.co_cellvars} == {}


@pytest.mark.single_server("a private plain server is stopped with SIGSTOP")
@pytest.mark.asyncio
async def test_a_connection_whose_handshake_times_out_stores_nothing_and_says_so():
    """A stopped Redis still accepts TCP connections (the kernel's backlog): a new
    connection of this loop is made and its handshake's reply (``CLIENT SETINFO``)
    times out. The write was never sent: ``OutboxUnavailable``, not an unknown outcome
    (it was ``SendOutcomeUnknown``, seen in the benchmark under load, when the
    Multiplexer opened a connection)."""
    with RedisServer() as server, redis_at(server.url):
        get_repository.cache_clear()
        try:
            outbox.send("mem", "warm")  # the scripts loaded, by the synchronous client
            server.process.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(outbox.OutboxUnavailable) as raised:
                    await outbox.asend("mem", "never written")
            finally:
                server.process.send_signal(signal.SIGCONT)
            assert not isinstance(raised.value, outbox.SendOutcomeUnknown), raised.value
            assert get_repository().count() == 1
            await aclose()
        finally:
            get_repository.cache_clear()


@pytest.mark.asyncio
async def test_concurrent_first_asends_build_the_repository_once(monkeypatch):
    """The first view's concurrent ``asend``s each built the repository in a thread of
    their own (50 threads started from the loop, their builds holding the GIL the loop
    needed: the longest loop iteration of the uvicorn run). One build serves them all."""
    from outbox.store import asteps

    real = asteps.get_repository
    loop_thread = threading.current_thread()
    in_threads: list[threading.Thread] = []

    def counted():
        if threading.current_thread() is not loop_thread:
            in_threads.append(threading.current_thread())
            time.sleep(0.05)  # a build that takes a while (a cluster's slot map, a loaded machine)
        return real()

    counted.cache_info = real.cache_info  # type: ignore[attr-defined]
    monkeypatch.setattr(asteps, "get_repository", counted)
    real.cache_clear()
    sent = await asyncio.gather(*(outbox.asend("mem", {"i": i}) for i in range(50)))
    assert len({m.id for m in sent}) == 50
    assert len(in_threads) == 1, f"built {len(in_threads)} times"
    await aclose()


@pytest.mark.asyncio
async def test_concurrent_asends_that_meet_noscript_load_the_scripts_once(monkeypatch):
    """After Redis lost its script cache (a restart, ``SCRIPT FLUSH``), every ``asend``
    of a view's first chunk met ``NOSCRIPT`` and loaded every script in a thread of its
    own: 50 threads each sending some twenty ``SCRIPT LOAD``s, holding the GIL the loop
    needed (the slowest ``/health`` answers of the uvicorn run came in its first 100 ms).
    One load, awaited by all of them, serves them all."""
    from outbox.store.base import RepositoryBase

    outbox.send("mem", "warm")  # the repository made, its scripts loaded
    get_repository().connection.script_flush()
    real = RepositoryBase.load_scripts
    loads: list[str] = []

    def counted(self):  # the real load, counted, taking a while (a loaded machine)
        loads.append(threading.current_thread().name)
        time.sleep(0.05)
        return real(self)

    monkeypatch.setattr(RepositoryBase, "load_scripts", counted)
    sent = await asyncio.gather(*(outbox.asend("mem", {"i": i}) for i in range(50)))
    assert len({m.id for m in sent}) == 50
    assert len(loads) == 1, f"loaded {len(loads)} times"
    assert get_repository().count() == 51
    await aclose()


@pytest.mark.single_server("the round trips shared by concurrent asends (the Multiplexer) are of one server")
@pytest.mark.asyncio
async def test_a_call_in_flight_holds_no_extracted_stack_in_debug_mode():
    """In asyncio's debug mode an ``asyncio.Future`` extracts its creator's stack when it
    is made: the future of each ``asend``'s replies held about a dozen objects while in
    flight, and their collections were most of the slowest callbacks of issue 33's
    measure (``benchmarks.bench_async``). The call's own awaitable keeps none, and still
    behaves as a future to the tasks that await it."""
    from outbox.store.client.aconnection import arun_batch, async_connection_for_loop

    loop = asyncio.get_running_loop()
    debug = loop.get_debug()
    loop.set_debug(True)
    try:
        client = await async_connection_for_loop()
        call = arun_batch(client, [("PING",), ("ECHO", "x")])
        assert getattr(call, "_source_traceback", None) is None
        assert asyncio.isfuture(call)
        assert await call == [b"PONG", b"x"]
        assert await asyncio.wait_for(arun_batch(client, [("PING",)]), 5) == [b"PONG"]

        waiting = asyncio.create_task(_awaited(arun_batch(client, [("PING",)])))
        await asyncio.sleep(0)  # the task awaits the call
        waiting.cancel("gone")
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await arun_batch(client, [("ECHO", "after")]) == [b"after"]  # the replies stay in step
    finally:
        loop.set_debug(debug)
        await aclose()


async def _awaited(awaitable):
    return await awaitable
