"""Ordered delivery per key (``send(..., ordering_key=...)``): the messages of one
(destination, key) are delivered one at a time in the order they were accepted; a retry
keeps the key's head at the head; a dead letter blocks its key or is skipped, by policy.
Real Redis, real RQ workers in this process, a real HTTP receiver on loopback."""

from __future__ import annotations

import pytest

import outbox
from outbox.exceptions import InvalidMessage
from tests.support import assert_index_invariant, hook_settings, wait_for

FAST_RETRY = [0.05] * 10  # seconds between attempts: a retry is due again at once


def hook(receiver, **destination):
    """The 'hook' destination at ``receiver`` with many attempts in flight at once (so
    order comes from the keys, not from one slot), no breaker, fast retries."""
    return hook_settings(
        receiver.url,
        **{"MAX_IN_FLIGHT": 16, "MAX_RETRIES": 5, "BREAKER": False, "RETRY": FAST_RETRY, **destination},
    )


def ids_of(receiver) -> list[str]:
    return [r.headers["webhook-id"] for r in receiver.requests]


def settle(worker, rounds: int = 40) -> None:
    """Run burst workers until nothing is due (retries come due 50 ms apart). A message
    still ``waiting`` then waits behind a blocked head: a head that leaves its key
    promotes the next in the same script, so waiting alone is never due work (counting
    it ran all 40 rounds, 10 to 27 s, whenever a test blocked a key)."""
    import time

    from outbox.store import get_repository

    repo = get_repository()
    for _ in range(rounds):
        worker(simple=True)
        counts = repo.counts()
        if not any(counts.get(s) for s in ("pending", "retrying", "sending")):
            return
        time.sleep(0.06)


def test_the_messages_of_a_key_wait_behind_its_head(receiver, repo):
    with hook(receiver):
        first = outbox.send("hook", {"n": 1}, ordering_key="order-42")
        second = outbox.send("hook", {"n": 2}, ordering_key="order-42")
        other = outbox.send("hook", {"n": 3}, ordering_key="order-43")
        plain = outbox.send("hook", {"n": 4})
    got = {m.id: outbox.get(m.id) for m in (first, second, other, plain)}
    assert [got[m.id].status for m in (first, second, other, plain)] == [
        "pending",
        "waiting",
        "pending",
        "pending",
    ]
    assert [got[m.id].order_seq for m in (first, second, other, plain)] == [1, 2, 1, None]
    assert got[second.id].ordering_key == "order-42" and got[plain.id].ordering_key is None
    assert repo.counts()["waiting"] == 1
    assert_index_invariant(repo)


def test_send_returns_an_ordered_message_as_stored_waiting_with_its_sequence(receiver, repo):
    """Issue 30, item 9: send() said "pending, order_seq None" for a message that get()
    then showed "waiting", sequence 2. send_many too."""
    with hook(receiver):
        first = outbox.send("hook", {"n": 1}, ordering_key="k")
        second = outbox.send("hook", {"n": 2}, ordering_key="k")
        many = outbox.send_many([{"destination": "hook", "body": n, "ordering_key": "k"} for n in (3, 4)])
        plain = outbox.send("hook", {"n": 5})
    returned = [first, second, *many, plain]
    assert [(m.status, m.order_seq) for m in returned] == [
        ("pending", 1),
        ("waiting", 2),
        ("waiting", 3),
        ("waiting", 4),
        ("pending", None),
    ]
    assert [(m.status, m.order_seq, m.order_prev) for m in returned] == [
        (g.status, g.order_seq, g.order_prev) for g in (outbox.get(m.id) for m in returned)
    ]


def test_a_key_is_delivered_in_order_and_a_retry_keeps_its_head_at_the_head(receiver, worker, repo):
    # the first message of key A fails twice: nothing of A overtakes it; key B goes on
    answers = iter([500, 500])

    def handler(receiver, request):
        body = request.json()
        if body["key"] == "A" and body["n"] == 0:
            try:
                return next(answers)
            except StopIteration:
                return 200
        return 200

    receiver.answer = handler
    with hook(receiver):
        sent = [outbox.send("hook", {"key": k, "n": n}, ordering_key=k) for n in range(4) for k in ("A", "B")]
        settle(worker)
    by_key = {"A": [], "B": []}
    for r in receiver.requests:
        body = r.json()
        by_key[body["key"]].append(body["n"])
    assert by_key["A"] == [0, 0, 0, 1, 2, 3]  # two retries of the head, then the rest in order
    assert by_key["B"] == [0, 1, 2, 3]
    assert all(outbox.get(m.id).status == "succeeded" for m in sent)
    assert_index_invariant(repo)


