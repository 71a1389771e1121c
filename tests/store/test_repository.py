"""The repository against a real Redis: records, indexes, compare-and-set transitions."""

import itertools
import json
import time

import pytest

import outbox
from outbox.delivery import loop as delivery
from outbox.records import STATUSES, Attempt, Message, partition_of
from outbox.store import Change, ClaimOptions, ExchangeRequest, PartitionAsk
from tests.support import assert_index_invariant, with_destinations


def make(repo, n=1, **kwargs):
    """Write messages through the real send path (records + job) and return them."""
    return outbox.send_many([{"destination": "mem", "body": {"n": i}, **kwargs} for i in range(n)])


def test_records_round_trip(repo):
    sent = outbox.send(
        "mem",
        {"order": 1, "name": "Zoë"},
        headers={"X-Trace": "abc"},
        idempotency_key="k-1",
        max_retries=7,
        retry=[1, 2],
    )
    got = repo.get(sent.id)
    assert got.id == sent.id and got.destination == "mem"
    assert got.json() == {"order": 1, "name": "Zoë"}
    assert got.content_type == "application/json"
    assert got.headers == {"X-Trace": "abc"}
    assert got.idempotency_key == "k-1"
    assert (got.status, got.retry_count, got.max_retries) == ("pending", 0, 7)
    assert got.retry_policy["delays"] == [1.0, 2.0]
    assert got.created_at == pytest.approx(time.time(), abs=5)
    assert got.next_attempt_at == pytest.approx(got.created_at)
    assert got.queue == "outbox"
    raw = repo.connection.get(repo.keys.message(sent.id))
    header, _, body = raw.partition(b"\n")
    assert set(json.loads(header)) == {
        "content_type",
        "headers",
        "destination",
        "created_at",
        "idempotency_key",
    }
    assert json.loads(body) == {"order": 1, "name": "Zoë"}
    resend = repo.connection.hgetall(repo.keys.resend(sent.id))
    assert resend[b"status"] == b"pending"
    # Fields at their default are left out (retry_count 0); the retry budget and policy
    # share one field.
    assert b"retry_count" not in resend and b"max_retries" not in resend and b"retry_policy" not in resend
    assert json.loads(resend[b"retry"]) == [7, ["s", [1, 2], "equal"]]
    assert_index_invariant(repo)


def test_one_create_call_answers_each_message_by_its_position(repo):
    """create.lua answers only the messages it did not write as new, by position: a
    repeated push ("exists"), a key already used with the same body ("duplicate"), with
    another body ("conflict"), and the rest of a call that holds a conflict ("refused")."""
    from outbox.sending.validation import SendArguments, build_message

    first = outbox.send("mem", {"n": 1}, idempotency_key="k-dup")
    other = outbox.send("mem", {"n": 2}, idempotency_key="k-conflict")
    pushed = build_message(SendArguments("mem", {"n": 3}))
    assert [c.code for c in repo.create([pushed], time.time()).created] == ["new"]

    fresh = build_message(SendArguments("mem", {"n": 4}, delay=30))
    dup = build_message(SendArguments("mem", {"n": 1}, idempotency_key="k-dup"))
    result = repo.create([fresh, pushed, dup], time.time())
    assert [(c.id, c.standing_id, c.code) for c in result.created] == [
        (fresh.id, fresh.id, "new"),
        (pushed.id, pushed.id, "exists"),
        (dup.id, first.id, "duplicate"),
    ]
    assert result.woken == []  # the fresh message is delayed; the others wrote nothing

    # With partitions a call is all-or-nothing within each partition only: the message
    # refused for its neighbour's conflict shares that neighbour's partition.
    refused = build_message(SendArguments("mem", {"n": 5}), partition=partition_of(other.id))
    clash = build_message(SendArguments("mem", {"n": 6}, idempotency_key="k-conflict"))
    result = repo.create([refused, clash], time.time())
    assert [(c.standing_id, c.code) for c in result.created] == [
        (refused.id, "refused"),
        (other.id, "conflict"),
    ]
    assert not repo.connection.exists(repo.keys.message(refused.id), repo.keys.resend(refused.id))

    # The script writes the resend fields that repeat its own arguments (status,
    # destination, queue, next_attempt_at); the call sends the others.
    resend = repo.connection.hgetall(repo.keys.resend(fresh.id))
    assert set(resend) == {
        b"status",
        b"destination",
        b"queue",
        b"next_attempt_at",
        b"retry",
        b"send_time",
        b"updated_at",
    }
    assert (resend[b"status"], resend[b"destination"], resend[b"queue"]) == (b"pending", b"mem", b"outbox")
    assert float(resend[b"next_attempt_at"]) == float(resend[b"send_time"]) == fresh.send_time
    got = repo.get(fresh.id)
    assert (got.status, got.next_attempt_at, got.send_time, got.created_at) == (
        "pending",
        fresh.send_time,
        fresh.send_time,
        fresh.created_at,
    )
    assert_index_invariant(repo)


