"""An exchange written again counts each attempt once in its destination's health (issue
31, item 1; ``lua/health.lua``: the run's token and each outcome's number).

The worker's exchange (health, transitions, claims) is retried whole when it raises: a
reply lost after the scripts ran, or a later step of a partitioned exchange failing. The
failure is injected at the client *after* the real scripts ran on the real server (a
reply lost), once, in the round trip that carries the health step. Before: one delivery
counted ``t_s = 2``, and a failure run counted twice opened a breaker early."""

from __future__ import annotations

import os
import time

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import outbox
from outbox.store import get_repository
from outbox.store.base import RepositoryBase

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["one", "sixteen", "cluster"])
def deployment(request, settings):
    """One partition or 16 on the single server, or 16 on the real cluster."""
    if request.param == "cluster":
        request.getfixturevalue("cluster_mode")
    elif os.environ.get("OUTBOX_TEST_CLUSTER"):
        pytest.skip(
            "the suite runs on the cluster: its outbox connection is the cluster (the 'cluster' case)"
        )
    else:
        request.getfixturevalue("redis")
        settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": 16 if request.param == "sixteen" else 1}
    get_repository.cache_clear()
    yield get_repository()
    get_repository.cache_clear()


@pytest.fixture
def reply_lost_once(monkeypatch):
    """The first round trip that records health runs on the server, then raises
    ConnectionError as if its reply were lost. Yields the list of the injections made."""
    real = RepositoryBase.run_scripts
    lost: list[list[str]] = []

    def losing_once(self, calls, client=None, *, errors=False):
        replies = real(self, calls, client, errors=errors)
        if not lost and any(call[0] == "health" for call in calls):
            lost.append([call[0] for call in calls])
            raise RedisConnectionError("the reply was lost (injected after the scripts ran)")
        return replies

    monkeypatch.setattr(RepositoryBase, "run_scripts", losing_once)
    return lost


def counts(repo, destination: str) -> tuple[int, int, int]:
    values = repo.connection.hmget(repo.keys.dest(destination), "t_s", "t_r", "t_p")
    return tuple(int(v or 0) for v in values)  # type: ignore[return-value]


def deliver(worker, *ids: str, within: float = 30.0) -> None:
    """Run burst workers until none of ``ids`` waits to be attempted, for at most
    ``within`` seconds: on the cluster a burst's claims may not reach a message sent into
    a partition it visits last (the wake-up job ends with the burst; a running worker
    claims again), and then no exchange, so no lost reply, was made (CI failed so twice,
    once after five bursts in a row: a count of bursts is no bound on a loaded machine)."""
    deadline = time.monotonic() + within
    while True:
        worker(simple=True)
        if all(outbox.get(i).status not in ("pending", "retrying") for i in ids):
            return
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)


def where_it_waits(repo, message_id: str) -> str:
    """Where a message still waiting is held: the due index of each partition that has it
    (its due time against now), and its queue's wake-up flag (for a failure's message)."""
    found = []
    queue = outbox.get(message_id).queue
    for k in repo.keys.partition_numbers():
        score = repo.connection.zscore(repo.keys.partition(k).due(queue), message_id)
        if score is not None:
            found.append(f"partition {k} due in {score - time.time():+.2f} s")
    flag = repo.connection.get(repo.keys.wake(queue))
    return f"{', '.join(found) or 'in no due index'}; wake-up flag {flag!r}"


def test_a_success_written_again_is_counted_once(deployment, hook, worker, reply_lost_once):
    sent = outbox.send("hook", {"n": 1})
    deliver(worker, sent.id)
    status = outbox.get(sent.id).status
    assert reply_lost_once, (
        f"no reply was lost (the message is {status}, {where_it_waits(deployment, sent.id)}): "
        "the test did not test anything"
    )
    assert status == "succeeded"
    assert len(hook.requests) == 1
    assert counts(deployment, "hook") == (1, 0, 0)


def test_failures_written_again_are_counted_once(deployment, receiver, worker, reply_lost_once):
    from tests.support import hook_settings

    receiver.respond(500)
    with hook_settings(receiver.url, MAX_RETRIES=0, BREAKER={"FAILURES": 2, "COOLDOWN": 60}):
        sent = outbox.send("hook", {"n": 1})
        deliver(worker, sent.id)
    assert reply_lost_once, "no reply was lost: the test did not test anything"
    assert outbox.get(sent.id).status == "failed"
    assert counts(deployment, "hook") == (0, 1, 0)  # a 500 is retryable: kind "r", retries used up
    state = deployment.connection.hmget(deployment.keys.dest("hook"), "consecutive", "breaker")
    # one failure of a breaker that opens at two: still closed
    assert (int(state[0]), (state[1] or b"closed").decode()) == (1, "closed")


def test_an_exchange_of_several_destinations_written_again_counts_each_once(
    deployment, receiver, worker, reply_lost_once
):
    # One partition: one health.lua call counts every destination of the exchange at
    # once, so the run keeps one mark (outbox:counted:<run>), not one per destination
    # and exchange (a SET each: one per endpoint delivery when deliveries spread over
    # endpoints); with more partitions each destination's call keeps its own.
    from outbox import webhooks

    receiver.respond(200)
    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    for i in range(3):
        webhooks.create_endpoint("acme", f"{receiver.base}/ep/{i}")
    event = outbox.publish("order.paid", {"n": 1}, application="acme")
    deliver(worker, *(d.id for d in event.deliveries))
    assert reply_lost_once, "no reply was lost: the test did not test anything"
    names = [d.message.destination for d in event.deliveries]
    assert [outbox.get(d.id).status for d in event.deliveries] == ["succeeded"] * 3
    assert len(receiver.requests) == 3
    assert [counts(deployment, name) for name in names] == [(1, 0, 0)] * 3
    if deployment.keys.partitions == 1:
        marks = deployment.connection.keys(f"{deployment.keys.prefix}:counted:*")
        assert len(marks) == 1, marks
