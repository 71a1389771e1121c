"""Destination health (issue 8): circuit breaker, parking, pause/resume/disable/enable,
Retry-After, 410 Gone, DISABLE_AFTER, events, and bounded health reads. Real Redis, real
RQ workers, a real HTTP receiver answering a script of statuses."""

from __future__ import annotations

import json
import time

import pytest
from django.core.management import CommandError, call_command

import outbox
from outbox import events
from outbox.destinations import controls, health
from outbox.exceptions import UnknownDestination
from outbox.records import new_message_id
from tests.support import assert_due_order, assert_index_invariant, hook_settings

BREAKER = {"FAILURES": 3, "COOLDOWN": 60, "MAX_COOLDOWN": 600}


def hook(receiver, **destination):
    """The 'hook' destination at ``receiver``, one attempt in flight at a time (a
    deterministic order), with the given settings."""
    return hook_settings(receiver.url, **{"MAX_IN_FLIGHT": 1, "MAX_RETRIES": 5, **destination})


def ids_of(receiver) -> list[str]:
    return [r.headers["webhook-id"] for r in receiver.requests]


def dest_hash(repo) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in repo.connection.hgetall(repo.keys.dest("hook")).items()}


def test_breaker_opens_after_n_consecutive_failures_and_charges_no_retry_after(receiver, worker, repo):
    receiver.respond(503)
    with hook(receiver, BREAKER=BREAKER):
        sent = outbox.send_many([{"destination": "hook", "body": i} for i in range(10)])
        worker(simple=True)
        h = health.get_health("hook")
    assert len(receiver.requests) == 3  # the third failure opened it: nothing more was attempted
    assert (h.breaker, h.state, h.consecutive_failures, h.parked) == ("open", "open", 3, 10)
    assert h.opened_at and h.next_probe_at == pytest.approx(h.opened_at + 60, abs=0.01)
    got = {m.id: m for m in (outbox.get(s.id) for s in sent)}
    first, second, third = (got[i] for i in ids_of(receiver))
    assert first.retry_count == second.retry_count == 1  # charged: the breaker was closed
    assert (third.status, third.retry_count) == ("pending", 0)  # the attempt that opened it: not charged
    assert [a.outcome for a in outbox.attempts(third.id)] == ["parked"]
    assert all(m.retry_count == 0 for m in got.values() if m.id not in (first.id, second.id))
    assert repo.counts()["pending"] + repo.counts()["retrying"] == 10
    assert (h.window.retryable, h.window.attempts, h.totals["retryable"]) == (3, 3, 3)
    assert_index_invariant(repo)


def test_probe_after_cooldown_which_doubles_while_probes_fail(receiver, worker, repo):
    receiver.respond(503)
    with hook(receiver, BREAKER={"FAILURES": 1, "COOLDOWN": 1.0, "MAX_COOLDOWN": 2.5}):
        m = outbox.send("hook", 1)
        worker(simple=True)
        state = dest_hash(repo)
        assert len(receiver.requests) == 1 and float(state["cooldown"]) == 1.0
        assert (
            controls.release_parked_due(now=float(state["opened_at"]) + 0.5) == 0
        )  # not before the cool-down
        cooldowns = []
        for _ in range(3):
            time.sleep(max(0.0, float(dest_hash(repo)["next_probe_at"]) - time.time()) + 0.05)
            worker(simple=True)  # the wake check unparks one message as the probe
            cooldowns.append(float(dest_hash(repo)["cooldown"]))
        assert len(receiver.requests) == 4  # one probe per cool-down
        assert cooldowns == [2.0, 2.5, 2.5]  # doubled, capped at MAX_COOLDOWN
        got = outbox.get(m.id)
        assert (got.status, got.retry_count) == ("pending", 0)  # failed probes spend no retry
        assert [a.outcome for a in outbox.attempts(m.id)] == ["parked"] * 4
        assert health.get_health("hook").breaker == "open"
    assert_index_invariant(repo)


