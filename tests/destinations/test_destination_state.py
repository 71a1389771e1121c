"""One state per destination, and no quiet lies on the dashboard (issue 20, item 6).

A destination has one state (``outbox.destinations.health.destination_state``), and the dashboard,
the destination page, ``outbox_destination status`` and the Prometheus metrics show the
same one; parked messages are not counted as overdue; the attempts chart draws parked
messages; an RQ worker whose ``outbox_worker`` stopped beating is shown stale, not live.
Real Redis, real workers, a real HTTP receiver.
"""

from __future__ import annotations

import io
from datetime import datetime, timezone

import pytest
from django.core.management import call_command
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import outbox
from outbox.destinations import controls, health
from outbox.metrics import OutboxCollector
from tests.support.console import deliver, element_text, text_of, u

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)


def scrape() -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The outbox's metrics as Prometheus reads them: sample name -> labels -> value."""
    registry = CollectorRegistry()
    registry.register(OutboxCollector())
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def metric_state(samples, destination: str) -> str:
    (state,) = [
        dict(k)["state"]
        for k, v in samples["outbox_destination_state"].items()
        if v == 1 and dict(k)["destination"] == destination
    ]
    return state


def status_line(name: str) -> str:
    out = io.StringIO()
    call_command("outbox_destination", "status", name, stdout=out)
    return out.getvalue().strip()


def row_of(html: str, name: str) -> str:
    return html.split(f'data-destination="{name}"')[1].split("</tr>")[0]


# -- (a) one state ---------------------------------------------------------------------
def test_one_failure_after_a_success_is_one_non_healthy_state_everywhere(superuser_client, hook, worker):
    deliver(hook, worker, 200, 1)
    assert health.get_health("hook").state == "healthy"
    (failed,) = deliver(hook, worker, 503, 1, retry=[3600])  # one failure, its retry an hour away
    h = health.get_health("hook")
    assert (h.consecutive_failures, h.failing_since is not None) == (1, True)
    assert outbox.get(failed.id).status == "retrying"

    state = h.state
    assert state == "degraded", h  # not "healthy" beside "failing since"
    assert health.destination_state(h).name == state
    assert "last attempt failed" in h.state_reason

    dashboard = text_of(superuser_client.get(u("dashboard")))
    row = row_of(dashboard, "hook")
    assert f'data-state="{state}"' in dashboard.split('data-destination="hook"')[1][:40]
    assert f"state-{state}" in row and "state-healthy" not in row
    page = text_of(superuser_client.get(u("destination", "hook")))
    assert f'data-state="{state}"' in page and "state-healthy" not in page
    assert h.state_reason in page
    line = status_line("hook")
    assert line.startswith(f"hook: {state} ("), line
    assert "healthy" not in line
    assert metric_state(scrape(), "hook") == state

    deliver(hook, worker, 200, 1)  # the next success: healthy again, everywhere
    assert health.get_health("hook").state == "healthy"
    assert 'data-state="healthy"' in text_of(superuser_client.get(u("destination", "hook")))
    assert status_line("hook").startswith("hook: healthy (")
    assert metric_state(scrape(), "hook") == "healthy"


def test_every_state_is_listed_once_and_the_metric_offers_them_all():
    from outbox.metrics.collector import DESTINATION_STATES

    assert len(set(health.STATES)) == len(health.STATES)
    assert tuple(DESTINATION_STATES) == health.STATES
    assert {
        "healthy",
        "degraded",
        "failing",
        "open",
        "half_open",
        "blocked",
        "paused",
        "disabled",
        "idle",
    } == set(health.STATES)


# -- (b) parked messages are not overdue ------------------------------------------------
def cell(html: str, element_id: str) -> str:
    return html.split(f'id="{element_id}"')[1].split("</td>")[0]


