"""One state per destination, and no quiet lies on the dashboard (issue 20, item 6).

A destination has one state (``outbox.health.destination_state``), and the dashboard,
the destination page, ``outbox_destination status`` and the Prometheus metrics show the
same one; parked messages are not counted as overdue; the attempts chart draws parked
messages; an RQ worker whose ``outbox_worker`` stopped beating is shown stale, not live.
Real Redis, real workers, a real HTTP receiver.
"""
# ruff: noqa: F811  (fixtures imported from test_admin_support are used as arguments)

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import outbox
from outbox import health
from outbox.metrics import OutboxCollector

from .test_admin_support import (  # noqa: F401  (fixtures)
    admin_client,
    deliver,
    superuser,
    text_of,
    u,
)

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
def test_one_failure_after_a_success_is_one_non_healthy_state_everywhere(admin_client, hook, worker):
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

    dashboard = text_of(admin_client.get(u("dashboard")))
    row = row_of(dashboard, "hook")
    assert f'data-state="{state}"' in dashboard.split('data-destination="hook"')[1][:40]
    assert f"state-{state}" in row and "state-healthy" not in row
    page = text_of(admin_client.get(u("destination", "hook")))
    assert f'data-state="{state}"' in page and "state-healthy" not in page
    assert h.state_reason in page
    line = status_line("hook")
    assert line.startswith(f"hook: {state} ("), line
    assert "healthy" not in line
    assert metric_state(scrape(), "hook") == state

    deliver(hook, worker, 200, 1)  # the next success: healthy again, everywhere
    assert health.get_health("hook").state == "healthy"
    assert 'data-state="healthy"' in text_of(admin_client.get(u("destination", "hook")))
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


def test_parked_messages_are_not_counted_as_overdue_but_shown_apart(admin_client, hook, worker):
    health.pause("hook", reason="receiver maintenance")
    held = outbox.send("hook", {"n": 1})
    worker(simple=True)  # the claim parks it: its destination is paused
    assert health.get_health("hook").parked == 1
    assert outbox.get(held.id).status == "pending"
    html = text_of(admin_client.get(u("dashboard")))
    pending = cell(html, "oldest-pending-wait")
    assert "due" not in pending and "none" in pending, pending  # not "due 0 s ago", not late
    parked = cell(html, "oldest-parked")
    assert 'data-count="1"' in parked and held.id in parked, parked
    assert "late" not in parked

    due = outbox.send("mem", {"n": 2}, delay=60)  # another destination's message: counted as before
    html = text_of(admin_client.get(u("dashboard")))
    assert due.id in cell(html, "oldest-pending-wait") and "next due in" in cell(html, "oldest-pending-wait")
    assert held.id not in cell(html, "oldest-pending-wait")
