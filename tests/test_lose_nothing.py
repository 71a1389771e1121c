"""Issue 11, "lose nothing": each reproduction of the fault runs as a test on real parts
(a private Redis, real worker processes, real receivers, PostgreSQL where one answers)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.db import transaction
from django.test import override_settings

import outbox
from outbox.testing import RedisServer, free_port
from tests.support import ROOT, assert_index_invariant, wait_for

DEAD_REDIS = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


def redis_at(url: str) -> override_settings:
    """The outbox's cache alias pointed at ``url`` (short socket timeouts)."""
    caches = {
        **django_settings.CACHES,
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 1},
        },
    }
    return override_settings(CACHES=caches)


# -- 1. Redis down at commit ---------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_redis_down_at_commit_keeps_the_message_and_the_relay_delivers_it(repo, worker):
    from outbox.models import CapturedMessage
    from outbox.sending.capture import relay

    with redis_at(DEAD_REDIS):
        with transaction.atomic():
            Group.objects.create(name="order-1")  # the caller's own row
            m = outbox.send("mem", {"order": 1})
        assert Group.objects.filter(name="order-1").exists()  # committed
        assert CapturedMessage.objects.filter(id=m.id).exists()  # and so is the message
        assert outbox.get(m.id).status == "pending"  # readable while Redis is away
    assert not repo.connection.exists(repo.keys.message(m.id))
    assert relay("default", older_than=0) == 1  # Redis is back: the relay pushes it
    assert not CapturedMessage.objects.exists()
    assert relay("default", older_than=0) == 0
    worker(simple=True)
    assert outbox.get(m.id).status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_fast_path_and_relay_racing_make_one_message(repo):
    from outbox.models import CapturedMessage
    from outbox.sending.capture import push, relay

    with redis_at(DEAD_REDIS), transaction.atomic():
        m = outbox.send("mem", {"order": 2})
    message = outbox.get(m.id)  # from the capture table
    assert relay("default", older_than=0) == 1
    push([message], "default")  # a late fast path pushes the same message again
    assert repo.count() == 1 and not CapturedMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_worker_relays_captured_messages(repo):
    """The relay runs in outbox_worker's housekeeping (burst: one pass)."""
    from outbox.delivery.worker import run_housekeeping_once

    with redis_at(DEAD_REDIS), transaction.atomic():
        m = outbox.send("mem", {"order": 3})
    with override_settings(OUTBOX={**django_settings.OUTBOX, "RELAY_AFTER": 0}):
        run_housekeeping_once()  # (the test may not touch the 'postgres' alias: logged, skipped)
    assert repo.get(m.id).status == "pending"


def test_redis_down_outside_a_transaction_is_a_clear_error_within_a_bounded_time(repo):
    with redis_at(DEAD_REDIS):
        started = time.monotonic()
        with pytest.raises(outbox.OutboxUnavailable, match="nothing was stored"):
            outbox.send("mem", {"order": 4})
        assert time.monotonic() - started < 10
    assert repo.count() == 0


# -- 5. idempotency under concurrency ------------------------------------------------------
def test_same_key_from_eight_threads_gives_every_caller_the_one_message(repo):
    barrier = threading.Barrier(8)
    ids: list[str] = []

    def send() -> None:
        barrier.wait()
        ids.append(outbox.send("mem", {"order": 5}, idempotency_key="order-5").id)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    assert repo.count() == 1 and outbox.get(ids[0]).json() == {"order": 5}


@pytest.mark.skipif(bool(django_settings.POSTGRES_MISSING), reason=django_settings.POSTGRES_MISSING or "")
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_same_key_from_eight_concurrent_transactions_returns_the_id_that_exists(repo):
    barrier = threading.Barrier(8)
    ids: list[str] = []
    errors: list[BaseException] = []

    def send(n: int) -> None:
        from django.db import connections

        try:
            with transaction.atomic(using="postgres"):
                barrier.wait()
                ids.append(outbox.send("mem", {"order": 6}, idempotency_key="order-6", using="postgres").id)
                time.sleep(0.05 * (n % 3))  # commit at different moments
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(ids) == 8 and len(set(ids)) == 1
    assert repo.count() == 1
    assert outbox.get(ids[0]).json() == {"order": 6}  # the id every caller got exists


# -- 2. a poison message in a batch --------------------------------------------------------
def test_a_poison_message_in_a_batch_dead_letters_without_repeating_its_batch_mates(
    repo, tmp_path, processes
):
    log = tmp_path / "delivered.txt"
    bodies = [{"n": i, "poison": i == 10} for i in range(20)]
    sent = outbox.send_many([{"destination": "poison", "body": b} for b in bodies])
    poison = sent[10]
    env = {"OUTBOX_TEST_DELIVERY_LOG": str(log)}
    for _ in range(8):  # each worker run dies on the poison until it is a dead letter
        worker = processes.worker(
            "--burst", hook_url="http://127.0.0.1:9/hook", visibility_timeout=2, env=env
        )
        worker.communicate(timeout=60)
        if outbox.get(poison.id).status == "failed" and all(
            outbox.get(m.id).status == "succeeded" for m in sent if m is not poison
        ):
            break
        time.sleep(2.1)  # past the poison's lease: the next worker's sweep takes it back
    delivered = log.read_text().split()
    for m in sent:
        if m is not poison:
            # In flight beside the poison at its first crash: taken back once (a lost
            # attempt, charged once), then attempted alone (issue 20, item 12). One that
            # had answered just before the crash is delivered again (at least once).
            lost = [a for a in outbox.attempts(m.id) if a.outcome == "lost"]
            assert len(lost) <= 1 and delivered.count(m.id) <= 1 + len(lost), (
                f"{m.id} delivered {delivered.count(m.id)} times, {len(lost)} lost attempts"
            )
            assert outbox.get(m.id).status == "succeeded"
    got = outbox.get(poison.id)
    assert got.status == "failed" and [a.outcome for a in outbox.attempts(poison.id)] == ["lost"] * 3
    assert_index_invariant(repo)


# -- 8. workers ride out a Redis restart ---------------------------------------------------
def test_a_worker_rides_out_a_redis_restart(receiver, tmp_path, processes):
    port = free_port()
    server = RedisServer(port=port).start()
    url = server.url
    worker = processes.worker(hook_url=receiver.url, visibility_timeout=30, redis_url=url)
    try:
        with redis_at(url), override_settings(OUTBOX={**django_settings.OUTBOX}):
            first = outbox.send("hook", {"n": 1})
            assert wait_for(lambda: outbox.get(first.id).status == "succeeded", timeout=20)
            server.process.send_signal(signal.SIGKILL)
            server.process.wait()
            time.sleep(2)
            server = RedisServer(port=port).start()  # empty: it kept nothing
            second = outbox.send("hook", {"n": 2})
            assert wait_for(lambda: outbox.get(second.id).status == "succeeded", timeout=40), worker_output(
                worker
            )
        assert worker.poll() is None, "the worker exited when Redis went away"
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(10)
        except Exception:
            worker.kill()
        server.stop()


def worker_output(process) -> str:
    process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=10)
    except Exception:
        process.kill()
        out, _ = process.communicate()
    return out.decode(errors="replace")[-3000:]


assert os.path.isdir(ROOT / "outbox")
