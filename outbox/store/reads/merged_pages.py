"""Reading an index across partitions: a k-way merge of per-partition pages.

With more than one partition (``OUTBOX["PARTITIONS"]`` > 1) an index is one sorted set
per partition and destination, and each partition's sorted sets live in their own hash
slot (``{p<k>}``), which on a Redis Cluster one script call cannot cross. So a read
across partitions asks every partition for its next entries, one ``lua/filter.lua``
call per partition (its destinations' sorted sets merged there), all in one pipeline
(one round trip per node on a cluster), and merges the partitions' pages here by
(score, id) in the order asked: the order one sorted set holding every entry would
have.

A position in the list is a :data:`~outbox.store.indexes.Cursor`, the (score, id) of
an entry: the order is total, so "every entry after this one" means the same in every
partition, whether the entry is there or not. One cursor therefore carries the position
of every partition at once (a page of a partition starts right after it, found in
O(log N) by score), and a page token needs no cursor per partition.

Costs, for P partitions and a page of ``limit``:

* a served filter (:func:`read` without a budget): P x (limit + 1) entries read, in one
  round trip per node, whatever the depth of the page;
* a filter no index serves (a budget): at most ``budget`` entries examined in total
  (shared by the partitions, in rounds of one pipeline each), checked in Redis.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from outbox.store.base import IDS_PER_CALL
from outbox.store.indexes import Cursor, IndexRange, order_key
from outbox.store.repository import MessageRepository

#: Entries a partition examines per call while scanning.
CHUNK = IDS_PER_CALL

#: An entry of a merged read: (score as Redis wrote it, id).
Entry = tuple[bytes, str]


def cursor_of(entry: Entry) -> Cursor:
    """The cursor that starts a read right after ``entry``."""
    return entry[0], entry[1].encode()


@dataclass
class Merged:
    """What :func:`read` found.

    Attributes:
        entries: the entries after the cursor that pass the checks, in list order, at
            most ``want`` (all of those before :attr:`frontier` when ``want`` is None).
        more: True when there may be entries beyond :attr:`entries` (a served read: at
            least one more exists; a scan: more matches were found, or the scan stopped
            before the end of the range).
        examined: index entries examined.
        matched: entries found that pass the checks (a scan may find some past the
            frontier: a lower bound of the matches in the range, >= ``len(entries)``).
        frontier: a scan that stopped before the end of the range examined every entry
            up to this one (the next scan goes on right after it); None otherwise.
        complete: every entry after the cursor in the range was examined.
        in_range: the index's entries within the score range (all of them, not only those
            after the cursor), when :func:`read` was asked to count; else None.
    """

    entries: list[Entry] = field(default_factory=list)
    more: bool = False
    examined: int = 0
    matched: int = 0
    frontier: Cursor | None = None
    complete: bool = True
    in_range: int | None = None


@dataclass(frozen=True)
class Budget:
    """A bounded scan's limit (:func:`read`).

    Attributes:
        entries: at most this many entries examined in total (not per group).
        size: the entries of the range after the cursor, when known (a scan that examined
            that many has seen them all, though no group was seen to end).
    """

    entries: int
    size: int | None = None


def read(
    repo: MessageRepository,
    groups: Sequence[tuple[str, ...]],
    span: IndexRange,
    *,
    after: Cursor | None,
    want: int | None,
    budget: Budget | None = None,
    count: bool = False,
) -> Merged:
    """The first ``want`` entries right after ``after`` (None: from the start) of an index
    read as one list, in the order of ``span`` (its score range; highest first when
    descending), from its sorted sets grouped by partition
    (:meth:`~outbox.store.indexes.Index.by_slot`).

    Without ``budget``: every group reads ``want + 1`` entries (one round trip per node)
    and the merge keeps ``want``; ``span``'s checks must then be "{}" (a served filter).
    With ``budget``: a bounded scan of at most ``budget.entries`` entries in total (not per
    group: each round shares what is left among the groups not at their end, at least
    one entry each while it lasts, so a budget under the number of groups leaves some
    unread and the scan can place none of its matches), checked by ``span``'s checks
    (``lua/filter.lua``'s JSON), in rounds that share
    what is left of the budget among the groups not yet at their end; it stops once
    ``want + 1`` matches are known to be in order (``want`` None: never early).
    ``count``: count the index's entries in the score range in the same calls
    (:attr:`Merged.in_range`; from the start, a scan also takes it as the budget's ``size``).

    Raises:
        ValueError: ``want`` is None without a budget.
        redis.exceptions.RedisError: Redis failed.
    """
    if budget is None:
        if want is None:
            raise ValueError("a read without a budget needs a number of entries")
        return _served(repo, groups, span, after=after, want=want, count=count)
    return _scan(repo, groups, span, after=after, want=want, budget=budget, count=count)


def _served(
    repo: MessageRepository,
    groups: Sequence[tuple[str, ...]],
    span: IndexRange,
    *,
    after: Cursor | None,
    want: int,
    count: bool,
) -> Merged:
    """:func:`read` of a served filter: ``want + 1`` entries of every group, merged."""
    if want <= 0 and not count:
        return Merged()
    slices = repo.read_slices(
        groups, span, counts=[want + 1] * len(groups), afters=[after] * len(groups), total=count
    )
    lists = [list(zip(s.scores, s.ids, strict=True)) for s in slices]
    merged = list(heapq.merge(*lists, key=order_key, reverse=span.descending))
    return Merged(
        entries=merged[:want],
        more=len(merged) > want,
        examined=sum(s.examined for s in slices),
        matched=len(merged),
        complete=len(merged) <= want,
        in_range=sum(s.total or 0 for s in slices) if count else None,
    )


def _scan(
    repo: MessageRepository,
    groups: Sequence[tuple[str, ...]],
    span: IndexRange,
    *,
    after: Cursor | None,
    want: int | None,
    budget: Budget,
    count: bool,
) -> Merged:
    """:func:`read` of a filter no index serves: a scan of the groups within ``budget``."""
    size = budget.size
    n = len(groups)
    cursors: list[Cursor | None] = [after] * n
    started = [False] * n  # a group examined something (its cursor is its own)
    done = [False] * n
    found: list[list[Entry]] = [[] for _ in groups]
    examined = 0
    definitive: list[Entry] = []
    frontier: Cursor | None = None
    in_range: int | None = None
    while True:
        active = [i for i in range(n) if not done[i]]
        left = budget.entries - examined
        if not active or left <= 0:
            break
        share = max(1, min(CHUNK, left // len(active)))
        counts = [0] * n
        for i in active:
            counts[i] = min(share, left)
            left -= counts[i]
            if left <= 0:
                break
        first = count and in_range is None  # every group is read in the first round
        slices = repo.read_slices(groups, span, counts=counts, afters=cursors, total=first)
        if first:
            in_range = sum(s.total or 0 for s in slices)
            if size is None and after is None:
                size = in_range
            for i, s in enumerate(slices):
                if s.total == 0:  # nothing in its range: at its end without a share
                    done[i] = True
        for i, s in enumerate(slices):
            if not counts[i]:
                continue
            examined += s.examined
            found[i] += zip(s.scores, s.ids, strict=True)
            if s.last is not None:
                cursors[i], started[i] = s.last, True
            if s.examined < counts[i]:
                done[i] = True
        if size is not None and examined >= size:
            done = [True] * n
        definitive, frontier = _in_order(found, cursors, started, done, after, span.descending)
        if want is not None and len(definitive) > want:
            break
    complete = all(done)
    entries = definitive if want is None else definitive[:want]
    return Merged(
        entries=entries,
        more=not complete or len(definitive) > len(entries),
        examined=examined,
        matched=sum(len(f) for f in found),
        frontier=None if complete else frontier,
        complete=complete,
        in_range=in_range,
    )


def _in_order(
    found: Sequence[Sequence[Entry]],
    cursors: Sequence[Cursor | None],
    started: Sequence[bool],
    done: Sequence[bool],
    after: Cursor | None,
    descending: bool,
) -> tuple[list[Entry], Cursor | None]:
    """The matches found whose place in the merged list is known (none of the groups still
    scanning can have an entry before them: they lie up to the frontier, the earliest
    last-examined entry of those groups), in list order; and that frontier (None when every
    group is at its end)."""
    pending = [cursors[i] if started[i] else after for i in range(len(found)) if not done[i]]
    merged = list(heapq.merge(*found, key=order_key, reverse=descending))
    if not pending:
        return merged, None
    if any(c is None for c in pending):  # a group examined nothing yet: nothing is known
        return [], None
    known = [c for c in pending if c is not None]
    edge = (max if descending else min)(known, key=order_key)
    limit = order_key(edge)
    if descending:
        return [e for e in merged if order_key(e) >= limit], edge
    return [e for e in merged if order_key(e) <= limit], edge