@pytest.mark.parametrize("n", [1, 3])
def test_a_create_call_run_again_never_undoes_what_a_worker_did(repo, n):
    """redis-py's Retry runs a command again after a ConnectionError or TimeoutError, also
    when the first run reached Redis and only its reply was lost. A send() whose create
    call ran twice must not put a message a worker already claimed or delivered back to
    pending: that would deliver it twice."""
    from outbox.sending.validation import SendArguments, build_message

    messages = [build_message(SendArguments("mem", {"n": i})) for i in range(n)]
    now = time.time()
    assert [c.code for c in repo.create(messages, now, repeat=False).created] == ["new"] * n
    repo.transition([claim_change(messages[0].id, "A")], now)
    for m in messages[1:]:
        repo.transition([claim_change(m.id, "B")], now)
        done = Change(id=m.id, from_statuses=("sending",), to="succeeded", score=now, lease="B")
        assert repo.transition([done], now)[0].applied

    again = repo.create(messages, now, repeat=False)
    assert [c.code for c in again.created] == ["exists"] * n
    assert again.woken == []
    assert [repo.get(m.id).status for m in messages] == ["sending"] + ["succeeded"] * (n - 1)
    assert repo.count("pending") == 0 and repo.count("sending") == 1
    assert repo.connection.zcard(repo.keys.of(messages[0].id).due(messages[0].queue)) == 0
    assert_index_invariant(repo)


def test_older_resend_records_with_max_retries_and_retry_policy_still_read(repo):
    (m,) = make(repo)
    key = repo.keys.resend(m.id)
    repo.connection.hdel(key, "retry")
    repo.connection.hset(
        key,
        mapping={"retry_count": "2", "max_retries": "9", "retry_policy": '["e",10,2,21600,"full"]'},
    )
    got = repo.get(m.id)
    assert (got.retry_count, got.max_retries) == (2, 9)
    assert got.retry_policy == {
        "strategy": "exponential",
        "base": 10,
        "factor": 2,
        "max_delay": 21600,
        "jitter": "full",
    }


@pytest.mark.parametrize(
    ("destination", "body", "content_type"),
    [("mem", {"a": 1}, None), ("mem", "Zoë", 'text/x-zo; q="1\\\\"'), ("mem", b"\x00\n", None)],
)
def test_the_record_send_writes_is_what_the_general_encoder_writes(repo, destination, body, content_type):
    """send() writes a message's header line without a JSON encoder per message, and
    leaves its resend record's updated_at to the script when it is created_at (issue 30,
    item 10): byte for byte what the general encoding writes."""
    from outbox.store.codec import _COMPACT_JSON, resend_fields

    sent = outbox.send(destination, body, content_type=content_type)
    header = {
        "destination": sent.destination,
        "content_type": sent.content_type,
        "created_at": sent.created_at,
    }
    expected = _COMPACT_JSON.encode(header).encode() + b"\n" + sent.body
    assert repo.connection.get(repo.keys.message(sent.id)) == expected
    resend = {k.decode(): v.decode() for k, v in repo.connection.hgetall(repo.keys.resend(sent.id)).items()}
    assert resend == resend_fields(sent)
    assert resend["updated_at"] == repr(sent.created_at)