def test_probe_success_closes_and_what_was_parked_is_delivered_oldest_first(receiver, worker, repo):
    receiver.respond(503, 503, 200)
    with hook(receiver, BREAKER={"FAILURES": 2, "COOLDOWN": 0.3}):
        sent = [outbox.send("hook", i) for i in range(6)]
        worker(simple=True)
        assert len(receiver.requests) == 2 and health.get_health("hook").parked == 6
        time.sleep(0.4)
        worker(simple=True)
        h = health.get_health("hook")
    ids = [m.id for m in sent]
    # m0 failed while closed (retrying, due again at once), the next attempted (m1 with
    # one partition) opened the breaker; the probe is the oldest due (m2); closing puts
    # the rest back in due order. With several partitions a run shares its claims among
    # them, so the second attempted is any of the others (roughly in due order: see
    # assert_due_order) and the order holds within each partition.
    got = ids_of(receiver)
    first, second = got[:2]
    assert first == ids[0]
    rest = [i for i in ids if i not in (first, second)]
    assert_due_order(repo, got, [first, second, *rest, first, second])
    assert (h.breaker, h.parked, h.consecutive_failures, h.failing_since) == ("closed", 0, 0, None)
    assert repo.counts()["succeeded"] == 6
    assert_index_invariant(repo)


def test_retry_after_on_429_blocks_the_whole_destination(receiver, worker, repo):
    receiver.respond((429, {"Retry-After": "2"}, 0.0), 200)
    with hook(receiver):
        sent = [outbox.send("hook", i) for i in range(3)]
        started = time.time()
        worker(simple=True)
        h = health.get_health("hook")
        assert len(receiver.requests) == 1
        assert h.blocked_until == pytest.approx(started + 2, abs=1.0)
        assert h.state == "blocked"  # not "healthy" while a Retry-After holds it
        later = [outbox.get(m.id) for m in sent[1:]]
        assert all(m.retry_count == 0 and m.next_attempt_at >= h.blocked_until - 0.01 for m in later)
        time.sleep(max(0.0, h.blocked_until - time.time()) + 0.1)
        worker(simple=True)
    assert repo.counts()["succeeded"] == 3
    assert all(r.at >= h.blocked_until - 0.05 for r in receiver.requests[1:])
    assert_index_invariant(repo)


def test_410_gone_disables_the_destination_and_enable_delivers_what_waited(receiver, worker, repo):
    receiver.respond(410)
    with hook(receiver):
        first, second = outbox.send("hook", 1), outbox.send("hook", 2)
        worker(simple=True)
        h = health.get_health("hook")
        assert (h.admin, h.disabled_reason, h.state, h.parked) == ("disabled", "410 Gone", "disabled", 1)
        assert outbox.get(first.id).status == "failed"  # 410 is permanent for its message
        assert len(receiver.requests) == 1
        receiver.respond(200)
        assert controls.enable("hook") == 1
        worker(simple=True)
    assert outbox.get(second.id).status == "succeeded"
    assert health.get_health("hook").admin == "active"
    assert_index_invariant(repo)


def test_pause_delivers_nothing_loses_nothing_and_resume_delivers_all_oldest_first(receiver, worker, repo):
    with hook(receiver):
        controls.pause("hook", reason="receiver maintenance")
        sent = outbox.send_many([{"destination": "hook", "body": i} for i in range(5)])
        worker(simple=True)
        h = health.get_health("hook")
        assert receiver.requests == [] and (h.admin, h.disabled_reason, h.parked) == (
            "paused",
            "receiver maintenance",
            5,
        )
        assert repo.counts()["pending"] == 5
        assert_index_invariant(repo)
        assert controls.resume("hook") == 5
        worker(simple=True)
    assert_due_order(repo, ids_of(receiver), [m.id for m in sent])
    assert repo.counts()["succeeded"] == 5 and health.get_health("hook").parked == 0
    assert_index_invariant(repo)


def test_in_flight_failure_while_paused_parks_without_a_retry(receiver, worker, repo):
    from outbox.delivery.loop import claim
    from outbox.delivery.outcomes import decide, rules_for, write
    from outbox.records import Outcome

    with hook(receiver):
        m = outbox.send("hook", 1)
        (claimed,) = claim(outbox.get(m.id).queue)
        controls.pause("hook")
        now = time.time()
        write(
            [decide(Outcome(claimed, now, 0.0, error="HTTP 503", status_code=503), now, rules_for(claimed))],
            now,
        )
        got = outbox.get(m.id)
        assert (got.status, got.retry_count, health.get_health("hook").parked) == ("pending", 0, 1)
        assert_index_invariant(repo)


