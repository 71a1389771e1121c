"""The destination summary: every destination's counts and state, made at one moment and
kept in Redis, so a page of the console costs the same with 10 destinations or 10,000
endpoints (issue 34, item 6).

Counting every destination is one ZCARD per destination, status and partition (60,000
at 10,000 endpoints on one server): too much for every page view. The summary is made
by one process at a time (:func:`outbox.destinations.summary.refresh`: the workers'
recovery sweep, every ``RECOVERY_INTERVAL`` seconds, or a console page that finds none,
or one older than :data:`STALE_AFTER`), and read in O(1) plus O(page):

* ``outbox:{g}:summary`` (hash): ``at`` (epoch seconds it was made), ``took_ms``,
  ``destinations``, ``count:<status>`` totals, ``parked``, ``blocked``, ``failing``
  (destinations failing or holding their messages), ``past_retention``, ``oldest:pending``
  and ``oldest:retrying`` (``"<id> <score>"`` of the oldest due message among the
  destinations delivering), ``endpoints`` (how many of the destinations are endpoints);
* ``outbox:{g}:summary:rows`` (hash): destination -> JSON ``{"counts": {status: n},
  "state": ..., "parked": n, "blocked": n}``;
* ``outbox:{g}:summary:order`` (sorted set): destination -> 0 when failing or holding
  (paused, disabled, breaker open, Retry-After), 1 with messages, 2 idle; Redis orders
  equal scores by name, so a page "failing first" is one ZRANGE.

The three are written under temporary names and renamed in one script
(``lua/summary_swap.lua``), so a reader sees
one summary or the next, never half of each. How true the counts are: they were exact
at ``at``; the console shows their age (``Summary.age``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from outbox.endpoint_names import is_endpoint
from outbox.records import STATUSES
from outbox.store.base import RepositoryBase

#: Seconds after which a console page makes the summary again itself (no worker has
#: lately: the workers' recovery sweep makes it every ``RECOVERY_INTERVAL`` s, 30 by
#: default, when it is older than :data:`MAX_AGE`).
STALE_AFTER = 60.0
#: Destinations (configured or ever sent to) up to which pages read every destination
#: live; beyond, they read the summary (and a page of destinations).
LIVE_DESTINATIONS = 100
#: Seconds a summary is used before the recovery sweep makes a new one (the sweep runs
#: every ``RECOVERY_INTERVAL`` s: the summary is at most that old, plus its making, while
#: a worker runs; at most :data:`STALE_AFTER` when none does).
MAX_AGE = 10.0
#: Seconds the refresh lock is held at most (a process that dies holding it).
LOCK_SECONDS = 30


@dataclass(frozen=True)
class SummaryRow:
    """One destination's row: counts per status, its state (``health.STATES``), parked
    and blocked counts."""

    name: str
    counts: dict[str, int]
    state: str
    parked: int = 0
    blocked: int = 0

    @property
    def rank(self) -> int:
        """0 failing or holding its messages, 1 with messages, 2 idle."""
        if self.state not in ("healthy", "idle", "degraded"):
            return 0
        return 1 if sum(self.counts.values()) else 2


@dataclass(frozen=True)
class Summary:
    """Totals of a summary and when it was made (epoch seconds, ``at``; ``took_ms``)."""

    at: float
    took_ms: float
    destinations: int
    counts: dict[str, int]
    parked: int = 0
    blocked: int = 0
    failing: int = 0
    past_retention: int = 0
    oldest: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: how many of ``destinations`` are endpoints
    endpoint_destinations: int = 0
    #: the endpoints' counts per status and blocked keys, added up (the metrics' ``endpoint:*``)
    endpoint_counts: dict[str, int] = field(default_factory=dict)
    endpoint_blocked: int = 0

    def age(self, now: float | None = None) -> float:
        """Seconds since it was made."""
        return max(0.0, (time.time() if now is None else now) - self.at)


def write(
    repo: RepositoryBase,
    rows: Sequence[SummaryRow],
    totals: Mapping[str, int],
    oldest: Mapping[str, tuple[str, float] | None],
    took_ms: float,
    at: float,
) -> Summary:
    """Store a summary (see the module), replacing the last one at once; returns it.
    ``totals`` has ``past_retention`` (the purge backlog)."""
    keys = repo.keys
    counts = dict.fromkeys(STATUSES, 0)
    endpoints = dict.fromkeys(STATUSES, 0)
    for row in rows:
        for status, n in row.counts.items():
            counts[status] += n
            if is_endpoint(row.name):
                endpoints[status] += n
    made = Summary(
        at,
        took_ms,
        len(rows),
        counts,
        sum(r.parked for r in rows),
        sum(r.blocked for r in rows),
        sum(1 for r in rows if r.rank == 0),
        int(totals.get("past_retention", 0)),
        {s: o for s, o in oldest.items() if o is not None},
        sum(1 for r in rows if is_endpoint(r.name)),
        endpoints,
        sum(r.blocked for r in rows if is_endpoint(r.name)),
    )
    head: dict[str, str] = {
        "at": repr(at),
        "took_ms": repr(took_ms),
        "destinations": str(made.destinations),
        "parked": str(made.parked),
        "blocked": str(made.blocked),
        "failing": str(made.failing),
        "past_retention": str(made.past_retention),
        **{f"count:{s}": str(n) for s, n in counts.items()},
        "endpoints": str(made.endpoint_destinations),
        **{f"endpoints:count:{s}": str(n) for s, n in endpoints.items()},
        "endpoints:blocked": str(made.endpoint_blocked),
        **{f"oldest:{s}": f"{i} {score!r}" for s, (i, score) in made.oldest.items()},
    }
    names = [keys.summary, keys.summary_rows, keys.summary_order]
    tmp = [keys.staged(k) for k in names]
    pipe = repo.connection.pipeline(transaction=False)
    for k in tmp:
        pipe.delete(k)
    pipe.hset(tmp[0], mapping={k: v for k, v in head.items()})  # noqa: C416 (typed by the call)
    for i in range(0, len(rows), 1000):
        chunk = rows[i : i + 1000]
        pipe.hset(tmp[1], mapping={r.name: _row_json(r) for r in chunk})
        pipe.zadd(tmp[2], {r.name: r.rank for r in chunk})
    pipe.execute()
    repo.run_script("summary_swap", [], keys=[*names, *tmp])
    return made


def _row_json(row: SummaryRow) -> str:
    return json.dumps(
        {"counts": row.counts, "state": row.state, "parked": row.parked, "blocked": row.blocked},
        separators=(",", ":"),
    )


def read(repo: RepositoryBase) -> Summary | None:
    """The last summary's totals, or None when none was made (one HGETALL)."""
    raw = cast("dict[bytes, bytes]", repo.connection.hgetall(repo.keys.summary))
    if not raw:
        return None
    h = {k.decode(): v.decode() for k, v in raw.items()}
    oldest = {}
    for status in STATUSES:
        if value := h.get(f"oldest:{status}"):
            mid, _, score = value.partition(" ")
            oldest[status] = (mid, float(score))
    return Summary(
        float(h["at"]),
        float(h.get("took_ms", "0")),
        int(h.get("destinations", "0")),
        {s: int(h.get(f"count:{s}", "0")) for s in STATUSES},
        int(h.get("parked", "0")),
        int(h.get("blocked", "0")),
        int(h.get("failing", "0")),
        int(h.get("past_retention", "0")),
        oldest,
        int(h.get("endpoints", "0")),
        {s: int(h.get(f"endpoints:count:{s}", "0")) for s in STATUSES},
        int(h.get("endpoints:blocked", "0")),
    )