def test_the_message_record_is_one_string_and_older_hash_records_still_read(repo):
    """The message record is one string: its small fields as a JSON object on the first
    line, then the body (a hash holding a body over 64 bytes is a hashtable, about 250
    bytes more per message). The id is the key's suffix; empty headers and no idempotency
    key write nothing. A record written by an older version (a hash, with ``id`` and ``headers:
    "{}"`` before 0.2) reads the same through every reader: get, list rows, claim,
    transition and delete (which also drops its idempotency key)."""
    sent = outbox.send("mem", {"a": 1}, idempotency_key="k-old")
    plain = outbox.send("mem", b"x" * 300)
    key = repo.keys.message(sent.id)
    assert repo.connection.type(key) == b"string"
    header, _, body = repo.connection.get(repo.keys.message(plain.id)).partition(b"\n")
    assert set(json.loads(header)) == {"content_type", "destination", "created_at"} and body == b"x" * 300
    # send_time is created_at unless the message was delayed: kept only then
    assert b"send_time" not in repo.connection.hgetall(repo.keys.resend(plain.id))
    assert repo.get(plain.id).send_time == plain.created_at
    delayed = outbox.send("mem", "later", delay=60)
    assert repo.get(delayed.id).send_time == pytest.approx(delayed.created_at + 60)
    repo.connection.delete(key)
    repo.connection.hset(
        key,
        mapping={
            "id": sent.id,
            "destination": "mem",
            "body": b'{"a": 1}',
            "content_type": "application/json",
            "created_at": repr(sent.created_at),
            "headers": "{}",
            "idempotency_key": "k-old",
        },
    )  # an older layout
    got = repo.get(sent.id)
    assert (got.id, got.headers, got.idempotency_key, got.json()) == (sent.id, {}, "k-old", {"a": 1})
    from outbox.store.reads.queries import summaries

    rows = summaries(repo, [sent.id, plain.id])
    assert [(r.id, r.destination, r.idempotency_key) for r in rows if r] == [
        (sent.id, "mem", "k-old"),
        (plain.id, "mem", None),
    ]
    claimed = {m.id: m for m in delivery.claim("outbox")}
    assert claimed[sent.id].json() == {"a": 1} and claimed[plain.id].body == b"x" * 300
    assert claimed[sent.id].created_at == sent.created_at
    results = repo.transition(
        [
            Change(m.id, ("sending",), "pending", m.created_at, lease=m.lease, return_records=True)
            for m in claimed.values()
        ],
        time.time(),
    )
    assert sorted((r.message.id, r.message.body) for r in results if r.message) == sorted(
        [(sent.id, b'{"a": 1}'), (plain.id, b"x" * 300)]
    )
    assert repo.delete([sent.id, plain.id], statuses=("pending",)) == [True, True]
    assert not repo.connection.exists(key, repo.keys.of(sent.id).idempotency("mem", "k-old"))
    assert outbox.send("mem", {"a": 2}, idempotency_key="k-old").id != sent.id


def test_binary_body_round_trips_exactly(repo):
    body = bytes(range(256)) * 4
    sent = outbox.send("mem", body)
    got = repo.get(sent.id)
    assert got.body == body and got.content_type == "application/octet-stream"


def test_get_missing_raises_and_get_many_gives_none(repo):
    with pytest.raises(outbox.MessageNotFound):
        repo.get("msg_nope")
    (m,) = make(repo)
    assert [x.id if x else None for x in repo.get_many(["msg_nope", m.id])] == [None, m.id]


