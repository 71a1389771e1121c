"""Index reads in Redis: lists and counts of messages by status and destination (one
sorted set per destination, see :mod:`outbox.store.keys`), pages by rank, merged ranges
across destinations (``lua/filter.lua``), walks, the destinations ever used, and the
per-minute outcome counters. Read only, but for :meth:`IndexReads.drop_index_entry`
(a repair). The queries of the admin console and bulk commands build on these
(:mod:`outbox.store.reads.queries`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any, cast

from outbox.records import STATUSES
from outbox.store.base import Members, RepositoryBase, ScoredMembers, ScriptCall, first_of, queue_first
from outbox.store.scripts import named

#: Where a walk over an index stopped: (score as Redis wrote it, id) of the last entry read.
Cursor = tuple[bytes, bytes]


@dataclass(frozen=True)
class Index:
    """A list of messages read as one sorted set: one sorted set per destination (of one
    destination, or of every one), all with the same kind of score (see
    :mod:`outbox.store.keys`); their union is the list, in score order (ties by id, as
    Redis orders one sorted set).

    Attributes:
        keys: the sorted sets, one per destination.
    """

    keys: tuple[str, ...]

    def by_slot(self) -> list[tuple[str, ...]]:
        """The keys grouped by hash tag (``{p<k>}``: one group per partition, each a
        hash slot of a Redis Cluster, in order of first appearance), so that one script
        call reads one group. A single group (every key) when the keys carry no tag or
        one tag: one partition, or a batch's one sorted set."""
        groups: dict[str, list[str]] = {}
        for key in self.keys:
            tag = hash_tag(key)
            groups.setdefault(tag if tag != key else "", []).append(key)  # untagged: one group
        return [tuple(keys) for keys in groups.values()]


@dataclass(frozen=True)
class IndexRange:
    """Which entries of an index a read takes, and in what order.

    Attributes:
        lo, hi: the score range (inclusive; None: unbounded on that side).
        descending: highest score first (ties by id, the other way round).
        checks: the JSON of ``lua/filter.lua``'s per-record checks an entry must pass
            ("{}": none).
    """

    lo: float | None = None
    hi: float | None = None
    descending: bool = False
    checks: str = "{}"


@dataclass
class Slice:
    """One group's part of a read of an index across partitions
    (:meth:`IndexReads.read_slices`).

    Attributes:
        ids: the ids read that pass the checks, in list order.
        scores: their scores, as Redis wrote them (``b"1764142207.123"``), in the same order.
        examined: entries examined (fewer than asked: the group has no more in the range).
        last: the last entry examined, or None when none was.
        total: the group's entries within the score range, when asked; else None.
    """

    ids: list[str]
    scores: list[bytes]
    examined: int
    last: Cursor | None
    total: int | None = None


