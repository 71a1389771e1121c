"""Alerts (issue 8): Django signals always; email to ADMINS and signed operational webhooks
delivered through the outbox by a real worker, suppressed across workers in Redis."""

from __future__ import annotations

import base64
import json
import threading
import time
from datetime import datetime

import pytest
from django.test import override_settings
from standardwebhooks import Webhook

import outbox
from outbox import alerts, events
from outbox.checks import check_outbox_settings
from outbox.destinations import controls, health
from outbox.events import DestinationEvent

SECRET = "whsec_" + base64.b64encode(b"ops-alerts-signing-key-0123456789").decode()
DEAD_URL = "http://127.0.0.1:9/hook"  # nothing listens on the discard port: connection refused


def alerting(
    receiver,
    *,
    suppress: float = 900,
    email: bool = True,
    webhook: bool = True,
    events_: list[str] | None = None,
    admins=(("Ops", "ops@example.com"), ("On call", "oncall@example.com")),
    **destinations: dict,
) -> override_settings:
    """The test OUTBOX with an ops webhook (the ``receiver``), an ops email destination,
    ``destinations`` added, and ``ALERTS`` using them."""
    from django.conf import settings

    config = {**settings.OUTBOX}
    config["DESTINATIONS"] = {
        **config["DESTINATIONS"],
        "ops-hook": {
            "TRANSPORT": "webhook",
            "OPTIONS": {"url": receiver.url, "secret": SECRET, "timeout": 5, "allow_private_networks": True},
            "RETRY": [0],
            "MAX_RETRIES": 3,
        },
        "ops-mail": {"TRANSPORT": "email", "OPTIONS": {"timeout": 2}, "RETRY": [0], "MAX_RETRIES": 3},
        **destinations,
    }
    config["ALERTS"] = {
        "SUPPRESS": suppress,
        "EMAIL_ADMINS": "ops-mail" if email else None,
        "WEBHOOK": "ops-hook" if webhook else None,
    }
    if events_ is not None:
        config["ALERTS"]["EVENTS"] = events_
    return override_settings(OUTBOX=config, ADMINS=list(admins))


def dead(**extra) -> dict:
    """A webhook destination whose receiver is down (connection refused, retryable)."""
    return {
        "TRANSPORT": "webhook",
        "OPTIONS": {"url": DEAD_URL, "timeout": 2, "allow_private_networks": True},
        "RETRY": [0],
        **extra,
    }


def opened(destination: str = "hook", at: float | None = None, **detail) -> DestinationEvent:
    return DestinationEvent(
        "destination.opened",
        destination,
        time.time() if at is None else at,
        detail or {"consecutive_failures": 5},
    )


def exhausted(destination: str, message_id: str, at: float | None = None) -> DestinationEvent:
    return DestinationEvent(
        "message.exhausted",
        destination,
        time.time() if at is None else at,
        {"id": message_id, "retry_count": 3, "status_code": 503, "error": "HTTP 503"},
    )


def verified(receiver) -> list[dict]:
    """Every request the ops receiver got, its Standard Webhooks signature verified."""
    return [Webhook(SECRET).verify(r.body, r.headers) for r in receiver.requests]


def test_an_alert_is_a_signed_webhook_and_an_email_to_admins_delivered_by_a_worker(
    receiver, worker, mailoutbox
):
    with alerting(receiver):
        at = time.time()
        alerts.notify([opened(at=at, consecutive_failures=5, next_probe_at=at + 15)])
        worker(simple=True)
    (payload,) = verified(receiver)
    assert payload["type"] == "destination.opened"
    assert datetime.fromisoformat(payload["timestamp"].replace("Z", "+00:00")).timestamp() == pytest.approx(
        at, abs=0.001
    )
    assert payload["data"] == {
        "destination": "hook",
        "at": at,
        "consecutive_failures": 5,
        "next_probe_at": at + 15,
        "count": 1,
        "since": at,
    }
    (email,) = mailoutbox
    assert email.to == ["ops@example.com", "oncall@example.com"]
    assert email.subject == "[Django] outbox: hook: circuit breaker opened (deliveries held)"
    assert "consecutive_failures: 5" in email.body
    # Both went through the outbox: messages with history in the console.
    sent = [outbox.get(i) for i in repo_ids("ops-hook") + repo_ids("ops-mail")]
    assert [m.status for m in sent] == ["succeeded", "succeeded"]


