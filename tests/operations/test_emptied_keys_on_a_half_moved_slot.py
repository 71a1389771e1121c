"""Scripts that empty a key and touch it again in the same call, on a real cluster while
the slot is held half-moved by a legacy migration (opened, nothing moved yet).

Every key such a script reads or writes is present at the source when it starts
(declared, or checked by ``lua/lib/guard.lua``; a missing one answers TRYAGAIN before
anything is written), so the script runs there. But a key it empties (the last member
removed: the key is deleted) is then missing from a migrating slot, and any later access
to it in the same call, a read or a write that would create it again, fails with
"Script attempted to access a non local key": the script aborts with its earlier writes
kept. (Checked on Valkey 8.1 and Redis 7.0: ``ZADD`` to a key absent from a migrating
slot fails that way in a script, and with ``redis.pcall`` the script goes on.)

Each test makes every key the call touches present (placeholders where an index would be
empty), opens the migration of the slot without moving a key, and asks for the call's
whole work: before the fixes, each aborted half-way."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

from redis.crc import key_slot

import outbox
from outbox.store import ClaimOptions, get_repository
from outbox.store.scripts import named
from outbox.testing.cluster_server import ClusterServer

FAR = 10**10  # a placeholder's score: never due
PLACEHOLDER = "msg_placeholder_p0"  # an id no script finds a record of


@contextmanager
def migrating(cluster: ClusterServer, key: str) -> Iterator[None]:
    """The slot of ``key`` held half-moved (its migration opened, no key moved yet);
    handed over at the end."""
    slot = key_slot(key.encode())
    target = next(n for n in cluster.nodes if n != cluster.slot_owner(slot))
    cluster.begin_migration(slot, target)
    try:
        yield
    finally:
        cluster.finish_migration(slot)


def present(connection, *keys: str) -> None:
    """Each of ``keys`` (sorted sets) made to exist, with a placeholder never due."""
    for key in keys:
        connection.zadd(key, {PLACEHOLDER: FAR})


def test_cancelling_the_last_message_of_an_ordering_key_on_a_half_moved_slot(cluster_mode, redis_cluster):
    """``order_leave`` (lib/ordering.lua) removed the message from its key's queue, then
    asked whether the queue was left empty (``EXISTS``): the queue it had just emptied was
    a non-local key. The message was cancelled (its record and indexes written) and the
    script aborted before the key's state was given its time to live, the caller told of
    an error."""
    m = outbox.send("hook", {"n": 1}, ordering_key="order-1", delay=3600)
    repo = get_repository()
    part = repo.keys.of(m.id)
    q, st = part.order("hook", "order-1"), part.order_state("hook", "order-1")
    assert cluster_mode.zcard(q) == 1
    present(
        cluster_mode,
        part.status("cancelled", "hook"),
        part.status("waiting", "hook"),
        part.parked("hook"),
        part.quarantine(m.queue),
        part.blocked("hook"),
    )
    with migrating(redis_cluster, q):
        result = outbox.cancel([m.id])
    assert result.acted == 1
    assert outbox.get(m.id).status == "cancelled"
    assert cluster_mode.exists(q) == 0
    assert cluster_mode.ttl(st) > 0  # kept for the key's time to live, then gone


def test_cancelling_an_ordered_head_that_empties_the_pending_index_on_a_half_moved_slot(
    cluster_mode, redis_cluster
):
    """The head is the only pending message of its destination (and the only due entry
    of its queue) in the partition; its cancel promotes the next message of the key. The
    gathered index writes (lib/writes.lua) took the head out of the pending and due
    indexes before they put the next message in: the emptied indexes were non-local
    keys, and the script aborted with the head cancelled and the next message 'pending'
    in its record but in no due index: never delivered."""
    head = outbox.send("hook", {"n": 1}, ordering_key="order-2", delay=3600)
    nxt = outbox.send("hook", {"n": 2}, ordering_key="order-2")
    repo = get_repository()
    part = repo.keys.of(head.id)
    assert outbox.get(nxt.id).status == "waiting"
    assert [i.decode() for i in cluster_mode.zrange(part.status("pending", "hook"), 0, -1)] == [head.id]
    assert [i.decode() for i in cluster_mode.zrange(part.due(head.queue), 0, -1)] == [head.id]
    present(
        cluster_mode,
        part.status("cancelled", "hook"),
        part.parked("hook"),
        part.quarantine(head.queue),
        part.blocked("hook"),
    )
    with migrating(redis_cluster, part.due(head.queue)):
        result = outbox.cancel([head.id])
    assert result.acted == 1
    assert (outbox.get(head.id).status, outbox.get(nxt.id).status) == ("cancelled", "pending")
    assert cluster_mode.zscore(part.due(nxt.queue), nxt.id) is not None
    assert cluster_mode.zscore(part.status("pending", "hook"), nxt.id) is not None


def test_deleting_an_ordered_head_that_empties_the_pending_index_on_a_half_moved_slot(
    cluster_mode, redis_cluster
):
    """The same through delete.lua, which takes the head out of its indexes at once
    (ZREM) before its key's next message is put in them: the next message was left
    'pending' in no due index, the head's records deleted."""
    head = outbox.send("hook", {"n": 1}, ordering_key="order-3", delay=3600)
    nxt = outbox.send("hook", {"n": 2}, ordering_key="order-3")
    repo = get_repository()
    part = repo.keys.of(head.id)
    present(cluster_mode, part.parked("hook"), part.quarantine(head.queue), part.blocked("hook"))
    cluster_mode.rpush(repo.keys.attempts(head.id), "placeholder")  # declared: present
    with migrating(redis_cluster, part.due(head.queue)):
        result = outbox.delete([head.id])
    assert result.acted == 1
    assert outbox.get(nxt.id).status == "pending"
    assert cluster_mode.zscore(part.due(nxt.queue), nxt.id) is not None
    assert cluster_mode.zscore(part.status("pending", "hook"), nxt.id) is not None