def claim_change(message_id, lease="L1", now=None):
    now = time.time() if now is None else now
    return Change(
        id=message_id,
        from_statuses=("pending", "retrying"),
        to="sending",
        score=now + 30,
        set={"lease": lease},
        due_by=now,
        return_records=True,
    )


def test_claim_is_compare_and_set(repo):
    (m,) = make(repo)
    now = time.time()
    first = repo.transition([claim_change(m.id, "A")], now)[0]
    assert first.applied and first.status == "sending"
    assert first.message.id == m.id and first.message.lease == "A" and first.message.body == m.body
    second = repo.transition([claim_change(m.id, "B")], now)[0]
    assert not second.applied and second.status == "sending" and second.message is None
    assert repo.get(m.id).lease == "A"
    assert_index_invariant(repo)


def test_claim_refuses_a_message_not_yet_due(repo):
    (m,) = outbox.send_many([{"destination": "mem", "body": "later", "delay": 60}])
    result = repo.transition([claim_change(m.id)], time.time())[0]
    assert not result.applied and result.status == "pending"


def test_completion_needs_the_lease(repo):
    (m,) = make(repo)
    now = time.time()
    repo.transition([claim_change(m.id, "A")], now)
    wrong = Change(id=m.id, from_statuses=("sending",), to="succeeded", score=now, lease="B")
    assert not repo.transition([wrong], now)[0].applied
    right = Change(
        id=m.id, from_statuses=("sending",), to="succeeded", score=now, lease="A", unset=("lease",)
    )
    assert repo.transition([right], now)[0].applied
    got = repo.get(m.id)
    assert got.status == "succeeded" and got.lease == ""
    assert repo.count("succeeded") == 1 and repo.count("sending") == 0
    assert_index_invariant(repo)


@pytest.mark.parametrize(
    "start,to,allowed",
    [
        ("pending", "cancelled", ("pending", "retrying")),
        ("pending", "sending", ("pending", "retrying")),
    ],
)
def test_each_transition_moves_the_index(repo, start, to, allowed):
    (m,) = make(repo)
    now = time.time()
    r = repo.transition([Change(id=m.id, from_statuses=allowed, to=to, score=now)], now)[0]
    assert r.applied
    assert repo.count(to) == 1 and repo.count(start) == 0
    assert repo.count(to, "mem") == 1 and repo.count(start, "mem") == 0
    assert_index_invariant(repo)


def test_transition_of_a_missing_message_reports_empty_status(repo):
    r = repo.transition(
        [Change(id="msg_missing", from_statuses=("pending",), to="cancelled", score=1.0)], time.time()
    )[0]
    assert not r.applied and r.status == ""


def test_attempts_are_capped_newest_first(repo):
    (m,) = make(repo)
    repo.attempts_kept = 3
    now = time.time()
    for i in range(5):
        # Bounce the message between pending and retrying, recording an attempt each time.
        to = "retrying" if i % 2 == 0 else "pending"
        frm = ("pending",) if i % 2 == 0 else ("retrying",)
        attempt = Attempt(started_at=now + i, duration_ms=i, outcome="retrying", error=f"e{i}")
        assert repo.transition([Change(id=m.id, from_statuses=frm, to=to, score=now, attempt=attempt)], now)[
            0
        ].applied
    assert [a.error for a in repo.attempts(m.id)] == ["e4", "e3", "e2"]


def test_events_are_published_only_when_applied(repo):
    (m,) = make(repo)
    pubsub = repo.connection.pubsub()
    pubsub.subscribe(repo.events_channel)
    pubsub.get_message(timeout=1)  # the subscribe confirmation
    now = time.time()
    refused = Change(id=m.id, from_statuses=("failed",), to="pending", score=now, event='{"event":"no"}')
    applied = Change(id=m.id, from_statuses=("pending",), to="cancelled", score=now, event='{"event":"yes"}')
    repo.transition([refused, applied], now)
    message = pubsub.get_message(timeout=2)
    assert json.loads(message["data"]) == {"event": "yes"}
    assert pubsub.get_message(timeout=0.2) is None
    pubsub.close()