def test_headers_say_the_key_its_sequence_and_the_one_delivered_before(receiver, worker):
    with hook(receiver):
        for n in range(3):
            outbox.send("hook", {"n": n}, ordering_key="order-42")
        settle(worker)
    seen = [
        (
            r.headers.get("outbox-ordering-key"),
            r.headers.get("outbox-ordering-sequence"),
            r.headers.get("outbox-ordering-previous"),
        )
        for r in receiver.requests
    ]
    assert seen == [("order-42", "1", None), ("order-42", "2", "1"), ("order-42", "3", "2")]


def test_a_dead_letter_blocks_its_key_until_it_is_requeued(receiver, worker, repo):
    bad = {"on": True}

    def handler(receiver, request):
        return 400 if bad["on"] and request.json()["n"] == 0 else 200

    receiver.answer = handler
    with hook(receiver):
        sent = [outbox.send("hook", {"n": n}, ordering_key="k1") for n in range(3)]
        settle(worker)
        assert [outbox.get(m.id).status for m in sent] == ["failed", "waiting", "waiting"]
        blocked = outbox.blocked_keys("hook")
        assert [(b.key, b.head.id) for b in blocked] == [("k1", sent[0].id)]
        assert repo.counts()["waiting"] == 2
        bad["on"] = False
        assert outbox.release_key("hook", "k1", "requeue") == sent[0].id
        assert outbox.blocked_keys("hook") == []
        settle(worker)
    assert [r.json()["n"] for r in receiver.requests] == [0, 0, 1, 2]
    assert [outbox.get(m.id).status for m in sent] == ["succeeded"] * 3
    assert_index_invariant(repo)


def test_cancelling_a_blocking_dead_letter_releases_the_next(receiver, worker, repo):
    receiver.answer = lambda receiver, request: 400 if request.json()["n"] == 0 else 200
    with hook(receiver):
        sent = [outbox.send("hook", {"n": n}, ordering_key="k1") for n in range(3)]
        settle(worker)
        assert outbox.release_key("hook", "k1", "cancel") == sent[0].id
        settle(worker)
    assert [r.json()["n"] for r in receiver.requests] == [0, 1, 2]
    assert [outbox.get(m.id).status for m in sent] == ["cancelled", "succeeded", "succeeded"]
    assert [r.headers.get("outbox-ordering-previous") for r in receiver.requests] == [None, None, "2"]
    assert_index_invariant(repo)


def test_with_the_skip_policy_a_dead_letter_is_set_aside_and_the_key_goes_on(receiver, worker, repo):
    receiver.answer = lambda receiver, request: 400 if request.json()["n"] == 1 else 200
    with hook(receiver, ORDERING="skip"):
        sent = [outbox.send("hook", {"n": n}, ordering_key="k1") for n in range(4)]
        settle(worker)
        assert outbox.blocked_keys("hook") == []
    assert [r.json()["n"] for r in receiver.requests] == [0, 1, 2, 3]
    assert [outbox.get(m.id).status for m in sent] == ["succeeded", "failed", "succeeded", "succeeded"]
    assert_index_invariant(repo)


def test_cancelling_the_head_lets_the_next_go_and_cancelling_a_waiting_one_keeps_the_order(
    receiver, worker, repo
):
    with hook(receiver):
        sent = [outbox.send("hook", {"n": n}, ordering_key="k1") for n in range(4)]
        assert outbox.cancel(sent[0].id) and outbox.cancel(sent[2].id)
        assert outbox.get(sent[1].id).status == "pending"
        assert outbox.get(sent[3].id).status == "waiting"
        settle(worker)
    assert [r.json()["n"] for r in receiver.requests] == [1, 3]
    assert_index_invariant(repo)


