"""Ordered delivery inside transactions (issue 23, "Which order"): the messages of one
(destination, ordering key) sent inside transactions are delivered in commit order.

A per-key sequence row in the database (``OrderingSequence``), incremented in the
sending transaction and locked until it ends, numbers the key's captured messages in
commit order; every push (the on-commit fast path, the relay) writes the key's earlier
captured rows to Redis before its own. Real Redis, real burst workers, SQLite (the
default alias) and PostgreSQL (the ``postgres`` alias, where one answers: see
tests/settings.py), threads with a PostgreSQL connection each for the concurrent cases.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Group
from django.db import connections, transaction

import outbox
from outbox.transports import locmem
from tests.support import redis_down, settle, wait_for

PG_MISSING = django_settings.POSTGRES_MISSING
needs_postgres = pytest.mark.skipif(bool(PG_MISSING), reason=PG_MISSING or "")
DATABASES = ["default"] if PG_MISSING else ["default", "postgres"]
db = pytest.mark.django_db(transaction=True, databases=DATABASES)
on_postgres = pytest.mark.django_db(transaction=True, databases=DATABASES)
ALIASES = [
    pytest.param("default", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=needs_postgres),
]
KEY = "order-42"


@pytest.fixture(autouse=True)
def delivered() -> Iterator[list]:
    """The locmem transport's list of delivered messages, emptied around the test."""
    locmem.outbox.clear()
    yield locmem.outbox
    locmem.outbox.clear()


def captured(alias: str):
    from outbox.models import CapturedMessage

    return CapturedMessage.objects.using(alias)


def sequences(alias: str):
    from outbox.models import OrderingSequence

    return OrderingSequence.objects.using(alias)


def redis_seq(message) -> int | None:
    """The message's sequence in its key as Redis gave it (None while only captured)."""
    return outbox.get(message.id).order_seq


def delivery_order(worker, messages) -> list[str]:
    """Deliver ``messages`` with burst workers; their ids in the order they were delivered."""
    settle(worker, [m.id for m in messages])
    ids = {m.id for m in messages}
    return [m.id for m in locmem.outbox if m.id in ids]


def send(alias: str, n: int, key: str = KEY, destination: str = "mem", **kwargs):
    return outbox.send(destination, {"n": n}, ordering_key=key, using=alias, **kwargs)