def test_deleting_messages_after_one_that_empties_an_index_on_a_half_moved_slot(cluster_mode, redis_cluster):
    """delete.lua takes each message out of every index of its queue and destination,
    one message after another: once the first emptied the due index (its only entry),
    the second's ZREM of it was a non-local key, after the first's records were
    deleted."""
    from outbox.records import partition_of

    repo = get_repository()
    due, other = outbox.send_many(
        [{"destination": "hook", "body": {"n": i}, "delay": 3600} for i in range(2)]
    )
    assert partition_of(due.id) == partition_of(other.id)  # one call (send_many: one partition)
    part = repo.keys.of(due.id)
    for m in list(cluster_mode.zrange(part.due(due.queue), 0, -1)):
        if m.decode() != due.id:
            cluster_mode.zrem(part.due(due.queue), m)
    assert [i.decode() for i in cluster_mode.zrange(part.due(due.queue), 0, -1)] == [due.id]
    present(cluster_mode, part.parked("hook"), part.quarantine(due.queue))
    for m in (due, other):
        cluster_mode.rpush(repo.keys.attempts(m.id), "placeholder")  # declared: present
    with migrating(redis_cluster, part.due(due.queue)):
        result = outbox.delete([due.id, other.id])
    assert result.acted == 2
    assert cluster_mode.exists(repo.keys.resend(due.id), repo.keys.resend(other.id)) == 0


def test_unparking_every_parked_message_of_a_partition_on_a_half_moved_slot(cluster_mode, redis_cluster):
    """unpark.lua looked at its parked set again after it had taken its last entries (to
    find more, and to count what is left): the set it had emptied was a non-local key.
    The messages were due again but the caller was told of an error (no wake-up, no
    probe bookkeeping)."""
    from outbox.destinations import controls
    from outbox.records import partition_of

    controls.pause("hook")
    sent = outbox.send_many([{"destination": "hook", "body": {"n": i}} for i in range(2)])
    repo = get_repository()
    part = repo.keys.of(sent[0].id)
    now = time.time()
    options = ClaimOptions(lease="L", deadline=now + 60, limit=5)
    claim = repo.claim(sent[0].queue, now, partition_of(sent[0].id), options)  # parks them
    assert claim.messages == []
    parked = [i.decode() for i in cluster_mode.zrange(part.parked("hook"), 0, -1)]
    assert sorted(parked) == sorted(m.id for m in sent)
    present(cluster_mode, part.due(sent[0].queue))
    cluster_mode.hset(repo.keys.dest("hook"), "admin", "active")  # resumed, not yet unparked
    with migrating(redis_cluster, part.parked("hook")):
        moved, _, left = repo.unpark("hook", time.time())
    assert (moved, left) == (2, 0)
    assert all(cluster_mode.zscore(part.due(m.queue), m.id) is not None for m in sent)


def test_a_gate_whose_in_flight_grants_all_lapsed_on_a_half_moved_slot(cluster_mode, redis_cluster):
    """gate.lua, for a destination with a MAX_CONCURRENCY, first drops the grants whose
    lease ended, then counted the set (ZCARD) and added its own grants (ZADD): when every
    grant had lapsed, the set it emptied was a non-local key, read and created again. The
    exchange raised that error (not an outage: a bug to it)."""
    repo = get_repository()
    keys = repo.keys
    inflight = keys.inflight("hook")
    now = time.time()
    cluster_mode.zadd(inflight, {"old|msg_1_p0": now - 100})  # a lapsed grant, alone
    cluster_mode.hset(keys.dest("hook"), "admin", "active")
    cluster_mode.set(keys.gcra("hook"), "0")
    args = named(
        prefix=keys.prefix,
        parts=keys.partitions,
        destination="hook",
        now=repr(now),
        lease="L",
        deadline=repr(now + 60),
        limits=json.dumps({"hook": [0, 0, 2]}),
        cap="",
    )
    args += ["msg_a_p0", repr(now), "msg_b_p0", repr(now)]
    with migrating(redis_cluster, inflight):
        reply = repo.run_script("gate", args, keys=[keys.dest("hook"), keys.gcra("hook"), inflight])
    assert [a.decode() for a in reply[:-1:2]] == ["take", "take"]  # last: the states (none: not an endpoint)
    assert reply[-1] == []
    assert sorted(cluster_mode.zrange(inflight, 0, -1)) == [b"L|msg_a_p0", b"L|msg_b_p0"]