def test_deleting_a_blocking_dead_letter_releases_its_key(receiver, worker, repo):
    receiver.answer = lambda receiver, request: 400 if request.json()["n"] == 0 else 200
    with hook(receiver):
        sent = [outbox.send("hook", {"n": n}, ordering_key="k1") for n in range(2)]
        settle(worker)
        assert repo.key_log("hook", "k1") == ([sent[1].id, sent[0].id], 2)  # newest first
        assert outbox.delete(sent[0].id)
        assert outbox.blocked_keys("hook") == []
        assert repo.key_log("hook", "k1") == ([sent[1].id], 1)
        settle(worker)
    assert [r.json()["n"] for r in receiver.requests] == [0, 1]
    assert_index_invariant(repo)


def test_a_delayed_head_holds_back_its_key(receiver, worker, repo):
    with hook(receiver):
        first = outbox.send("hook", {"n": 0}, ordering_key="k1", delay=3600)
        second = outbox.send("hook", {"n": 1}, ordering_key="k1")
        worker(simple=True)
    assert receiver.requests == []
    assert (outbox.get(first.id).status, outbox.get(second.id).status) == ("pending", "waiting")


def test_send_many_keeps_the_order_of_its_items(receiver, worker, repo):
    with hook(receiver):
        sent = outbox.send_many(
            [{"destination": "hook", "body": {"n": n}, "ordering_key": "k"} for n in range(5)]
        )
        assert [m.order_seq for m in map(outbox.get, [m.id for m in sent])] == [1, 2, 3, 4, 5]
        settle(worker)
    assert [r.json()["n"] for r in receiver.requests] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("key", ["", "x" * 201, "tab\there", 42, b"bytes"])
def test_a_bad_ordering_key_is_refused_and_nothing_is_written(receiver, repo, key):
    with hook(receiver), pytest.raises(InvalidMessage, match="ordering_key"):
        outbox.send("hook", {"n": 0}, ordering_key=key)
    assert sum(repo.counts().values()) == 0


def test_retry_now_does_not_move_a_waiting_message_ahead_of_its_head(receiver, worker, repo):
    from outbox.operations import actions

    receiver.answer = lambda receiver, request: 500 if request.json()["n"] == 0 else 200
    with hook(receiver, RETRY=[3600]):  # the head's retry is an hour away
        sent = [outbox.send("hook", {"n": n}, ordering_key="k1") for n in range(2)]
        worker(simple=True)
        assert outbox.get(sent[0].id).status == "retrying"
        assert actions.retry_now([sent[1].id]).acted == 0  # waiting: not a retry to hurry
        assert outbox.requeue(sent[1].id).acted == 0
        worker(simple=True)
        assert [r.json()["n"] for r in receiver.requests] == [0]
        assert outbox.get(sent[1].id).status == "waiting"
        receiver.answer = None
        assert actions.retry_now([sent[0].id]).acted == 1  # the head: due now, the key follows
        settle(worker)
    assert [r.json()["n"] for r in receiver.requests] == [0, 0, 1]
    assert_index_invariant(repo)


def test_requeued_dead_letters_of_a_skipping_key_rejoin_it_in_their_original_order(receiver, worker, repo):
    failing = {1, 2, 3}
    receiver.answer = lambda receiver, request: 400 if request.json()["n"] in failing else 200
    with hook(receiver, ORDERING="skip"):
        sent = [outbox.send("hook", {"n": n}, ordering_key="k1") for n in range(5)]
        settle(worker)
        assert [outbox.get(m.id).status for m in sent] == [
            "succeeded",
            "failed",
            "failed",
            "failed",
            "succeeded",
        ]
        failing.clear()
        receiver.requests.clear()
        # requeued in another order than they were sent: they rejoin in sequence order
        assert outbox.requeue([sent[3].id, sent[1].id, sent[2].id]).acted == 3
        got = [outbox.get(m.id) for m in sent[1:4]]
        assert [m.status for m in got] == ["pending", "waiting", "waiting"]
        assert [m.order_seq for m in got] == [6, 7, 8]
        settle(worker)
    assert [r.json()["n"] for r in receiver.requests] == [1, 2, 3]
    assert [r.headers.get("outbox-ordering-previous") for r in receiver.requests] == ["5", "6", "7"]
    assert_index_invariant(repo)


