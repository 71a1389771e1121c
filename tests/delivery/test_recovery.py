"""Nothing stays stuck: a worker killed mid-delivery, and due messages whose job is gone."""

import os
import signal
import time

import pytest
from django.test import override_settings

import outbox
from outbox.conf import outbox_settings
from outbox.delivery.loop import claim
from outbox.delivery.recovery import recover
from outbox.delivery.worker import Housekeeper
from outbox.records import STATUSES
from tests.support import assert_index_invariant, hook_settings, wait_for


def test_worker_killed_mid_delivery_then_delivered_by_another(receiver, repo, processes):
    receiver.respond((200, {}, 30.0), (200, {}, 0.0))  # the first request hangs
    with hook_settings(receiver.url):
        m = outbox.send("hook", {"order": "killed"})
    first = processes.worker("--burst", hook_url=receiver.url, visibility_timeout=2)
    try:
        assert wait_for(lambda: len(receiver.requests) == 1), (
            first.stdout.read1().decode() if first.stdout else ""
        )
        assert outbox.get(m.id).status == "sending"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(5)
    finally:
        if first.poll() is None:
            first.kill()
    assert outbox.get(m.id).status == "sending"  # nobody finished it
    time.sleep(2.1)  # past the visibility timeout
    second = processes.worker("--burst", hook_url=receiver.url, visibility_timeout=2)
    output, _ = second.communicate(timeout=60)
    assert second.returncode == 0, output.decode()
    got = outbox.get(m.id)
    assert got.status == "succeeded", output.decode()
    assert got.retry_count == 1
    assert [a.outcome for a in outbox.attempts(m.id)] == ["succeeded", "lost"]
    assert "visibility timeout" in outbox.attempts(m.id)[1].error
    assert [r.headers["webhook-id"] for r in receiver.requests] == [m.id, m.id]
    assert_index_invariant(repo)


def test_lost_message_without_retries_left_becomes_a_dead_letter_once_lost_alone(hook, repo, settings):
    # Lost from an ordinary claim (beside other attempts, for all the sweep knows), it is
    # not charged and is attempted alone once more (issue 20, item 12); lost alone, it is
    # the one that ended its worker: a dead letter.
    from outbox.delivery.loop import WorkerRun

    settings.OUTBOX = {**settings.OUTBOX, "VISIBILITY_TIMEOUT": 1}
    m = outbox.send("hook", 1, max_retries=0)
    claimed = claim("outbox", time.time())
    assert [c.id for c in claimed] == [m.id]
    assert recover().lost == 0  # not yet past the visibility timeout
    time.sleep(1.05)
    report = recover()
    assert report.lost == 1 and report.quarantined == 1
    got = outbox.get(m.id)
    assert got.status == "retrying" and got.retry_count == 0 and "not charged" in got.last_error
    assert claim("outbox", time.time()) == []  # an ordinary claim moves the suspect aside
    run = WorkerRun("outbox", repo, 5)
    assert run.write_and_claim(1) == []  # a run's claim says when (and, with partitions, where) it is due
    (alone,) = run.write_and_claim(1, quarantine=True)
    assert alone.id == m.id
    time.sleep(1.05)
    report = recover()
    assert report.lost == 1 and report.lost_alone == 1
    got = outbox.get(m.id)
    assert got.status == "failed" and "worker lost" in got.last_error and got.retry_count == 0
    assert [a.outcome for a in outbox.attempts(m.id)] == ["lost", "lost"]
    assert_index_invariant(repo)


def test_late_outcome_of_a_lost_worker_changes_nothing(hook, repo, settings):
    from outbox.delivery.outcomes import decide, rules_for, write
    from outbox.records import Outcome

    settings.OUTBOX = {**settings.OUTBOX, "VISIBILITY_TIMEOUT": 1}
    m = outbox.send("hook", 1)
    (claimed,) = claim("outbox", time.time())
    recover(now=time.time() + 2)  # taken back: retrying
    now = time.time()
    late = decide(Outcome(claimed, now, 0.0, ok=True, status_code=200), now, rules_for(claimed))
    assert write([late], time.time()) == [False]
    assert outbox.get(m.id).status == "retrying"


