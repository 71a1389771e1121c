"""Read-only queries for the admin console and the bulk commands, over a repository.

Each query reads one index of :class:`~outbox.store.MessageRepository` (one sorted set
per destination, see :mod:`outbox.store.keys`) and never loads every id:

* the index is the status index when a status is given, else the created index, of
  the destination given, or of every destination read together (merged in Redis in
  score order, :meth:`~outbox.store.MessageRepository.range_by_rank`); with more than
  one partition, each partition's sorted sets are read in a call of their own (one hash
  slot) and the partitions' pages merged here (:mod:`outbox.store.reads.merged_pages`;
  :func:`page_at` pages by position, as the console does then);
* a time range on the field the index is scored by becomes a score range
  (ZCOUNT/ZRANGE, exact and O(log N) per destination; a page across destinations
  reads offset + limit entries of each);
* other conditions (a queue; a created range on a status index; an updated range on
  a ``pending``/``retrying``/``sending`` index; the last HTTP status code or error
  class) are checked id by id. For a page that
  means a *bounded scan* of at most :data:`SCAN_LIMIT` index entries, and the count is
  then a lower bound (:attr:`Page.exact` is False); bulk actions check every entry,
  1,000 at a time.

What an index's score means (``updated`` is the time the message entered its status,
which is its ``updated_at`` for terminal statuses):

============================  ==============================================
index                         score
============================  ==============================================
created (no status)           created_at
pending, retrying             next_attempt_at
sending                       lease deadline (claim time + visibility timeout)
succeeded, failed, cancelled  time it entered the status (updated_at)
============================  ==============================================

A batch (the messages one bulk action acted on, :mod:`outbox.operations.batches`) is its own
index: a sorted set of ids scored by the order they were acted on; every other
condition, status and destination included, is then checked id by id.

The HTTP status code and error class of the last attempt have no index: they are
checked id by id, so a page scans at most :data:`SCAN_LIMIT` entries of the index that
serves the rest of the filter (the list says "checked N of M") and a bulk action walks
that index whole. Narrowing by status and destination keeps that index small. (An
index per code would cost every attempt more writes in ``transition.lua``, the hot
path, for a filter operators use during incidents on lists that are already narrowed.)

Keys are built only through ``repo.keys`` and ``repo.index``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from outbox.records import PARTITION_SUFFIX, STATUSES, Message, Status, created_at_of
from outbox.store.base import IDS_PER_CALL, Members
from outbox.store.codec import message_from_redis
from outbox.store.indexes import Cursor, Index, IndexRange
from outbox.store.reads import merged_pages
from outbox.store.repository import MessageRepository

#: Index entries a page whose filter no index serves may examine.
SCAN_LIMIT = 5_000
#: Ids read per round trip while scanning.
CHUNK = IDS_PER_CALL
#: Sort keys of the message list.
SORT_FIELDS = ("created", "updated", "next_attempt")
#: Message-record fields a list row needs (everything but the body), in a hash written by an older version.
SUMMARY_FIELDS = ("destination", "content_type", "headers", "created_at", "idempotency_key")
#: Bytes read from the start of a message record for a list row: its header line.
SUMMARY_BYTES = 1024


@dataclass(frozen=True)
class TimeRange:
    """An inclusive range of epoch seconds; None means unbounded on that side."""

    start: float | None = None
    end: float | None = None

    def __bool__(self) -> bool:
        return self.start is not None or self.end is not None

    def contains(self, value: float) -> bool:
        """True if ``value`` (epoch seconds) lies in the range."""
        return (self.start is None or value >= self.start) and (self.end is None or value <= self.end)


@dataclass(frozen=True)
class MessageFilter:
    """What the message list, bulk actions and bulk commands select.

    Attributes:
        status: one of :data:`~outbox.records.STATUSES`, or None for any.
        destination: a destination name, or None for any.
        queue: a django-rq queue name, or None for any.
        created: range of ``created_at``.
        updated: range of ``updated_at`` (the time of the last status change).
        status_code: the HTTP status of the last attempt (``last_status_code``), or None.
        error_class: the kind of the last failure (``last_error_class``: ``"http"``,
            ``"timeout"``, ``"ConnectError"`` ...), or None.
        due: range of ``next_attempt_at`` (served by the ``pending``/``retrying`` indexes).
        batch: a batch token (:mod:`outbox.operations.batches`): only the messages of that batch.
    """

    status: str | None = None
    destination: str | None = None
    queue: str | None = None
    created: TimeRange = field(default_factory=TimeRange)
    updated: TimeRange = field(default_factory=TimeRange)
    status_code: int | None = None
    error_class: str | None = None
    due: TimeRange = field(default_factory=TimeRange)
    batch: str | None = None

    def with_status(self, status: str | None) -> MessageFilter:
        """The same filter for another status."""
        return replace(self, status=status)


def score_field(status: str | None) -> str:
    """What the score of the index for ``status`` means: ``"created"``, ``"next_attempt"``
    (pending, retrying, and waiting: a message behind its ordering key's head keeps its
    due time, ``lua/create.lua``), ``"lease"`` (sending) or ``"updated"``."""
    if status is None:
        return "created"
    if status in (Status.PENDING.value, Status.RETRYING.value, Status.WAITING.value):
        return "next_attempt"
    if status == Status.SENDING.value:
        return "lease"
    return "updated"


def served_sorts(status: str | None) -> tuple[str, ...]:
    """The sort fields the index for ``status`` orders by (the lease deadline of a
    ``sending`` message is its claim time, = updated_at, plus a constant)."""
    scored = score_field(status)
    return ("updated",) if scored == "lease" else (scored,)


@dataclass(frozen=True)
class Plan:
    """How a filter is read: one index, a score range on it, and per-id checks.

    Attributes:
        filter: the filter planned.
        index: the sorted sets read (one per destination; a batch's own sorted set).
        score_field: what its score means (see :func:`score_field`).
        lo, hi: inclusive score bounds (None = unbounded).
        check_created: created range checked per id (from the id, no read).
        check_updated: updated range checked per id (reads the resend record).
        check_queue: queue checked per id (reads the resend record), or None.
        check_code: last HTTP status code checked per id, or None.
        check_class: last error class checked per id, or None.
        check_due: ``next_attempt_at`` range checked per id.
        check_status, check_destination: checked per id (batch indexes), or None.
    """

    filter: MessageFilter
    index: Index
    score_field: str
    lo: float | None = None
    hi: float | None = None
    check_created: TimeRange = field(default_factory=TimeRange)
    check_updated: TimeRange = field(default_factory=TimeRange)
    check_queue: str | None = None
    check_code: int | None = None
    check_class: str | None = None
    check_due: TimeRange = field(default_factory=TimeRange)
    check_status: str | None = None
    check_destination: str | None = None

    @property
    def exact(self) -> bool:
        """True if the index and score range alone answer the filter."""
        return not (self.check_created or self.reads_records)

    @property
    def reads_records(self) -> bool:
        return bool(self.check_updated or self.check_due) or any(
            v is not None
            for v in (
                self.check_queue,
                self.check_code,
                self.check_class,
                self.check_status,
                self.check_destination,
            )
        )

    @property
    def limits(self) -> list[str]:
        """Human-readable names of the conditions checked id by id."""
        out = []
        if self.check_status is not None:
            out.append("status (in a batch)")
        if self.check_destination is not None:
            out.append("destination (in a batch)")
        if self.check_queue is not None:
            out.append("queue")
        if self.check_code is not None:
            out.append("HTTP status code")
        if self.check_class is not None:
            out.append("error class")
        if self.check_due:
            out.append("next attempt range")
        if self.check_created:
            out.append("created range (with a status)")
        if self.check_updated:
            out.append(
                "updated range (with this status)"
                if self.filter.status
                else "updated range (without a status)"
            )
        return out


def plan(repo: MessageRepository, flt: MessageFilter) -> Plan:
    """Choose the index and score range that serve ``flt``; the rest becomes per-id checks.

    Raises:
        ValueError: an unknown status.
    """
    if flt.status is not None and flt.status not in STATUSES:
        raise ValueError(f"unknown status {flt.status!r}; expected one of {STATUSES}")
    if flt.batch is not None:
        return Plan(
            filter=flt,
            index=Index((repo.keys.batch(flt.batch),)),
            score_field="batch",
            check_created=flt.created,
            check_updated=flt.updated,
            check_due=flt.due,
            check_status=flt.status,
            check_destination=flt.destination,
            check_queue=flt.queue,
            check_code=flt.status_code,
            check_class=flt.error_class,
        )
    index = repo.index(flt.status, flt.destination)
    scored = score_field(flt.status)
    served = {"created": flt.created, "updated": flt.updated, "next_attempt": flt.due}.get(
        scored, TimeRange()
    )
    return Plan(
        filter=flt,
        index=index,
        score_field=scored,
        lo=served.start,
        hi=served.end,
        check_created=TimeRange() if scored == "created" else flt.created,
        check_updated=TimeRange() if scored == "updated" else flt.updated,
        check_due=TimeRange() if scored == "next_attempt" else flt.due,
        check_queue=flt.queue,
        check_code=flt.status_code,
        check_class=flt.error_class,
    )


def check(repo: MessageRepository, p: Plan, ids: Sequence[str]) -> list[str]:
    """The ids that pass the plan's per-id checks, in order: the created range from the
    ids themselves, the rest where the records are (``lua/filter.lua``, one round trip,
    read only; about a microsecond per id in Redis instead of a record shipped to Python)."""
    out = [i for i in ids if p.check_created.contains(created_at_of(i))] if p.check_created else list(ids)
    if not out or not p.reads_records:
        return out
    return repo.check_ids(out, _checks_json(p))


def scan(
    repo: MessageRepository,
    p: Plan,
    *,
    offset: int,
    count: int,
    descending: bool,
    after: Cursor | None = None,
) -> tuple[list[str], int, Cursor | None]:
    """Check a slice of the plan's index (by rank within its score range, its sorted sets
    merged; or the ``count`` entries right after ``after``) in Redis, in one round trip
    (``lua/filter.lua``, read only): (the ids that pass, in order; how many entries were
    examined, fewer than ``count`` at the end of the range; where the next slice starts
    after, when the index has several sorted sets)."""
    span = IndexRange(p.lo, p.hi, descending, _checks_json(p, created=True))
    return repo.merged_range(p.index, span, offset=offset, count=count, after=after)


def _checks_json(p: Plan, created: bool = False) -> str:
    """The plan's per-record checks as ``lua/filter.lua`` takes them (only those that
    apply; the created range too when ``created``, else it was checked from the ids)."""
    checks: list[tuple[str, object]] = []
    if created:
        checks += [("created_lo", p.check_created.start), ("created_hi", p.check_created.end)]
    checks += [
        ("status", p.check_status),
        ("queue", p.check_queue),
        ("code", None if p.check_code is None else str(p.check_code)),
        ("class", p.check_class),
        ("destination", p.check_destination),
        ("updated_lo", p.check_updated.start),
        ("updated_hi", p.check_updated.end),
        ("due_lo", p.check_due.start),
        ("due_hi", p.check_due.end),
    ]
    return json.dumps({name: value for name, value in checks if value is not None})


def count_range(repo: MessageRepository, p: Plan) -> int:
    """Entries of the plan's index within its score range (ZCARD or ZCOUNT per sorted set, O(log N))."""
    return repo.count_range(p.index, p.lo, p.hi)