def test_parked_messages_are_not_counted_as_overdue_but_shown_apart(superuser_client, hook, worker):
    controls.pause("hook", reason="receiver maintenance")
    held = outbox.send("hook", {"n": 1})
    worker(simple=True)  # the claim parks it: its destination is paused
    assert health.get_health("hook").parked == 1
    assert outbox.get(held.id).status == "pending"
    html = text_of(superuser_client.get(u("dashboard")))
    pending = cell(html, "oldest-pending-wait")
    assert "due" not in pending and "none" in pending, pending  # not "due 0 s ago", not late
    parked = cell(html, "oldest-parked")
    assert 'data-count="1"' in parked and held.id in parked, parked
    assert "late" not in parked

    due = outbox.send("mem", {"n": 2}, delay=60)  # another destination's message: counted as before
    html = text_of(superuser_client.get(u("dashboard")))
    assert due.id in cell(html, "oldest-pending-wait") and "next due in" in cell(html, "oldest-pending-wait")
    assert held.id not in cell(html, "oldest-pending-wait")


# -- (d) workers: live by the outbox's own heartbeat ---------------------------------------
def worker_rows(html: str) -> dict[str, str]:
    import re

    return dict(re.findall(r'<tr class="worker-row" data-worker="([^"]+)" data-liveness="([^"]+)"', html))


def test_a_listed_rq_worker_whose_outbox_heartbeat_stopped_is_stale(superuser_client, repo):
    import time

    from django_rq import get_queue
    from rq import SimpleWorker
    from rq.utils import utcformat

    queue = get_queue("outbox")
    now = time.time()

    def listed(name: str, pid: int) -> SimpleWorker:
        w = SimpleWorker([queue], connection=queue.connection, name=name)
        w.pid = pid
        w.register_birth()  # as RQ lists a worker: its key lives up to 8 minutes
        return w

    ghost = listed("ghost", 900001)  # an outbox_worker killed 100 s ago: RQ still lists it
    repo.beat(f"{ghost.hostname}:900001", 5.0, now - 105)
    old = datetime.fromtimestamp(now - 100, timezone.utc)
    queue.connection.hset(ghost.key, "last_heartbeat", utcformat(old))  # RQ has not heard from it either
    alive = listed("alive", 900002)
    repo.beat(f"{alive.hostname}:900002", 65.0, now)
    listed("plain", 900003)  # a plain rqworker: never beat

    html = text_of(superuser_client.get(u("dashboard")))
    assert worker_rows(html) == {"alive": "live", "ghost": "stale", "plain": "no_heartbeat"}
    assert element_text(html, "worker-count") == "2"  # ghost is not counted live
    assert element_text(html, "stale-worker-count") == "1"
    assert '<td class="workers">2</td>' in html.split('data-queue="outbox"')[1].split("</tr>")[0]
    workers = {dict(k)["state"]: v for k, v in scrape()["outbox_workers"].items()}
    assert workers == {"live": 1, "stale": 1, "no_heartbeat": 1}


def test_a_killed_outbox_worker_process_is_stale_once_its_heartbeat_expires(
    superuser_client, receiver, settings, processes
):
    import os
    import signal
    import time

    from outbox.admin_views.rq_stats import queue_stats
    from outbox.delivery.worker import heartbeat_ttl
    from tests.support import wait_for

    settings.OUTBOX = {**settings.OUTBOX, "RECOVERY_INTERVAL": 0.5}  # heartbeats valid 6 s
    names = ["outbox_high", "outbox", "outbox_low"]

    def liveness() -> set[str]:
        return {w.liveness for w in queue_stats(names)[1]}

    process = processes.worker("--recovery-interval", "0.5", hook_url=receiver.url, visibility_timeout=30)
    try:
        assert wait_for(lambda: liveness() == {"live"}, timeout=30), liveness()
        html = text_of(superuser_client.get(u("dashboard")))
        assert element_text(html, "worker-count") == "1"
        os.kill(process.pid, signal.SIGKILL)
        process.wait(5)
        killed = time.monotonic()
        assert liveness() == {"live"}  # RQ lists it, and its heartbeat has not expired yet
        assert wait_for(lambda: liveness() == {"stale"}, timeout=heartbeat_ttl(0.5) + 5), liveness()
        # within its heartbeat's TTL (and 3 s for polling on a busy machine), not RQ's 8 minutes
        assert time.monotonic() - killed <= heartbeat_ttl(0.5) + 3
    finally:
        if process.poll() is None:
            process.kill()
    html = text_of(superuser_client.get(u("dashboard")))
    assert list(worker_rows(html).values()) == ["stale"]
    assert element_text(html, "worker-count") == "0" and element_text(html, "stale-worker-count") == "1"
    assert "no worker is running" in html
    assert {dict(k)["state"]: v for k, v in scrape()["outbox_workers"].items()}["stale"] == 1