def page(repo: RepositoryBase, start: int, count: int) -> list[SummaryRow]:
    """Rows ``start`` to ``start + count - 1`` of the summary, failing first, then by name
    (one ZRANGE and one HMGET)."""
    names = [
        n.decode()
        for n in cast(
            "list[bytes]", repo.connection.zrange(repo.keys.summary_order, start, start + count - 1)
        )
    ]
    if not names:
        return []
    values = cast("list[bytes | None]", repo.connection.hmget(repo.keys.summary_rows, names))
    out = []
    for name, value in zip(names, values, strict=True):
        if value is None:
            continue
        d = json.loads(value)
        out.append(SummaryRow(name, d["counts"], d["state"], d.get("parked", 0), d.get("blocked", 0)))
    return out


def rows_of(repo: RepositoryBase, names: Sequence[str]) -> dict[str, SummaryRow]:
    """The summary rows of these destinations (those it has; one HMGET)."""
    if not names:
        return {}
    values = cast("list[bytes | None]", repo.connection.hmget(repo.keys.summary_rows, list(names)))
    out = {}
    for name, value in zip(names, values, strict=True):
        if value is not None:
            d = json.loads(value)
            out[name] = SummaryRow(name, d["counts"], d["state"], d.get("parked", 0), d.get("blocked", 0))
    return out


def lock(repo: RepositoryBase) -> bool:
    """Take the refresh lock (SET NX, :data:`LOCK_SECONDS`): True when this process may
    make the summary now."""
    return bool(repo.connection.set(repo.keys.summary_lock, "1", nx=True, ex=LOCK_SECONDS))


def unlock(repo: RepositoryBase) -> None:
    repo.connection.delete(repo.keys.summary_lock)
