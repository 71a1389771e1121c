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
from outbox.destinations import health, summary
from outbox.endpoint_names import is_endpoint
from outbox.records import STATUSES, Status, created_at_of
from outbox.store import get_repository
from outbox.store.reads import summary as summary_store
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
    listing = url(model_admin, "message_list")  # reversed once, not once per cell

    def filtered(**params: str) -> str:
        return f"{listing}?{urlencode(params)}"

    for name, counts in repo.counts_by_destination(names).items():
        h = healths[name]
        rows.append(
            DestinationRow(
                name=name,
                counts=[StatusCount(s, counts[s], filtered(status=s, destination=name)) for s in STATUSES],
                total=sum(counts.values()),
                failing=h.failing,
                state=h.state,
                state_reason=h.state_reason,
                last_success=moment(h.last_success_at),
                failing_since=moment(h.failing_since),
                failing_for=duration(now - h.failing_since) if h.failing_since else "",
                parked=h.parked,
                url=filtered(destination=name),
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
    # Up to LIVE_DESTINATIONS (configured or ever sent to) every destination is read live,
    # with its counts and health; beyond, the destination summary (totals made at most
    # MAX_AGE s ago, shown with their age) and the rows of the settings destinations and of
    # the first ON_DASHBOARD endpoints, failing first.
    if summary.many(repo):
        parts = _from_summary(model_admin, request, now)
    else:
        parts = _live(model_admin, request, now)
    return TemplateResponse(
        request,
        f"{TEMPLATES}/dashboard.html",
        context(
            model_admin,
            request,
            _("Outbox dashboard"),
            queues=queues,
            workers=workers,
            live_workers=sum(1 for w in workers if w.live),
            stale_workers=sum(1 for w in workers if not w.live),
            statuses=STATUSES,
            refresh_seconds=15,
            **parts,
        ),
    )


def _live(model_admin: ModelAdmin, request: HttpRequest, now: float) -> dict[str, object]:
    """The dashboard's counts, rows, chart and waits read now, for every destination."""
    repo = get_repository()
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
    return {
        "status_counts": [StatusCount(s, counts[s], list_url(model_admin, status=s)) for s in STATUSES],
        "total": sum(counts.values()),
        "destinations": destinations,
        "chart_destination": chart_destination,
        "chart": chart,
        "oldest_pending": _oldest(model_admin, repo.oldest(Status.PENDING.value, among=delivering), now),
        "oldest_retry": _oldest(model_admin, repo.oldest(Status.RETRYING.value, among=delivering), now),
        "parked": Parked(
            sum(row.parked for row in destinations),
            parking,
            _oldest(model_admin, repo.oldest_parked(parking), now),
        ),
        "purge_backlog": repo.count_past_retention(outbox_settings.RETENTION or {}, now),
        "blocked_keys": sum(row.blocked_keys for row in destinations),
        "blocking": [row for row in destinations if row.blocked_keys],
        **endpoint_table(model_admin, destinations),
    }


def _from_summary(model_admin: ModelAdmin, request: HttpRequest, now: float) -> dict[str, object]:
    """The dashboard past ``LIVE_DESTINATIONS``: totals, waits and the purge backlog from
    the destination summary (with its age); the table's rows read live: every settings
    destination and the summary's first ``ON_DASHBOARD`` endpoints (failing or holding
    first across every endpoint); the chart of the configured destinations (or of the one
    asked). O(settings + ON_DASHBOARD), not O(endpoints)."""
    repo = get_repository()
    made = summary.current(repo)
    configured = list(outbox_settings.DESTINATIONS)
    first = summary_store.page(repo, 0, endpoints.ON_DASHBOARD + len(configured))
    shown = [r.name for r in first if is_endpoint(r.name)][: endpoints.ON_DASHBOARD]
    others = [r.name for r in first if not is_endpoint(r.name) and r.name not in configured]
    destinations = destination_rows(model_admin, now, [*configured, *others, *shown])
    chart_destination = (request.GET.get("chart") or "").strip() or None
    if chart_destination is not None and not (
        chart_destination in configured or summary_store.rows_of(repo, [chart_destination])
    ):
        chart_destination = None
    # the chart of every destination would read each one's minutes: the configured ones
    # (bounded by settings), or the one picked
    chart = attempt_chart(health.timeline(chart_destination, CHART_MINUTES, now, names=configured))
    parking = [row.name for row in destinations if row.parked]
    return {
        "status_counts": [StatusCount(s, made.counts[s], list_url(model_admin, status=s)) for s in STATUSES],
        "total": sum(made.counts.values()),
        "destinations": destinations,
        "destination_table": destinations,
        "endpoints_hidden": max(0, made.endpoint_destinations - len(shown)),
        "endpoints_url": url(model_admin, "endpoints"),
        "chart_destination": chart_destination,
        "chart_configured": True,
        "chart": chart,
        "oldest_pending": _oldest(model_admin, made.oldest.get(Status.PENDING.value), now),
        "oldest_retry": _oldest(model_admin, made.oldest.get(Status.RETRYING.value), now),
        "parked": Parked(made.parked, parking, _oldest(model_admin, repo.oldest_parked(parking), now)),
        "purge_backlog": made.past_retention,
        "blocked_keys": made.blocked,
        "blocking": [row for row in destinations if row.blocked_keys],
        "summary": made,
        "summary_age": duration(made.age(now)),
    }