def test_unknown_destination_actions_raise():
    with pytest.raises(UnknownDestination):
        controls.pause("nope")
    with pytest.raises(UnknownDestination):
        controls.resume("nope")


def test_auto_disable_after_failing_continuously_for_disable_after(receiver, worker, repo):
    receiver.respond(503)
    with hook(receiver, DISABLE_AFTER=1, RETRY=[2], MAX_RETRIES=10):
        m = outbox.send("hook", 1)
        worker(simple=True)  # fails; its retry is due in 2 s (beyond a claim's slack)
        assert health.get_health("hook").admin == "active"
        time.sleep(2.1)
        worker(simple=True)  # fails again, failing for over 1 s: disabled
        h = health.get_health("hook")
    assert (h.admin, h.disabled_reason) == ("disabled", "failing for 1 s")
    got = outbox.get(m.id)
    assert (got.status, got.retry_count, h.parked) == ("retrying", 1, 1)  # the second failure: parked
    assert [a.outcome for a in outbox.attempts(m.id)] == ["parked", "retrying"]
    assert_index_invariant(repo)


def test_events_are_published_once_per_transition_not_per_message(receiver, worker, repo):
    received: list[str] = []

    def on_opened(sender, event, **kwargs):
        received.append(event.event)

    events.destination_opened.connect(on_opened)
    pubsub = repo.connection.pubsub()
    pubsub.subscribe(repo.events_channel)
    pubsub.get_message(timeout=1)
    receiver.respond(503, 503, 200)
    try:
        with hook(receiver, BREAKER={"FAILURES": 2, "COOLDOWN": 0.3}):
            outbox.send_many([{"destination": "hook", "body": i} for i in range(8)])
            worker(simple=True)
            time.sleep(0.4)
            worker(simple=True)
    finally:
        events.destination_opened.disconnect(on_opened)
    names = []
    while (item := pubsub.get_message(timeout=0.2)) is not None:
        event = json.loads(item["data"])["event"]
        if event.startswith("destination."):
            names.append(event)
    pubsub.close()
    assert names == [
        "destination.failing",
        "destination.opened",
        "destination.recovered",
        "destination.closed",
    ]
    assert received == ["destination.opened"]  # the worker handed it to outbox.alerts.notify


def test_exhausted_event_when_retries_run_out(receiver, worker, repo):
    got: list = []

    def on_exhausted(sender, event, **kwargs):
        got.append(event)

    events.message_exhausted.connect(on_exhausted)
    receiver.respond(500)
    try:
        with hook(receiver, MAX_RETRIES=1):
            m = outbox.send("hook", 1)
            worker(simple=True)
    finally:
        events.message_exhausted.disconnect(on_exhausted)
    assert [(e.event, e.detail["id"]) for e in got] == [("message.exhausted", m.id)]


def test_cancel_or_delete_of_a_parked_message_leaves_no_entry_that_resurrects_it(receiver, worker, repo):
    with hook(receiver):
        controls.pause("hook")
        a, b, c = (outbox.send("hook", i) for i in range(3))
        worker(simple=True)
        assert health.get_health("hook").parked == 3
        outbox.cancel(a.id)
        outbox.delete(b.id)
        parked = [i for key in repo.keys.every("parked", "hook") for i in repo.connection.zrange(key, 0, -1)]
        assert parked == [c.id.encode()]
        assert_index_invariant(repo)
        assert controls.resume("hook") == 1
        worker(simple=True)
    assert ids_of(receiver) == [c.id]
    assert outbox.get(a.id).status == "cancelled"
    assert_index_invariant(repo)