# -- (c) the attempts chart draws parked messages ------------------------------------------
def test_the_attempts_chart_draws_parked_messages_while_nothing_is_attempted(superuser_client, hook, worker):
    from outbox.admin_views.chart import CHART_MINUTES

    controls.pause("hook")
    outbox.send_many([{"destination": "hook", "body": {"n": n}} for n in range(3)])
    worker(simple=True)  # the claim parks them: no attempt is made
    assert health.get_health("hook").parked == 3 and not hook.requests
    minutes = health.timeline("hook", CHART_MINUTES)
    assert sum(m.succeeded + m.retryable + m.permanent for m in minutes) == 0
    assert sum(m.parked for m in minutes) == 3 and minutes[-1].parked == 3  # due this minute
    for page in (u("dashboard"), u("dashboard") + "?chart=hook", u("destination", "hook")):
        html = text_of(superuser_client.get(page))
        assert element_text(html, "chart-total-parked") == "3", page
        assert 'class="series-parked"' in html, page  # a bar is drawn

    controls.resume("hook")
    worker(simple=True)  # delivered: nothing parked any more, three attempts drawn instead
    minutes = health.timeline("hook", CHART_MINUTES)
    assert (sum(m.parked for m in minutes), sum(m.succeeded for m in minutes)) == (0, 3)


@pytest.mark.parametrize(
    ("fields", "state"),
    [
        ({}, "idle"),
        ({"window": (5, 0)}, "healthy"),
        ({"window": (9, 11)}, "degraded"),  # recovering: the last attempt succeeded
        ({"consecutive_failures": 1, "failing_since": 1.0, "window": (5, 1)}, "degraded"),
        ({"consecutive_failures": 2, "failing_since": 1.0}, "degraded"),  # idle since, not healthy
        ({"consecutive_failures": 1, "failing_since": 1.0, "window": (4, 8)}, "failing"),
        ({"consecutive_failures": 3, "failing_since": 1.0}, "failing"),
        ({"consecutive_failures": 3, "blocked_until": 2e9}, "blocked"),
        ({"breaker": "half_open", "blocked_until": 2e9}, "half_open"),
        ({"breaker": "open", "consecutive_failures": 5}, "open"),
        ({"admin": "paused", "breaker": "open"}, "paused"),
        ({"admin": "disabled", "disabled_reason": "410 Gone", "breaker": "open"}, "disabled"),
    ],
)
def test_destination_state_takes_the_first_that_applies(fields, state):
    succeeded, failed = fields.pop("window", (0, 0))
    attempts = succeeded + failed
    window = health.Window(
        300, succeeded, failed, 0, attempts, failed / attempts if attempts else 0.0, None, None
    )
    h = health.DestinationHealth(
        **{
            "name": "d",
            "breaker": "closed",
            "admin": "active",
            "disabled_reason": "",
            "consecutive_failures": 0,
            "last_success_at": None,
            "last_failure_at": None,
            "failing_since": None,
            "last_failing_since": None,
            "opened_at": None,
            "next_probe_at": None,
            "blocked_until": None,
            "parked": 0,
            "window": window,
            "totals": {},
            "latency_buckets": (),
            "latency_sum_seconds": 0.0,
            **fields,
        }
    )
    assert h.state == state
    assert h.failing == (state in health.TROUBLE_STATES)
    assert h.state_reason and "\n" not in h.state_reason


def test_liveness_by_the_outbox_heartbeat_then_rqs():
    import time

    from rq.utils import utcformat

    from outbox.delivery.liveness import _rq_time, liveness

    now = time.time()
    assert abs(_rq_time(utcformat(datetime.fromtimestamp(now, timezone.utc))) - now) < 1e-3
    assert _rq_time("") is None
    assert liveness(None, now, now, 65) == "no_heartbeat"  # a plain rqworker
    assert liveness(now + 1, None, now, 65) == "live"
    assert liveness(now - 1, now - 10, now, 65) == "live"  # a --burst run: RQ heard from it lately
    assert liveness(now - 1, now - 66, now, 65) == "stale"
    assert liveness(now - 1, None, now, 65) == "stale"
