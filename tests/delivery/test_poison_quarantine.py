"""Issue 20, item 12: a poison message does not take its batch mates with it.

Messages taken back from a crashed worker are suspects; each is attempted alone (the
quarantine lane), so a second crash singles out the poison, and an innocent message is
charged at most one lost attempt per poison neighbour. Real parts: ``outbox_worker``
processes restarted by the test as a supervisor would, a private Redis, and a callable
that ends its process with ``os._exit(1)`` (``tests/poison.py``).
"""

from __future__ import annotations

import threading
import time

import pytest

import outbox
from tests import settings_quarantine as q
from tests.support import Supervisor, assert_index_invariant, wait_for, with_destinations
from tests.support.console import text_of, u

#: Past VISIBILITY_TIMEOUT + RECOVERY_INTERVAL + the first backoff: the wake-up that
#: follows a sweep (WAKE_INTERVAL 0.2 s), the claim round trips, and the innocent
#: messages' own attempts one at a time (50 ms each, over two workers). 1.5 s sufficed on a
#: quiet machine; CI runs several test processes on 2 cores, where 6.2 s was seen against
#: a bound of 6.0 (a 2 s lease), and 9.3 s against 8.5 (a 4 s lease, 3 s here) with the
#: machine's load at 8. With a 6 s lease (tests/settings_quarantine.py) and 4 s here, a
#: batch mate held for one more lease and sweep (the defect this bounds: at least
#: 6 + 1 + 0.5 + 6 = 13.5 s) still ends 2 s past the bound of 11.5 s.
SLACK = 4.0


def test_a_poison_message_mid_batch_is_singled_out_and_its_batch_mates_are_charged_once(repo, tmp_path):
    log = tmp_path / "delivered.txt"
    # outbox_worker processes, each started again 0.2 s after it exits (as systemd or
    # Kubernetes would); their output goes to files in tmp_path.
    supervisor = Supervisor(tmp_path, restart=True)
    for _ in range(2):
        supervisor.worker(
            settings_module="tests.settings_quarantine", env={"OUTBOX_TEST_DELIVERY_LOG": str(log)}
        )
    try:
        assert wait_for(lambda: supervisor.ready(2), 30), supervisor.output()
        with with_destinations(crasher=q.CRASHER):
            sent = outbox.send_many(
                [{"destination": "crasher", "body": {"n": i, "poison": i == 10}} for i in range(20)]
            )
        poison, mates = sent[10], [m for i, m in enumerate(sent) if i != 10]

        def settled() -> bool:
            return outbox.get(poison.id).status == "failed" and all(
                outbox.get(m.id).status in ("succeeded", "failed") for m in mates
            )

        assert wait_for(settled, 90), supervisor.output()
    finally:
        supervisor.stop()

    got = outbox.get(poison.id)
    lost = outbox.attempts(poison.id)
    assert got.status == "failed", supervisor.output()
    assert [a.outcome for a in lost] == ["lost"] * 3  # max_retries=2: three crashes, then a dead letter
    assert supervisor.exits.count(1) == 3  # each of its attempts ended a worker
    first_crash = lost[-1].started_at
    bound = q.VISIBILITY_TIMEOUT + q.RECOVERY_INTERVAL + q.FIRST_BACKOFF + SLACK

    charged, settle_times = {}, []
    for m in mates:
        record = outbox.get(m.id)
        attempts = outbox.attempts(m.id)
        assert record.status == "succeeded", (m.id, record.status, [a.outcome for a in attempts])
        charged[m.id] = sum(a.outcome == "lost" for a in attempts)
        assert charged[m.id] <= 1, (m.id, [a.outcome for a in attempts])  # at most once per poison neighbour
        assert record.retry_count == charged[m.id]
        if charged[m.id]:
            done = attempts[0].started_at + attempts[0].duration_ms / 1000
            settle_times.append(done - first_crash)
            assert done - first_crash <= bound, (
                f"{m.id} settled {done - first_crash:.1f} s after the first crash; bound {bound} s"
            )
    print(f"settled after the first crash: {sorted(round(t, 2) for t in settle_times)} s; bound {bound} s")
    # The scenario happened: batch mates were in flight beside the poison when it crashed.
    assert sum(charged.values()) >= 5, charged
    delivered = log.read_text().split()
    assert all(delivered.count(m.id) >= 1 for m in mates)
    assert poison.id not in delivered
    # Visible: the poison is marked quarantined (it keeps its lane if a person requeues
    # it); each batch mate's mark was cleared by the attempt it survived alone.
    assert got.suspect == 3
    assert not any(outbox.get(m.id).suspect for m in mates)
    assert_index_invariant(repo)