def range_ids(repo: MessageRepository, p: Plan, *, offset: int, limit: int, descending: bool) -> list[str]:
    """A slice of the plan's index within its score range, by rank (see
    :meth:`~outbox.store.MessageRepository.range_by_rank`)."""
    return repo.range_by_rank(p.index, p.lo, p.hi, offset=offset, limit=limit, descending=descending)


@dataclass
class Page:
    """One page of a filtered, sorted listing.

    Attributes:
        ids: the message ids on the page, in order.
        total: how many match: exact if :attr:`exact`, else the matches found among
            the :attr:`scanned` entries (a lower bound).
        exact: True if ``total`` is the true count.
        scanned: index entries examined by a bounded scan (0 when the index served it).
        index_total: entries of the index within the score range.
        plan: how the filter was read.
    """

    ids: list[str]
    total: int
    exact: bool
    scanned: int
    index_total: int
    plan: Plan


def page(
    repo: MessageRepository,
    flt: MessageFilter,
    *,
    offset: int = 0,
    limit: int = 50,
    descending: bool = True,
    scan_limit: int | None = None,
) -> Page:
    """A page of the ids matching ``flt``, in the order of the index that serves it.

    Served filters cost a few O(log N) commands per destination (and, across
    destinations, offset + limit entries of each). Others scan at most
    ``scan_limit`` (default :data:`SCAN_LIMIT`) index entries from the start, in the
    requested direction.

    ``offset`` (entries, from 0) and ``limit`` may be any non-negative integer: an
    offset past the end gives an empty page (Redis is never asked for a rank past the
    index's size, so a page number of 10**30 cannot reach it as an out-of-range integer).

    With more than one partition the index's partitions are merged here
    (:mod:`outbox.store.reads.merged_pages`): a served page reads ``offset + limit + 1``
    entries of every partition (P x (offset + limit) in all: deep pages cost more, so the
    console pages by cursor with :func:`page_at` instead); a scan shares ``scan_limit``
    among the partitions and the page holds only matches whose place in the merged
    order is known.
    """
    scan_limit = SCAN_LIMIT if scan_limit is None else scan_limit
    p = plan(repo, flt)
    index_total = count_range(repo, p)
    offset, limit = min(max(offset, 0), index_total), min(max(limit, 0), index_total)
    groups = p.index.by_slot()
    if len(groups) > 1:  # partitions: merged here from a page of each (merged_pages)
        return _merged_page(repo, p, groups, _Window(offset, limit, descending, scan_limit), index_total)
    if p.exact:
        ids = range_ids(repo, p, offset=offset, limit=limit, descending=descending)
        return Page(ids, index_total, True, 0, index_total, p)
    matches: list[str] = []
    scanned = 0
    after: Cursor | None = None  # across destinations, each chunk goes on from the last one's end
    while scanned < min(scan_limit, index_total):
        count = min(CHUNK, scan_limit - scanned)
        offset_in = 0 if after is not None else scanned
        found, examined, after = scan(
            repo, p, offset=offset_in, count=count, descending=descending, after=after
        )
        scanned += examined
        matches += found
        if examined < count:
            break
    exact = scanned >= index_total
    return Page(matches[offset : offset + limit], len(matches), exact, scanned, index_total, p)


