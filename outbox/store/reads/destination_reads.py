"""Reads of destination health from Redis, for :mod:`outbox.destinations.health` (which
turns them into its read model). Each function is one pipelined round trip; replies are
decoded to text.

Keys (:class:`~outbox.store.keys.Keys`): the destination's hash ``dest``, its parked set
``parked``, its per-minute hashes ``health`` and per-hour error hashes ``errors``. On one
partition a destination's latest minute with outcomes is carried in its hash ``dest``
(``lua/health.lua``'s ``carry``: fields ``cm``, the minute, and its counts, each named as
in a minute's hash with a ``c`` before) until outcomes of a later minute move it to its
minute's hash: the minute hashes read here come with it added (:func:`with_carried`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outbox.store.destination_state import LATENCY_BUCKETS
from outbox.store.repository import MessageRepository

Hash = dict[str, str]

#: A minute's counts (the fields of its hash): attempts by outcome, latency buckets.
MINUTE_COUNTS = ("s", "r", "p", *(f"b{i}" for i in range(LATENCY_BUCKETS + 1)))
#: The fields of the carried minute in a destination's hash (``lua/health.lua``'s ``carry``).
CARRIED_FIELDS = ("cm", *(f"c{f}" for f in MINUTE_COUNTS))


def _text(raw: dict[bytes, bytes]) -> Hash:
    return {k.decode(): v.decode() for k, v in raw.items()}


def with_carried(dest: Hash, minutes: Sequence[int], hashes: list[Hash]) -> list[Hash]:
    """The hashes of ``minutes`` (in order), with the carried minute of the destination's
    hash ``dest`` added to its minute's (the counts of the two never overlap: an
    outcome is counted in one of them)."""
    carried = dest.get("cm")
    if not carried or int(carried) not in minutes:
        return hashes
    i = list(minutes).index(int(carried))
    merged = dict(hashes[i])
    for f in MINUTE_COUNTS:
        n = int(dest.get(f"c{f}") or 0)
        if n:
            merged[f] = str(int(merged.get(f) or 0) + n)
    return [*hashes[:i], merged, *hashes[i + 1 :]]


def destination_rows(
    repo: MessageRepository, names: Sequence[str], minutes: Sequence[int]
) -> list[tuple[Hash, int, list[Hash]]]:
    """Per destination of ``names``, in order: (its hash, the size of its parked set, its
    hash of each minute of ``minutes`` (minute numbers, epoch seconds // 60), in order,
    its carried minute added: :func:`with_carried`).

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    pipe = repo.connection.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(repo.keys.dest(name))
        for m in minutes:
            pipe.hgetall(repo.keys.health(name, m))
        for key in repo.keys.every("parked", name):
            pipe.zcard(key)
    replies: list[Any] = pipe.execute()
    step = 1 + len(minutes) + repo.keys.partitions
    rows = []
    for i in range(len(names)):
        row = replies[i * step : (i + 1) * step]
        dest, per_minute = _text(row[0]), [_text(h) for h in row[1 : 1 + len(minutes)]]
        rows.append(
            (dest, sum(int(c) for c in row[1 + len(minutes) :]), with_carried(dest, minutes, per_minute))
        )
    return rows


def minute_rows(
    repo: MessageRepository, names: Sequence[str], minutes: Sequence[int]
) -> list[tuple[list[Hash], list[int]]]:
    """Per destination of ``names``, in order: (its hash of each minute of ``minutes``,
    its carried minute added (:func:`with_carried`), the number of its parked messages that became due in each minute: the first minute
    counts everything before it, the last everything after).

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    pipe = repo.connection.pipeline(transaction=False)
    for n in names:
        pipe.hmget(repo.keys.dest(n), CARRIED_FIELDS)
        for m in minutes:
            pipe.hgetall(repo.keys.health(n, m))
        for j, m in enumerate(minutes):
            low = "-inf" if j == 0 else m * 60
            high = "+inf" if j == len(minutes) - 1 else f"({(m + 1) * 60}"
            for key in repo.keys.every("parked", n):
                pipe.zcount(key, low, high)
    replies: list[Any] = pipe.execute()
    parts = repo.keys.partitions
    step = 1 + len(minutes) * (1 + parts)
    out = []
    for i in range(len(names)):
        row = replies[i * step : (i + 1) * step]
        carried = {f: v.decode() for f, v in zip(CARRIED_FIELDS, row[0], strict=True) if v is not None}
        counts = row[1 + len(minutes) :]
        out.append(
            (
                with_carried(carried, minutes, [_text(h) for h in row[1 : 1 + len(minutes)]]),
                [sum(int(c) for c in counts[j * parts : (j + 1) * parts]) for j in range(len(minutes))],
            )
        )
    return out


def error_hashes(repo: MessageRepository, name: str, hours: Sequence[int]) -> list[Hash]:
    """The error hash of destination ``name`` for each hour of ``hours`` (hour numbers,
    epoch seconds // 3600), in order.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    pipe = repo.connection.pipeline(transaction=False)
    for h in hours:
        pipe.hgetall(repo.keys.errors(name, h))
    return [_text(raw) for raw in pipe.execute()]
