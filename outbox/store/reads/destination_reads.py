"""Reads of destination health from Redis, for :mod:`outbox.destinations.health` (which
turns them into its read model). Each function is one pipelined round trip; replies are
decoded to text.

Keys (:class:`~outbox.store.keys.Keys`): the destination's hash ``dest``, its parked set
``parked``, its per-minute hashes ``health`` and per-hour error hashes ``errors``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outbox.store.repository import MessageRepository

Hash = dict[str, str]


def _text(raw: dict[bytes, bytes]) -> Hash:
    return {k.decode(): v.decode() for k, v in raw.items()}


def destination_rows(
    repo: MessageRepository, names: Sequence[str], minutes: Sequence[int]
) -> list[tuple[Hash, int, list[Hash]]]:
    """Per destination of ``names``, in order: (its hash, the size of its parked set, its
    hash of each minute of ``minutes`` (minute numbers, epoch seconds // 60), in order).

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
        per_minute = row[1 : 1 + len(minutes)]
        rows.append(
            (_text(row[0]), sum(int(c) for c in row[1 + len(minutes) :]), [_text(h) for h in per_minute])
        )
    return rows


def minute_rows(
    repo: MessageRepository, names: Sequence[str], minutes: Sequence[int]
) -> list[tuple[list[Hash], list[int]]]:
    """Per destination of ``names``, in order: (its hash of each minute of ``minutes``,
    the number of its parked messages that became due in each minute: the first minute
    counts everything before it, the last everything after).

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    pipe = repo.connection.pipeline(transaction=False)
    for n in names:
        for m in minutes:
            pipe.hgetall(repo.keys.health(n, m))
        for j, m in enumerate(minutes):
            low = "-inf" if j == 0 else m * 60
            high = "+inf" if j == len(minutes) - 1 else f"({(m + 1) * 60}"
            for key in repo.keys.every("parked", n):
                pipe.zcount(key, low, high)
    replies: list[Any] = pipe.execute()
    parts = repo.keys.partitions
    step = len(minutes) * (1 + parts)
    out = []
    for i in range(len(names)):
        row = replies[i * step : (i + 1) * step]
        counts = row[len(minutes) :]
        out.append(
            (
                [_text(h) for h in row[: len(minutes)]],
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