def test_requeued_messages_of_two_lifetimes_of_a_key_rejoin_in_the_order_they_were_sent(
    receiver, worker, repo, settings
):
    """Issue 31 (also checked): a key's sequence restarts at 1 once its state expired, and
    a bulk requeue sorted the messages it requeues by (key, sequence) alone, so a message
    of the key's second lifetime rejoined between two of its first. They now sort by
    lifetime first (its epoch's start), then sequence."""

    settings.OUTBOX = {**settings.OUTBOX, "ORDERING_KEY_TTL": 1}
    with hook(receiver):
        first = [outbox.send("hook", {"n": n}, ordering_key="k1") for n in (1, 2)]
        settle(worker)
        state = repo.order_keys("hook", "k1").order_state("hook", "k1")
        assert wait_for(lambda: not repo.connection.exists(state), timeout=10)
        second = outbox.send("hook", {"n": 3}, ordering_key="k1")
        assert second.order_seq == 1
        settle(worker)
        receiver.requests.clear()
        assert outbox.requeue([second.id, first[1].id, first[0].id]).acted == 3
        settle(worker)
    assert [r.json()["n"] for r in receiver.requests] == [1, 2, 3]
    assert_index_invariant(repo)


def test_a_keys_state_expires_after_its_last_message_left(receiver, worker, repo, settings):
    settings.OUTBOX = {**settings.OUTBOX, "ORDERING_KEY_TTL": 120}
    with hook(receiver):
        outbox.send("hook", {"n": 0}, ordering_key="k1")
        keys = repo.order_keys("hook", "k1")
        assert repo.connection.ttl(keys.order_state("hook", "k1")) == -1  # in use: kept
        settle(worker)
    assert 0 < repo.connection.ttl(keys.order_state("hook", "k1")) <= 120
    assert not repo.connection.exists(keys.order("hook", "k1"))


def test_a_key_that_is_not_ascii_is_percent_encoded_in_its_header(receiver, worker):
    from urllib.parse import unquote

    with hook(receiver):
        outbox.send("hook", {"n": 0}, ordering_key="commande n°42 100%")
        settle(worker)
    header = receiver.requests[0].headers["outbox-ordering-key"]
    assert header == "commande%20n%C2%B042%20100%25" and unquote(header) == "commande n°42 100%"


def test_a_message_cannot_set_the_ordering_headers_itself(receiver):
    with hook(receiver), pytest.raises(InvalidMessage, match="Outbox-Ordering"):
        outbox.send("hook", {"n": 0}, headers={"Outbox-Ordering-Sequence": "1"})


def test_eager_mode_delivers_a_keys_messages_in_order_inside_the_call(receiver, settings):
    settings.OUTBOX = {**settings.OUTBOX, "EAGER": True}
    with hook(receiver):
        sent = outbox.send_many(
            [{"destination": "hook", "body": {"n": n}, "ordering_key": "k"} for n in range(3)]
        )
        outbox.send("hook", {"n": 3}, ordering_key="k")
    assert [r.json()["n"] for r in receiver.requests] == [0, 1, 2, 3]
    assert [outbox.get(m.id).status for m in sent] == ["succeeded"] * 3


@pytest.mark.parametrize("action", ["cancel", "delete"])
def test_acting_on_a_key_head_and_its_next_message_in_one_call_leaves_no_stale_index_entry(
    receiver, worker, repo, action
):
    """Issue 31, item 5: cancelling (or deleting) a key's head together with the message
    behind it, in one call (the console's "all of key K" lists the head first), promoted
    the next message to pending and then moved it out of its index on its stale status:
    its pending entry (and a due entry) stayed, and the pending count read 2 for 1."""
    with hook(receiver):
        head, second, third = (outbox.send("hook", {"n": n}, ordering_key="k1") for n in range(3))
        result = getattr(outbox, action)([head.id, second.id])
        assert result.acted == 2, result
        assert repo.counts()["pending"] == 1 and repo.counts()["waiting"] == 0
        assert_index_invariant(repo)
        settle(worker)
    assert outbox.get(third.id).status == "succeeded"
    assert [r.json()["n"] for r in receiver.requests] == [2]
    counts = repo.counts()
    assert counts["pending"] == counts["waiting"] == 0 and counts["succeeded"] == 1
    assert_index_invariant(repo)