# -- the quarantine lane, in this process ---------------------------------------------------
_running: set[str] = set()
_beside: dict[str, set[str]] = {}
_lock = threading.Lock()


def track(message) -> None:
    """A callable destination that records which attempts ran beside each one."""
    with _lock:
        _beside.setdefault(message.id, set()).update(_running)
        for other in _running:
            _beside.setdefault(other, set()).add(message.id)
        _running.add(message.id)
    time.sleep(0.02)
    with _lock:
        _running.discard(message.id)


def tracked(max_retries: int = 2):
    return with_destinations(
        tracked={
            "TRANSPORT": "callable",
            "OPTIONS": {"path": f"{__name__}.track"},
            "MAX_IN_FLIGHT": 16,
            "MAX_RETRIES": max_retries,
        }
    )


def lose(repo, ids: list[str]) -> None:
    """Claim ``ids`` together as a worker would, and let the sweep take them back as if
    that worker had died (their lease is made to end now)."""
    from outbox.delivery.loop import claim
    from outbox.delivery.recovery import recover

    claimed = claim("outbox", time.time())
    assert {m.id for m in claimed} >= set(ids)
    for m in claimed:
        repo.connection.zadd(repo.keys.of(m.id).status("sending", m.destination), {m.id: time.time() - 1})
    recover()


def in_index(repo, name: str) -> list[bytes]:
    """The ids in index ``name`` of the queue ``outbox``, in every partition."""
    return [i for key in repo.keys.every(name, "outbox") for i in repo.connection.zrange(key, 0, -1)]


def test_suspects_are_attempted_alone_and_never_beside_other_messages(repo, settings):
    from outbox.delivery import loop as delivery

    _beside.clear()
    with tracked():
        crashed = outbox.send_many([{"destination": "tracked", "body": i} for i in range(4)])
        lose(repo, [m.id for m in crashed])
        fresh = outbox.send_many([{"destination": "tracked", "body": i} for i in range(8)])
        assert {outbox.get(m.id).suspect for m in crashed} == {1}
        for _ in range(20):  # a run ends when its budget is spent; the next goes on
            if not delivery.run("outbox").claimed:
                break
    assert {outbox.get(m.id).status for m in crashed + fresh} == {"succeeded"}
    for m in crashed:
        assert _beside.get(m.id, set()) == set(), f"a suspect ran beside {_beside[m.id]}"
        got = outbox.get(m.id)
        assert got.suspect == 0 and got.retry_count == 1
        assert [a.outcome for a in outbox.attempts(m.id)] == ["succeeded", "lost"]
        assert "quarantined" in outbox.attempts(m.id)[1].error
    assert any(_beside.get(m.id) for m in fresh)  # the others still ran side by side
    assert_index_invariant(repo)


def test_a_loss_beside_others_with_no_retry_left_is_not_a_dead_letter(repo):
    from outbox.delivery import loop as delivery

    with tracked(max_retries=0):
        sent = outbox.send_many([{"destination": "tracked", "body": i} for i in range(3)])
        lose(repo, [m.id for m in sent])
        for m in sent:
            got = outbox.get(m.id)
            assert got.status == "retrying" and got.retry_count == 0 and got.suspect == 1
            (lost,) = outbox.attempts(m.id)
            assert lost.outcome == "lost" and "not charged" in lost.error
        assert_index_invariant(repo)
        for _ in range(5):
            delivery.run("outbox")
    assert {outbox.get(m.id).status for m in sent} == {"succeeded"}


