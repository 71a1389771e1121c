"""Issue 31, item 7: the exchange (health, outcomes, claims) as named steps on a typed
request (outbox/store/exchange.py), each step's outage handled where it happens. On the
private server with 16 partitions (each step one call per slot, as on a cluster); an
outage of one slot is injected at the client: the refused calls do not run (as a
``TRYAGAIN`` answered before a script runs), the others run for real."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest
from redis.exceptions import TryAgainError

import outbox
from outbox.delivery import loop
from outbox.delivery.outcomes import decide, health_outcome, rules_for
from outbox.records import Outcome, partition_of
from outbox.store import ExchangeRequest, PartitionAsk, get_repository
from outbox.store.decisions import change_of
from outbox.store.exchange import Exchange

PARTITIONS = 16


@pytest.fixture
def repo(partitioned):
    """16 partitions on the private server (tests/conftest.py)."""
    return partitioned


def refusing(repo, monkeypatch, refuse):
    """Make ``repo.run_scripts`` answer ``TRYAGAIN`` (without running it) for each call
    ``refuse(name, keys)`` is true of; the others run. Returns the refused calls' names."""
    real = type(repo).run_scripts
    refused: list[str] = []

    def run_scripts(self, calls, client=None, *, errors=False):
        keep = [i for i, c in enumerate(calls) if not refuse(c[0], c[2] if len(c) > 2 else ())]
        replies = real(self, [calls[i] for i in keep], client, errors=errors) if keep else []
        out = [None] * len(calls)
        for i, reply in zip(keep, replies, strict=True):
            out[i] = reply
        for i, c in enumerate(calls):
            if i not in keep:
                refused.append(c[0])
                error = TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot")
                if not errors:
                    raise error
                out[i] = error
        return out

    monkeypatch.setattr(type(repo), "run_scripts", run_scripts)
    return refused


def in_partitions(n: int, destination: str = "hook") -> list:
    """Claimed messages of ``destination`` in ``n`` different partitions."""
    seen: dict[int, str] = {}
    i = 0
    while len(seen) < n:
        m = outbox.send(destination, {"i": i})
        seen.setdefault(partition_of(m.id), m.id)
        i += 1
    claimed = {m.id: m for m in loop.claim("outbox", limit=1000)}
    return [claimed[i] for i in seen.values()]


def decided(messages, ok=True):
    now = time.time()
    return [
        decide(
            Outcome(m, now, 1.0, status_code=200, ok=True)
            if ok
            else Outcome(m, now, 1.0, error="HTTP 503", status_code=503),
            now,
            rules_for(m),
        )
        for m in messages
    ]


def request(decisions, asks=(), **more):
    now = time.time()
    return ExchangeRequest(
        "outbox",
        now,
        uuid.uuid4().hex,
        now + 30,
        list(asks) or [PartitionAsk(0, 0)],
        changes=[change_of(d) for d in decisions],
        outcomes=[[*health_outcome(d.outcome), 0] for d in decisions],
        **more,
    )


def with_outcomes(decisions, messages):
    return [
        dataclasses.replace(
            d, outcome=Outcome(m, time.time(), 1.0, status_code=200, ok=d.status == "succeeded")
        )
        for d, m in zip(decisions, messages, strict=True)
    ]


def test_the_request_asks_at_least_one_partition():
    with pytest.raises(ValueError):
        ExchangeRequest("outbox", 0.0, "L", 1.0, [])


