"""Issue 30, item 2: after a timeout the outcome of a send is unknown, and ``send()`` says
so. A private Redis is stopped with SIGSTOP after a warm ``send()``: the next ``send()``
times out, yet the server runs the write when it resumes (SIGCONT). The error must not
say "nothing was stored"; it is an :class:`outbox.SendOutcomeUnknown` (an
``OutboxUnavailable``, so existing ``except`` clauses still catch it) naming the
messages, and ``outbox.send_again`` stores them under their own ids without a second
copy, whether or not the first write had landed."""

from __future__ import annotations

import json
import signal

import pytest

import outbox
from outbox.testing import RedisServer
from tests.support import redis_at, wait_for

pytestmark = pytest.mark.single_server("a private plain server is stopped with SIGSTOP")


@pytest.fixture
def stoppable():
    """A private Redis the outbox writes to (1 s socket timeout), and a way to freeze it."""
    with RedisServer() as server, redis_at(server.url):
        from outbox.store import get_repository

        get_repository.cache_clear()
        yield server
        server.process.send_signal(signal.SIGCONT)
    get_repository.cache_clear()


def frozen_send(server: RedisServer, send):
    """Call ``send`` while ``server`` is stopped; resume it after the call raised; return
    the exception."""
    server.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(outbox.OutboxUnavailable) as raised:
            send()
    finally:
        server.process.send_signal(signal.SIGCONT)
    return raised.value


def count() -> int:
    from outbox.store import get_repository

    return get_repository().count()


def exists(message_id: str) -> bool:
    from outbox.store import get_repository

    return get_repository().get_many([message_id])[0] is not None


def test_a_send_that_timed_out_is_unknown_not_unstored(stoppable):
    outbox.send("mem", {"warm": True})  # a connection in the pool, so the write is sent
    exc = frozen_send(stoppable, lambda: outbox.send("mem", {"order": 1}))
    assert isinstance(exc, outbox.SendOutcomeUnknown)
    assert "nothing was stored" not in str(exc)
    assert "unknown" in str(exc) and "send_again" in str(exc)
    assert [json.loads(m.body) for m in exc.unknown] == [{"order": 1}] and exc.stored == exc.unstored == []
    sent = exc.unknown[0]
    # the write was on the wire: the resumed server ran it, under the id the error names
    assert wait_for(lambda: exists(sent.id), timeout=10)
    again = outbox.send_again(exc.unknown)
    assert [m.id for m in again] == [sent.id]
    assert count() == 2  # the warm one and this one: no second copy


def test_send_again_stores_what_a_timed_out_send_had_not_stored(stoppable):
    """The same recovery when only some of the write had landed: send_again stores the
    rest, once."""
    outbox.delete([outbox.send("mem", {"warm": True}).id])
    exc = frozen_send(
        stoppable, lambda: outbox.send_many([{"destination": "mem", "body": i} for i in range(3)])
    )
    assert isinstance(exc, outbox.SendOutcomeUnknown)
    ids = [m.id for m in exc.unknown]
    assert len(ids) == 3
    assert wait_for(lambda: count() == 3, timeout=10)
    outbox.delete(ids[:2])  # as if only the last had landed
    assert count() == 1
    again = outbox.send_again(exc.unknown)
    assert [m.id for m in again] == ids
    assert count() == 3 and all(exists(i) for i in ids)
    assert [m.id for m in outbox.send_again(exc.unknown)] == ids and count() == 3  # again: still 3


def test_a_redis_that_cannot_be_reached_still_says_nothing_was_stored(repo):
    """A refused connection means the write was never sent: that is still 'nothing was
    stored', and not unknown."""
    from tests.support import redis_down

    with redis_down(), pytest.raises(outbox.OutboxUnavailable, match="nothing was stored") as raised:
        outbox.send("mem", {"order": 2})
    assert not isinstance(raised.value, outbox.SendOutcomeUnknown)