def test_outcome_events_are_skipped_without_a_subscriber_and_reach_a_pattern_subscriber(repo):
    def publishes() -> int:
        return int(repo.connection.info("commandstats").get("cmdstat_publish", {}).get("calls", 0))

    a, b = make(repo, 2)
    now = time.time()
    before = publishes()
    change = Change(id=a.id, from_statuses=("pending",), to="cancelled", score=now, event='{"event":"a"}')
    assert repo.transition([change], now)[0].applied
    assert publishes() == before  # nobody listens: no PUBLISH at all
    pubsub = repo.connection.pubsub()
    pubsub.psubscribe(repo.events_channel[:-2] + "*")
    pubsub.get_message(timeout=1)  # the psubscribe confirmation
    change = Change(id=b.id, from_statuses=("pending",), to="cancelled", score=now, event='{"event":"b"}')
    repo.transition([change], now)
    message = pubsub.get_message(timeout=2)
    assert json.loads(message["data"]) == {"event": "b"}
    pubsub.close()


def test_filter_count_and_pagination(repo):
    messages = make(repo, 25)
    ids = [m.id for m in messages]
    assert repo.count() == 25 and repo.count("pending") == 25 and repo.count("pending", "mem") == 25
    page1 = repo.filter(None, offset=0, limit=10)
    page3 = repo.filter(None, offset=20, limit=10)
    assert len(page1) == 10 and len(page3) == 5
    assert set(page1 + repo.filter(None, offset=10, limit=10) + page3) == set(ids)
    assert repo.counts() == {**{s: 0 for s in STATUSES}, "pending": 25}
    assert repo.destinations() == ["mem"]
    with pytest.raises(ValueError):
        repo.filter("bogus")


def test_iter_ids_sees_every_id_once_while_they_leave_the_index(repo):
    ids = {m.id for m in make(repo, 2500)}
    seen = []
    for batch in repo.iter_ids("pending", batch=300):
        seen += batch
        now = time.time()
        repo.transition(
            [Change(id=i, from_statuses=("pending",), to="cancelled", score=now) for i in batch], now
        )
    assert sorted(seen) == sorted(ids)
    seen_static = [i for batch in repo.iter_ids("cancelled", batch=7) for i in batch]
    assert sorted(seen_static) == sorted(ids)


def test_delete_removes_everything_but_refuses_sending(repo):
    a, b = make(repo, 2, idempotency_key=None)
    c = outbox.send("mem", "x", idempotency_key="del-key")
    now = time.time()
    repo.transition([claim_change(b.id)], now)
    assert repo.delete([a.id, b.id, c.id], ("pending", "failed")) == [True, False, True]
    assert (
        repo.connection.exists(
            repo.keys.message(a.id), repo.keys.resend(a.id), repo.keys.of(c.id).idempotency("mem", "del-key")
        )
        == 0
    )
    assert repo.count() == 1 and repo.count("sending") == 1
    assert_index_invariant(repo)


def test_delete_drops_the_idempotency_key_of_a_destination_named_in_non_ascii(repo):
    # delete.lua once counted the destination's length in bytes (4 for "zoë") where
    # keys.py counts characters (3): it looked for another key and left this one behind.
    from django.conf import settings

    with with_destinations(zoë=settings.OUTBOX["DESTINATIONS"]["mem"]):
        m = outbox.send("zoë", "x", idempotency_key="k-ë")
        key = repo.keys.of(m.id).idempotency("zoë", "k-ë")
        assert repo.connection.exists(key) == 1
        assert repo.delete([m.id], ("pending",)) == [True]
        assert repo.connection.exists(key) == 0
    assert_index_invariant(repo)