def test_due_message_whose_wakeup_job_vanished_is_woken_again(hook, worker, repo):
    # Fault finding (b): a job taken off the queue by a worker killed before it ran it.
    # The outbox's own indexes are the truth: the stale wake-up flag is replaced.
    from outbox.delivery.recovery import wake_due
    from outbox.store.background.wakeups import WAKE_STALE_AFTER, get_queue

    m = outbox.send("hook", 1)
    get_queue("outbox").empty()  # the job is lost; its wake-up flag stays
    worker(simple=True)
    assert outbox.get(m.id).status == "pending"
    assert wake_due(now=time.time()) == []  # the flag is fresh: a job may still be on its way
    assert wake_due(now=time.time() + WAKE_STALE_AFTER + 0.1) == ["outbox"]
    assert wake_due(now=time.time() + WAKE_STALE_AFTER + 0.2) == []  # one job, not one per check
    worker()
    assert outbox.get(m.id).status == "succeeded" and len(hook.requests) == 1


def test_a_due_retry_does_not_depend_on_rq_scheduler(receiver, repo, processes):
    # Fault finding (a): retries sat overdue while a killed process held RQ's scheduler
    # lock. Due retries are found from the retrying index by any outbox_worker.
    receiver.respond(500, 200)
    with hook_settings(receiver.url, RETRY=[1]):
        m = outbox.send("hook", 1)
        worker = processes.worker(
            "--burst", hook_url=receiver.url, visibility_timeout=30
        )  # burst: one pass, no RQ scheduler
        worker.communicate(timeout=60)
        got = outbox.get(m.id)
        assert got.status == "retrying"
        from outbox.store.background.wakeups import get_queue

        assert get_queue("outbox").scheduled_job_registry.count == 0  # nothing left to RQ
        time.sleep(max(0.0, got.next_attempt_at - time.time()) + 0.1)
        second = processes.worker("--burst", hook_url=receiver.url, visibility_timeout=30)
        output, _ = second.communicate(timeout=60)
    assert outbox.get(m.id).status == "succeeded", output.decode()


def test_recovery_sweeps_share_one_per_interval(repo):
    a, b = Housekeeper(recovery_interval=30), Housekeeper(recovery_interval=30)
    assert repo.acquire_lock("recovery", a.token, 27)
    assert not repo.acquire_lock("recovery", b.token, 27)  # the lock is held for this interval


def test_a_burst_worker_s_sweep_takes_the_lock_and_lets_it_go(hook, repo, settings, monkeypatch):
    """``outbox_worker --burst`` runs its housekeeping once: its recovery sweep is skipped
    while another process's sweep holds the lock (a long-running worker swept within
    this interval), as a long-running worker's is; when it sweeps, it lets go of the lock
    at the end, so the next burst worker sweeps again. It swept without the lock: every
    burst worker scanned every destination's indexes (the endpoints benchmark: 1.5 Redis
    commands more per delivery at 1,000 endpoints), however recently another had."""
    from outbox.delivery import worker as worker_module

    sweeps: list[float] = []
    monkeypatch.setattr(worker_module, "recover", lambda: sweeps.append(time.time()))
    held = repo.acquire_lock("recovery", "another-process", 30)
    assert held
    worker_module.run_housekeeping_once(relay=False)
    assert sweeps == []  # another process's sweep holds the lock
    assert repo.connection.get(repo.keys.lock("recovery")) == b"another-process"  # not taken from it
    repo.connection.delete(repo.keys.lock("recovery"))  # that sweep's lock lapsed
    worker_module.run_housekeeping_once(relay=False)
    worker_module.run_housekeeping_once(relay=False)
    assert len(sweeps) == 2  # each burst worker sweeps: the lock is let go after
    assert repo.connection.exists(repo.keys.lock("recovery")) == 0