def test_write_health_leaves_out_the_changes_of_a_destination_whose_home_slot_refuses(repo, monkeypatch):
    hooks = in_partitions(1, "hook")
    mems = in_partitions(1, "mem")
    decisions = with_outcomes(decided(hooks + mems), hooks + mems)
    refusing(repo, monkeypatch, lambda name, keys: name == "health" and "{d:hook}" in keys[0])
    step = Exchange(repo, request(decisions))
    sent = step.write_health()
    assert sent == [1]  # mem's change only
    assert [r.unwritten for r in step.results] == ["destination", ""]
    minute = int(time.time() // 60)
    assert not repo.connection.exists(repo.keys.health("hook", minute))
    assert repo.connection.exists(repo.keys.health("mem", minute))


def test_write_and_pick_writes_the_partitions_that_answer(repo, monkeypatch):
    a, b = in_partitions(2)
    decisions = with_outcomes(decided([a, b]), [a, b])
    moving = repo.keys.partition(partition_of(a.id)).due("outbox").split("}")[0] + "}"
    refused = refusing(repo, monkeypatch, lambda name, keys: any(k.startswith(moving) for k in keys))
    asks = [PartitionAsk(partition_of(a.id), 5), PartitionAsk(partition_of(b.id), 5)]
    step = Exchange(repo, request(decisions, asks))
    step.write_and_pick([0, 1])
    assert sorted(refused) == ["pick", "transition"]
    assert (step.results[0].unwritten, step.results[0].applied) == ("partition", False)
    assert (step.results[1].unwritten, step.results[1].applied) == ("", True)
    assert outbox.get(a.id).status == "sending" and outbox.get(b.id).status == "succeeded"
    assert partition_of(a.id) in step.refused and partition_of(b.id) in step.picked


def test_gate_leaves_the_messages_of_a_destination_whose_gate_refuses(repo, monkeypatch):
    partitions = sorted({partition_of(outbox.send("hook", {"i": i}).id) for i in range(3)})
    refusing(repo, monkeypatch, lambda name, keys: name == "gate")
    step = Exchange(repo, request([], [PartitionAsk(p, 5) for p in partitions]))
    step.write_and_pick([])
    step.gate()
    assert step.answers and set(step.answers.values()) == {("stale", "")}
    step.apply_claims()
    claims = step.claims()
    assert not [m for c in claims for m in c.messages]
    assert {outbox.get(m).status for m in step.answers} == {"pending"}  # still due


def test_apply_claims_gives_a_refused_partitions_grants_back(repo, monkeypatch):
    a, b = (outbox.send("hook", {"i": i}) for i in range(2))
    extra = []  # sent into a's partition on the way: not due, so each partition picks one
    while partition_of(b.id) == partition_of(a.id):
        extra.append(b.id)
        b = outbox.send("hook", {"i": 9})
    if extra:
        outbox.cancel(extra)
    moving = f"{{p{partition_of(a.id)}}}"
    refusing(repo, monkeypatch, lambda name, keys: name == "claim_apply" and moving in keys[0])
    req = request([], [PartitionAsk(partition_of(a.id), 5), PartitionAsk(partition_of(b.id), 5)])
    step = Exchange(repo, req)
    step.write_and_pick([])
    step.gate()
    assert repo.connection.zcard(repo.keys.inflight("hook")) == 2  # both granted
    step.apply_claims()
    assert isinstance(step.refused[partition_of(a.id)], TryAgainError)
    claims = step.claims()
    step.give_back(claims)
    assert claims[0].unavailable and not claims[0].messages
    assert [m.id for m in claims[1].messages] == [b.id]
    assert outbox.get(a.id).status == "pending"  # still due
    members = [m.decode() for m in repo.connection.zrange(repo.keys.inflight("hook"), 0, -1)]
    assert members == [f"{req.lease}|{b.id}"]  # a's grant given back at once


def test_in_steps_and_one_round_trip_give_the_same_reply(redis, settings):
    for partitions in (1, PARTITIONS):
        settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": partitions}
        get_repository.cache_clear()
        repo = get_repository()
        redis.flushdb()
        m = outbox.send("hook", {"n": partitions})
        (claimed,) = loop.claim("outbox")
        (d,) = with_outcomes(decided([claimed], ok=False), [claimed])
        reply = repo.outcomes_and_claim(request([d], [PartitionAsk(partition_of(m.id), 5)], slack=1.0))
        assert reply.results[0].applied and not reply.results[0].unwritten
        assert [x.id for x in reply.claims[0].messages] == [m.id]  # the retry, due at once
    get_repository.cache_clear()


def test_a_destination_at_its_cap_does_not_use_up_the_claims_limit(repo):
    """A claim for one message (a slot freed for ``mem``) whose partition's due index
    starts with a message of ``hook``, at its cap in this exchange: the pick's entry of
    ``hook`` counted against the limit, so the claim took nothing and met ``hook`` alone
    at its cap, which lends ``hook`` the worker's idle slots (``WorkerRun.lending``): two busy
    destinations then went past their share (24 of 16 seen on the cluster). A capped
    destination's entries are now left due without counting, as with one partition."""
    first = outbox.send("hook", {"n": 0})
    then = outbox.send("mem", {"n": 1})
    while partition_of(then.id) != partition_of(first.id):  # keyless: a partition at random
        outbox.cancel([then.id])  # no longer due
        then = outbox.send("mem", {"n": 1})
    ask = PartitionAsk(partition_of(first.id), 1, {"hook": 0, "mem": 1})
    reply = repo.outcomes_and_claim(request([], [ask]))
    (claim,) = reply.claims
    assert [m.id for m in claim.messages] == [then.id]
    assert claim.capped == ["hook"]
    assert outbox.get(first.id).status == "pending"  # still due