@dataclass(frozen=True)
class _Window:
    """The page :func:`page` was asked for: ``offset`` and ``limit`` (within the index),
    its direction, and the most entries a scan may examine."""

    offset: int
    limit: int
    descending: bool
    scan_limit: int


def _merged_page(
    repo: MessageRepository, p: Plan, groups: Sequence[tuple[str, ...]], window: _Window, index_total: int
) -> Page:
    """:func:`page` of an index in several partitions (see there)."""
    offset, limit = window.offset, window.limit
    if p.exact:
        span = IndexRange(p.lo, p.hi, window.descending)
        found = merged_pages.read(repo, groups, span, after=None, want=offset + limit)
        return Page([i for _, i in found.entries[offset:]], index_total, True, 0, index_total, p)
    if not index_total:
        return Page([], 0, True, 0, 0, p)
    found = merged_pages.read(
        repo,
        groups,
        IndexRange(p.lo, p.hi, window.descending, _checks_json(p, created=True)),
        after=None,
        want=None,
        budget=merged_pages.Budget(min(window.scan_limit, index_total), size=index_total),
        count=True,  # a partition with nothing in range is then at its end at once
    )
    ids = [i for _, i in found.entries[offset : offset + limit]]
    return Page(ids, found.matched, found.complete, found.examined, index_total, p)


