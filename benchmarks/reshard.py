"""What ``send()`` sees while a partition's hash slot moves between primaries (issue 22,
"Resharding" in docs/operations.md).

    .venv/bin/python -m benchmarks.reshard                       # legacy migration, bundled Valkey 8.1
    .venv/bin/python -m benchmarks.reshard --atomic BINARY       # CLUSTER MIGRATESLOTS, a Valkey 9 server

A private 3-primary cluster (``outbox.testing.ClusterServer``; RQ's queues on a private
plain Redis), P = 16. ``--existing`` messages are sent to partition 5 (each with an
idempotency key that hashes there), then one thread keeps sending more to partition 5
while its slot moves to another primary: the legacy way (``CLUSTER SETSLOT
IMPORTING/MIGRATING``, ``MIGRATE`` ``--batch`` keys at a time, ``CLUSTER SETSLOT NODE``,
as ``valkey-cli --cluster reshard`` does) or, with ``--atomic``, Valkey 9's ``CLUSTER
MIGRATESLOTS``. Prints how long the move took, the sends that succeeded and failed
(with their errors), the slowest send, and the messages counted after: every
acknowledged send must be there.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

PARTITIONS = 16
PARTITION = 5


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atomic", metavar="BINARY", help="a Valkey 9+ valkey-server: CLUSTER MIGRATESLOTS")
    parser.add_argument(
        "--existing", type=int, default=3000, help="messages in the partition before it moves"
    )
    parser.add_argument("--batch", type=int, default=10, help="keys per MIGRATE (legacy)")
    args = parser.parse_args(argv)

    from redis.crc import key_slot

    from benchmarks import compare
    from outbox.testing.cluster_server import ClusterServer

    server = compare.private_redis()
    cluster = ClusterServer(primaries=3, binary=args.atomic).start()
    os.environ["BENCH_CLUSTER_NODES"] = ",".join(cluster.urls)
    os.environ["BENCH_PARTITIONS"] = str(PARTITIONS)
    try:
        compare.setup_django()
        import outbox
        from outbox.store import get_repository
        from outbox.store.keys import partition_for

        keys = (f"k{i}" for i in range(10**7) if partition_for("noop", f"k{i}", PARTITIONS) == PARTITION)
        for _ in range(args.existing):
            key = next(keys)
            outbox.send("noop", {"k": key}, idempotency_key=key)
        slot = key_slot(f"{{p{PARTITION}}}".encode())
        source = cluster.slot_owner(slot)
        target = next(n for n in cluster.nodes if n != source)
        version = cluster.node_client(source).info("server")
        sent, errors, slowest = [0], [], [0.0]
        stop = threading.Event()

        def sender() -> None:
            while not stop.is_set():
                key = next(keys)
                t = time.perf_counter()
                try:
                    outbox.send("noop", {"k": key}, idempotency_key=key)
                    sent[0] += 1
                except outbox.OutboxUnavailable as exc:
                    cause = exc.__cause__ or exc
                    errors.append(f"OutboxUnavailable ({type(cause).__name__}: {cause})")
                slowest[0] = max(slowest[0], time.perf_counter() - t)

        thread = threading.Thread(target=sender)
        thread.start()
        time.sleep(0.3)
        t0 = time.perf_counter()
        if args.atomic:
            cluster.node_client(source).execute_command(
                "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", cluster.node_id(target)
            )
            while cluster.slot_owner(slot) != target and time.perf_counter() - t0 < 60:
                time.sleep(0.01)
        else:
            cluster.move_slots([slot], target, batch=args.batch)
        moved = time.perf_counter() - t0
        time.sleep(0.3)
        stop.set()
        thread.join()
        counted = sum(get_repository().counts().values())
        print(
            f"server {version.get('valkey_version') or version['redis_version']}; "
            f"{'CLUSTER MIGRATESLOTS' if args.atomic else f'legacy migration, {args.batch} keys per MIGRATE'}: "
            f"slot {slot} (partition {PARTITION}, {args.existing:,} messages before) moved in {moved:.2f} s"
        )
        print(
            f"sends during and around the move: {sent[0]} acknowledged, {len(errors)} refused; slowest {slowest[0]:.3f} s"
        )
        for error in sorted(set(errors)):
            print(f"  {errors.count(error)} x {error}")
        print(f"messages counted after: {counted:,} (expected {args.existing + sent[0]:,})")
        if counted != args.existing + sent[0]:
            raise SystemExit("an acknowledged send is missing")
    finally:
        cluster.stop()
        server.stop()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1:])
