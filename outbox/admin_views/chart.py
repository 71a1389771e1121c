"""A small stacked bar chart of outcomes per minute, laid out in Python and drawn by the
template as inline SVG (no JavaScript, no external library).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from outbox.destinations.health import OUTCOME_KINDS

if TYPE_CHECKING:
    from outbox.destinations.health import MinuteStats

#: Minutes shown on the console's attempt charts (the dashboard, a destination's page).
CHART_MINUTES = 60


@dataclass
class Segment:
    """One coloured part of a bar: ``series`` name, top ``y`` and height ``h`` (SVG units)."""

    series: str
    y: float
    h: float
    value: int


@dataclass
class Bar:
    """The bar of one minute: left ``x``, ``width`` and its segments, bottom up."""

    x: float
    width: float
    minute: datetime
    label: str
    segments: list[Segment] = field(default_factory=list)


@dataclass
class Plot:
    """The drawing area of a chart (SVG user units): size and margins."""

    width: int
    height: int
    left: int
    top: int
    bottom: int

    @property
    def baseline(self) -> int:
        """The y of the x axis."""
        return self.height - self.bottom


@dataclass
class Chart(Plot):
    """Everything the template needs to draw the bar chart (SVG user units)."""

    peak: int
    bars: list[Bar]
    totals: dict[str, int]
    first: datetime | None
    last: datetime | None

    @property
    def mid_y(self) -> float:
        return self.top + (self.baseline - self.top) / 2


def outcome_chart(
    minutes: Sequence[int],
    series: Mapping[str, Sequence[int]],
    *,
    width: int = 720,
    height: int = 180,
    left: int = 44,
    top: int = 10,
    bottom: int = 22,
) -> Chart:
    """Lay out a stacked bar per minute.

    Args:
        minutes: epoch minutes (``epoch seconds // 60``), oldest first.
        series: name -> one count per minute, stacked in the given order, bottom up.
        width, height: the SVG viewBox size; ``left``, ``top``, ``bottom``: margins
            kept for the axis labels.

    Returns:
        A :class:`Chart`; its ``peak`` is the largest stacked total (at least 1).
    """
    n = len(minutes)
    peak = max([sum(values[i] for values in series.values()) for i in range(n)] or [0]) or 1
    plot_w = width - left - 4
    plot_h = height - top - bottom
    slot = plot_w / n if n else plot_w
    bars = []
    for i, minute in enumerate(minutes):
        moment = datetime.fromtimestamp(minute * 60, tz=timezone.utc)
        base = float(height - bottom)
        parts = []
        for name, values in series.items():
            value = int(values[i])
            h = plot_h * value / peak
            base -= h
            parts.append(Segment(name, round(base, 2), round(h, 2), value))
        label = ", ".join(f"{s.value} {s.series}" for s in parts)
        bars.append(
            Bar(
                round(left + i * slot + 0.5, 2),
                round(max(slot - 1, 1), 2),
                moment,
                label,
                [s for s in parts if s.value],
            )
        )
    totals = {name: sum(int(v) for v in values) for name, values in series.items()}
    return Chart(
        width,
        height,
        left,
        top,
        bottom,
        peak,
        bars,
        totals,
        bars[0].minute if bars else None,
        bars[-1].minute if bars else None,
    )


#: The series of :func:`attempt_chart`, stacked bottom up: the outcomes of
#: :data:`outbox.destinations.health.OUTCOME_KINDS`, then the messages parked now.
ATTEMPT_SERIES = (*OUTCOME_KINDS, "parked")


def attempt_chart(minutes: Sequence[MinuteStats]) -> Chart:
    """The chart of attempts per minute by outcome (from :func:`outbox.destinations.health.timeline`),
    stacked bottom up as :data:`ATTEMPT_SERIES`: succeeded, retryable, permanent
    (retries included), and the messages parked now by the minute they became due
    (:attr:`outbox.destinations.health.MinuteStats.parked`), so a held destination's chart is not empty."""
    return outcome_chart(
        [m.minute for m in minutes], {s: [getattr(m, s) for m in minutes] for s in ATTEMPT_SERIES}
    )


@dataclass
class LatencyChart(Plot):
    """Latency percentiles per minute as SVG polylines (``points`` attribute strings).

    Attributes:
        p50, p95: ``"x,y x,y ..."`` of the minutes that had attempts (gaps skipped).
        peak_ms: the top of the scale in milliseconds.
        last_p50_ms, last_p95_ms: the newest minute's values with attempts, or None.
    """

    p50: str
    p95: str
    peak_ms: float
    last_p50_ms: float | None
    last_p95_ms: float | None
    first: datetime | None
    last: datetime | None

    @property
    def p50_points(self) -> list[tuple[str, str]]:
        """(x, y) of each p50 point, for markers (a lone minute draws no line)."""
        return [tuple(p.split(",")) for p in self.p50.split()]  # type: ignore[misc]

    @property
    def p95_points(self) -> list[tuple[str, str]]:
        return [tuple(p.split(",")) for p in self.p95.split()]  # type: ignore[misc]


def latency_chart(
    minutes: Sequence[MinuteStats],
    *,
    width: int = 720,
    height: int = 140,
    left: int = 54,
    top: int = 10,
    bottom: int = 22,
) -> LatencyChart:
    """Lay out the p50 and p95 latency of each minute (from
    :func:`outbox.destinations.health.timeline`: milliseconds, None for a minute without
    attempts) as two lines over the same scale."""
    p50 = [m.p50_ms for m in minutes]
    p95 = [m.p95_ms for m in minutes]
    n = len(minutes)
    values = [v for v in (*p50, *p95) if v is not None]
    peak = max(values or [1.0]) or 1.0
    plot_w = width - left - 4
    plot_h = height - top - bottom
    slot = plot_w / n if n else plot_w

    def points(series: Sequence[float | None]) -> str:
        out = []
        for i, v in enumerate(series):
            if v is not None:
                x = left + (i + 0.5) * slot
                y = height - bottom - plot_h * v / peak
                out.append(f"{x:.1f},{y:.1f}")
        return " ".join(out)

    def last(series: Sequence[float | None]) -> float | None:
        return next((v for v in reversed(series) if v is not None), None)

    stamps = [datetime.fromtimestamp(m.minute * 60, tz=timezone.utc) for m in minutes]
    return LatencyChart(
        width,
        height,
        left,
        top,
        bottom,
        points(p50),
        points(p95),
        peak,
        last(p50),
        last(p95),
        stamps[0] if stamps else None,
        stamps[-1] if stamps else None,
    )