def test_release_gives_back_a_claim_whose_reply_was_lost_and_only_that_claim(repo):
    # Without ids, release.lua finds the claim's messages by its exact lease deadline in
    # every destination's sending index (the run-time keys of lib/keys.lua).
    a, b, c = make(repo, 3)
    now = time.time()
    part = partition_of(a.id)  # one send_many call: one partition (any, with partitions)
    lost = repo.claim("outbox", now, part, ClaimOptions(lease="lost", deadline=now + 60, limit=2))
    other = repo.claim("outbox", now, part, ClaimOptions(lease="other", deadline=now + 61, limit=1))
    assert len(lost.messages) == 2 and len(other.messages) == 1
    released = repo.release("other-token", now + 60, now)
    assert released.applied == []  # the lease must match too
    repo.clear_wake_flag("outbox")  # set by the send: the release sets it again
    released = repo.release("lost", now + 60, now)
    assert sorted(released.applied) == sorted(m.id for m in lost.messages)
    assert released.woken == ["outbox"]
    assert repo.count("sending") == 1 and repo.count("pending") == 2
    assert_index_invariant(repo)


def test_message_from_redis_ignores_unknown_fields(repo):
    (m,) = make(repo)
    repo.connection.hset(repo.keys.resend(m.id), "future_field", "x")
    assert isinstance(repo.get(m.id), Message)


def test_bulk_changes_give_every_message_its_own_score(repo):
    # Formatting float sums to 6 decimals once rounded neighbours to the same score.
    ids = [m.id for m in make(repo, 3000)]
    assert outbox.cancel(ids).acted == 3000
    scores = [
        score
        for key in repo.index("cancelled").keys
        for _, score in repo.connection.zrange(key, 0, -1, withscores=True)
    ]
    assert len(set(scores)) == 3000


def test_score_clock_never_hands_out_overlapping_chunks():
    # Two chunks of 1,000 prepared within a millisecond once shared scores.
    from outbox.operations.actions import TIE_BREAK_US, score_clock

    starts = [round(score_clock.reserve(1000) * 1e6) for _ in range(50)]
    assert all(later - earlier >= 1000 * TIE_BREAK_US for earlier, later in itertools.pairwise(starts))


def test_outcomes_are_written_before_the_claim_even_on_a_cold_script_cache(hook, redis):
    """A pipeline of transition + claim on a Redis whose script cache holds only
    claim.lua (a restart, then one claim): the outcome must still be written before the
    claim, so a retry due at once is claimed in the same round trip. Without loading the
    scripts first, transition met NOSCRIPT and ran after the claim."""
    import uuid

    from outbox.delivery.loop import claim
    from outbox.delivery.outcomes import decide, rules_for
    from outbox.records import Outcome
    from outbox.store import get_repository
    from outbox.store.decisions import change_of
    from outbox.store.scripts import sha, source

    m = outbox.send("hook", {"n": 1})
    (claimed,) = claim(m.queue)
    redis.script_flush()
    redis.script_load(source("claim"))
    assert redis.script_exists(sha("transition")) == [False]
    get_repository.cache_clear()
    repo = get_repository()
    now = time.time()
    change = change_of(
        decide(Outcome(claimed, now, 0.0, error="HTTP 503", status_code=503), now, rules_for(claimed))
    )
    assert change.to == "retrying" and change.score <= now + 0.01
    reply = repo.outcomes_and_claim(
        ExchangeRequest(
            m.queue,
            now + 0.01,
            uuid.uuid4().hex,
            now + 60,
            [PartitionAsk(partition_of(m.id), 10, {})],  # the message's partition (any, with partitions)
            changes=[change],
            slack=0.5,
        )
    )
    results, (next_claim,) = reply.results, reply.claims
    assert results[0].applied
    assert [x.id for x in next_claim.messages] == [m.id]


def server_commands(conn, action):
    """Commands Redis ran for ``action()`` (INFO commandstats, Lua's included), less the
    INFO and CONFIG calls of the measurement itself and the SCRIPT LOADs of a process's
    first call (one per script in lua/, once)."""
    conn.config_resetstat()
    action()
    return sum(
        int(v["calls"])
        for name, v in conn.info("commandstats").items()
        if not name.startswith(("cmdstat_info", "cmdstat_config", "cmdstat_script"))
    )


