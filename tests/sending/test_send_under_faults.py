"""Issue 11, "lose nothing", on the sending side: a message sent while Redis is down is
captured with the caller's transaction and relayed later, and one idempotency key sent
from many threads or transactions at once is one message. Each reproduction of the fault
runs as a test on real parts (a private Redis, PostgreSQL where one answers); the worker
side is in tests/delivery/test_worker_under_faults.py."""

from __future__ import annotations

import threading
import time

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.db import transaction
from django.test import override_settings

import outbox
from outbox.testing import free_port
from tests.support import redis_at

DEAD_REDIS = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


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
