"""An ``asend`` cancelled at each await point of its write, deterministically (issue 33,
"a test that cancels at every await point"; redis-py had bugs there: CVE-2023-28858).

Every await point is made a checkpoint this test controls: before and after each
operation the steps ask of the driver (``asteps.aperform``: the caller's own awaits,
the wake-up job's thread included), and where a ``redis.asyncio`` connection awaits
its socket: before and after the write, before each read of a reply (inside redis-py's
guard, which disconnects a connection whose await was cancelled; the Multiplexer's task
on one server, the caller itself on a cluster). For k = 0, 1, 2, ... the task is cancelled at checkpoint k (0: before it
ever ran) until the call completes before reaching k. For each k: cancelled before the
write's operation began → a plain ``CancelledError`` and nothing stored; at or after
it → ``SendCancelled`` naming the message, stored once or not at all, and
``asend_again`` stores it exactly once however often it is called. The next call on
the same connections gets its own reply. Real Redis, single server and cluster."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from redis.asyncio.connection import AbstractConnection

import outbox
from outbox.store import asteps, get_repository
from outbox.store.client import aconnection
from outbox.store.steps import Batch

# Run where the awaiter of a cancelled task gets the exception the task raised (Python
# 3.11+: SendCancelled; 3.10 raises a new CancelledError with it as __context__) and where
# redis-py reads a reply in AbstractConnection._read_response_from_parser, inside the guard
# where a cancellation disconnects the connection (5.1+; 5.0 awaits its parser inline): the
# oldest supported combination (Python 3.10, redis-py 5.0.1) has neither.
pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11) or not hasattr(AbstractConnection, "_read_response_from_parser"),
    reason="Python 3.10 or redis-py 5.0: the awaiter of a cancelled task cannot see SendCancelled, "
    "or there is no reply reader to checkpoint (docs/async.md)",
)


class Checkpoints:
    """Numbered await points (1, 2, ...) of one ``asend``; at number ``k`` its task is
    cancelled. ``write_at``: the number of the checkpoint just before the write's
    operation was performed (None: not reached)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.n = 0
        self.names: list[str] = []
        self.task: asyncio.Task[Any] | None = None
        self.write_at: int | None = None
        self.cancelled_at: int | None = None

    async def __call__(self, name: str) -> None:
        if self.task is None or self.task.done():
            return  # not our call's (another's, or after it ended)
        self.n += 1
        self.names.append(name)
        if self.n == self.k:
            self.cancelled_at = self.n
            self.task.cancel()
        await asyncio.sleep(0)  # the await point itself: a cancellation lands here


@pytest.fixture
def checkpoints(monkeypatch) -> list[Checkpoints]:
    """The driver's operations and the asyncio connections' writes and reads, each
    behind a checkpoint of the current :class:`Checkpoints` (the list's last)."""
    current: list[Checkpoints] = [Checkpoints(-1)]  # no task: no checkpoint
    perform = asteps.aperform
    write = AbstractConnection._send_packed_command

    async def aperform(repository, client, op, on_sent=None):
        cp = current[-1]
        await cp(f"before {type(op).__name__}")
        if isinstance(op, Batch) and op.write and cp.write_at is None and cp.task is not None:
            cp.write_at = cp.n
        result = await perform(repository, client, op, on_sent)
        await cp(f"after {type(op).__name__}")
        return result

    # Inside redis-py's own guard (a cancellation there disconnects the connection), where
    # its real awaits are: the socket's write and drain, the wait for a reply.
    async def send_packed(self, command):
        await current[-1]("connection write")
        await write(self, command)
        await current[-1]("connection written")

    read = AbstractConnection._read_response_from_parser

    async def read_reply(self, *args, **kwargs):
        await current[-1]("connection read")
        return await read(self, *args, **kwargs)

    monkeypatch.setattr(asteps, "aperform", aperform)
    monkeypatch.setattr(AbstractConnection, "_send_packed_command", send_packed)
    monkeypatch.setattr(AbstractConnection, "_read_response_from_parser", read_reply)
    return current


async def _settled() -> None:
    """Until this loop's Multiplexer (one server) has no connection task left: a
    cancelled call's write, once taken, still goes out and is read."""
    for _ in range(1000):
        held = aconnection._clients.get(asyncio.get_running_loop())
        if held is None or held[2] is None or not held[2].tasks:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the Multiplexer's tasks did not end")


@pytest.mark.asyncio
async def test_asend_cancelled_at_each_await_point(spread, checkpoints):
    repo = get_repository()
    await outbox.asend("mem", "warm")  # the loop's client and connections made
    outcomes: dict[str, list[int]] = {"plain": [], "unknown, stored": [], "unknown, not stored": []}
    for k in range(60):
        cp = Checkpoints(k)
        checkpoints.append(cp)
        before = repo.count()
        cp.task = asyncio.ensure_future(outbox.asend("mem", {"k": k}))
        if k == 0:
            cp.task.cancel()  # before it ran at all
        try:
            message = await cp.task
        except outbox.SendCancelled as exc:
            await _settled()
            assert cp.task.cancelled() and isinstance(exc, outbox.SendOutcomeUnknown)
            assert (
                cp.write_at is not None and cp.cancelled_at is not None and cp.cancelled_at > cp.write_at
            ), (
                k,
                cp.names,
            )
            (unknown,) = exc.unknown
            landed = repo.count() - before
            assert landed in (0, 1), (k, cp.names, landed)
            outcomes["unknown, stored" if landed else "unknown, not stored"].append(k)
            checkpoints.append(Checkpoints(-1))  # asend_again's own awaits: no cancellation
            for _ in range(2):
                (again,) = await outbox.asend_again(exc.unknown)
                assert again.id == unknown.id and repo.count() == before + 1, (k, cp.names)
        except asyncio.CancelledError:
            await _settled()
            assert cp.write_at is None or k == 0 or cp.cancelled_at <= cp.write_at, (k, cp.names)
            assert repo.count() == before, (k, cp.names)
            outcomes["plain"].append(k)
        else:
            assert cp.n < k, (k, cp.names)  # completed before checkpoint k: every point was tried
            assert (await outbox.aget(message.id)).body == message.body
            break
        checkpoints.append(Checkpoints(-1))
        mine = await outbox.asend("mem", {"after": k})  # the same pool: its own reply
        assert (await outbox.aget(mine.id)).body == mine.body and repo.count() == before + 2 - (
            k in outcomes["plain"]
        )
    else:
        pytest.fail(f"asend did not complete within 60 checkpoints: {cp.names}")
    assert outcomes["plain"] and outcomes["unknown, stored"], outcomes
    await aconnection.aclose()