@dataclass
class CursorPage:
    """One page of a listing read by position (:func:`page_at`), for next/previous links.

    Attributes:
        ids: the message ids on the page, in list order.
        total: how many match: exact if :attr:`exact`, else the matches a bounded scan
            found from this page's position on (a lower bound).
        exact: True if ``total`` is the true count of the whole list.
        scanned: index entries a bounded scan examined (0 when the index served it).
        index_total: entries of the index within the score range.
        plan: how the filter was read.
        previous: where the page before ends (read it with ``backward=True``), or None
            when this is the first page.
        next: where the page after starts (read it with ``backward=False``), or None when
            this is the last page.
    """

    ids: list[str]
    total: int
    exact: bool
    scanned: int
    index_total: int
    plan: Plan
    previous: Cursor | None = None
    next: Cursor | None = None


def page_at(
    repo: MessageRepository,
    flt: MessageFilter,
    *,
    cursor: Cursor | None = None,
    backward: bool = False,
    limit: int = 50,
    descending: bool = True,
    scan_limit: int | None = None,
) -> CursorPage:
    """The page of the ids matching ``flt`` right after ``cursor`` (None: the first page),
    or with ``backward`` the page right before it, in the order of the index that serves
    the filter (highest score first when ``descending``).

    A cursor is the (score, id) of an entry (:attr:`CursorPage.previous` and
    :attr:`CursorPage.next` of another page); the order is total, so one cursor is the
    position in every partition (:mod:`outbox.store.reads.merged_pages`). A cursor of an entry
    deleted meanwhile still works; one from another filter's list is only a position.
    A page read backward that would be short is the first page instead.

    Cost: for a served filter one ``lua/filter.lua`` call per partition, pipelined (one
    round trip per node), that reads ``limit + 1`` entries of the partition's sorted sets
    from the cursor (O(log N) to find it) and counts them (ZCARD/ZCOUNT), however deep the
    page; for a filter no index serves, at most ``scan_limit`` (default
    :data:`SCAN_LIMIT`) entries examined from the cursor on, in Redis, in rounds of one
    call per partition.
    """
    scan_limit = SCAN_LIMIT if scan_limit is None else scan_limit
    limit = max(limit, 0)
    p = plan(repo, flt)
    found = merged_pages.read(
        repo,
        p.index.by_slot(),
        IndexRange(
            p.lo,
            p.hi,
            descending != backward,  # backward: read the other way, then turn round
            "{}" if p.exact else _checks_json(p, created=True),
        ),
        after=cursor,
        want=limit,
        budget=None if p.exact else merged_pages.Budget(max(1, scan_limit)),
        count=True,  # the count in the same calls
    )
    index_total = found.in_range or 0
    entries = found.entries
    if backward:
        if len(entries) < limit and found.complete:  # fewer than a page before it: the first page
            return page_at(repo, flt, limit=limit, descending=descending, scan_limit=scan_limit)
        entries = entries[::-1]
    ends = [merged_pages.cursor_of(e) for e in entries]
    full = bool(ends) and len(ends) >= limit
    # Past a page that is not full a scan goes on from where it stopped (its frontier).
    beyond = (ends[0] if backward else ends[-1]) if full else found.frontier
    previous: Cursor | None
    following: Cursor | None
    if backward:
        previous = beyond if found.more else None
        following = ends[-1] if ends else found.frontier or cursor
    else:
        following = beyond if found.more else None
        previous = None if cursor is None else ends[0] if ends else found.frontier
    if p.exact:
        total, exact = index_total, True
    else:
        total, exact = found.matched, found.complete and cursor is None
    return CursorPage(
        [i for _, i in entries],
        total,
        exact,
        0 if p.exact else found.examined,
        index_total,
        p,
        previous=previous,
        next=following,
    )


