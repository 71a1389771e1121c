"""How evenly the outbox's partitions spread over a cluster's primaries (issue 22,
"choosing P" in docs/operations.md).

    .venv/bin/python -m benchmarks.partition_spread [--partitions 16 32 64 128 256] [--primaries 3 4 6]

Each partition ``k`` is the hash tag ``{p<k>}`` of its keys (``outbox.store.keys``,
``Keys.tag_prefix``), so it lives in the hash slot ``key_slot(b"{p<k>}")`` (redis-py's
CRC16, :func:`redis.crc.key_slot`: the tag alone decides the slot). The slots are split
over the primaries as ``valkey-cli``/``redis-cli --cluster create`` splits them: equal
ranges of 16384 / N slots (``clusterManagerCommandCreate``). For each P and N the table
gives the partitions on the busiest and on the idlest primary, the mean P / N, and
busiest / mean: the busiest primary's share of the work against a perfect split, since a
partition's messages are about equally many (the partition is a hash of the
destination and key). Pure computation: no server is needed.
"""

from __future__ import annotations

import argparse
import sys

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot


def even_split(primaries: int) -> list[range]:
    """The slot ranges of ``primaries`` primaries as ``--cluster create`` assigns them:
    ``16384 / N`` slots each, rounded, the last one ending at slot 16383."""
    per_node = REDIS_CLUSTER_HASH_SLOTS / primaries
    ranges, first, cursor = [], 0, 0.0
    for i in range(primaries):
        last = round(cursor + per_node - 1)
        if last > REDIS_CLUSTER_HASH_SLOTS - 1 or i == primaries - 1:
            last = REDIS_CLUSTER_HASH_SLOTS - 1
        ranges.append(range(first, last + 1))
        first, cursor = last + 1, cursor + per_node
    return ranges


def partitions_per_primary(partitions: int, primaries: int) -> list[int]:
    """How many of the tags ``{p0}``..``{p<P-1>}`` each primary's slots hold."""
    ranges = even_split(primaries)
    counts = [0] * primaries
    for k in range(partitions):
        slot = key_slot(f"{{p{k}}}".encode())
        counts[next(i for i, r in enumerate(ranges) if slot in r)] += 1
    return counts


def table(partition_counts: list[int], primary_counts: list[int]) -> str:
    """A Markdown table: one row per P, per N the busiest/idlest partitions per primary
    and busiest / mean."""
    head = "| P | " + " | ".join(
        f"{n} primaries: busiest / idlest (mean), busiest ÷ mean" for n in primary_counts
    )
    lines = [head + " |", "|---|" + "---|" * len(primary_counts)]
    for p in partition_counts:
        cells = []
        for n in primary_counts:
            counts = partitions_per_primary(p, n)
            mean = p / n
            cells.append(f"{max(counts)} / {min(counts)} ({mean:.1f}), **{max(counts) / mean:.2f}×**")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--primaries", type=int, nargs="+", default=[3, 4, 6])
    args = parser.parse_args(argv)
    print(table(args.partitions, args.primaries))


if __name__ == "__main__":
    main(sys.argv[1:])
