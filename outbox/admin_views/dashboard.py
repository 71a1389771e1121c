"""The dashboard: counts per status and destination, queues and workers, outcomes per
minute over the last hour, and how long the oldest due messages have waited.

Cost: a handful of round trips whatever the number of messages (ZCARDs in pipelines,
one GET per minute counter in a pipeline, two ZRANGEs for the oldest entries).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.http import urlencode

from ..conf import outbox_settings
from ..connection import get_repository
from ..records import STATUSES, Status
from ..store.queries import counts_by_destination, created_at_of
from .base import TEMPLATES, console_view, context, require_view, url
from .chart import outcome_chart
from .formatting import duration, moment
from .rq_stats import queue_stats

if TYPE_CHECKING:
    from .base import ModelAdmin

#: Minutes shown on the outcomes chart.
CHART_MINUTES = 60
#: Outcomes drawn on the chart, bottom up.
CHART_SERIES = ("succeeded", "failed")


@dataclass
class StatusCount:
    status: str
    count: int
    url: str


@dataclass
class DestinationRow:
    """One destination's counts; ``failing`` when failed + retrying reach the threshold share."""

    name: str
    counts: list[StatusCount]
    total: int
    trouble: int
    share: float
    failing: bool
    url: str


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


def _list_url(model_admin: ModelAdmin, **params: str) -> str:
    return url(model_admin, "message_list") + ("?" + urlencode(params) if params else "")


def _oldest(model_admin: ModelAdmin, status: str, now: float) -> Oldest | None:
    found = get_repository().oldest(status)
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
        late=now - score > outbox_settings.RECOVERY_GRACE,
        wait=duration(abs(now - score)),
        age=duration(now - created),
    )


def destination_rows(model_admin: ModelAdmin, threshold: float) -> list[DestinationRow]:
    """Per-destination counts, failing destinations flagged (one pipeline)."""
    repo = get_repository()
    rows = []
    for name, counts in counts_by_destination(repo, repo.destinations()).items():
        total = sum(counts.values())
        trouble = counts[Status.FAILED.value] + counts[Status.RETRYING.value]
        share = trouble / total if total else 0.0
        rows.append(
            DestinationRow(
                name=name,
                counts=[
                    StatusCount(s, counts[s], _list_url(model_admin, status=s, destination=name))
                    for s in STATUSES
                ],
                total=total,
                trouble=trouble,
                share=share,
                failing=trouble > 0 and share >= threshold,
                url=_list_url(model_admin, destination=name),
            )
        )
    return rows


@console_view
def dashboard(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET: the dashboard page (``admin:outbox_dashboard``). Needs ``outbox.view_message``."""
    require_view(model_admin, request)
    repo = get_repository()
    now = time.time()
    counts = repo.counts()
    queues, workers = queue_stats(outbox_settings.queue_names)
    this_minute = int(now // 60)
    minutes = list(range(this_minute - CHART_MINUTES + 1, this_minute + 1))
    chart = outcome_chart(minutes, repo.stats(CHART_SERIES, minutes))
    threshold = getattr(model_admin, "failing_threshold", 0.1)
    return TemplateResponse(
        request,
        f"{TEMPLATES}/dashboard.html",
        context(
            model_admin,
            request,
            "Outbox dashboard",
            status_counts=[StatusCount(s, counts[s], _list_url(model_admin, status=s)) for s in STATUSES],
            total=sum(counts.values()),
            destinations=destination_rows(model_admin, threshold),
            failing_threshold_percent=round(threshold * 100),
            queues=queues,
            workers=workers,
            chart=chart,
            oldest_pending=_oldest(model_admin, Status.PENDING.value, now),
            oldest_retry=_oldest(model_admin, Status.RETRYING.value, now),
            purge_backlog=repo.count_past_retention(outbox_settings.RETENTION or {}, now),
            statuses=STATUSES,
        ),
    )