@dataclass
class Count:
    """A number of messages; ``exact`` False means at least ``n`` (a bounded scan stopped)."""

    n: int = 0
    exact: bool = True


def eligible_statuses(flt: MessageFilter, allowed: Sequence[str]) -> list[str]:
    """The statuses an action allowed on ``allowed`` statuses will walk for ``flt``."""
    if flt.status is None:
        return list(allowed)
    return [flt.status] if flt.status in allowed else []


def count_matching(
    repo: MessageRepository, flt: MessageFilter, statuses: Sequence[str], *, scan_limit: int | None = None
) -> Count:
    """How many messages in ``statuses`` match ``flt`` (exact when indexes serve it)."""
    total = Count()
    for status in statuses:
        found = page(repo, flt.with_status(status), limit=0, scan_limit=scan_limit)
        total.n += found.total
        total.exact = total.exact and found.exact
    return total


def iter_matching(
    repo: MessageRepository,
    flt: MessageFilter,
    statuses: Sequence[str],
    *,
    as_of: float,
    batch: int = CHUNK,
) -> Iterator[list[str]]:
    """Yield every id in ``statuses`` matching ``flt``, a batch at a time, for a bulk action.

    Walks each status index with :meth:`~outbox.store.MessageRepository.iter_ids` (safe
    while the action moves ids out of it). Only messages created up to ``as_of`` and,
    in terminal statuses, that entered their status up to ``as_of`` are yielded: what
    the user saw when confirming, and never a message the action itself sent back
    round (requeued, delivered again and back in ``succeeded``).
    """
    for status in statuses:
        p = plan(repo, flt.with_status(status))
        hi = p.hi
        if p.score_field == "updated":
            hi = as_of if hi is None else min(hi, as_of)
        created = p.check_created
        end = as_of if created.end is None else min(created.end, as_of)
        p = replace(p, hi=hi, check_created=TimeRange(created.start, end))
        if p.score_field == "batch":
            updated = p.check_updated  # a batch has no status score: bound finished ones by hand
            if score_field(status) == "updated":  # a finished status
                p = replace(p, check_updated=TimeRange(updated.start, min(updated.end or as_of, as_of)))
            walk = _walk_by_rank(repo, p.index.keys[0], batch)
        else:
            walk = repo.iter_ids(status, flt.destination, batch=batch, min_score=p.lo, max_score=p.hi)
        for ids in walk:
            kept = check(repo, p, ids)
            if kept:
                yield kept