def test_health_window_latency_errors_timeline_and_bounded_reads(receiver, worker, repo):
    receiver.respond(200, 200, 500, (404, {}, 0.0), 200)
    with hook(receiver):
        for i in range(5):
            outbox.send("hook", i)
        worker(simple=True)
        commands = _commands_for(repo, lambda: health.get_health("hook"))
        h = health.get_health("hook")
        groups = health.error_groups("hook")
        chart = health.timeline("hook", minutes=5)
        everything = health.timeline(None, minutes=5)
    assert (h.window.succeeded, h.window.retryable, h.window.permanent) == (4, 1, 1)
    assert h.window.failure_rate == pytest.approx(2 / 6)
    assert h.window.p50_ms is not None and 0 < h.window.p50_ms <= h.window.p95_ms
    assert h.totals == {"succeeded": 4, "retryable": 1, "permanent": 1}
    assert h.latency_buckets[-1] == (float("inf"), 6) and h.latency_sum_seconds > 0
    assert sorted((g.status_code, g.error_class, g.count) for g in groups) == [
        (404, "http", 1),
        (500, "http", 1),
    ]
    assert sum(m.succeeded for m in chart) == 4 and sum(m.succeeded for m in everything) == 4
    # The same number of commands however many attempts were recorded (with partitions,
    # one more per partition: the size of the destination's parked set in each).
    repo.record_outcomes([["hook", "s", 5.0, 200, "", "", 0, f"m{i}"] for i in range(500)], "{}", time.time())
    assert _commands_for(repo, lambda: health.get_health("hook")) == commands <= 7 + repo.keys.partitions


