"""Issue 31, item 4: one partition whose slot is held half-moved (``TRYAGAIN``) holds back
its own outcomes only. The other partitions' outcomes are written and announced at once,
the run goes on and ends normally (no RQ job ends by an exception), and the held outcome
is written once the move ends (each message delivered once). On a real 3-primary cluster
with 16 partitions (tests/support/cluster.py), a legacy migration held half-way."""

from __future__ import annotations

import threading
import time

import django_rq

import outbox
from outbox.events import message_succeeded
from outbox.store import get_repository

HOLD = 8.0  # seconds the slot stays half-moved: longer than half the lease below (6 s)


def _two_messages_on_other_slots(repo, slot_of):
    """Send until two messages sit in partitions of different slots, neither of them the
    home slot of the destination 'hook' (whose health is written there)."""
    home = slot_of(repo.keys.dest("hook").encode())
    sent = outbox.send_many(
        [{"destination": "hook", "body": i, "idempotency_key": f"s{i}"} for i in range(8)]
    )
    held = next(m for m in sent if slot_of(repo.keys.message(m.id).encode()) != home)
    other = next(
        m
        for m in sent
        if slot_of(repo.keys.message(m.id).encode())
        not in (home, slot_of(repo.keys.message(held.id).encode()))
    )
    return sent, held, other


def test_a_half_moved_partition_holds_back_only_its_own_outcomes(
    cluster_mode, redis_cluster, hook, worker, settings
):
    from redis.crc import key_slot

    from outbox.store.client import cluster_admin

    settings.OUTBOX = {**settings.OUTBOX, "VISIBILITY_TIMEOUT": 12}
    repo = get_repository()
    sent, held, other = _two_messages_on_other_slots(repo, key_slot)
    record = repo.keys.message(held.id).encode()
    slot = key_slot(record)
    source = redis_cluster.slot_owner(slot)
    target = next(n for n in redis_cluster.nodes if n != source)
    moved, handed_over = threading.Event(), threading.Event()
    seen_during_hold: dict[str, object] = {}
    announced: list[tuple[str, float]] = []

    def on_succeeded(sender, message, **kwargs):
        announced.append((message.id, time.monotonic()))

    def finish_later() -> None:
        time.sleep(HOLD)
        seen_during_hold["other"] = outbox.get(other.id).status
        seen_during_hold["held"] = outbox.get(held.id).status
        seen_during_hold["announced"] = [i for i, _ in announced]
        redis_cluster.finish_migration(slot)
        handed_over.set()

    def answer(receiver, request):  # called one at a time (the receiver's lock held)
        if request.json() == sent.index(held) and not moved.is_set():  # while its attempt is in flight
            redis_cluster.begin_migration(slot, target)
            cluster_admin.migrate(redis_cluster.node_client(source), target, [record], 5000)
            moved.set()
            threading.Thread(target=finish_later, daemon=True).start()
            return 200
        return (200, {}, 0.5, None)  # decided after the held one: their exchange meets the moving slot

    hook.answer = answer
    message_succeeded.connect(on_succeeded)
    try:
        worker(simple=True)
    finally:
        message_succeeded.disconnect(on_succeeded)
        handed_over.wait(HOLD + 5)
        if slot in redis_cluster.migrations:
            redis_cluster.finish_migration(slot)
    assert moved.is_set() and handed_over.is_set()
    # written and announced during the hold, not after it
    assert seen_during_hold["other"] == "succeeded"
    assert other.id in seen_during_hold["announced"]
    assert seen_during_hold["held"] == "sending"
    # the held outcome written once the move ended, by the same run (each message once)
    assert {outbox.get(m.id).status for m in sent} == {"succeeded"}
    bodies = sorted(r.json() for r in hook.requests)
    assert bodies == list(range(len(sent)))
    assert [i for i, _ in announced].count(held.id) == 1
    # no delivery job ended by an exception
    for name in settings.RQ_QUEUES:
        assert django_rq.get_queue(name).failed_job_registry.count == 0