def _walk_by_rank(repo: MessageRepository, key: str, batch: int) -> Iterator[list[str]]:
    """Every member of a sorted set that does not change meanwhile (a batch), by rank
    (one ZRANGE per ``batch`` members)."""
    start = 0
    while batch > 0:
        ids = [raw.decode() for raw in cast(Members, repo.connection.zrange(key, start, start + batch - 1))]
        if not ids:
            return
        yield ids
        start += len(ids)


#: Index entries a search by the end of an id examines at most (ZSCAN, 1,000 a call).
ID_SCAN_LIMIT = 1_000_000
#: Most messages a search by part of an id returns.
ID_MATCHES = 100
#: Hex digits after ``msg_`` in a message id (see :func:`~outbox.records.new_message_id`).
ID_DIGITS = 28
#: Hex digits of an id's creation time in milliseconds (the start of those digits).
ID_TIME_DIGITS = 12
#: A part of a message id as the list shows it: ``msg_…4f60b163`` (the start and the end,
#: "…" or "..." for the hidden middle), ``msg_01a2017c`` (a start), ``4f60b163`` (an end);
#: with partitions an end may name its id's partition too (``4f60b163_p7``).
ID_PART = re.compile(
    r"(?P<start>msg_[0-9a-f]*)?(?:\u2026|\.\.\.)?(?P<end>[0-9a-f]*(?:_p[0-9]+)?)",
)
#: Fewest hex digits of an id's end a search looks for (fewer would match too many).
ID_END_MIN = 6


