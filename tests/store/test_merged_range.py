"""lua/lib/merge.lua's k-way merge (a heap of the sorted sets' heads, each set read one
entry first: issue 34, item 6) gives exactly what one sorted set holding every entry
would: pages by rank, descending or not, within score bounds, and walks from a cursor
across ties."""

from __future__ import annotations

import random

import pytest

from outbox.store.indexes import Index, IndexRange


@pytest.mark.parametrize("descending", [False, True])
def test_merged_pages_equal_one_sorted_set(repo, descending):
    rng = random.Random(34)
    conn = repo.connection
    keys = [f"{repo.keys.prefix}:{{mergetest}}:z:{i}" for i in range(40)]
    union = f"{repo.keys.prefix}:{{mergetest}}:union"
    for i, key in enumerate(keys):
        # few distinct scores: many ties, ordered by member
        entries = {f"m{i:02d}-{j:03d}": float(rng.randint(0, 30)) for j in range(rng.randint(0, 25))}
        if entries:
            conn.zadd(key, entries)
            conn.zadd(union, entries)
    index = Index(tuple(keys))
    read = conn.zrevrangebyscore if descending else conn.zrangebyscore
    for lo, hi in ((None, None), (5.0, 20.0)):
        args = (
            ("+inf" if hi is None else hi, "-inf" if lo is None else lo)
            if descending
            else (
                "-inf" if lo is None else lo,
                "+inf" if hi is None else hi,
            )
        )
        expected = [m.decode() for m in read(union, *args)]
        for offset, count in ((0, 1), (0, 50), (37, 25), (len(expected) - 3, 10)):
            span = IndexRange(lo, hi, descending)
            ids, _, _ = repo.merged_range(index, span, offset=offset, count=count)
            assert ids == expected[offset : offset + count], (lo, hi, offset, count)
        walked, cursor = [], None
        while True:  # a walk in chunks of 7 from each chunk's cursor, through the ties
            ids, examined, cursor = repo.merged_range(
                index, IndexRange(lo, hi, descending), offset=0, count=7, after=cursor
            )
            walked += ids
            if examined < 7:
                break
        assert walked == expected
