"""benchmarks.partition_spread, whose table docs/operations.md ("Choosing P") prints: its
model of an even slot split is the split a real cluster is made with, and it counts the
outbox's own partition tags."""

from __future__ import annotations

from redis.crc import key_slot

from benchmarks.partition_spread import even_split, partitions_per_primary
from outbox.store.keys import Keys


def test_the_even_split_is_the_one_of_cluster_create(redis_cluster):
    """The session's cluster is formed by ``valkey-cli --cluster create`` (3 primaries)."""
    ranges = even_split(3)
    assert [(r.start, r.stop - 1) for r in ranges] == [(0, 5460), (5461, 10922), (10923, 16383)]
    for r in ranges:  # each range is served by one primary
        assert len({redis_cluster.slot_owner(slot) for slot in (r.start, r.start + 1, r.stop - 1)}) == 1
    assert len({redis_cluster.slot_owner(r.start) for r in ranges}) == 3


def test_it_counts_the_tags_the_outbox_writes():
    keys = Keys("outbox", partitions=16)
    tags = [keys.tag_prefix(k).split(":", 1)[1] for k in range(16)]
    assert tags == [f"{{p{k}}}" for k in range(16)]
    counts = partitions_per_primary(16, 3)
    assert sum(counts) == 16
    ranges = even_split(3)
    assert counts == [sum(key_slot(tag.encode()) in r for tag in tags) for r in ranges]
    assert max(counts) == 7  # the 1.3x the mean (16 / 3) on the busiest primary


def test_one_primary_holds_every_partition():
    assert partitions_per_primary(64, 1) == [64]
    assert [len(r) for r in even_split(6)] == [2731, 2730, 2731, 2731, 2730, 2731]