@dataclass
class IdSearch:
    """Messages found by part of their id (:func:`find_by_id_part`).

    Attributes:
        ids: the ids found, oldest first, at most :data:`ID_MATCHES`.
        complete: False when the search stopped early (more than :data:`ID_MATCHES`
            matches, or :data:`ID_SCAN_LIMIT` index entries examined): there may be more.
        examined: created-index entries examined.
    """

    ids: list[str] = field(default_factory=list)
    complete: bool = True
    examined: int = 0


def id_part(text: str) -> tuple[str, str] | None:
    """``(start, end)`` of a typed part of a message id (see :data:`ID_PART`): ``start``
    is ``msg_`` and the hex digits after it ("" without ``msg_``), ``end`` the hex digits
    after a "…" (or, without ``msg_``, all of them). None for text that is no part of an
    id, a whole id, an end shorter than :data:`ID_END_MIN` digits without a start, or
    ``msg_`` alone. Case and surrounding spaces are ignored."""
    text = text.strip().lower()
    match = ID_PART.fullmatch(text)
    if match is None:
        return None
    start, end = match.group("start") or "", match.group("end") or ""
    digits = end.split("_p", 1)[0]  # an end's hex digits, without the partition it names
    if start and not digits and len(start) - 4 >= ID_DIGITS:
        return None  # a whole id: found (or not) by its key
    if not start and len(digits) < ID_END_MIN:
        return None
    if start == "msg_" and not end:
        return None
    if len(start) - 4 + len(digits) > ID_DIGITS:
        return None
    return start, end


def find_by_id_part(repo: MessageRepository, start: str, end: str) -> IdSearch:
    """Messages whose id begins with ``start`` (``msg_`` and hex digits, or "") and ends
    with ``end`` (hex digits, or ""), from the created indexes of every destination.

    A start of ``msg_`` and hex digits is a range of creation times (an id's first 12
    hex digits are its creation time in milliseconds, the created index's score), read
    by rank from where it begins: O(log N) plus the entries in the range. An end alone
    is looked for with ZSCAN ``MATCH *<end>`` over every created index. Either way at
    most :data:`ID_SCAN_LIMIT` entries are examined (in calls of 1,000) and
    :data:`ID_MATCHES` ids returned; :attr:`IdSearch.complete` says if it stopped early.
    """
    found = IdSearch()
    matches: dict[str, None] = {}  # ZSCAN may return an entry twice
    budget = ID_SCAN_LIMIT
    digits = start[4:]
    # an end without the partition an id names (``_p<k>``) is the end of its hex digits
    pattern = f"*{end}" if "_p" in end or not repo.keys.partitioned else f"*{end}_p*"
    for key in repo.index().keys:
        if budget <= 0 or len(matches) > ID_MATCHES:
            found.complete = False
            break
        if digits:
            time_digits = digits[:ID_TIME_DIGITS]
            pad = ID_TIME_DIGITS - len(time_digits)
            # The score is the creation time in seconds; the id's milliseconds its floor.
            lo = (int(time_digits + "0" * pad, 16) - 1) / 1000.0
            hi = (int(time_digits + "f" * pad, 16) + 2) / 1000.0
            rank = int(repo.connection.zcount(key, "-inf", f"({lo!r}"))
            while budget > 0 and len(matches) <= ID_MATCHES:
                chunk = cast(
                    list[tuple[bytes, float]], repo.connection.zrange(key, rank, rank + 999, withscores=True)
                )
                budget -= len(chunk)
                found.examined += len(chunk)
                inside = [raw.decode() for raw, score in chunk if score <= hi]
                matches.update((i, None) for i in inside if i.startswith(start) and _ends_with(i, end))
                if len(inside) < 1000:
                    break
                rank += 1000
            else:
                found.complete = False
        else:
            cursor = 0
            while True:
                cursor, members = cast(
                    tuple[int, list[tuple[bytes, float]]],
                    repo.connection.zscan(key, cursor, match=pattern, count=1000),
                )
                budget -= 1000
                found.examined += 1000  # about: COUNT is a hint
                matches.update((raw.decode(), None) for raw, _score in members)
                if cursor == 0:
                    break
                if budget <= 0 or len(matches) > ID_MATCHES:
                    found.complete = False
                    break
    found.ids = sorted(matches, key=lambda i: i[4:])
    if len(found.ids) > ID_MATCHES:
        found.ids, found.complete = found.ids[:ID_MATCHES], False
    return found