def in_thread(target: Callable[[], None], errors: list[BaseException]) -> threading.Thread:
    """A started thread running ``target`` with a database connection of its own
    (closed at the end); what it raises goes to ``errors``."""

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def waiting_on_a_lock() -> int:
    """PostgreSQL backends of the test database waiting for a lock (another's row)."""
    with connections["postgres"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


# -- (a) commit order, not start order -----------------------------------------------------
@needs_postgres
@on_postgres
def test_a_key_is_in_commit_order_when_the_later_transaction_pushes_first(worker):
    """T2 starts first; T1 sends to the key first; T2's send waits on the key's row until
    T1 commits. T1's own push is held back until T2 has committed and pushed: T2's push
    writes T1's message first, so T1's message comes first in Redis and on the wire."""
    t1_sent, t2_started, go, t2_done = (threading.Event() for _ in range(4))
    sent: dict[str, object] = {}
    errors: list[BaseException] = []

    def before_own_push() -> None:  # T1's on-commit callbacks run in order: this one first
        assert t2_done.wait(30)
        sent["t1 in Redis before its own push"] = redis_seq(sent["t1"])

    def t1() -> None:
        with transaction.atomic(using="postgres"):
            transaction.on_commit(before_own_push, using="postgres")
            sent["t1"] = send("postgres", 1)
            t1_sent.set()
            assert go.wait(30)

    def t2() -> None:
        try:
            with transaction.atomic(using="postgres"):
                Group.objects.using("postgres").create(name="t2")  # T2's transaction started
                t2_started.set()
                assert t1_sent.wait(30)
                sent["t2"] = send("postgres", 2)  # waits for T1's commit
        finally:
            t2_done.set()

    second = in_thread(t2, errors)
    assert t2_started.wait(30)
    first = in_thread(t1, errors)
    assert t1_sent.wait(30), errors
    assert wait_for(lambda: waiting_on_a_lock() >= 1, timeout=15), "T2's send did not wait for T1's key row"
    assert "t2" not in sent  # still waiting
    go.set()
    first.join(60)
    second.join(60)
    assert not errors, errors
    m1, m2 = sent["t1"], sent["t2"]
    assert sent["t1 in Redis before its own push"] == 1  # T2's push wrote it, first
    assert redis_seq(m1) < redis_seq(m2)
    assert not captured("postgres").exists()
    assert delivery_order(worker, [m1, m2]) == [m1.id, m2.id]


# -- (b) Redis down at the first commit ----------------------------------------------------
@pytest.mark.parametrize("alias", ALIASES)
@db
def test_a_later_commit_pushes_the_earlier_captured_message_first(alias, worker):
    with redis_down(), transaction.atomic(using=alias):
        m1 = send(alias, 1)
    assert captured(alias).filter(id=m1.id).exists()  # its push failed: still captured
    with transaction.atomic(using=alias):
        m2 = send(alias, 2)
    assert (redis_seq(m1), redis_seq(m2)) == (1, 2)
    assert not captured(alias).exists()  # both pushed, both rows gone
    assert delivery_order(worker, [m1, m2]) == [m1.id, m2.id]


@pytest.mark.parametrize("alias", ALIASES)
@db
def test_while_redis_is_down_the_relay_pushes_a_key_in_commit_order(alias, worker):
    from outbox.sending.capture import relay

    with redis_down():
        sent = []
        for n in range(5):
            with transaction.atomic(using=alias):
                sent.append(send(alias, n))
        with transaction.atomic(using=alias):
            other = send(alias, 9, key="order-43")
    # the relay takes rows oldest first: make the key's last message look the oldest
    captured(alias).filter(id=sent[-1].id).update(created_at=1.0)
    assert relay(alias, older_than=0, limit=2) == 6
    assert [redis_seq(m) for m in sent] == [1, 2, 3, 4, 5]
    assert redis_seq(other) == 1
    assert not captured(alias).exists()
    assert delivery_order(worker, sent) == [m.id for m in sent]


@pytest.mark.parametrize("alias", ALIASES)
@db
def test_a_relay_batch_holding_only_a_later_row_pushes_the_earlier_rows_first(alias):
    from outbox.sending.capture import relay

    with redis_down():
        with transaction.atomic(using=alias):
            m1 = send(alias, 1)
        with transaction.atomic(using=alias):
            m2 = send(alias, 2)
    captured(alias).filter(id=m1.id).update(created_at=time.time() + 3600)  # not due for the relay
    assert relay(alias, older_than=0) == 2  # the batch is m2 alone; m1 is pushed (and counted) with it
    assert (redis_seq(m1), redis_seq(m2)) == (1, 2)  # m1 went first all the same
    assert not captured(alias).exists()  # m1's row, pushed too, is gone with m2's


@pytest.mark.parametrize("alias", ALIASES)
@db
def test_while_redis_is_down_nothing_of_the_key_is_pushed(alias):
    from outbox.sending.capture import push

    with redis_down():
        with transaction.atomic(using=alias):
            m1 = send(alias, 1)
        with transaction.atomic(using=alias):
            m2 = send(alias, 2)
        push([m2], alias)  # a fast path that fails again
    assert captured(alias).count() == 2
    assert outbox.get(m1.id).order_seq is None and outbox.get(m2.id).order_seq is None  # captured only


# -- (c) rollbacks -------------------------------------------------------------------------
@pytest.mark.parametrize("alias", ALIASES)
@db
def test_a_rollback_leaves_no_gap_and_no_message(alias, worker):
    from outbox.sending.capture import relay

    with redis_down():
        with pytest.raises(RuntimeError), transaction.atomic(using=alias):
            gone = send(alias, 0)
            raise RuntimeError("rolled back")
        with transaction.atomic(using=alias):
            m1 = send(alias, 1)
            with pytest.raises(RuntimeError), transaction.atomic(using=alias):  # a savepoint
                also_gone = send(alias, 2)
                raise RuntimeError("rolled back to the savepoint")
            m3 = send(alias, 3)
        assert dict(captured(alias).values_list("id", "order_seq")) == {m1.id: 1, m3.id: 2}
        assert sequences(alias).get(destination="mem", ordering_key=KEY).last == 2
    relay(alias, older_than=0)
    assert (redis_seq(m1), redis_seq(m3)) == (1, 2)
    for m in (gone, also_gone):
        with pytest.raises(outbox.MessageNotFound):
            outbox.get(m.id)
    assert delivery_order(worker, [m1, m3]) == [m1.id, m3.id]


@pytest.mark.parametrize("alias", ALIASES)
@db
def test_a_repeated_idempotency_key_takes_no_number(alias):
    with redis_down(), transaction.atomic(using=alias):
        m1 = send(alias, 1, idempotency_key="pay-1")
        again = send(alias, 1, idempotency_key="pay-1")
        m2 = send(alias, 2)
    assert again.id == m1.id
    assert dict(captured(alias).values_list("id", "order_seq")) == {m1.id: 1, m2.id: 2}


@pytest.mark.parametrize("alias", ALIASES)
@db
def test_send_many_numbers_each_key_in_item_order(alias):
    from outbox.sending.capture import relay

    keys = ["A", "B", "A", "A", None, "B"]
    items = [{"destination": "mem", "body": {"n": n}, "ordering_key": key} for n, key in enumerate(keys)]
    with redis_down(), transaction.atomic(using=alias):
        sent = outbox.send_many(items, using=alias)
    assert dict(captured(alias).values_list("id", "order_seq")) == {
        m.id: seq for m, seq in zip(sent, [1, 1, 2, 3, None, 2], strict=True)
    }
    with transaction.atomic(using=alias):
        last = send(alias, 6, key="A")  # its push takes A's earlier rows along, not B's
    assert [redis_seq(sent[i]) for i in (0, 2, 3)] + [redis_seq(last)] == [1, 2, 3, 4]
    assert set(captured(alias).values_list("id", flat=True)) == {sent[1].id, sent[4].id, sent[5].id}
    relay(alias, older_than=0)
    assert [redis_seq(sent[i]) for i in (1, 5)] == [1, 2]
    assert outbox.get(sent[4].id).status == "pending" and not captured(alias).exists()


# -- (d) keys do not wait for each other ---------------------------------------------------
@needs_postgres
@on_postgres
def test_other_keys_and_other_destinations_do_not_wait_for_an_open_transaction():
    held, go = threading.Event(), threading.Event()
    sent: dict[str, object] = {}
    errors: list[BaseException] = []

    def holder() -> None:
        with transaction.atomic(using="postgres"):
            sent["held"] = send("postgres", 1)
            held.set()
            assert go.wait(30)

    def other() -> None:
        with transaction.atomic(using="postgres"):
            sent["key"] = send("postgres", 2, key="order-43")
            sent["destination"] = send("postgres", 3, destination="hook")  # same key, another destination
            sent["plain"] = outbox.send("mem", {"n": 4}, using="postgres")

    first = in_thread(holder, errors)
    assert held.wait(30), errors
    second = in_thread(other, errors)
    second.join(15)
    finished = not second.is_alive()
    go.set()
    first.join(30)
    second.join(30)
    assert not errors, errors
    assert finished, "a send to another key waited for an open transaction"
    assert [redis_seq(sent[k]) for k in ("held", "key", "destination")] == [1, 1, 1]


# -- (e) transactional and non-transactional sends of one key ------------------------------
@pytest.mark.parametrize("alias", ALIASES)
@db
def test_a_captured_message_is_ordered_when_it_is_pushed(alias, worker):
    """A send outside a transaction is ordered when Redis accepts it; a captured message
    that missed its commit push takes its place when the relay pushes it, after the
    non-transactional sends made meanwhile."""
    from outbox.sending.capture import relay

    with redis_down(), transaction.atomic(using=alias):
        captured_first = send(alias, 1)
    direct = outbox.send("mem", {"n": 2}, ordering_key=KEY)  # Redis is back: accepted now
    relay(alias, older_than=0)
    assert (redis_seq(direct), redis_seq(captured_first)) == (1, 2)
    with transaction.atomic(using=alias):
        after = send(alias, 3)
    assert redis_seq(after) == 3
    assert delivery_order(worker, [captured_first, direct, after]) == [direct.id, captured_first.id, after.id]


# -- pushes that Redis refused in part -----------------------------------------------------
@pytest.mark.parametrize("alias", ALIASES)
@db
def test_a_push_refused_for_another_message_s_conflict_keeps_the_row(alias, repo):
    """An idempotency conflict refuses the other messages of its script call (nothing is
    half-written): their rows stay and a later push writes them, in order."""
    from outbox.sending.capture import relay

    with redis_down():
        with transaction.atomic(using=alias):
            taken = outbox.send("mem", {"body": "A"}, idempotency_key="pay-7", using=alias)
        with transaction.atomic(using=alias):
            m1 = send(alias, 1)
        with transaction.atomic(using=alias):
            m2 = send(alias, 2)
    outbox.send("mem", {"body": "B"}, idempotency_key="pay-7")  # the key, taken meanwhile
    for _ in range(3):
        relay(alias, older_than=0)
    assert not captured(alias).exists()
    with pytest.raises(outbox.MessageNotFound):
        repo.get(taken.id)  # refused for good (logged)
    assert (redis_seq(m1), redis_seq(m2)) == (1, 2)


# -- the sequence table stays small --------------------------------------------------------
@pytest.mark.parametrize("alias", ALIASES)
@db
def test_the_relay_deletes_the_sequences_of_keys_with_nothing_captured(alias):
    from outbox.sending.capture import relay

    with redis_down(), transaction.atomic(using=alias):
        waiting = send(alias, 1, key="held")
    with transaction.atomic(using=alias):
        send(alias, 1, key="done")
    assert set(sequences(alias).values_list("ordering_key", flat=True)) == {"held", "done"}
    captured(alias).filter(id=waiting.id).update(created_at=time.time() + 3600)  # not the relay's yet
    relay(alias, older_than=0)
    assert list(sequences(alias).values_list("ordering_key", "last")) == [("held", 1)]
    with transaction.atomic(using=alias):
        again = send(alias, 2, key="done")  # starts again at 1 in the database
        also = send(alias, 2, key="held")
    assert (redis_seq(again), redis_seq(waiting), redis_seq(also)) == (2, 1, 2)


@pytest.mark.parametrize("alias", ALIASES)
@db
def test_one_relay_pass_deletes_every_unused_sequence_row(alias):
    """Issue 30, also checked: a pass deleted at most 500 rows (the first 500), so more
    new keys per pass than that grew the table without bound; the pass now goes through
    the table in batches of 500."""
    from outbox.models import OrderingSequence
    from outbox.sending import sequences as sequences_module
    from outbox.sending.capture import relay

    sequences(alias).bulk_create(
        [OrderingSequence(destination="mem", ordering_key=f"k{i}", last=1) for i in range(1201)]
    )
    with redis_down(), transaction.atomic(using=alias):
        kept = send(alias, 1, key="still-captured")
    captured(alias).filter(id=kept.id).update(created_at=time.time() + 3600)  # not the relay's yet
    assert sequences(alias).count() == 1202
    assert sequences_module.PRUNE_BATCH == 500
    relay(alias, older_than=0)
    assert list(sequences(alias).values_list("ordering_key", flat=True)) == ["still-captured"]


@needs_postgres
@on_postgres
@pytest.mark.parametrize("skip_locked", [True, False], ids=["skip-locked", "nowait-only"])
def test_pruning_skips_a_key_an_open_transaction_holds_and_never_waits_for_it(skip_locked, monkeypatch):
    """Also where the database has NOWAIT but no SKIP LOCKED (MariaDB 10.5): before issue
    30 nothing was pruned there at all."""
    from outbox.sending import sequences as sequences_module

    features = type(connections["postgres"].features)  # every connection's, the pruner's thread too
    monkeypatch.setattr(features, "has_select_for_update_skip_locked", skip_locked)
    with transaction.atomic(using="postgres"):
        send("postgres", 1)  # the key's row exists, nothing captured: prunable
        send("postgres", 1, key="free")  # another key's: prunable, and not held
    held, go = threading.Event(), threading.Event()
    sent: dict[str, object] = {}
    errors: list[BaseException] = []

    def holder() -> None:
        with transaction.atomic(using="postgres"):
            sent["held"] = send("postgres", 2)  # number 2, uncommitted, the key's row locked
            held.set()
            assert go.wait(30)

    thread = in_thread(holder, errors)
    assert held.wait(30), errors
    pruned: list[int] = []
    pruner = in_thread(lambda: pruned.append(sequences_module.prune("postgres")), errors)
    pruner.join(15)
    finished = not pruner.is_alive()
    go.set()
    thread.join(30)
    pruner.join(30)
    assert not errors, errors
    assert finished, "pruning waited for an open transaction"
    assert pruned == [1]  # the free key's row
    assert sequences("postgres").get(ordering_key=KEY).last == 2  # kept, and numbered on
    assert not sequences("postgres").filter(ordering_key="free").exists()
    assert redis_seq(sent["held"]) == 2


@db
def test_numbers_where_an_update_cannot_return_rows(monkeypatch):
    """Databases without ``UPDATE ... RETURNING``: an update, then a read of the row."""
    monkeypatch.setattr(connections["default"].features, "can_return_columns_from_insert", False)
    with redis_down(), transaction.atomic():
        sent = [send("default", n, key=key) for n, key in enumerate(["A", "A", "B", "A"])]
    assert [captured("default").get(id=m.id).order_seq for m in sent] == [1, 2, 1, 3]
    assert dict(sequences("default").values_list("ordering_key", "last")) == {"A": 3, "B": 1}


@needs_postgres
@on_postgres
def test_concurrent_transactions_fast_paths_and_a_relay_keep_each_key_in_commit_order():
    """Four threads commit 15 transactions each on two keys while a relay (with its
    pruning of sequence rows) runs in a loop: every key's Redis order is its commit
    order. A transaction holds its key from its send() to its commit, so a counter
    taken right after send() counts commits in order."""
    from outbox.sending.capture import relay

    commits: dict[str, tuple[str, int]] = {}
    counters = {"A": 0, "B": 0}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def sender(t: int) -> None:
        for i in range(15):
            key = "AB"[(t + i) % 2]
            with transaction.atomic(using="postgres"):
                m = send("postgres", i, key=key)
                with lock:
                    counters[key] += 1
                    commits[m.id] = (key, counters[key])

    def relayer() -> None:
        while not stop.is_set():
            relay("postgres", older_than=0, log=False)

    relaying = in_thread(relayer, errors)
    senders = [in_thread(lambda t=t: sender(t), errors) for t in range(4)]
    for thread in senders:
        thread.join(120)
    stop.set()
    relaying.join(60)
    assert not errors, errors
    relay("postgres", older_than=0)
    assert not captured("postgres").exists()
    for key in "AB":
        ids = [i for i, _ in sorted((i, n) for i, (k, n) in commits.items() if k == key)]
        by_commit = sorted(ids, key=lambda i: commits[i][1])
        assert [outbox.get(i).order_seq for i in by_commit] == list(range(1, 31))