def repo_ids(destination: str) -> list[str]:
    from outbox.store import get_repository

    repo = get_repository()
    return [
        r.decode()
        for key in repo.keys.every("created", destination)
        for r in repo.connection.zrange(key, 0, -1)
    ]


def test_the_same_event_twice_and_from_many_workers_at_once_sends_one_alert(receiver, worker, mailoutbox):
    with alerting(receiver, suppress=3):
        event = opened()
        alerts.notify([event])
        alerts.notify([event])
        start = threading.Barrier(8)

        def another_worker():
            start.wait()
            alerts.notify([opened()])

        threads = [threading.Thread(target=another_worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        worker(simple=True)
        assert len(verified(receiver)) == 1
        assert len(mailoutbox) == 1
        assert len(repo_ids("ops-hook")) == 1
        # Exactly one call won the window; the next alert reports the nine it suppressed.
        time.sleep(3.05)
        alerts.notify([opened()])
        worker(simple=True)
    assert [p["data"]["count"] for p in sorted(verified(receiver), key=lambda p: p["timestamp"])] == [1, 10]


def test_after_the_window_another_alert_reports_what_was_suppressed(receiver, worker):
    with alerting(receiver, suppress=0.3, email=False):
        alerts.notify([opened()])
        second = opened()
        alerts.notify([second])  # suppressed, counted
        time.sleep(0.35)
        third = opened()
        alerts.notify([third])
        worker(simple=True)
    first_alert, second_alert = sorted(verified(receiver), key=lambda p: p["timestamp"])
    assert first_alert["data"]["count"] == 1
    assert (second_alert["data"]["count"], second_alert["data"]["since"]) == (2, second.at)
    assert second_alert["data"]["at"] == third.at


def test_other_events_and_destinations_have_windows_of_their_own(receiver, worker):
    with alerting(receiver, email=False):
        now = time.time()
        alerts.notify(
            [
                opened("hook", now),
                DestinationEvent("destination.closed", "hook", now + 1, {}),
                opened("mem", now),
                opened("hook", now + 2),  # suppressed
            ]
        )
        worker(simple=True)
    got = sorted((p["type"], p["data"]["destination"]) for p in verified(receiver))
    assert got == [
        ("destination.closed", "hook"),
        ("destination.opened", "hook"),
        ("destination.opened", "mem"),
    ]


def test_a_repeated_notify_after_the_window_cannot_send_the_same_event_twice(receiver, worker):
    with alerting(receiver, suppress=0.2, email=False):
        event = opened()
        alerts.notify([event])
        time.sleep(0.25)
        alerts.notify([event])  # a new window, but the same event: its idempotency key
        worker(simple=True)
    assert len(verified(receiver)) == 1


def test_exhausted_messages_are_aggregated_per_destination_and_none_goes_unreported(receiver, worker):
    with alerting(receiver, suppress=0.5, email=False):
        t = time.time()
        alerts.notify([exhausted("hook", "msg_1", t)])
        alerts.notify([exhausted("hook", "msg_2", t + 0.01), exhausted("hook", "msg_3", t + 0.02)])
        alerts.notify([exhausted("hook", "msg_4", t + 0.03), exhausted("mem", "msg_5", t + 0.03)])
        worker(simple=True)  # the first alert of each destination
        first = sorted(verified(receiver), key=lambda p: p["data"]["destination"])
        assert [(p["type"], p["data"]["destination"], p["data"]["count"]) for p in first] == [
            ("message.exhausted", "hook", 1),
            ("message.exhausted", "mem", 1),
        ]
        assert first[0]["data"]["last"]["id"] == "msg_1"
        time.sleep(0.55)
        worker(simple=True)  # housekeeping reports what the ended window counted
        time.sleep(0.55)
        worker(simple=True)  # nothing more to report
    payloads = verified(receiver)
    assert len(payloads) == 3
    flushed = payloads[2]["data"]
    assert (flushed["destination"], flushed["count"], flushed["since"]) == ("hook", 3, t + 0.01)
    assert flushed["last"]["id"] == "msg_4"


def test_messages_whose_retries_run_out_alert_once_with_their_count(receiver, worker, mailoutbox):
    got: list = []

    def on_exhausted(sender, message, attempt, event, **kwargs):
        got.append((message.id, message.status, attempt.outcome, event.event))

    events.message_exhausted.connect(on_exhausted)
    try:
        with alerting(receiver, suppress=0.5, dead=dead(MAX_RETRIES=1)):
            sent = outbox.send_many([{"destination": "dead", "body": i} for i in range(6)])
            worker(simple=True)
            time.sleep(0.55)
            worker(simple=True)
    finally:
        events.message_exhausted.disconnect(on_exhausted)
    assert sorted(got) == sorted((m.id, "failed", "failed", "message.exhausted") for m in sent)
    payloads = [p for p in verified(receiver) if p["type"] == "message.exhausted"]
    assert 1 <= len(payloads) <= 2  # one alert, and one more for what its window counted
    assert sum(p["data"]["count"] for p in payloads) == 6
    mails = [m for m in mailoutbox if "exhausted" in m.subject]
    assert 1 <= len(mails) <= 2
    assert "message(s) to 'dead' became dead letters" in mails[0].body


@pytest.mark.parametrize("policy", ["block", "skip"])
def test_an_exhausted_ordered_message_names_its_key_and_says_whether_it_is_blocked(
    receiver, worker, mailoutbox, policy
):
    shop = {
        "TRANSPORT": "locmem",
        "OPTIONS": {"fail_with": "HTTP 503 try later"},  # retryable, and no retry left
        "RETRY": [0],
        "MAX_RETRIES": 0,
        "ORDERING": policy,
    }
    with alerting(receiver, shop=shop):
        sent = [outbox.send("shop", {"n": n}, ordering_key="order 42") for n in range(2)]
        worker(simple=True)  # the head runs out of retries: the alert is sent through the outbox
        worker(simple=True)  # and delivered (with "skip", the next one failed too)
    blocked = policy == "block"
    assert outbox.get(sent[1].id).status == ("waiting" if blocked else "failed")
    payloads = [p for p in verified(receiver) if p["type"] == "message.exhausted"]
    assert payloads, verified(receiver)
    last = payloads[0]["data"]["last"]
    assert (last["ordering_key"], last["blocked"]) == ("order 42", blocked)
    (mail,) = [m for m in mailoutbox if "exhausted" in m.subject]
    if blocked:
        assert "Its ordering key 'order 42' is blocked: the key's later messages wait" in mail.body
        assert "manage.py outbox_ordering release shop 'order 42' --requeue (or --cancel)" in mail.body
    else:
        assert "Its ordering key 'order 42' is not blocked (ORDERING 'skip')" in mail.body
    assert "ordering_key: order 42" in mail.body


def test_an_exhausted_alert_of_a_message_without_a_key_says_nothing_of_keys():
    alert = alerts.Alert("message.exhausted", "hook", 1.0, 1, 1.0, {"id": "msg_1", "error": "HTTP 503"})
    assert "ordering key" not in alert.email_text()


def test_a_raising_signal_receiver_breaks_neither_notify_nor_delivery(receiver, worker, caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    events.destination_opened.connect(broken)
    events.message_exhausted.connect(broken)
    try:
        with alerting(receiver, email=False, dead=dead(MAX_RETRIES=0)):
            alerts.notify([opened()])
            m = outbox.send("dead", 1)
            worker(simple=True)
    finally:
        events.destination_opened.disconnect(broken)
        events.message_exhausted.disconnect(broken)
    assert sorted(p["type"] for p in verified(receiver)) == ["destination.opened", "message.exhausted"]
    assert outbox.get(m.id).status == "failed"
    logged = [
        r.getMessage() for r in caplog.records if r.name == "outbox" and "receiver bug" in repr(r.exc_info)
    ]
    assert len(logged) == 2 and "destination.opened" in logged[0] and m.id in logged[1]


def test_an_alert_about_an_alert_destination_never_goes_through_it(receiver, worker, mailoutbox):
    with alerting(receiver):
        alerts.notify([opened("ops-hook"), opened("ops-mail")])
        worker(simple=True)
    assert [p["data"]["destination"] for p in verified(receiver)] == ["ops-mail"]
    assert [m.subject for m in mailoutbox] == [
        "[Django] outbox: ops-hook: circuit breaker opened (deliveries held)"
    ]


def test_when_the_ops_webhook_itself_fails_its_alerts_stay_bounded(receiver, worker, mailoutbox):
    receiver.respond(503)
    with alerting(receiver, suppress=60):
        alerts.notify([opened("hook")])
        for _ in range(3):
            worker(simple=True)
    # The ops webhook's own failures (failing, exhausted) are reported by email only, once each.
    subjects = sorted(m.subject for m in mailoutbox)
    assert subjects == sorted(set(subjects))
    assert any("ops-hook" in s for s in subjects)
    assert all(json.loads(r.body)["data"]["destination"] != "ops-hook" for r in receiver.requests)


def test_events_not_chosen_are_not_alerted_but_still_signalled(receiver, worker):
    seen: list[str] = []

    def on_closed(sender, event, **kwargs):
        seen.append(event.event)

    events.destination_closed.connect(on_closed)
    try:
        with alerting(receiver, email=False, events_=["destination.opened"]):
            alerts.notify([DestinationEvent("destination.closed", "hook", time.time(), {}), opened()])
            worker(simple=True)
    finally:
        events.destination_closed.disconnect(on_closed)
    assert [p["type"] for p in verified(receiver)] == ["destination.opened"]
    assert seen == ["destination.closed"]


def test_without_alerts_configured_notify_sends_signals_and_touches_no_redis(redis):
    seen: list[str] = []

    def on_opened(sender, event, **kwargs):
        seen.append(event.destination)

    events.destination_opened.connect(on_opened)
    try:
        before = redis.dbsize()
        alerts.notify([opened()])
        assert redis.dbsize() == before
    finally:
        events.destination_opened.disconnect(on_opened)
    assert seen == ["hook"]


def test_invalid_alert_settings_at_runtime_are_logged_never_raised(settings, caplog):
    settings.OUTBOX = {**settings.OUTBOX, "ALERTS": {"WEBHOOK": "nope"}}
    seen: list[str] = []

    def on_opened(sender, event, **kwargs):
        seen.append(event.event)

    events.destination_opened.connect(on_opened)
    try:
        alerts.notify([opened()])
    finally:
        events.destination_opened.disconnect(on_opened)
    assert seen == ["destination.opened"]
    assert any("OUTBOX['ALERTS'] is invalid" in r.getMessage() and r.exc_info for r in caplog.records)


@pytest.mark.django_db(transaction=True)
def test_an_alert_caused_inside_a_rolled_back_transaction_still_goes_out(receiver, worker):
    """An operator's pause in a view with ATOMIC_REQUESTS: the pause is in Redis and stays,
    so its alert must not be captured with (and rolled back with) the request's transaction."""
    from django.db import transaction

    with alerting(receiver, email=False):
        with pytest.raises(RuntimeError), transaction.atomic():
            controls.pause("hook", reason="maintenance")
            raise RuntimeError("the view failed after pausing")
        worker(simple=True)
    assert health.get_health("hook").admin == "paused"
    (payload,) = verified(receiver)
    assert (payload["type"], payload["data"]["reason"]) == ("destination.paused", "maintenance")


def test_notify_never_raises_even_for_what_is_not_an_event(receiver, caplog):
    with alerting(receiver):
        alerts.notify([object()])  # type: ignore[list-item]
        alerts.notify(None)  # type: ignore[arg-type]
    assert sum("handling destination events failed" in r.getMessage() for r in caplog.records) == 2


def test_redis_down_during_notify_is_logged_not_raised(receiver, caplog):
    from tests.support.messages import redis_down

    with alerting(receiver, email=False), redis_down():
        alerts.notify([opened()])  # does not raise
    assert any("suppression window" in r.getMessage() and r.exc_info for r in caplog.records)


# -- system checks ---------------------------------------------------------------------------
def ids() -> set[str]:
    """The ids the settings checks report."""
    return {e.id for e in check_outbox_settings()}


@pytest.mark.parametrize(
    "value,message",
    [
        ("ops", "must be a dict"),
        ({"SUPRESS": 900}, "unknown key(s) SUPRESS"),
        ({"SUPPRESS": 0}, "positive number of seconds"),
        ({"SUPPRESS": "900"}, "positive number of seconds"),
        ({"SUPPRESS": True}, "positive number of seconds"),
        ({"EVENTS": ["destination.exploded"]}, "unknown event(s) destination.exploded"),
        ({"EVENTS": "destination.opened"}, "must be a list of event names"),
        ({"WEBHOOK": "nope"}, "'nope' is not a destination"),
        ({"EMAIL_ADMINS": 3}, "must be a destination name or None"),
        ({"EMAIL_ADMINS": "hook"}, "'hook' must be an email destination, but its transport is 'webhook'"),
        ({"WEBHOOK": "mem"}, "'mem' must be a webhook destination, but its transport is 'locmem'"),
    ],
)
def test_bad_alert_settings_are_outbox_e007(settings, value, message):
    settings.OUTBOX = {**settings.OUTBOX, "ALERTS": value}
    errors = [e for e in check_outbox_settings() if e.id == "outbox.E007"]
    assert len(errors) == 1 and message in errors[0].msg, errors


def test_alert_settings_warnings(receiver, settings):
    with alerting(receiver, admins=()):
        assert "outbox.W008" in ids()
    with alerting(receiver, email=False):
        assert ids() == set()
    settings.OUTBOX = {**settings.OUTBOX, "ALERTS": {"WEBHOOK": "hook"}}  # 'hook' has no secret
    assert ids() == {"outbox.W009"}


def test_good_alert_settings_pass_the_checks(receiver):
    with alerting(receiver, events_=["destination.opened", "message.exhausted"]):
        assert ids() == set()


# -- end to end with the health engine ---------------------------------------------------------
def test_a_receiver_down_opens_the_breaker_and_one_opened_alert_goes_out_despite_many_messages(
    receiver, worker
):
    with alerting(
        receiver,
        email=False,
        dead=dead(MAX_RETRIES=10, BREAKER={"FAILURES": 3, "COOLDOWN": 60}),
    ):
        outbox.send_many([{"destination": "dead", "body": i} for i in range(40)])
        worker(simple=True)
        outbox.send_many([{"destination": "dead", "body": i} for i in range(40, 60)])
        worker(simple=True)
        h = health.get_health("dead")
    assert h.breaker == "open" and h.parked >= 50
    kinds = [p["type"] for p in verified(receiver)]
    assert kinds.count("destination.opened") == 1
    assert len(kinds) == len(set(kinds))  # one alert per event kind, not per message
    assert set(kinds) <= {"destination.opened", "destination.failing"}