def test_a_quarantine_claim_that_empties_the_due_index_on_a_half_moved_slot(cluster_mode, redis_cluster):
    """claim_apply.lua in the quarantine lane: a message taken from both indexes (it was in
    the due index too, after a "retry now") that was the due index's only entry, then a
    message no longer suspect moved to the due index. The gathered writes took the first
    out before they put the second in: the emptied due index was a non-local key, and
    the script aborted with the first message 'sending' and the second in no index."""
    from outbox.records import partition_of

    sent = outbox.send_many([{"destination": "hook", "body": {"n": i}} for i in range(2)])
    a, b = sent
    repo = get_repository()
    keys = repo.keys
    part = keys.of(a.id)
    partition = partition_of(a.id)
    queue = a.queue
    due, quarantine = part.due(queue), part.quarantine(queue)
    now = time.time()
    # a: a suspect in both indexes; b: no longer suspect, in the quarantine index alone
    cluster_mode.hset(keys.resend(a.id), "suspect", "1")
    cluster_mode.zadd(quarantine, {a.id: now - 1, b.id: now - 1})
    cluster_mode.zrem(due, b.id)
    assert [i.decode() for i in cluster_mode.zrange(due, 0, -1)] == [a.id]
    present(
        cluster_mode, part.status("sending", "hook"), part.status("retrying", "hook"), part.parked("hook")
    )
    args = named(
        prefix=keys.prefix, parts=keys.partitions, now=repr(now), lease="L", deadline=repr(now + 60), lane="q"
    )
    args += [a.id, "take", "", b.id, "lane", ""]
    declared = [due, quarantine]
    for m in (a, b):
        declared += repo.claim_apply_keys(m.id, "hook")
    assert partition == partition_of(b.id)
    with migrating(redis_cluster, due):
        reply = repo.run_script("claim_apply", args, keys=list(dict.fromkeys(declared)))
    claimed = reply[0]  # flat: message record ({id, raw}), resend pairs
    assert [claimed[0][0].decode()] == [a.id]
    assert outbox.get(a.id).status == "sending"
    assert cluster_mode.zscore(due, b.id) is not None
    assert cluster_mode.zscore(quarantine, b.id) is None


def test_an_outcome_after_the_last_grant_of_a_destination_on_a_half_moved_slot(cluster_mode, redis_cluster):
    """health.lua ends each outcome's grant in the destination's in-flight set (ZREM),
    one outcome after another: once one took the set's last grant, the next outcome's
    ZREM (its grant already gone: lapsed, or given back) was a non-local key."""
    repo = get_repository()
    keys = repo.keys
    inflight = keys.inflight("hook")
    now = time.time()
    minute, hour = int(now // 60), int(now // 3600)
    cluster_mode.zadd(inflight, {"L|msg_a_p0": now + 60})  # msg_b's grant: given back already
    cluster_mode.hset(keys.dest("hook"), "admin", "active")
    cluster_mode.hset(keys.health("hook", minute), "placeholder", 0)
    cluster_mode.hset(keys.errors("hook", hour), "placeholder", 0)
    outcomes = [
        ["hook", "s", 5, 200, "", "", 0, "msg_a_p0", now, "L", 0],
        ["hook", "s", 5, 200, "", "", 0, "msg_b_p0", now, "L", 0],
    ]
    with migrating(redis_cluster, inflight):
        repo.record_outcomes(outcomes, "{}", now)
    assert cluster_mode.exists(inflight) == 0
    assert int(cluster_mode.hget(keys.health("hook", minute), "s")) == 2


def test_a_repair_given_an_entry_twice_on_a_half_moved_slot(cluster_mode, redis_cluster):
    """repair.lua takes each stale entry out of the index, one ZREM per entry: once the
    index's last entry was out, a later ZREM (an id given twice, as ZSCAN may) was a
    non-local key."""
    repo = get_repository()
    keys = repo.keys
    part = keys.partition(0)
    index = part.status("pending", "hook")
    cluster_mode.zadd(index, {"msg_gone_p0": 1})
    args = [*named(statuses="pending", destination="hook"), "msg_gone_p0", "msg_gone_p0"]
    cluster_mode.hset(keys.resend("msg_other_p0"), "status", "succeeded")  # present: declared
    rkeys = [keys.resend("msg_other_p0"), keys.resend("msg_other_p0")]
    with migrating(redis_cluster, index):
        removed = repo.run_script("repair", args, keys=[index, *rkeys])
    assert removed == [b"msg_gone_p0"]
    assert cluster_mode.exists(index) == 0