def test_the_latest_minute_rides_in_the_state_hash_and_moves_to_its_minute_hash_later(repo):
    # On one partition a minute's counts are carried in the destination's state hash
    # (written by the HSET health.lua makes anyway) instead of 2 HINCRBY and an EXPIRE of
    # a minute hash per destination and exchange; a later minute's outcomes move them to
    # their minute's hash. The reads see the same either way.
    minute = int(time.time() // 60) - 3

    def outcomes(kinds: str, first: int) -> list[list]:
        return [
            ["hook", k, 3.0, 503 if k != "s" else 200, "http", "", 0, f"m{first + i}"]
            for i, k in enumerate(kinds)
        ]

    def hincrbys() -> int:
        return int(repo.connection.info("commandstats").get("cmdstat_hincrby", {}).get("calls", 0))

    before = hincrbys()
    repo.record_outcomes(outcomes("ssr", 0), "{}", minute * 60 + 10)
    repo.record_outcomes(outcomes("s", 3), "{}", minute * 60 + 50)
    if not repo.keys.partitioned:
        assert hincrbys() == before + 1  # the hour's error count of the "r"; the minute's: none
        assert not repo.connection.exists(repo.keys.health("hook", minute))
    repo.record_outcomes(outcomes("ss", 4), "{}", (minute + 1) * 60 + 5)
    repo.record_outcomes(outcomes("p", 6), "{}", (minute + 3) * 60 + 5)
    now = (minute + 3) * 60 + 30
    h = health.get_health("hook", now)
    chart = health.timeline("hook", minutes=5, now=now)
    assert (h.window.succeeded, h.window.retryable, h.window.permanent) == (5, 1, 1)
    assert [(m.succeeded, m.retryable, m.permanent) for m in chart] == [
        (0, 0, 0), (3, 1, 0), (2, 0, 0), (0, 0, 0), (0, 0, 1)
    ]  # fmt: skip
    assert h.window.p50_ms is not None and sum(n for _, n in h.latency_buckets[-1:]) == 7
    moved = {k.decode(): int(v) for k, v in repo.connection.hgetall(repo.keys.health("hook", minute)).items()}
    assert (moved["s"], moved["r"], moved.get("p", 0)) == (3, 1, 0)  # its hash has it now
    assert 7200 - 300 < repo.connection.ttl(repo.keys.health("hook", minute)) <= 7200 + 60
    if not repo.keys.partitioned:
        state = dest_hash(repo)
        assert (state["cm"], state["cp"], "cs" in state) == (str(minute + 3), "1", False)


def _commands_for(repo, action) -> int:
    """Commands the server ran for ``action`` (INFO commandstats, the INFO calls excluded)."""

    def total() -> int:
        stats = repo.connection.info("commandstats")
        return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")

    before = total()
    action()
    return total() - before


def test_status_command_and_actions(receiver, capsys, repo):
    with hook(receiver):
        call_command("outbox_destination", "pause", "hook", "--reason", "maintenance")
        call_command("outbox_destination", "status", "hook")
        out = capsys.readouterr().out
        assert "hook: paused" in out and "admin=paused (maintenance)" in out
        call_command("outbox_destination", "resume", "hook")
        call_command("outbox_destination", "status")
        out = capsys.readouterr().out
        assert "hook: resumed; 0 waiting message(s)" in out and "hook: idle" in out
        with pytest.raises(CommandError, match="unknown destination 'hoook'"):
            call_command("outbox_destination", "status", "hoook")


def test_settings_are_validated_with_clear_errors():
    from django.core.exceptions import ImproperlyConfigured

    from outbox.destinations.config import get_destination

    for bad, text in [
        ({"BREAKER": {"FAILURES": 0}}, "['BREAKER']['FAILURES'] must be an integer >= 1"),
        ({"BREAKER": {"NOPE": 1}}, "unknown key(s) NOPE"),
        ({"RATE_LIMIT": "fast"}, "['RATE_LIMIT'] must look like '100/s'"),
        ({"RATE_LIMIT": {"RATE": 0}}, "['RATE_LIMIT']['RATE'] must be a number above 0"),
        ({"MAX_CONCURRENCY": 0}, "['MAX_CONCURRENCY'] must be None or an integer >= 1"),
        ({"DISABLE_AFTER": -1}, "['DISABLE_AFTER'] must be None or seconds above 0"),
    ]:
        with hook_settings("http://127.0.0.1:9/hook", **bad), pytest.raises(ImproperlyConfigured) as info:
            get_destination("hook")
        assert text in str(info.value), str(info.value)
    with hook_settings("http://127.0.0.1:9/hook", RATE_LIMIT="6000/m", MAX_CONCURRENCY=4, BREAKER=False):
        d = get_destination("hook")
        assert (d.rate_limit.interval, d.max_concurrency, d.breaker) == (0.01, 4, None)


def test_system_checks_report_invalid_protection_settings(settings):
    from outbox.checks import check_outbox_settings

    settings.OUTBOX = {**settings.OUTBOX, "RATE_LIMIT": "lots", "BREAKER": {"COOLDOWN": 0}}
    messages = [(e.id, e.msg) for e in check_outbox_settings()]
    assert ("outbox.E001", "OUTBOX['BREAKER']['COOLDOWN'] must be seconds above 0, not 0") in messages
    assert any(
        i == "outbox.E001" and m.startswith("OUTBOX['RATE_LIMIT'] must look like") for i, m in messages
    )
    assert any(i == "outbox.E002" and "['hook']['BREAKER']" in m for i, m in messages)


def test_a_probe_whose_lease_expired_lets_another_go(receiver, worker, repo, settings):
    from outbox.delivery.loop import claim
    from outbox.delivery.recovery import recover

    settings.OUTBOX = {**settings.OUTBOX, "VISIBILITY_TIMEOUT": 1}
    receiver.respond(503)
    with hook(receiver, BREAKER={"FAILURES": 1, "COOLDOWN": 0.2}):
        m = outbox.send("hook", 1)
        worker(simple=True)  # fails: open
        time.sleep(0.3)
        assert controls.release_parked_due() == 1  # the cool-down is over: the oldest parked becomes due
        (probe,) = claim(outbox.get(m.id).queue)  # claimed as the probe; its worker "dies"
        state = dest_hash(repo)
        assert (state["breaker"], state["probe_id"]) == ("half_open", m.id)
        assert controls.release_parked_due() == 0  # no second probe while this one's lease runs
        time.sleep(max(0.0, float(state["probe_deadline"]) - time.time()) + 0.1)
        assert recover().lost == 1  # taken back while half-open: parked, uncharged
        got = outbox.get(m.id)
        assert (got.status, got.retry_count, health.get_health("hook").parked) == ("pending", 0, 1)
        assert controls.release_parked_due() == 1  # a new probe may go
        receiver.respond(200)
        worker(simple=True)
    assert outbox.get(m.id).status == "succeeded" and health.get_health("hook").breaker == "closed"
    assert_index_invariant(repo)


def test_breaker_opens_on_the_failure_rate_with_enough_attempts(repo):
    # FAILURES out of reach: only the rate can open it. [failures, rate, min attempts,
    # window, cool-down, max cool-down, disable after] as config.breaker_config_json() gives.
    config = json.dumps({"hook": [100, 0.4, 10, 300, 15, 600, 0]})
    now = time.time()

    def outcome(kind: str, i: int) -> list:
        return ["hook", kind, 3.0, 503 if kind == "r" else 200, "http" if kind == "r" else "", "", 0, f"m{i}"]

    assert (
        repo.record_outcomes([outcome("rs"[i % 2], i) for i in range(8)], config, now) == []
    )  # 8 < 10 attempts
    raised = repo.record_outcomes([outcome("r", 8), outcome("s", 9)], config, now)
    assert [json.loads(e)["event"] for e in raised] == ["destination.opened"]
    assert json.loads(raised[0])["reason"] == "failure rate" and json.loads(raised[0])["failure_rate"] == 0.5
    assert health.get_health("hook").breaker == "open"


def test_unpark_skips_stale_entries(receiver, repo):
    with hook(receiver):
        controls.pause("hook")
        gone = new_message_id(partition=repo.keys.partitions - 1 if repo.keys.partitioned else None)
        repo.connection.zadd(repo.keys.of(gone).parked("hook"), {gone: 1.0})
        assert controls.resume("hook") == 0
    assert sum(repo.connection.zcard(key) for key in repo.keys.every("parked", "hook")) == 0


def test_resume_behind_an_open_breaker_lets_one_probe_go_not_everything(receiver, worker, repo):
    receiver.respond(503)
    with hook(receiver, BREAKER={"FAILURES": 1, "COOLDOWN": 0.2}):
        outbox.send_many([{"destination": "hook", "body": i} for i in range(5)])
        worker(simple=True)  # the first fails: open; the others park
        controls.pause("hook")
        time.sleep(0.3)  # the probe is due
        assert controls.resume("hook") == 1  # one probe, the others keep waiting
        assert health.get_health("hook").parked == 4
    assert_index_invariant(repo)


# -- issue 30, item 6: a breaker turned off while it is open ---------------------------------


def open_the_breaker(receiver, worker, count: int = 3, cooldown: float = 60) -> list:
    """Messages to 'hook' parked behind a breaker (FAILURES 1) that one 503 opened."""
    receiver.respond(503, 200)  # the first request fails, the rest succeed
    with hook(receiver, BREAKER={"FAILURES": 1, "COOLDOWN": cooldown}):
        sent = [outbox.send("hook", i) for i in range(count)]
        worker(simple=True)
        h = health.get_health("hook")
    assert (h.breaker, h.parked, len(receiver.requests)) == ("open", count, 1)
    return sent


def test_the_recovery_sweep_closes_a_breaker_left_open_by_an_earlier_setting(receiver, worker, repo):
    sent = open_the_breaker(receiver, worker)
    closed = []
    events.destination_closed.connect(
        lambda sender, **kw: closed.append(kw), weak=False, dispatch_uid="t-closed"
    )
    try:
        with hook(receiver, BREAKER=False):
            worker(simple=True)  # its housekeeping pass: the recovery sweep, then the jobs
            h = health.get_health("hook")
    finally:
        events.destination_closed.disconnect(dispatch_uid="t-closed")
    assert (h.breaker, h.parked) == ("closed", 0)
    assert {outbox.get(m.id).status for m in sent} == {"succeeded"}
    assert [e["event"].detail["reason"] for e in closed] == ["no breaker configured"]
    assert_index_invariant(repo)


def test_an_outcome_closes_a_breaker_left_half_open_when_none_is_configured(
    receiver, worker, repo, monkeypatch
):
    """Without the sweep: the probe the wake check lets out after the cool-down meets no
    breaker, so its failure is a retry charged like any other, not 'parked' for good."""
    monkeypatch.setattr("outbox.delivery.recovery.close_breakers_left", lambda: [])
    sent = open_the_breaker(receiver, worker, cooldown=0.2)
    time.sleep(0.3)
    receiver.respond(503, 503, 200)  # the second request (the probe) fails too
    with hook(receiver, BREAKER=False):
        worker(simple=True)  # the probe fails: no breaker now, so it closes; the rest go
        h = health.get_health("hook")
        assert_index_invariant(repo)
        worker(simple=True)  # the probe's retry (RETRY [0]: due at once)
    assert (h.breaker, h.parked) == ("closed", 0)
    got = [outbox.get(m.id) for m in sent]
    assert [m.status for m in got] == ["succeeded"] * 3
    # the probe's failure was charged as a retry (there is no breaker to park it)
    assert sorted(m.retry_count for m in got) == [0, 0, 1]
    probe = next(m for m in got if m.retry_count == 1)
    assert [a.outcome for a in reversed(outbox.attempts(probe.id))] == ["retrying", "succeeded"]
