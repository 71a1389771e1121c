"""Issue 33's loop-blocking target: what ``asend()`` does on the event loop beyond the
write itself. Each item here was a slow callback's cause in ``benchmarks.bench_async``
(docs/benchmarks.md, "Async views"). Real Redis, no mocks."""

from __future__ import annotations

import asyncio
import contextvars

import pytest
from django.db import connections, transaction

import outbox
from outbox.store.client.aconnection import aclose


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
