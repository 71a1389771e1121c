"""The destinations set (``outbox:destinations``): a sending process adds a name with its
messages at most once per ``REGISTER_AGAIN`` seconds, not with every one (issue 30,
item 10), and again after that, so a name Redis lost comes back."""

import pytest

import outbox
from outbox.exceptions import IdempotencyConflict
from outbox.store import base


def sadds(redis) -> int:
    return int(redis.info("commandstats").get("cmdstat_sadd", {}).get("calls", 0))


def test_a_name_is_added_once_then_not_with_every_message(repo, redis):
    outbox.send("mem", {"n": 1})
    assert repo.destinations() == ["mem"]
    redis.config_resetstat()
    outbox.send("mem", {"n": 2})
    outbox.send_many([{"destination": "mem", "body": {"n": 3}}])
    assert sadds(redis) == 0
    assert repo.count("pending", "mem") == 3


def test_a_name_redis_lost_comes_back_after_register_again(repo, redis, monkeypatch):
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
