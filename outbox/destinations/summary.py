"""Making the destination summary (:mod:`outbox.store.reads.summary`): every destination's
counts, state, parked and blocked counts, the totals, the oldest due messages and the
purge backlog, at one moment, for the console's dashboard at any number of endpoints.

:func:`refresh` costs in proportion to the destinations (one pipelined round of O(1)
reads per destination, status and partition: ~0.1-0.5 s at 10,000 endpoints, measured in
``docs/benchmarks.md``); it runs in one process at a time, in the workers' recovery sweep
when the summary is older than ``MAX_AGE`` (:func:`refresh_if_old`), or in a console page
that finds none, or one older than ``STALE_AFTER`` (no worker running). Every page shows
the summary's age.
"""

from __future__ import annotations

import time

from outbox.conf import outbox_settings
from outbox.destinations import health
from outbox.records import Status
from outbox.store import MessageRepository, get_repository
from outbox.store.reads import summary as store
from outbox.store.reads.summary import LIVE_DESTINATIONS, Summary, SummaryRow


def refresh(repo: MessageRepository | None = None) -> Summary:
    """Make the summary now and store it; returns its totals.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    repo = repo or get_repository()
    started = time.perf_counter()
    now = time.time()
    names = health.known_destinations()
    healths = health.get_all_health(names, now)
    blocked = repo.blocked_key_counts(names)
    rows = [
        SummaryRow(name, counts, healths[name].state, healths[name].parked, blocked.get(name, 0))
        for name, counts in repo.counts_by_destination(names).items()
    ]
    delivering = [r.name for r in rows if r.state not in health.HELD_STATES]
    oldest = {s: repo.oldest(s, among=delivering) for s in (Status.PENDING.value, Status.RETRYING.value)}
    backlog = repo.count_past_retention(outbox_settings.RETENTION or {}, now)
    took = (time.perf_counter() - started) * 1000
    return store.write(repo, rows, {"past_retention": backlog}, oldest, took, now)


def refresh_if_old(max_age: float = store.MAX_AGE, repo: MessageRepository | None = None) -> Summary | None:
    """Make the summary when it is missing or older than ``max_age`` seconds and no other
    process is making it (a lock); returns the summary made, or None."""
    repo = repo or get_repository()
    last = store.read(repo)
    if last is not None and last.age() < max_age:
        return None
    if not store.lock(repo):
        return None
    try:
        return refresh(repo)
    finally:
        store.unlock(repo)


def current(repo: MessageRepository | None = None) -> Summary:
    """The summary for a page: the stored one, made again here first when there is none
    or it is older than ``STALE_AFTER`` (no worker has made one lately)."""
    repo = repo or get_repository()
    last = store.read(repo)
    if last is None or last.age() >= store.STALE_AFTER:
        made = refresh_if_old(store.STALE_AFTER, repo)
        if made is not None:
            return made
        if last is None:  # another process is making the first one: make ours
            return refresh(repo)
    return last


def many(repo: MessageRepository | None = None) -> bool:
    """Whether pages read the summary for every destination (more than
    ``LIVE_DESTINATIONS`` configured or ever sent to: one SCARD) rather than reading
    each destination live."""
    repo = repo or get_repository()
    return repo.destination_count() + len(outbox_settings.DESTINATIONS) > LIVE_DESTINATIONS


def status_counts(
    destination: str | None, repo: MessageRepository | None = None
) -> tuple[dict[str, int], Summary | None]:
    """Counts per status of ``destination`` (read now), or of every destination: read now
    up to ``LIVE_DESTINATIONS``, else the summary's (returned too: its age is shown)."""
    repo = repo or get_repository()
    if destination is not None or not many(repo):
        return repo.counts(destination), None
    made = current(repo)
    return dict(made.counts), made