def test_a_message_lost_alone_without_retries_left_is_a_dead_letter_that_stays_quarantined(repo):
    from outbox.delivery import loop as delivery

    with tracked(max_retries=1):
        (m,) = outbox.send_many([{"destination": "tracked", "body": 0}])
        lose(repo, [m.id])  # claimed from the due index (with others, for all the sweep knows)
        assert outbox.get(m.id).retry_count == 1
        assert delivery.claim("outbox", time.time()) == []  # an ordinary claim moves it aside
        run = delivery.WorkerRun("outbox", repo, 5)
        assert run.write_and_claim(1) == []  # a run's claim says when (and, with partitions, where) it is due
        claimed = run.write_and_claim(1, quarantine=True)  # the quarantine lane
        assert [c.id for c in claimed] == [m.id]
        repo.connection.zadd(repo.keys.of(m.id).status("sending", "tracked"), {m.id: time.time() - 1})
        from outbox.delivery.recovery import recover

        report = recover()
        assert (report.lost, report.lost_alone, report.quarantined) == (1, 1, 0)
        got = outbox.get(m.id)
        assert got.status == "failed" and got.suspect == 2
        assert "attempted alone" in got.last_error
        outbox.requeue(m.id)  # a person's requeue: still attempted alone
        delivery.claim("outbox", time.time(), limit=10)  # an ordinary claim moves it aside
        assert outbox.get(m.id).status == "pending"
        assert repo.connection.zscore(repo.keys.of(m.id).quarantine("outbox"), m.id) is not None
        assert_index_invariant(repo)


def test_quarantined_messages_are_woken_cancelled_and_deleted_like_due_ones(repo):
    from outbox.delivery.loop import claim
    from outbox.delivery.recovery import wake_due
    from outbox.store.background.wakeups import get_queue

    with tracked():
        sent = outbox.send_many([{"destination": "tracked", "body": i} for i in range(3)])
        lose(repo, [m.id for m in sent])
        claim("outbox", time.time(), limit=10)  # moves the suspects aside, claims none
        assert len(in_index(repo, "quarantine")) == 3
        assert in_index(repo, "due") == []
        repo.connection.delete(repo.keys.wake("outbox"))
        get_queue("outbox").empty()
        assert wake_due(time.time()) == ["outbox"]  # due in the quarantine index: woken
        from outbox.metrics import OutboxCollector

        (family,) = [f for f in OutboxCollector().collect() if f.name == "outbox_queue_quarantined"]
        assert {s.labels["queue"]: s.value for s in family.samples}["outbox"] == 3
        outbox.cancel(sent[0].id)
        outbox.delete(sent[1].id)
        assert in_index(repo, "quarantine") == [sent[2].id.encode()]
        assert_index_invariant(repo)


@pytest.mark.django_db(transaction=True)
def test_the_detail_page_says_a_message_is_quarantined(repo, superuser_client):
    with tracked():
        (m,) = outbox.send_many([{"destination": "tracked", "body": 0}])
        lose(repo, [m.id])
        html = text_of(superuser_client.get(u("message_detail", m.id)))
    assert "Quarantined" in html and "attempted alone" in html
    assert "quarantined: its next attempt is made alone" in html  # the lost attempt's error


def test_outbox_recover_says_how_many_it_quarantined(repo):
    from io import StringIO

    from django.core.management import call_command

    from outbox.delivery.loop import claim

    with tracked():
        sent = outbox.send_many([{"destination": "tracked", "body": i} for i in range(2)])
        claim("outbox", time.time())
        for m in sent:
            repo.connection.zadd(repo.keys.of(m.id).status("sending", "tracked"), {m.id: time.time() - 1})
        out = StringIO()
        call_command("outbox_recover", stdout=out)
    assert (
        "recovered: 2 from lost workers (2 lost beside other attempts, quarantined; 0 lost" in out.getvalue()
    )
