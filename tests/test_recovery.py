"""Nothing stays stuck: a worker killed mid-delivery, and due messages whose job is gone."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.test import override_settings

import outbox
from outbox.recovery import RecoveryLoop, recover
from tests.conftest import assert_index_invariant, hook_settings

ROOT = Path(__file__).resolve().parent.parent


def start_worker(receiver_url: str, visibility_timeout: int, *extra: str) -> subprocess.Popen:
    """A real ``outbox_worker`` process on the test Redis (it inherits OUTBOX_TEST_REDIS_URL)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "OUTBOX_TEST_HOOK_URL": receiver_url,
        "OUTBOX_TEST_VISIBILITY_TIMEOUT": str(visibility_timeout),
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "django", "outbox_worker", "--burst", *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_for(predicate, timeout=15.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def test_worker_killed_mid_delivery_then_delivered_by_another(receiver, repo):
    receiver.respond((200, {}, 30.0), (200, {}, 0.0))  # the first request hangs
    with hook_settings(receiver.url):
        m = outbox.send("hook", {"order": "killed"})
    first = start_worker(receiver.url, visibility_timeout=2)
    try:
        assert wait_for(lambda: len(receiver.requests) == 1), first.stdout.read1().decode() if first.stdout else ""
        assert outbox.get(m.id).status == "sending"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(5)
    finally:
        if first.poll() is None:
            first.kill()
    assert outbox.get(m.id).status == "sending"  # nobody finished it
    time.sleep(2.1)  # past the visibility timeout
    second = start_worker(receiver.url, visibility_timeout=2)
    output, _ = second.communicate(timeout=60)
    assert second.returncode == 0, output.decode()
    got = outbox.get(m.id)
    assert got.status == "succeeded", output.decode()
    assert got.retry_count == 1
    assert [a.outcome for a in outbox.attempts(m.id)] == ["succeeded", "lost"]
    assert "visibility timeout" in outbox.attempts(m.id)[1].error
    assert [r.headers["webhook-id"] for r in receiver.requests] == [m.id, m.id]
    assert_index_invariant(repo)


def test_lost_message_without_retries_left_becomes_a_dead_letter(hook, repo, settings):
    from outbox.delivery import claim

    settings.OUTBOX = {**settings.OUTBOX, "VISIBILITY_TIMEOUT": 1}
    m = outbox.send("hook", 1, max_retries=0)
    claimed, _ = claim([m.id], time.time())
    assert [c.id for c in claimed] == [m.id]
    assert recover().lost == 0  # not yet past the visibility timeout
    report = recover(now=time.time() + 2)
    assert report.lost == 1
    got = outbox.get(m.id)
    assert got.status == "failed" and "worker lost" in got.last_error
    assert_index_invariant(repo)


def test_late_outcome_of_a_lost_worker_changes_nothing(hook, repo, settings):
    from outbox.delivery import claim, decide, write

    settings.OUTBOX = {**settings.OUTBOX, "VISIBILITY_TIMEOUT": 1}
    m = outbox.send("hook", 1)
    (claimed,), _ = claim([m.id], time.time())
    recover(now=time.time() + 2)  # taken back: retrying
    late = decide(claimed, now=time.time(), ok=True, status_code=200)
    assert write([late], time.time()) == [False]
    assert outbox.get(m.id).status == "retrying"


def test_due_message_whose_job_vanished_is_enqueued_again(hook, worker, repo):
    from outbox.dispatch import get_queue

    m = outbox.send("hook", 1)
    get_queue("outbox").empty()  # the job is lost (deleted by hand, Redis lost it...)
    worker(simple=True)
    assert outbox.get(m.id).status == "pending"
    assert recover(now=m.created_at + 0.5).reenqueued == 0  # within RECOVERY_GRACE (1 s in tests)
    assert recover(now=m.created_at + 5).reenqueued == 1
    assert recover(now=m.created_at + 5).reenqueued == 0  # its new job is queued: left alone
    worker()
    assert outbox.get(m.id).status == "succeeded" and len(hook.requests) == 1


def test_recovery_loops_share_one_sweep_per_interval(repo):
    a, b = RecoveryLoop(interval=30), RecoveryLoop(interval=30)
    assert a.sweep_once() is not None
    assert b.sweep_once() is None  # the lock is held for this interval


def test_a_job_timeout_is_not_blamed_on_the_message(receiver, worker, repo):
    receiver.respond((200, {}, 3.0), (200, {}, 0.0))
    with hook_settings(receiver.url):
        from django.conf import settings

        with override_settings(OUTBOX={**settings.OUTBOX, "VISIBILITY_TIMEOUT": 1}):
            m = outbox.send("hook", 1)
            worker(simple=True)  # RQ kills the job after 1 s, mid-request
            got = outbox.get(m.id)
            assert got.status == "sending" and outbox.attempts(m.id) == []
            time.sleep(max(0.0, got.last_attempt_at + 1.05 - time.time()))  # past the lease
            assert recover().lost == 1
            worker(simple=True)
    got = outbox.get(m.id)
    assert got.status == "succeeded"
    assert [a.outcome for a in outbox.attempts(m.id)] == ["succeeded", "lost"]


def test_retention_deletes_old_finished_messages_but_keeps_dead_letters(repo, settings, worker):
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION": {"succeeded": 60, "cancelled": 60, "failed": None}}
    done = outbox.send("mem", "done")
    withdrawn = outbox.send("mem", "withdrawn")
    outbox.cancel(withdrawn.id)
    dead = outbox.send("mem", "dead", max_retries=0)
    now = time.time()
    from outbox.delivery import claim, decide, write

    claimed = {m.id: m for m in claim([done.id, dead.id], now)[0]}
    write([decide(claimed[done.id], now=now, ok=True), decide(claimed[dead.id], now=now, ok=False, error="x")], now)
    assert recover(now=now + 30).purged == 0  # younger than their retention
    assert recover(now=now + 61).purged == 2
    assert outbox.get(dead.id).status == "failed"  # dead letters stay until a person acts
    assert repo.count() == 1
    assert_index_invariant(repo)