def test_a_job_timeout_mid_batch_keeps_decided_outcomes_and_charges_only_the_attempt_in_flight(
    receiver, worker, repo, monkeypatch
):
    # Issue 11, finding 2: VISIBILITY_TIMEOUT=2, max_retries=0, three messages: the first
    # answered 200, the second hangs, the third not yet attempted. Before, all three
    # ended failed with a lost attempt, the delivered one included.
    from outbox.delivery import loop as delivery
    from outbox.store.background import wakeups

    monkeypatch.setattr(wakeups, "JOB_TIMEOUT_MARGIN", -1)  # RQ kills the job after 1 s
    monkeypatch.setattr(delivery, "FAILSAFE_WAIT", 0.2)
    receiver.respond((200, {}, 0.0), (200, {}, 3.0), (200, {}, 0.0))
    with hook_settings(receiver.url, MAX_IN_FLIGHT=1):
        from django.conf import settings

        with override_settings(OUTBOX={**settings.OUTBOX, "VISIBILITY_TIMEOUT": 2}):
            sent = outbox.send_many([{"destination": "hook", "body": i, "max_retries": 0} for i in range(3)])
            worker(simple=True)  # the job is killed mid-attempt of the second message
            # The roles by the order the receiver got them: on one server that is the
            # send order; in 16 partitions (the cluster) the claims' order of partitions
            first, hung = (r.headers["webhook-id"] for r in receiver.requests[:2])
            (third,) = {m.id for m in sent} - {first, hung}
            assert outbox.get(first).status == "succeeded"  # written before the second started
            assert outbox.get(hung).status == "sending"  # in flight: the lease decides
            assert outbox.attempts(hung) == []
            assert outbox.get(third).status in ("pending", "succeeded")  # never charged
            time.sleep(max(0.0, outbox.get(hung).last_attempt_at + 2.05 - time.time()))
            assert recover().lost == 1
            worker(simple=True)
    assert [a.outcome for a in outbox.attempts(first)] == ["succeeded"]
    # lost from an ordinary claim with no retry left: not charged, attempted alone once
    # more (issue 20, item 12), and delivered this time
    assert [a.outcome for a in outbox.attempts(hung)] == ["succeeded", "lost"]
    assert outbox.get(hung).retry_count == 0
    assert [a.outcome for a in outbox.attempts(third)] == ["succeeded"]
    delivered = [r.headers["webhook-id"] for r in receiver.requests]
    assert delivered.count(first) == 1 and delivered.count(third) == 1
    assert_index_invariant(repo)


def test_a_redis_error_in_the_loop_still_writes_decided_outcomes(hook, repo, monkeypatch):
    # Issue 11, finding 2: any exception escaping the loop threw decided outcomes away.
    from outbox.delivery import loop as delivery
    from outbox.store import MessageRepository

    sent = outbox.send_many([{"destination": "hook", "body": i} for i in range(3)])
    calls = {"n": 0}
    original = MessageRepository.outcomes_and_claim

    def flaky(self, request):
        if request.changes and not calls["n"]:  # the write of the first outcomes, with the next claim
            calls["n"] += 1
            raise RuntimeError("boom between two writes")
        return original(self, request)

    monkeypatch.setattr(MessageRepository, "outcomes_and_claim", flaky)
    with pytest.raises(RuntimeError):
        delivery.run("outbox")
    # What the receiver got was decided: each such message is succeeded with its one
    # attempt. On one server the first claim takes all three; in 16 partitions (the
    # cluster) a partition the first claim did not ask keeps its message pending, never
    # claimed (CI on the cluster: 2 delivered, 1 pending), which is not what this tests.
    delivered = {r.json() for r in hook.requests}
    assert delivered, "the run delivered nothing before the write that failed"
    for i, m in enumerate(sent):
        if i in delivered:
            assert outbox.get(m.id).status == "succeeded"
            assert len(outbox.attempts(m.id)) == 1
        else:
            assert outbox.get(m.id).status == "pending" and not outbox.attempts(m.id)
    if repo.keys.partitions == 1:
        assert delivered == {0, 1, 2}


