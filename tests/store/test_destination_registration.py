"""The destinations set (``outbox:destinations``), which lists, counts, retention and the
index repair read. On one server the create script adds a call's names with every call
(an ``SADD`` of a member already there: about 0.2 µs), so a name Redis lost (a restart
without persistence, a failover to an empty replica) is listed and counted again from the
next message on. With more than one partition the set is a key of its own slot, added by
a command of its own: a process adds a name at most once per ``REGISTER_AGAIN`` seconds,
and again after that, so a name Redis lost comes back within those seconds."""

import pytest

import outbox
from outbox.exceptions import IdempotencyConflict
from outbox.store import base


def sadds(redis) -> int:
    return int(redis.info("commandstats").get("cmdstat_sadd", {}).get("calls", 0))


def test_on_one_server_a_name_redis_lost_is_counted_again_from_the_next_message(repo, redis):
    if repo.keys.partitioned:
        pytest.skip("with partitions the names are added once per REGISTER_AGAIN (the next test)")
    outbox.send("mem", {"n": 1})
    redis.srem(repo.keys.destinations, "mem")  # as after Redis lost its data
    outbox.send("mem", {"n": 2})
    assert repo.destinations() == ["mem"]
    assert repo.count("pending", "mem") == 2 and repo.count("pending") == 2


def test_with_partitions_a_name_is_added_once_then_not_with_every_message(partitioned, redis):
    repo = partitioned
    outbox.send("mem", {"n": 1})
    assert repo.destinations() == ["mem"]
    redis.config_resetstat()
    outbox.send("mem", {"n": 2})
    outbox.send_many([{"destination": "mem", "body": {"n": 3}}])
    assert sadds(redis) == 0
    assert repo.count("pending", "mem") == 3


def test_a_name_redis_lost_comes_back_after_register_again(partitioned, redis, monkeypatch):
    repo = partitioned
    outbox.send("mem", {"n": 1})
    redis.srem(repo.keys.destinations, "mem")  # as after Redis lost its data
    outbox.send("mem", {"n": 2})
    assert repo.destinations() == []  # within REGISTER_AGAIN of the last add
    clock = base.time.monotonic() + base.REGISTER_AGAIN
    monkeypatch.setattr(base.time, "monotonic", lambda: clock)
    sent = outbox.send("mem", {"n": 3})
    assert repo.destinations() == ["mem"]
    assert repo.filter(None)[0] == sent.id  # the list over every destination sees it


def test_a_conflict_registers_nothing(repo, redis):
    """On one server (create.lua adds the names): a call with a conflict writes nothing.
    With partitions the names are added before the calls, whatever they find."""
    if repo.keys.partitioned:
        pytest.skip("with partitions the names are added before the create calls")
    outbox.send("mem", {"n": 1}, idempotency_key="k")
    redis.srem(repo.keys.destinations, "mem")
    repo.registered.clear()
    with pytest.raises(IdempotencyConflict):
        outbox.send("mem", {"n": 2}, idempotency_key="k")
    assert repo.destinations() == [] and "mem" not in repo.registered
    outbox.send("mem", {"n": 3})
    assert repo.destinations() == ["mem"]
