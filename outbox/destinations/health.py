"""Destination health, the read model: what each destination's attempts did lately,
its circuit breaker and its one state (``docs/destinations.md``). The operator's
pause/resume/disable/enable are :mod:`outbox.destinations.controls`.

Workers record every attempt's outcome in Redis as they write it (``lua/health.lua``,
in the same round trip as the status change): per destination a hash
``outbox:dest:<name>`` (admin state, breaker, consecutive failures, last success,
failing since, cumulative totals and latency histogram), per minute a hash
``outbox:health:<name>:<minute>`` (attempts by outcome, latency buckets; kept 2 h; on one
partition the latest minute with outcomes is carried in the destination's hash until a
later minute's outcomes move it there, and read from either) and
per hour ``outbox:errors:<name>:<hour>`` (failures by status code and error class; kept
25 h). Reading one destination's health is a fixed number of small reads in one round
trip, whatever the traffic (:func:`get_health`).

Latency is kept in a fixed log-scale histogram: bucket ``i`` (0..15) counts attempts
that took at most 2^i ms (1 ms .. 32.8 s), bucket 16 the slower ones. Percentiles are
estimated from the merged buckets by linear interpolation inside the bucket, as
Prometheus' ``histogram_quantile`` does.

"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from outbox.conf import outbox_settings
from outbox.store import get_repository
from outbox.store.destination_state import LATENCY_BUCKETS
from outbox.store.reads import destination_reads

logger = logging.getLogger("outbox")

WINDOW_SECONDS = 300  # the sliding window of DestinationHealth.window
BUCKETS = LATENCY_BUCKETS  # latency buckets 0..15 are <= 2^i ms; bucket 16 is +Inf
BOUNDS = tuple(2**i / 1000 for i in range(BUCKETS)) + (math.inf,)  # upper bounds, seconds
FAILING_CONSECUTIVE = 3  # consecutive failures that make a destination "failing"
FAILING_MIN_ATTEMPTS = 10  # attempts in the window before its failure rate counts
FAILING_RATE = 0.5
ERROR_HOURS = 24  # hours of error groups read by error_groups()
OUTCOME_KINDS = {"succeeded": "s", "retryable": "r", "permanent": "p"}


@dataclass(frozen=True)
class Window:
    """Attempts of the last ``seconds`` (whole minutes, the current one included)."""

    seconds: int
    succeeded: int
    retryable: int
    permanent: int
    attempts: int
    failure_rate: float
    p50_ms: float | None
    p95_ms: float | None


@dataclass(frozen=True)
class MinuteStats:
    """One minute of attempts (``minute`` = epoch seconds // 60), for charts.

    ``parked``: messages parked now (their destination paused, disabled or its breaker
    open) that became due in that minute; the first minute of a timeline also counts
    those due earlier, the last those due later (a claim looks a moment ahead).
    """

    minute: int
    succeeded: int
    retryable: int
    permanent: int
    p50_ms: float | None
    p95_ms: float | None
    parked: int = 0


@dataclass(frozen=True)
class ErrorGroup:
    """Failed attempts with one (status code, error class), over the last 24 hours."""

    status_code: int | None
    error_class: str
    count: int
    last_at: float
    last_error: str


@dataclass(frozen=True)
class DestinationHealth:
    """One destination's health (see the module docstring; times are epoch seconds)."""

    name: str
    breaker: str
    admin: str
    disabled_reason: str
    consecutive_failures: int
    last_success_at: float | None
    last_failure_at: float | None
    failing_since: float | None
    last_failing_since: float | None
    opened_at: float | None
    next_probe_at: float | None
    blocked_until: float | None
    parked: int
    window: Window
    totals: dict[str, int]
    latency_buckets: tuple[tuple[float, int], ...]
    latency_sum_seconds: float

    @property
    def state(self) -> str:
        """Its one state (:func:`destination_state`), one of :data:`STATES`."""
        return destination_state(self).name

    @property
    def state_reason(self) -> str:
        """Why it is in that state, one sentence (:func:`destination_state`)."""
        return destination_state(self).reason

    @property
    def failing(self) -> bool:
        """Its state is one of :data:`TROUBLE_STATES`: its deliveries fail, or are held
        because they failed (the dashboard's red rows)."""
        return self.state in TROUBLE_STATES


#: Every state a destination can be in, the first that applies winning (see
#: :func:`destination_state`): the operator's hold, the circuit breaker, a Retry-After,
#: then what its attempts did lately.
STATES = ("disabled", "paused", "open", "half_open", "blocked", "failing", "degraded", "healthy", "idle")
#: States in which its deliveries fail or are held because they failed (an operator's
#: pause is not one).
TROUBLE_STATES = frozenset({"disabled", "open", "half_open", "blocked", "failing"})
#: States in which its due messages wait instead of going: parked (paused, disabled,
#: breaker open or half-open) or rescheduled (a Retry-After). They are not overdue.
HELD_STATES = frozenset({"disabled", "paused", "open", "half_open", "blocked"})


@dataclass(frozen=True)
class DestinationState:
    """A destination's state and why: ``name`` one of :data:`STATES`, ``reason`` one
    sentence in English (no times: pages and the command show those beside it)."""

    name: str
    reason: str


def destination_state(h: DestinationHealth) -> DestinationState:
    """The one state of a destination, from its health; every page, the
    ``outbox_destination`` command and the ``outbox_destination_state`` metric show this.

    The first that applies, in the order of :data:`STATES`:

    * ``disabled`` / ``paused``: the operator's (or an automatic) hold: nothing is sent;
    * ``open``: its circuit breaker is open (messages park; a probe goes after the cool-down);
    * ``half_open``: one probe is in flight;
    * ``blocked``: a ``Retry-After`` holds it until :attr:`DestinationHealth.blocked_until`;
    * ``failing``: its last ``FAILING_CONSECUTIVE`` (3) or more attempts failed (the
      ``destination.failing`` event's threshold), or its last attempt failed and at least
      half of at least ``FAILING_MIN_ATTEMPTS`` (10) attempts of the window failed;
    * ``degraded``: its last attempt failed (a run of 1 or 2: ``failing_since`` is set;
      or no run, after an enable started it afresh, and no success since), or it
      succeeded but at least half of the window's attempts (10 or more) failed;
    * ``healthy``: its last attempt succeeded and most of the window's did;
    * ``idle``: no attempt in the window (and its last one did not fail).
    """
    w = h.window
    run = h.consecutive_failures
    mostly_failed = w.attempts >= FAILING_MIN_ATTEMPTS and w.failure_rate >= FAILING_RATE
    in_a_row = f"{run} failure{'' if run == 1 else 's'} in a row"
    if h.admin == "disabled":
        why = f"{h.disabled_reason}; " if h.disabled_reason else ""
        return DestinationState("disabled", f"{why}nothing is sent until it is enabled")
    if h.admin == "paused":
        why = f"{h.disabled_reason}; " if h.disabled_reason else ""
        return DestinationState("paused", f"{why}nothing is sent until it is resumed")
    if h.breaker == "open":
        return DestinationState("open", f"its circuit breaker is open: messages wait for a probe; {in_a_row}")
    if h.breaker == "half_open":
        return DestinationState(
            "half_open", "one probe is in flight: the other messages wait for its outcome"
        )
    if h.blocked_until:
        return DestinationState(
            "blocked", "the receiver asked it to wait (Retry-After): messages wait until then"
        )
    if run >= FAILING_CONSECUTIVE or (run and mostly_failed):
        most = (
            f"; {w.failure_rate:.0%} of {w.attempts} attempts in {w.seconds // 60} min failed"
            if mostly_failed
            else ""
        )
        return DestinationState("failing", f"its last attempts failed: {in_a_row}{most}")
    if run or h.failing_since:
        return DestinationState("degraded", f"its last attempt failed: {in_a_row}")
    if w.attempts and h.last_failure_at and (h.last_success_at or 0) < h.last_failure_at:
        # no failure run, yet the last attempt failed: an enable started the run afresh
        # (lua/admin.lua); nothing has succeeded since, so it is not said to have
        return DestinationState(
            "degraded", "its last attempt failed, before it was enabled again; none since"
        )
    if mostly_failed:
        return DestinationState(
            "degraded",
            f"its last attempt succeeded, but {w.failure_rate:.0%} of {w.attempts} attempts "
            f"in {w.seconds // 60} min failed",
        )
    if w.attempts:
        return DestinationState("healthy", "its last attempt succeeded")
    return DestinationState("idle", f"no attempt in the last {w.seconds // 60} min")


# -- reading ---------------------------------------------------------------------------------
def _float(raw: Any) -> float | None:
    return float(raw) if raw not in (None, b"", "") else None


def _int(raw: Any) -> int:
    return int(float(raw)) if raw not in (None, b"", "") else 0


def percentile(buckets: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) in milliseconds of a latency histogram (counts per
    bucket, see :data:`BOUNDS`), interpolated linearly within its bucket; None when empty."""
    total = sum(buckets)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        if n and seen + n >= rank:
            lower = 0.0 if i == 0 else 2 ** (i - 1)
            if i >= BUCKETS:
                return float(lower)
            upper = float(2**i)
            return lower + (upper - lower) * max(0.0, rank - seen) / n
        seen += n
    return float(2 ** (BUCKETS - 1))


def _buckets(h: dict[str, str], prefix: str) -> list[int]:
    return [_int(h.get(f"{prefix}{i}")) for i in range(BUCKETS + 1)]


def _minutes(now: float, count: int) -> list[int]:
    current = int(now // 60)
    return list(range(current - count + 1, current + 1))


def _window(hashes: Sequence[dict[str, str]], seconds: int) -> Window:
    s = sum(_int(h.get("s")) for h in hashes)
    r = sum(_int(h.get("r")) for h in hashes)
    p = sum(_int(h.get("p")) for h in hashes)
    merged = [sum(col) for col in zip(*(_buckets(h, "b") for h in hashes), strict=True)] if hashes else []
    attempts = s + r + p
    return Window(
        seconds,
        s,
        r,
        p,
        attempts,
        (r + p) / attempts if attempts else 0.0,
        percentile(merged, 0.5),
        percentile(merged, 0.95),
    )


def _health(
    name: str, dest: dict[str, str], parked: int, minutes: Sequence[dict[str, str]]
) -> DestinationHealth:
    lb = _buckets(dest, "lb")
    cumulative, running = [], 0
    for bound, n in zip(BOUNDS, lb, strict=True):
        running += n
        cumulative.append((bound, running))
    admin = dest.get("admin", "active")
    return DestinationHealth(
        name=name,
        breaker=dest.get("breaker", "closed"),
        admin=admin,
        disabled_reason=dest.get("admin_reason", "") if admin != "active" else "",
        consecutive_failures=_int(dest.get("consecutive")),
        last_success_at=_float(dest.get("last_success_at")),
        last_failure_at=_float(dest.get("last_failure_at")),
        failing_since=_float(dest.get("failing_since")),
        last_failing_since=_float(dest.get("last_failing_since")),
        opened_at=_float(dest.get("opened_at")),
        next_probe_at=_float(dest.get("next_probe_at")) if dest.get("breaker") == "open" else None,
        blocked_until=b if (b := _float(dest.get("blocked_until"))) and b > time.time() else None,
        parked=parked,
        window=_window(minutes, WINDOW_SECONDS),
        totals={k: _int(dest.get(f"t_{v}")) for k, v in OUTCOME_KINDS.items()},
        latency_buckets=tuple(cumulative),
        latency_sum_seconds=float(dest.get("lat_sum") or 0.0),
    )


def get_all_health(names: Iterable[str], now: float | None = None) -> dict[str, DestinationHealth]:
    """The health of each destination in ``names`` (one round trip: per destination one
    HGETALL of its hash, one ZCARD of its parked set and one HGETALL per window minute)."""

    names = list(dict.fromkeys(names))
    minutes = _minutes(time.time() if now is None else now, math.ceil(WINDOW_SECONDS / 60))
    rows = destination_reads.destination_rows(get_repository(), names, minutes)
    return {
        name: _health(name, dest, parked, hashes)
        for name, (dest, parked, hashes) in zip(names, rows, strict=True)
    }


def get_health(name: str, now: float | None = None) -> DestinationHealth:
    """One destination's health (a fixed number of small reads, one round trip).

    A name never used has all counters at zero (``state`` ``"idle"``).
    """
    return get_all_health([name], now)[name]


def known_destinations() -> list[str]:
    """Every destination configured or ever sent to, sorted (one SMEMBERS)."""

    return sorted(set(outbox_settings.DESTINATIONS) | set(get_repository().destinations()))


def timeline(
    name: str | None, minutes: int = 60, now: float | None = None, *, names: Sequence[str] | None = None
) -> list[MinuteStats]:
    """Attempts per minute for the last ``minutes`` minutes (at most 120: kept 2 h), oldest
    first, with the messages parked now by the minute they became due
    (:attr:`MinuteStats.parked`: a chart does not go quiet while a destination holds its
    messages); ``name`` None sums the destinations ``names`` (default: every destination
    configured or seen, :func:`known_destinations`). One round trip: per destination and
    minute one HGETALL and one ZCOUNT of its parked set."""

    minutes = max(1, min(int(minutes), 120))
    if name is not None:
        names = [name]
    elif names is None:
        names = known_destinations()
    span = _minutes(time.time() if now is None else now, minutes)
    rows = destination_reads.minute_rows(get_repository(), names, span)
    out = []
    for j, m in enumerate(span):
        hashes = [row_hashes[j] for row_hashes, _ in rows]
        parked = sum(counts[j] for _, counts in rows)
        w = _window(hashes, 60)
        out.append(MinuteStats(m, w.succeeded, w.retryable, w.permanent, w.p50_ms, w.p95_ms, parked))
    return out


def error_groups(name: str, limit: int = 10, now: float | None = None) -> list[ErrorGroup]:
    """Failures of the last 24 hours grouped by (status code, error class), most
    frequent first, at most ``limit`` (24 hourly hashes, one round trip)."""

    hour = int((time.time() if now is None else now) // 3600)
    hours = range(hour - ERROR_HOURS + 1, hour + 1)
    groups: dict[str, dict[str, Any]] = {}
    for fields in destination_reads.error_hashes(get_repository(), name, hours):  # oldest hour first:
        # newer last_error overwrite older
        for key, value in fields.items():
            kind, _, group = key.partition(":")
            g = groups.setdefault(group, {"count": 0, "last_at": 0.0, "last_error": ""})
            if kind == "c":
                g["count"] += _int(value)
            elif kind == "t" and float(value) >= g["last_at"]:
                g["last_at"] = float(value)
                g["last_error"] = fields.get(f"e:{group}", "")
    out = []
    for group, g in groups.items():
        code, _, cls = group.partition("|")
        out.append(ErrorGroup(int(code) or None, cls, g["count"], g["last_at"], g["last_error"]))
    out.sort(key=lambda e: (-e.count, -e.last_at))
    return out[:limit]


def status_line(h: DestinationHealth) -> str:
    """One line about a destination for the ``outbox_destination`` command."""

    def at(t: float | None) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z" if t else "-"

    w = h.window
    parts = [
        f"{h.name}: {h.state} ({h.state_reason})",
        f"admin={h.admin}" + (f" ({h.disabled_reason})" if h.disabled_reason else ""),
        f"breaker={h.breaker}",
        f"parked={h.parked}",
        f"consecutive_failures={h.consecutive_failures}",
        f"failing_since={at(h.failing_since)}",
        f"last_success={at(h.last_success_at)}",
        f"window {w.seconds}s: {w.succeeded} ok, {w.retryable} retryable, {w.permanent} permanent"
        + (
            f", p50 {w.p50_ms:.1f} ms, p95 {w.p95_ms:.1f} ms"
            if w.p50_ms is not None and w.p95_ms is not None
            else ""
        ),
    ]
    if h.next_probe_at:
        parts.append(f"next_probe={at(h.next_probe_at)}")
    if h.blocked_until:
        parts.append(f"blocked_until={at(h.blocked_until)}")
    return "; ".join(parts)
