"""The dashboard: counts per status and destination with each destination's health
(failing from its recent attempts, last success, failing since), queues and workers,
delivery attempts per minute by outcome over the last hour (all destinations, or one:
``?chart=<destination>``), how long the oldest due messages have waited (of the
destinations that deliver: messages their destination holds are counted apart, as
parked), the parked messages, and the blocked ordering keys (per destination, each a
link to its page of them).

Cost: a handful of round trips whatever the number of messages (ZCARDs in pipelines:
the status indexes, the blocked keys; one pipeline of small health hashes, one for the chart's minutes, three pipelines of
one-entry ZRANGEs for the oldest entries).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.http import urlencode
from django.utils.translation import gettext as _

from outbox.admin_views import endpoints
from outbox.admin_views.base import TEMPLATES, console_view, context, list_url, require_view, url
from outbox.admin_views.chart import CHART_MINUTES, attempt_chart
from outbox.admin_views.formatting import duration, moment
from outbox.admin_views.rq_stats import queue_stats
from outbox.conf import outbox_settings
from outbox.destinations import health
from outbox.endpoint_names import is_endpoint
from outbox.records import STATUSES, Status, created_at_of
from outbox.store import get_repository
from outbox.store.repository import sum_counts

if TYPE_CHECKING:
    from outbox.admin_views.base import ModelAdmin


@dataclass
class StatusCount:
    status: str
    count: int
    url: str


@dataclass
class DestinationRow:
    """One destination's counts and health (``state``, ``state_reason`` and ``failing``
    from :func:`outbox.destinations.health.destination_state`: its holds and recent attempts, not
    all-time totals)."""

    name: str
    counts: list[StatusCount]
    total: int
    failing: bool
    state: str
    state_reason: str
    last_success: datetime | None
    failing_since: datetime | None
    failing_for: str
    parked: int
    url: str
    page_url: str
    chart_url: str
    blocked_keys: int = 0
    blocked_url: str = ""


@dataclass
class Oldest:
    """The lowest-scored message of a pending/retrying index: due at ``due``."""

    id: str
    url: str
    due: datetime
    created: datetime
    overdue: bool
    late: bool  # due for longer than the recovery grace: workers are behind or absent
    wait: str  # how long it has been due, or how long until it is
    age: str  # how long since it was created


@dataclass
class Parked:
    """Messages parked by their destination (paused, disabled, breaker open): how many,
    by how many destinations, and the one due first (not overdue: held on purpose)."""

    count: int
    destinations: list[str]
    oldest: Oldest | None


def _oldest(model_admin: ModelAdmin, found: tuple[str, float] | None, now: float) -> Oldest | None:
    """What the page shows of ``found``, an (id, due score) read from an index (None: none)."""
    if found is None:
        return None
    message_id, score = found
    created = created_at_of(message_id)
    return Oldest(
        id=message_id,
        url=url(model_admin, "message_detail", message_id),
        due=moment(score),
        created=moment(created),
        overdue=score <= now,
        late=now - score > outbox_settings.LATE_AFTER,
        wait=duration(abs(now - score)),
        age=duration(now - created),
    )


def destination_rows(
    model_admin: ModelAdmin, now: float, names: list[str] | None = None
) -> list[DestinationRow]:
    """Per destination (``names``; default: configured or ever used): counts, health and
    blocked ordering keys (three pipelines)."""
    repo = get_repository()
    if names is None:
        names = health.known_destinations()
    healths = health.get_all_health(names)
    blocked = repo.blocked_key_counts(names)
    rows = []
    for name, counts in repo.counts_by_destination(names).items():
        h = healths[name]
        rows.append(
            DestinationRow(
                name=name,
                counts=[
                    StatusCount(s, counts[s], list_url(model_admin, status=s, destination=name))
                    for s in STATUSES
                ],
                total=sum(counts.values()),
                failing=h.failing,
                state=h.state,
                state_reason=h.state_reason,
                last_success=moment(h.last_success_at),
                failing_since=moment(h.failing_since),
                failing_for=duration(now - h.failing_since) if h.failing_since else "",
                parked=h.parked,
                url=list_url(model_admin, destination=name),
                page_url=url(model_admin, "destination", name),
                chart_url=url(model_admin, "dashboard") + "?" + urlencode({"chart": name}) + "#chart-heading",
                blocked_keys=blocked.get(name, 0),
                blocked_url=url(model_admin, "blocked_keys", name),
            )
        )
    return rows


def endpoint_table(model_admin: ModelAdmin, rows: list[DestinationRow]) -> dict[str, Any]:
    """What the destination table shows (presentation only, :mod:`.endpoints`): every
    settings destination, then at most ``ON_DASHBOARD`` endpoints, failing first; the
    others are counted and on the paginated endpoint page."""
    settings_rows = [r for r in rows if not is_endpoint(r.name)]
    endpoint_rows = sorted((r for r in rows if is_endpoint(r.name)), key=lambda r: (not r.failing, -r.total))
    return {
        "destination_table": settings_rows + endpoint_rows[: endpoints.ON_DASHBOARD],
        "endpoints_hidden": max(0, len(endpoint_rows) - endpoints.ON_DASHBOARD),
        "endpoints_url": url(model_admin, "endpoints"),
    }


@console_view
def dashboard(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET: the dashboard page (``admin:outbox_dashboard``). Needs ``outbox.view_message``."""
    require_view(model_admin, request)
    repo = get_repository()
    now = time.time()
    queues, workers = queue_stats(outbox_settings.queue_names)
    names = health.known_destinations()
    destinations = destination_rows(model_admin, now, names)
    # every destination with messages has a row: the totals are theirs, added up
    counts = sum_counts({c.status: c.count for c in row.counts} for row in destinations)
    chart_destination = (request.GET.get("chart") or "").strip() or None
    if chart_destination is not None and chart_destination not in names:
        chart_destination = None
    chart = attempt_chart(health.timeline(chart_destination, CHART_MINUTES, now, names=names))
    # Messages of a destination that holds them (paused, breaker open, Retry-After ...)
    # wait on purpose: they are shown apart, never as overdue.
    delivering = [row.name for row in destinations if row.state not in health.HELD_STATES]
    parking = [row.name for row in destinations if row.parked]
    parked = Parked(
        sum(row.parked for row in destinations),
        parking,
        _oldest(model_admin, repo.oldest_parked(parking), now),
    )
    return TemplateResponse(
        request,
        f"{TEMPLATES}/dashboard.html",
        context(
            model_admin,
            request,
            _("Outbox dashboard"),
            status_counts=[StatusCount(s, counts[s], list_url(model_admin, status=s)) for s in STATUSES],
            total=sum(counts.values()),
            destinations=destinations,
            **endpoint_table(model_admin, destinations),
            chart_destination=chart_destination,
            queues=queues,
            workers=workers,
            live_workers=sum(1 for w in workers if w.live),
            stale_workers=sum(1 for w in workers if not w.live),
            chart=chart,
            oldest_pending=_oldest(model_admin, repo.oldest(Status.PENDING.value, among=delivering), now),
            oldest_retry=_oldest(model_admin, repo.oldest(Status.RETRYING.value, among=delivering), now),
            parked=parked,
            purge_backlog=repo.count_past_retention(outbox_settings.RETENTION or {}, now),
            blocked_keys=sum(row.blocked_keys for row in destinations),
            blocking=[row for row in destinations if row.blocked_keys],
            statuses=STATUSES,
            refresh_seconds=15,
        ),
    )