def test_a_message_with_an_unusable_retry_policy_is_failed_and_recovery_goes_on(hook, repo, settings):
    # Issue 11, finding 4: a bad policy crashed the job, left the message sending, and
    # then made every recovery sweep raise.
    settings.OUTBOX = {**settings.OUTBOX, "VISIBILITY_TIMEOUT": 1}
    bad, good = outbox.send_many([{"destination": "hook", "body": i} for i in range(2)])
    repo.connection.hset(
        repo.keys.resend(bad.id), "retry", '[3, {"strategy": "exponential", "jitter": "bogus"}]'
    )
    claimed = claim("outbox", time.time())
    assert {m.id for m in claimed} == {bad.id, good.id}
    report = recover(now=time.time() + 2)  # both leases expired
    assert report.lost == 2
    got = outbox.get(bad.id)
    assert got.status == "failed" and "retry policy cannot be used" in got.last_error
    assert outbox.get(good.id).status == "retrying"
    assert_index_invariant(repo)


def test_retention_keeps_pace_in_one_sweep(repo, settings):
    # Issue 11, finding 9: 1,000 per status per sweep could not keep up with delivery.
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION": {"succeeded": 60, "cancelled": 60, "failed": None}}
    sent = outbox.send_many([{"destination": "mem", "body": i} for i in range(2500)])
    outbox.cancel([m.id for m in sent])
    report = recover(now=time.time() + 61, limit=1000, purge_budget=30)
    assert report.purged == 2500 and report.purge_backlog == 0
    assert repo.count() == 0


def test_retention_deletes_old_finished_messages_but_keeps_dead_letters(repo, settings, worker):
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION": {"succeeded": 60, "cancelled": 60, "failed": None}}
    done = outbox.send("mem", "done")
    withdrawn = outbox.send("mem", "withdrawn")
    outbox.cancel(withdrawn.id)
    dead = outbox.send("mem", "dead", max_retries=0)
    now = time.time()
    from outbox.delivery.outcomes import decide, rules_for, write
    from outbox.records import Outcome

    claimed = {m.id: m for m in claim("outbox", now)}
    write(
        [
            decide(Outcome(claimed[done.id], now, 0.0, ok=True), now, rules_for(claimed[done.id])),
            decide(Outcome(claimed[dead.id], now, 0.0, error="x"), now, rules_for(claimed[dead.id])),
        ],
        now,
    )
    assert recover(now=now + 30).purged == 0  # younger than their retention
    assert recover(now=now + 61).purged == 2
    assert outbox.get(dead.id).status == "failed"  # dead letters stay until a person acts
    assert repo.count() == 1
    assert_index_invariant(repo)


def as_before_0_3(repo, messages, schema: int) -> None:
    """Make ``messages`` (pending) look written by an older version: listed in the indexes
    across destinations that older versions kept, at schema ``schema``."""
    created, pending = repo.keys.legacy_indexes(["pending"])
    repo.connection.zadd(created, {m.id: m.created_at for m in messages})
    repo.connection.zadd(pending, {m.id: m.created_at for m in messages})
    repo.connection.set(f"{repo.keys.prefix}:schema", schema)


#: Records written before partitions existed are those of a deployment of one partition:
#: a deployment of several starts empty (its partition count is fixed when it is set up,
#: and its keys carry hash tags no older version wrote), so there is nothing of theirs
#: to put back there.
BEFORE_PARTITIONS = "older versions wrote a deployment of one partition only"


@pytest.mark.skipif(outbox_settings.partitions > 1, reason=BEFORE_PARTITIONS)
def test_messages_written_by_version_0_1_are_claimed_after_an_upgrade(hook, worker, repo):
    # Version 0.1 kept pending/retrying messages only in the status indexes.
    old = outbox.send_many([{"destination": "hook", "body": i} for i in range(3)])
    as_before_0_3(repo, old, schema=0)
    repo.connection.delete(repo.keys.due("outbox"), f"{repo.keys.prefix}:schema")
    worker(simple=True)  # its housekeeping pass runs the sweep, which upgrades
    assert {outbox.get(m.id).status for m in old} == {"succeeded"}
    assert repo.upgrade() == 0  # once
    assert_index_invariant(repo)  # the indexes across destinations are gone


