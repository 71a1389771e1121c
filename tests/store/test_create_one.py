"""``lua/create_one.lua``, ``send()``'s script for one plain message, writes exactly what
``lua/create.lua`` writes for that message: every key, every field, every score, the
wake-up flag and the reply; on one server and with partitions. Each message is created
twice, under two ids, once through each script, and what Redis holds is compared."""

from __future__ import annotations

import dataclasses
import time

import pytest

from outbox.records import new_message_id, partition_of
from outbox.sending.validation import SendArguments, build_message
from outbox.store.scripts import sha
from tests.support import assert_index_invariant

SHAPES = {
    "plain": SendArguments("mem", {"n": 1}),
    "delayed": SendArguments("mem", {"n": 2}, delay=30),
    "headers, retries, priority": SendArguments(
        "mem",
        b"\x00raw",
        content_type="application/octet-stream",
        headers={"X-A": "1"},
        max_retries=3,
        retry=[1, 5],
        priority="high",
    ),
    "due within the slack": SendArguments("mem", {"n": 3}, delay=0.2),
}


def through_create_lua(repo, message, now, slack):
    """``message`` created by ``lua/create.lua`` (what every call used before)."""
    keys = repo.create_keys([message])
    if not repo.keys.partitioned:
        keys.append(repo.keys.destinations)
    args = repo.create_args([message], now, slack, False)
    reply = repo.connection.evalsha(sha("create"), len(keys), *keys, *args)
    return repo.parse_create([message], reply)


def held(repo, message):
    """What Redis holds of ``message`` (its own keys, and its entries in the shared ones)."""
    conn, keys = repo.connection, repo.keys
    part = keys.of(message.id)
    return {
        "record": conn.get(keys.message(message.id)),
        "resend": conn.hgetall(keys.resend(message.id)),
        "status": conn.zscore(part.status(message.status, message.destination), message.id),
        "due": conn.zscore(part.due(message.queue), message.id),
        "created": conn.zscore(part.created(message.destination), message.id),
    }


def twins(shape, partitioned):
    one = build_message(SHAPES[shape])
    pid = partition_of(one.id) if partitioned else None
    other = dataclasses.replace(one, id=new_message_id(partition=pid))
    return one, other


@pytest.fixture(params=["one server", "partitions"])
def store(request):
    return request.getfixturevalue("repo" if request.param == "one server" else "partitioned")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_create_one_writes_what_create_writes(store, shape):
    repo = store
    one, other = twins(shape, repo.keys.partitioned)
    assert repo.create_call([one], time.time(), 0.5)[0] == "create_one"
    now = time.time()
    replies = []
    for message, run in (
        (one, lambda m: repo.create([m], now, due_slack=0.5, repeat=False)),
        (other, lambda m: through_create_lua(repo, m, now, 0.5)),
    ):
        repo.connection.delete(repo.keys.wake(message.queue))
        result = run(message)
        # with partitions the caller sets the flags of the queues the script returns
        flag = None if repo.keys.partitioned else repo.connection.get(repo.keys.wake(message.queue))
        replies.append(([(c.code, c.standing_id == message.id) for c in result.created], result.woken, flag))
    assert replies[0] == replies[1]
    assert held(repo, one) == held(repo, other)
    assert held(repo, one)["record"] is not None
    if not repo.keys.partitioned:
        assert repo.connection.sismember(repo.keys.destinations, "mem")
    assert_index_invariant(repo)


def test_create_one_run_again_writes_nothing_and_says_exists(store):
    """A reply lost after the write, the call sent again by redis-py's Retry: "exists",
    nothing rewritten (a worker may have claimed the message meanwhile)."""
    repo = store
    message = build_message(SendArguments("mem", {"n": 1}))
    now = time.time()
    assert [c.code for c in repo.create([message], now, repeat=False).created] == ["new"]
    before = held(repo, message)
    repo.connection.hset(repo.keys.resend(message.id), "status", "sending")
    again = repo.create([message], now, repeat=False)
    assert [(c.code, c.standing_id) for c in again.created] == [("exists", message.id)]
    assert again.woken == []
    assert repo.connection.hget(repo.keys.resend(message.id), "status") == b"sending"
    assert held(repo, message)["record"] == before["record"]


@pytest.mark.parametrize(
    "arguments",
    [
        SendArguments("mem", {"n": 1}, idempotency_key="k"),
        SendArguments("mem", {"n": 1}, ordering_key="o"),
    ],
    ids=["idempotency key", "ordering key"],
)
def test_a_message_with_a_key_and_more_than_one_message_go_to_create_lua(repo, arguments):
    keyed = build_message(arguments)
    assert repo.create_call([keyed], time.time(), 0.5)[0] == "create"
    plain = [build_message(SendArguments("mem", {"n": i})) for i in range(2)]
    assert repo.create_call(plain, time.time(), 0.5)[0] == "create"