class IndexReads(RepositoryBase):
    """The index part of :class:`~outbox.store.repository.MessageRepository`."""

    def index(self, status: str | None = None, destination: str | None = None) -> Index:
        """The index listing messages with this status and/or destination: the status
        index (or, without a status, the created index) of that destination, or of every
        destination ever used when ``destination`` is None (one ``SMEMBERS``).

        Raises:
            ValueError: an unknown status.
        """
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; expected one of {STATUSES}")
        names = [destination] if destination is not None else self.destinations()
        if status is None:
            return Index(tuple(k for d in names for k in self.keys.every("created", d)))
        return Index(tuple(k for d in names for k in self.keys.every("status", status, d)))

    def filter(
        self,
        status: str | None = None,
        destination: str | None = None,
        *,
        offset: int = 0,
        limit: int = 50,
        newest_first: bool = True,
        min_score: float | None = None,
        max_score: float | None = None,
    ) -> list[str]:
        """Ids with this status and/or destination, a page at a time.

        Ordered by the index score (see :mod:`outbox.store.keys`): created_at when no
        status is given. ``min_score``/``max_score`` bound the score (epoch seconds).
        See :meth:`range_by_rank` for what a deep page costs.
        """
        return self.range_by_rank(
            self.index(status, destination),
            min_score,
            max_score,
            offset=offset,
            limit=limit,
            descending=newest_first,
        )

    def range_by_rank(
        self, index: Index, lo: float | None, hi: float | None, *, offset: int, limit: int, descending: bool
    ) -> list[str]:
        """A page of an index within a score range, read by rank.

        One sorted set (one destination): unlike ``ZRANGEBYSCORE ... LIMIT offset`` (which
        walks ``offset`` entries), this finds the rank where the range starts with ZCOUNT
        and reads by rank, so a deep page costs O(log N) too; two round trips. Several
        (every destination): ``lua/filter.lua`` merges them in Redis in one round trip,
        reading ``offset + limit`` entries of each (O(destinations x (offset + limit))).
        Several partitions: one such call per partition (:meth:`read_slices`, one hash
        slot each), merged here.
        """
        if limit <= 0 or not index.keys:
            return []
        groups = index.by_slot()
        if len(groups) > 1:  # partitions: one call per partition (slot), merged here
            slices = self.read_slices(
                groups,
                IndexRange(lo, hi, descending),
                counts=[offset + limit] * len(groups),
                afters=[None] * len(groups),
            )
            rows = [list(zip(s.scores, s.ids, strict=True)) for s in slices]
            merged = heapq.merge(*rows, key=order_key, reverse=descending)
            return [i for _, i in islice(merged, offset, offset + limit)]
        if len(index.keys) > 1:
            return self.merged_range(index, IndexRange(lo, hi, descending), offset=offset, count=limit)[0]
        key = index.keys[0]
        pipe = self.connection.pipeline(transaction=False)
        pipe.zcount(key, score_bound(lo, "-inf"), score_bound(hi, "+inf"))
        if descending:
            pipe.zcount(key, score_bound(hi, "+inf", exclusive=True), "+inf")
        else:
            pipe.zcount(key, "-inf", score_bound(lo, "-inf", exclusive=True))
        counts: list[int] = pipe.execute()  # ZCOUNT, ZCOUNT
        in_range, before = counts
        if (descending and hi is None) or (not descending and lo is None):
            before = 0
        end = min(offset + limit, in_range)
        if end <= offset:
            return []
        read = self.connection.zrevrange if descending else self.connection.zrange
        return [raw.decode() for raw in cast(Members, read(key, before + offset, before + end - 1))]

    def merged_range(
        self, index: Index, span: IndexRange, *, offset: int, count: int, after: Cursor | None = None
    ) -> tuple[list[str], int, Cursor | None]:
        """Entries ``offset`` to ``offset + count`` (by rank, in the order of ``span``) of an
        index within ``span``'s score range, its sorted sets (all of one hash slot: one
        partition's, or any on a single server) merged in Redis as if they were one, that
        pass ``span``'s checks. One round trip, read only.

        ``after``: start right after this entry (the cursor a previous call returned)
        instead of at ``offset``: a walk in chunks then reads ``count`` entries of each
        sorted set per chunk instead of ``offset + count``.

        Returns (the ids that pass, in order; how many entries were examined: fewer than
        ``count`` at the end of the range; the cursor of the last entry examined, or None
        when none was)."""
        later = self.checked_elsewhere(index.keys, span.checks)
        here = replace(span, checks="{}") if later else span
        matched, examined, last_score, last_id, *_ = self.run_script(
            "filter", self.range_args(here, offset=offset, count=count, after=after), keys=index.keys
        )
        cursor = (last_score, last_id) if last_score is not None else None
        ids = [raw.decode() for raw in matched]
        return (self.check_ids(ids, span.checks) if later else ids), int(examined), cursor

    def checked_elsewhere(self, keys: Sequence[str], checks: str) -> bool:
        """True when ``checks`` must be made where the records are, not in the script that
        reads ``keys``: keys across the deployment (``{g}``: a batch's sorted set) with
        more than one partition, whose ids' records are in other slots."""
        if not self.keys.partitioned or checks == "{}":
            return False
        shared = f"{self.keys.shared}:"
        return all(key.startswith(shared) for key in keys)

    def range_args(
        self, span: IndexRange, *, offset: int, count: int, after: Cursor | None, total: bool = False
    ) -> list[Any]:
        """ARGV of ``lua/filter.lua`` in range mode (see :meth:`merged_range` and
        :meth:`read_slices`; ``total``: also count the entries within the score range)."""
        return named(
            prefix=self.keys.prefix,
            parts=self.keys.partitions,
            checks=span.checks,
            mode="range",
            lo=score_bound(span.lo, "-inf"),
            hi=score_bound(span.hi, "+inf"),
            offset=offset,
            count=count,
            descending=int(span.descending),
            after_score=after[0] if after else "",
            after_id=after[1] if after else "",
            **({"total": 1} if total else {}),
        )

    def read_slices(
        self,
        groups: Sequence[tuple[str, ...]],
        span: IndexRange,
        *,
        counts: Sequence[int],
        afters: Sequence[Cursor | None],
        total: bool = False,
    ) -> list[Slice]:
        """Per group of sorted sets (:meth:`Index.by_slot`: one partition's sorted sets,
        one hash slot), the ``counts[i]`` entries right after ``afters[i]`` (None: from
        the start of ``span``'s score range) in its order, merged as one sorted set, and
        which of them pass its checks (``lua/filter.lua`` range mode, read only), with their
        scores. One script call per group, all in one pipeline (on a cluster one round
        trip per node, redis-py's cluster pipeline sending each call to its slot's node).
        A group whose count is 0 is not read (an empty :class:`Slice`) unless ``total``:
        then every group is called and counts its entries within the score range
        (:attr:`Slice.total`), so a page and its count take one round trip.

        Cost per group: O(log N + keys x (count + entries tied at the cursor's score)).

        A group of keys across the deployment (:meth:`checked_elsewhere`: a batch) holds
        ids of every partition, whose records a script of the ``{g}`` slot may not read:
        it is read without ``span``'s checks, and its ids checked where their records are
        (:meth:`check_ids`).
        """
        calls: list[ScriptCall] = []
        asked = [i for i, n in enumerate(counts) if n > 0 or total]  # a count reads every group
        later: list[int] = []  # groups of {g} keys whose ids are checked where they live
        for i in asked:
            here = span
            if self.checked_elsewhere(groups[i], span.checks):
                here = replace(span, checks="{}")
                later.append(i)
            args = self.range_args(here, offset=0, count=counts[i], after=afters[i], total=total)
            calls.append(("filter", args, groups[i]))
        out = [Slice([], [], 0, None) for _ in groups]  # not read: no total either
        for i, (matched, examined, last_score, last_id, scores, in_range) in zip(
            asked, self.run_scripts(calls) if calls else [], strict=True
        ):
            last = (last_score, last_id) if last_score is not None else None
            found = None if in_range is None else int(in_range)
            ids = [raw.decode() for raw in matched]
            kept = list(scores)
            if i in later:
                passed = set(self.check_ids(ids, span.checks))
                kept = [score for id_, score in zip(ids, kept, strict=True) if id_ in passed]
                ids = [id_ for id_ in ids if id_ in passed]
            out[i] = Slice(ids, kept, int(examined), last, found)
        return out

    def check_ids(self, ids: Sequence[str], checks: str) -> list[str]:
        """The ids that pass ``checks`` (the JSON of ``lua/filter.lua``'s per-record
        checks), in order, checked where their records are: ``lua/filter.lua`` in ids
        mode, one call per partition, in one pipeline (read only)."""
        if not ids:
            return []
        opts = named(prefix=self.keys.prefix, parts=self.keys.partitions, checks=checks, mode="ids")
        calls: list[ScriptCall] = []
        for positions in self.by_partition(ids):
            chunk = [ids[i] for i in positions]
            calls.append(("filter", [*opts, *chunk], [self.keys.resend(i) for i in chunk]))
        passed = {raw.decode() for reply in self.run_scripts(calls) for raw in reply[0]}
        return [i for i in ids if i in passed]

    def count(
        self,
        status: str | None = None,
        destination: str | None = None,
        *,
        min_score: float | None = None,
        max_score: float | None = None,
    ) -> int:
        """How many messages have this status and/or destination (ZCARD, or ZCOUNT with
        bounds, per destination: O(log N) each)."""
        return self.count_range(self.index(status, destination), min_score, max_score)

    def count_range(self, index: Index, lo: float | None = None, hi: float | None = None) -> int:
        """Entries of an index within a score range: ZCARD without bounds, else ZCOUNT
        (O(log N)), per sorted set, in one round trip (with partitions, one
        ``lua/filter.lua`` "cards" call per partition, pipelined: one round trip per node)."""
        groups = index.by_slot()
        if len(groups) > 1:
            return sum(sum(cards) for cards in self.cards(groups, lo, hi))
        pipe = self.connection.pipeline(transaction=False)
        for key in index.keys:
            if lo is None and hi is None:
                pipe.zcard(key)
            else:
                pipe.zcount(key, score_bound(lo, "-inf"), score_bound(hi, "+inf"))
        counts: list[int] = pipe.execute()  # ZCARD or ZCOUNT per sorted set
        return sum(counts)

    def cards(
        self, groups: Sequence[Sequence[str]], lo: float | None = None, hi: float | None = None
    ) -> list[list[int]]:
        """Per group of sorted sets of one hash slot each (a partition's), the entries of
        each within a score range (ZCARD without bounds, else ZCOUNT): one
        ``lua/filter.lua`` call per group, all in one pipeline (on a cluster one round trip
        per node), instead of one command per sorted set through the cluster pipeline."""
        opts = named(mode="cards", lo=score_bound(lo, "-inf"), hi=score_bound(hi, "+inf"))
        calls: list[ScriptCall] = [("filter", opts, list(keys)) for keys in groups if keys]
        replies = iter(self.run_scripts(calls) if calls else [])
        return [[int(n) for n in next(replies)] if keys else [] for keys in groups]

    def counts(self, destination: str | None = None) -> dict[str, int]:
        """Message count per status, of one destination or all (one pipelined ZCARD per
        status and destination, O(1) each)."""
        names = [destination] if destination is not None else self.destinations()
        return sum_counts(self.counts_by_destination(names).values())

    def counts_by_destination(self, destinations: Iterable[str]) -> dict[str, dict[str, int]]:
        """Per destination, the message count per status: one pipeline of O(1) ZCARDs
        (with partitions, one call per partition of its ZCARDs: :meth:`cards`)."""
        names = list(destinations)
        if self.keys.partitioned:  # one call per partition (its ZCARDs), not one command each
            groups = [
                [self.keys.partition(k).status(s, d) for d in names for s in STATUSES]
                for k in self.keys.partition_numbers()
            ]
            per_partition = self.cards(groups) if names else []
            n = len(STATUSES)
            return {
                d: {s: sum(c[i * n + j] for c in per_partition) for j, s in enumerate(STATUSES)}
                for i, d in enumerate(names)
            }
        pipe = self.connection.pipeline(transaction=False)
        self.queue_status_counts(pipe, names)
        return self.parse_status_counts(names, pipe.execute())

    def queue_status_counts(self, pipe: Any, destinations: Sequence[str]) -> None:
        """Add to ``pipe`` one ZCARD per destination, status and partition (in that order),
        for :meth:`parse_status_counts`: a caller that reads more in the same round trip."""
        for destination in destinations:
            for status in STATUSES:
                for key in self.keys.every("status", status, destination):
                    pipe.zcard(key)

    def parse_status_counts(
        self, destinations: Sequence[str], cards: Sequence[int]
    ) -> dict[str, dict[str, int]]:
        """The replies of :meth:`queue_status_counts` as destination -> status -> count
        (summed over partitions)."""
        p = self.keys.partitions
        n = len(STATUSES) * p
        return {
            d: {
                status: sum(int(c) for c in cards[i * n + j * p : i * n + (j + 1) * p])
                for j, status in enumerate(STATUSES)
            }
            for i, d in enumerate(destinations)
        }

    def count_past_retention(self, retention: dict[str, float | None], now: float) -> int:
        """Messages kept longer than ``retention`` (status -> seconds, None = for ever)
        allows: the purge backlog. One ZCOUNT per status and destination (O(log N))."""
        names = self.destinations()
        pipe = self.connection.pipeline(transaction=False)
        for status, seconds in retention.items():
            if seconds is not None:
                for name in names:
                    for key in self.keys.every("status", status, name):
                        pipe.zcount(key, "-inf", repr(now - seconds))
        counts: list[int] = pipe.execute()  # ZCOUNT per status with a retention and destination
        return sum(counts)

    def destination_count(self) -> int:
        """How many destinations a message was ever sent to (one SCARD, O(1))."""
        return int(self.connection.scard(self.keys.destinations))

    def destinations(self) -> list[str]:
        """Names of every destination a message was ever sent to, sorted."""
        return sorted(
            d.decode() for d in cast("set[bytes]", self.connection.smembers(self.keys.destinations))
        )

    def is_known_destination(self, name: str) -> bool:
        """Whether a message was ever sent to destination ``name`` (one SISMEMBER)."""
        return bool(self.connection.sismember(self.keys.destinations, name))

    def oldest(
        self, status: str, destination: str | None = None, *, among: Iterable[str] | None = None
    ) -> tuple[str, float] | None:
        """The (id, score) with the lowest score in a status index (of ``destination``,
        of the destinations ``among``, or of every one), or None if empty. One round trip
        (one ``ZRANGE`` of one entry per destination)."""
        keys = (
            self.index(status, destination).keys
            if among is None
            else tuple(k for d in among for k in self.keys.every("status", status, d))
        )
        return self._lowest(keys)

    def oldest_parked(self, destinations: Iterable[str]) -> tuple[str, float] | None:
        """The (id, due score) of the parked message due first among ``destinations``
        (held while paused, disabled or its breaker is open), or None when none is
        parked. One round trip (one ``ZRANGE`` of one entry per destination)."""
        return self._lowest(tuple(k for d in destinations for k in self.keys.every("parked", d)))

    def parked_counts(self, destinations: Iterable[str]) -> dict[str, int]:
        """How many messages each of ``destinations`` holds parked now (paused, disabled,
        breaker open), those with none left out. One round trip (a ``ZCARD`` per
        destination and partition)."""
        names = list(destinations)
        keyed = [(d, k) for d in names for k in self.keys.every("parked", d)]
        if not keyed:
            return {}
        pipe = self.connection.pipeline(transaction=False)
        for _, key in keyed:
            pipe.zcard(key)
        counts: dict[str, int] = {}
        for (destination, _), n in zip(keyed, pipe.execute(), strict=True):
            if n:
                counts[destination] = counts.get(destination, 0) + int(n)
        return counts

    def _lowest(self, keys: Sequence[str]) -> tuple[str, float] | None:
        """The (member, score) with the lowest score over the sorted sets ``keys``."""
        if not keys:
            return None
        pipe = self.connection.pipeline(transaction=False)
        for key in keys:
            queue_first(pipe, key)
        firsts = [f for reply in pipe.execute() if (f := first_of(reply))]
        if not firsts:
            return None
        raw, score = min(firsts, key=lambda row: (row[1], row[0]))
        return raw.decode(), score

    def iter_ids(
        self,
        status: str | None = None,
        destination: str | None = None,
        *,
        batch: int = 1000,
        min_score: float | None = None,
        max_score: float | None = None,
    ) -> Iterator[list[str]]:
        """Yield every matching id, ``batch`` at a time: one destination after another
        (sorted by name), oldest score first within each.

        Walks each index by score with an exclusive lower bound, so ids that leave the
        index meanwhile (a bulk action moving them) do not make it skip others.
        """
        for key in self.index(status, destination).keys:
            yield from self._walk_by_score(key, batch, min_score, max_score)

    def _walk_by_score(
        self, key: str, batch: int, min_score: float | None, max_score: float | None
    ) -> Iterator[list[str]]:
        lo, hi = score_bound(min_score, "-inf"), score_bound(max_score, "+inf")
        seen_at_score: set[str] = set()
        last_score: float | None = None
        while True:
            rows = cast(
                ScoredMembers,
                self.connection.zrangebyscore(
                    key, lo, hi, start=0, num=batch + len(seen_at_score), withscores=True
                ),
            )
            ids = []
            for raw, score in rows:
                member = raw.decode()
                if score == last_score and member in seen_at_score:
                    continue
                if score != last_score:
                    last_score, seen_at_score = score, set()
                seen_at_score.add(member)
                ids.append(member)
                if len(ids) == batch:
                    break
            if not ids:
                return
            yield ids
            lo = repr(last_score)

    def due(self, status: str, before: float, limit: int = 1000) -> list[tuple[str, float]]:
        """Up to ``limit`` (id, score) pairs in a status index (every destination) with
        score <= ``before``, lowest score first. One round trip."""
        pipe = self.connection.pipeline(transaction=False)
        for key in self.index(status).keys:
            pipe.zrangebyscore(key, "-inf", repr(before), start=0, num=limit, withscores=True)
        rows = [row for found in cast(list[ScoredMembers], pipe.execute()) for row in found]
        rows.sort(key=lambda row: (row[1], row[0]))
        return [(raw.decode(), score) for raw, score in rows[:limit]]

    def stats(self, outcomes: Iterable[str], minutes: Sequence[int]) -> dict[str, list[int]]:
        """Per-minute outcome counters: outcome -> counts for each minute (epoch // 60)."""
        outcomes = list(outcomes)
        pipe = self.connection.pipeline(transaction=False)
        p = self.keys.partitions
        for outcome in outcomes:
            for minute in minutes:
                for key in self.keys.every("stats", outcome, minute):
                    pipe.get(key)
        values: list[bytes | None] = pipe.execute()  # GET per outcome, minute and partition
        out: dict[str, list[int]] = {}
        for i, outcome in enumerate(outcomes):
            row = values[i * len(minutes) * p : (i + 1) * len(minutes) * p]
            out[outcome] = [sum(int(v) for v in row[j * p : (j + 1) * p] if v) for j in range(len(minutes))]
        return out

    def drop_index_entry(self, status: str, message_id: str) -> None:
        """Remove an id from a status index of every destination (repairing an entry
        without a record, whose destination is no longer known)."""
        pipe = self.connection.pipeline(transaction=False)
        for key in self.index(status).keys:
            pipe.zrem(key, message_id)
        pipe.execute()


def sum_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counts per status (of several destinations) added up, status by status."""
    total = dict.fromkeys(STATUSES, 0)
    for one in counts:
        for status, n in one.items():
            total[status] += n
    return total


def order_key(entry: tuple[bytes, str] | Cursor) -> tuple[float, str]:
    """The sort key of an index entry (score as Redis wrote it, id) or a cursor: (score,
    id), ids compared as Redis compares members (byte order; ids are ASCII)."""
    score, member = entry
    return float(score), member.decode() if isinstance(member, bytes) else member


def hash_tag(key: str) -> str:
    """The part of ``key`` Redis Cluster hashes (its hash tag, the text between the first
    ``{`` and the next ``}`` when not empty; else the whole key), as in
    https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/#hash-tags."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def score_bound(value: float | None, default: str, exclusive: bool = False) -> str:
    """A sorted-set score bound for ZCOUNT/ZRANGEBYSCORE: ``default`` when None, ``(x`` when exclusive."""
    if value is None:
        return default
    return f"({value!r}" if exclusive else repr(value)
