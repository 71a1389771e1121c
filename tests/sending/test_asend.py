"""Issue 33: ``await outbox.asend()`` and friends, on ``redis.asyncio``, driving the same
write steps as ``send()`` (outbox.store.steps). Real Redis (the suite's private server,
or the cluster through ``spread``); no mocks."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction

import outbox
from outbox.store.client.aconnection import aclose
from outbox.testing import RedisServer
from tests.support import redis_at

#: Python 3.11 and later give the awaiter of a cancelled task the exception its code raised
#: (SendCancelled); 3.10 a new CancelledError, the task's own exception as its __context__.
AWAITER_SEES_THE_TASKS_ERROR = pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="Python 3.10: awaiting a cancelled task raises a new CancelledError (the task's own SendCancelled is its __context__), so a test awaiting the task cannot tell the two answers apart (docs/async.md)",
)


def stored(message_id: str) -> bool:
    from outbox.store import get_repository

    return get_repository().get_many([message_id])[0] is not None


def count() -> int:
    from outbox.store import get_repository

    return get_repository().count()


@pytest.mark.asyncio
async def test_asend_stores_what_send_stores(spread):
    message = await outbox.asend("mem", {"order": 1}, headers={"X-A": "b"})
    again = await outbox.aget(message.id)
    assert again.id == message.id and again.status == "pending" and again.body == message.body
    sync = outbox.send("mem", {"order": 1}, headers={"X-A": "b"})
    assert outbox.get(sync.id).body == again.body
    batch = await outbox.asend_many([{"destination": "mem", "body": i} for i in range(5)])
    assert [m.status for m in batch] == ["pending"] * 5 and all(map(stored, [m.id for m in batch]))
    await aclose()


@pytest.mark.asyncio
async def test_asend_refuses_what_send_refuses(spread):
    with pytest.raises(outbox.UnknownDestination):
        await outbox.asend("nowhere", "x")
    first = await outbox.asend("mem", "a", idempotency_key="k1")
    assert (await outbox.asend("mem", "a", idempotency_key="k1")).id == first.id
    with pytest.raises(outbox.IdempotencyConflict):
        await outbox.asend("mem", "b", idempotency_key="k1")
    with pytest.raises(outbox.MessageNotFound):
        await outbox.aget("m_nope")
    await aclose()


@pytest.mark.asyncio
async def test_concurrent_asends_each_keep_their_own_outcome(spread):
    await outbox.asend("mem", "taken", idempotency_key="dup")

    async def one(i: int):
        if i % 10 == 0:  # every tenth conflicts: its failure is its own
            return await outbox.asend("mem", f"other {i}", idempotency_key="dup")
        return await outbox.asend("mem", {"i": i})

    results = await asyncio.gather(*(one(i) for i in range(100)), return_exceptions=True)
    for i, result in enumerate(results):
        if i % 10 == 0:
            assert isinstance(result, outbox.IdempotencyConflict), result
        else:
            assert isinstance(result, outbox.Message) and result.body == outbox.get(result.id).body
            assert b'"i": %d' % i in result.body or f'"i":{i}'.encode() in result.body
    assert len({r.id for r in results if isinstance(r, outbox.Message)}) == 90
    await aclose()


@AWAITER_SEES_THE_TASKS_ERROR
@pytest.mark.asyncio
async def test_a_cancelled_asend_is_unknown_once_its_write_was_sent(redis):
    """Cancel after 0, 1, 2, ... event-loop steps until the call finishes first: every
    await point of the write (connecting, sending, reading the reply, the wake-up job's
    thread) is hit. Before the write: a plain CancelledError and nothing stored; after:
    SendCancelled (a SendOutcomeUnknown) naming the message, which send_again stores once.
    And the next call on the same pool gets its own reply (CVE-2023-28858)."""
    seen = {"before": 0, "unknown": 0}
    for steps in range(400):
        before = count()
        task = asyncio.ensure_future(outbox.asend("mem", {"steps": steps}))
        for _ in range(steps):
            await asyncio.sleep(0)
        if task.done():
            assert stored(task.result().id)
            break
        task.cancel()
        try:
            await task
        except outbox.SendCancelled as exc:
            seen["unknown"] += 1
            assert task.cancelled()
            (message,) = exc.unknown
            assert isinstance(exc, asyncio.CancelledError) and isinstance(exc, outbox.SendOutcomeUnknown)
            await outbox.asend_again(exc.unknown)
            assert stored(message.id) and count() == before + 1
        except asyncio.CancelledError:
            seen["before"] += 1
            assert count() == before
        else:
            assert stored(task.result().id)
        mine = await outbox.asend("mem", {"after": steps})
        assert (await outbox.aget(mine.id)).body == mine.body
    else:
        pytest.fail("asend never finished within 400 loop steps")
    assert seen["before"], seen  # steps=0: cancelled before the task ran at all
    await aclose()


@pytest.fixture
def stoppable():
    """A private Redis the outbox writes to (1 s socket timeout), and a way to freeze it."""
    with RedisServer() as server, redis_at(server.url):
        from outbox.store import get_repository

        get_repository.cache_clear()
        yield server
        server.process.send_signal(signal.SIGCONT)
    get_repository.cache_clear()


@pytest.mark.single_server("a private plain server is stopped with SIGSTOP")
@pytest.mark.asyncio
async def test_a_hung_redis_blocks_only_the_awaiting_task(stoppable):
    await outbox.asend("mem", "warm")  # a connection in this loop's pool
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    tick = asyncio.ensure_future(ticker())
    stoppable.process.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    try:
        with pytest.raises(outbox.SendOutcomeUnknown) as raised:
            await outbox.asend("mem", "during the hang")
    finally:
        stoppable.process.send_signal(signal.SIGCONT)
        tick.cancel()
    assert time.monotonic() - started >= 0.9  # the socket timeout, 1 s
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert len(ticks) > 50 and max(gaps) < 0.05, max(gaps)
    await outbox.asend_again(raised.value.unknown)
    assert stored(raised.value.unknown[0].id)
    await aclose()


@AWAITER_SEES_THE_TASKS_ERROR
@pytest.mark.single_server("a private plain server is stopped with SIGSTOP")
@pytest.mark.asyncio
async def test_a_task_cancelled_while_its_write_waits_for_the_reply_is_unknown(stoppable):
    """The await point after the write was sent, made certain: the server is stopped,
    so the reply cannot come; the cancellation there is SendCancelled, and the task ends
    cancelled. The server then runs the write: send_again stores it once."""
    await outbox.asend("mem", "warm")
    stoppable.process.send_signal(signal.SIGSTOP)
    try:
        task = asyncio.ensure_future(outbox.asend("mem", "cancelled in flight"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(outbox.SendCancelled) as raised:
            await task
    finally:
        stoppable.process.send_signal(signal.SIGCONT)
    assert task.cancelled()
    (message,) = raised.value.unknown
    await outbox.asend_again(raised.value.unknown)
    assert stored(message.id) and count() == 2
    await aclose()


@pytest.mark.django_db(transaction=True)
def test_asend_through_async_to_sync_inside_atomic_is_captured_with_the_transaction():
    from outbox.models import CapturedMessage

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        gone = async_to_sync(outbox.asend)("mem", "rolled back")
        assert CapturedMessage.objects.filter(id=gone.id).exists()
        raise Rollback
    assert not stored(gone.id) and not CapturedMessage.objects.filter(id=gone.id).exists()
    with transaction.atomic():
        kept = async_to_sync(outbox.asend)("mem", "committed")
        assert not stored(kept.id)  # not ahead of the commit
    assert stored(kept.id)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_operation_signals_of_the_async_twins_run_orm_receivers_off_the_loop():
    from django.contrib.auth.models import User

    from outbox.events import messages_cancelled

    loop_thread = threading.current_thread()
    seen: list[tuple[threading.Thread, int]] = []

    def receiver(sender, message_ids, **kwargs):
        seen.append((threading.current_thread(), User.objects.count()))  # the ORM: sync only

    messages_cancelled.connect(receiver)
    try:
        message = await outbox.asend("mem", "to cancel", delay=60)
        result = await outbox.acancel(message.id)
    finally:
        messages_cancelled.disconnect(receiver)
    assert result.acted == 1
    assert seen and seen[0][0] is not loop_thread and seen[0][1] == 0
    assert (await outbox.aget(message.id)).status == "cancelled"
    assert (await outbox.arequeue(message.id)).acted == 1
    assert (await outbox.adelete(message.id)).acted == 1
    await aclose()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_eager_mode_delivers_inside_asend(settings):
    from django.core import mail  # noqa: F401  (locmem transports record in process)

    settings.OUTBOX = {**settings.OUTBOX, "EAGER": True}
    message = await outbox.asend("mem", {"eager": True})
    assert message.status == "succeeded"
    await aclose()