def test_an_upgrade_of_a_new_redis_reports_nothing_put_back(hook, repo):
    """On a Redis whose schema key is missing but whose messages are all in their due
    index (a new install), the upgrade counts what it put back: none."""
    sent = outbox.send_many([{"destination": "hook", "body": i} for i in range(3)])
    repo.connection.delete(f"{repo.keys.prefix}:schema")
    assert repo.upgrade() == 0
    if repo.keys.partitioned:
        return  # the rest puts back records of an older version: see BEFORE_PARTITIONS
    as_before_0_3(repo, sent, schema=0)
    repo.connection.delete(repo.keys.due("outbox"))
    assert repo.upgrade() == 3


def test_an_upgrade_from_0_2_drops_the_indexes_across_destinations(hook, worker, repo):
    """Older versions (schema < 3) also listed every message in ``outbox:created`` and
    ``outbox:status:<status>``; each is in its destination's indexes too, so the upgrade
    deletes them, and lists, counts and delivery read the same."""
    sent = outbox.send_many([{"destination": "hook", "body": i} for i in range(3)])
    as_before_0_3(repo, sent, schema=2)
    assert repo.upgrade() == 0
    assert not repo.connection.exists(*repo.keys.legacy_indexes(STATUSES))
    assert repo.count("pending") == 3 and set(repo.filter()) == {m.id for m in sent}
    worker(simple=True)
    assert {outbox.get(m.id).status for m in sent} == {"succeeded"}
    assert_index_invariant(repo)


def test_outbox_recover_repairs_index_entries_whose_record_disagrees(repo):
    """Issue 31, item 5: index entries left by a defect (a message gone, or moved on to
    another status) made counts lie for good: nothing took them out. `outbox_recover
    --repair-indexes` does, counts them, and leaves every true entry alone."""
    import io

    from django.core.management import call_command

    from outbox.records import partition_of
    from tests.support import assert_index_invariant

    for n in range(3):
        outbox.send("mem", {"n": n})  # three true pending entries, left alone
    cancelled = outbox.send("mem", {"n": 9})
    outbox.cancel([cancelled.id])
    conn, keys = repo.connection, repo.keys.of(cancelled.id)  # the indexes of its partition
    queue = outbox.get(cancelled.id).queue
    # as the old bulk.lua left them: a cancelled message still pending and due, and a
    # deleted one still counted
    conn.zadd(keys.status("pending", "mem"), {cancelled.id: 1.0})
    conn.zadd(keys.due(queue), {cancelled.id: 1.0})
    first = cancelled.id
    gone = first[:10] + ("f" if first[10] != "f" else "e") + first[11:]  # no such message, same partition
    conn.zadd(keys.status("pending", "mem"), {gone: 2.0})
    stale = 2
    if repo.keys.partitioned:  # and an id of another partition (its record in another slot)
        k = partition_of(first)
        conn.zadd(keys.status("pending", "mem"), {f"{first.rsplit('_p', 1)[0]}_p{(k + 1) % 16}": 3.0})
        stale = 3
    assert repo.counts()["pending"] == 3 + stale  # the lie: 3 are pending

    out = io.StringIO()
    call_command("outbox_recover", "--repair-indexes", stdout=out)
    expected = f"repaired: {stale + 1} index entries whose record disagreed (due 1, pending {stale})"
    assert expected in out.getvalue(), out.getvalue()
    assert repo.counts()["pending"] == 3 and repo.counts()["cancelled"] == 1
    assert_index_invariant(repo)
    out = io.StringIO()
    call_command("outbox_recover", "--repair-indexes", stdout=out)
    assert "repaired: 0 index entries" in out.getvalue()