def test_a_batch_writes_each_index_once_not_once_per_message(repo):
    """Scripts gather their index writes (lib/writes.lua): a batch of N messages of two
    destinations costs about one command per message to create, two to claim (the
    resend record's HGETALL and HSET) and three to complete (HMGET, HSET, HDEL), plus a
    few per call, instead of one per index entry and record."""
    conn, n = repo.connection, 60
    batch = [{"destination": ("mem", "hook")[i % 2], "body": {"n": i}} for i in range(n)]
    messages = []
    created = server_commands(conn, lambda: messages.extend(outbox.send_many(batch)))
    assert created <= n + 30, created  # the wake-up job's enqueue (RQ) is about 20 of the rest
    now = time.time()
    claimed = []
    claim = lambda: claimed.extend(  # noqa: E731
        repo.claim(
            messages[0].queue,
            now,
            partition_of(messages[0].id),
            ClaimOptions(lease="L", deadline=now + 30, limit=n),
        ).messages
    )
    # with partitions a claim takes four steps of one slot each (outbox/store/partitioned.py):
    # the pick's read, the gate's grant and the apply's check cost about 5 commands a message
    per_message, per_call = (2, 15) if not repo.keys.partitioned else (6, 15 + 4 * repo.keys.partitions)
    assert server_commands(conn, claim) <= per_message * n + per_call
    assert sorted(m.id for m in claimed) == sorted(m.id for m in messages)
    assert {m.body for m in claimed} == {m.body for m in messages}
    done = [
        Change(id=m.id, from_statuses=("sending",), to="succeeded", score=now, lease="L", unset=("lease",))
        for m in claimed
    ]
    assert server_commands(conn, lambda: repo.transition(done, now)) <= 3 * n + 15
    assert repo.count("succeeded") == n and repo.count("sending") == 0
    assert_index_invariant(repo)


def test_a_message_changed_twice_in_one_call_keeps_the_order_of_its_index_writes(repo):
    a, b = make(repo, 2)
    now = time.time()
    changes = [
        Change(id=a.id, from_statuses=("pending",), to="cancelled", score=now),
        Change(id=b.id, from_statuses=("pending",), to="cancelled", score=now),
        Change(id=a.id, from_statuses=("cancelled",), to="pending", score=now + 1),
        Change(id=a.id, from_statuses=("pending",), to="pending", score=now + 2),
    ]
    assert [r.applied for r in repo.transition(changes, now)] == [True] * 4
    assert repo.get(a.id).status == "pending" and repo.get(b.id).status == "cancelled"
    assert repo.connection.zscore(repo.keys.of(a.id).due(a.queue), a.id) == pytest.approx(now + 2)
    assert_index_invariant(repo)
    # the same id twice in one bulk action: acted on once, indexes in step
    assert outbox.cancel([a.id, a.id, b.id]).acted == 1
    assert outbox.requeue([b.id, b.id]).acted == 1
    assert_index_invariant(repo)


def test_a_claim_reads_older_hash_records_among_string_ones(repo):
    """The claim reads its messages' records with one MGET; a record an older version
    wrote (a hash, which MGET answers as nil) is read on its own."""
    messages = make(repo, 3)
    old = messages[1]
    key = repo.keys.message(old.id)
    conn = repo.connection
    conn.delete(key)
    conn.hset(
        key,
        mapping={
            "destination": "mem",
            "content_type": "application/json",
            "created_at": repr(old.created_at),
            "body": old.body,
        },
    )
    now = time.time()
    claimed = repo.claim(
        old.queue, now, partition_of(old.id), ClaimOptions(lease="L", deadline=now + 30, limit=10)
    ).messages
    assert {m.id: m.body for m in claimed} == {m.id: m.body for m in messages}