def _ends_with(message_id: str, end: str) -> bool:
    """True when ``message_id`` ends with ``end`` (hex digits, and perhaps the partition
    the id names): an end without a partition is the end of the id's hex digits."""
    if "_p" in end:
        return message_id.endswith(end)
    return PARTITION_SUFFIX.sub("", message_id).endswith(end)


def find(repo: MessageRepository, text: str) -> list[str]:
    """Ids matching a search: a message id (exact, surrounding spaces ignored) or an
    idempotency key (exactly as typed, or without surrounding spaces); when neither
    finds anything, part of an id as the console's list shows it (``msg_…4f60b163``,
    ``4f60b163``, ``msg_01a2017c``: :func:`id_part`, :func:`find_by_id_part`).

    Keys are scoped per destination, so the key is looked up under every destination
    ever used. Returns the message id first, then the key's messages; no duplicates.
    """
    return search(repo, text).ids


def search(repo: MessageRepository, text: str) -> IdSearch:
    """:func:`find`, saying also whether a search by part of an id was complete."""
    found = _find_exact(repo, text)
    if found:
        return IdSearch(found)
    part = id_part(text)
    return find_by_id_part(repo, *part) if part else IdSearch()


def _find_exact(repo: MessageRepository, text: str) -> list[str]:
    typed, text = text, text.strip()
    if not text:
        return []
    found = []
    if repo.connection.exists(repo.keys.resend(text)):
        found.append(text)
    keys = dict.fromkeys([typed, text])  # a key may have surrounding spaces: try it as typed too
    for by_key in repo.ids_for_idempotency_keys([(d, k) for k in keys for d in repo.destinations()]):
        if by_key and by_key not in found and repo.connection.exists(repo.keys.resend(by_key)):
            found.append(by_key)
    return found


def summaries(repo: MessageRepository, ids: Sequence[str]) -> list[Message | None]:
    """The messages with these ids without their bodies (``body`` is b""), for list rows.

    One round trip: the start of each message record (``GETRANGE`` of
    :data:`SUMMARY_BYTES`: its header line, not the body) and the resend record
    (HGETALL); None where an id has no message. A header longer than that, or a record
    written by an older version (a hash: HMGET of its small fields), costs one more.
    """
    if not ids:
        return []
    pipe = repo.connection.pipeline(transaction=False)
    for message_id in ids:
        pipe.getrange(repo.keys.message(message_id), 0, SUMMARY_BYTES - 1)
        pipe.hgetall(repo.keys.resend(message_id))
    replies = pipe.execute(raise_on_error=False)
    starts = repo.resolve_older_records(ids, replies[::2], lambda key, pipe: pipe.hmget(key, SUMMARY_FIELDS))
    long = [i for i, start in enumerate(starts) if isinstance(start, bytes) and b"\n" not in start and start]
    if long:  # a header over SUMMARY_BYTES: read the whole record
        wholes = repo.mget([repo.keys.message(ids[i]) for i in long])
        for i, whole in zip(long, wholes, strict=True):
            starts[i] = whole
    out: list[Message | None] = []
    for i, start in enumerate(starts):
        resend = replies[2 * i + 1]
        if isinstance(start, list):  # HMGET of a hash written by an older version
            start = {name.encode(): v for name, v in zip(SUMMARY_FIELDS, start, strict=True) if v is not None}
        if not start or not resend:
            out.append(None)
            continue
        message = message_from_redis(start, resend, ids[i])
        message.body = b""  # a list row has no body (GETRANGE may have read its start)
        out.append(message)
    return out
