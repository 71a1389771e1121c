"""What a worker sends to Redis per delivered message, by command and by Lua script, on
one server or a private cluster, at a given partition count (issue 22: where the time
goes on a cluster; docs/benchmarks.md, "On a cluster").

    .venv/bin/python -m benchmarks.worker_commands [--primaries 3] [--partitions 16] [--n 2000] [--profile]

``--primaries 0`` is one private server. N no-op messages (``benchmarks.compare_settings``,
out of the box) are sent with ``send_many(100)``, then one burst worker run
(``outbox.delivery.worker.run_worker``) in this process delivers them while every
command redis-py sends is counted (``EVALSHA`` by script name) with the round trip it
went in. Prints messages/s (one run: read it against the load), the commands per
delivered message, and the round trips per delivered message by what they carried;
``--profile`` adds the 30 functions of most own time (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
from collections import Counter


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--primaries", type=int, default=3, help="cluster primaries (0: one server)")
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--n", type=int, default=2000, help="messages (a multiple of 100)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)

    from benchmarks import compare
    from outbox.testing.cluster_server import ClusterServer

    server = compare.private_redis()
    cluster = ClusterServer(primaries=args.primaries).start() if args.primaries else None
    if cluster is not None:
        os.environ["BENCH_CLUSTER_NODES"] = ",".join(cluster.urls)
    os.environ["BENCH_PARTITIONS"] = str(args.partitions)
    compare.use_profile("defaults")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["BENCH_EXPECT"], os.environ["BENCH_OUT"] = str(args.n), os.path.join(tmp, "done.json")
        try:
            compare.setup_django()
            import outbox
            from outbox.delivery.worker import run_worker
            from outbox.store.connection import get_repository

            body = compare.body_200()
            for _ in range(args.n // 100):
                outbox.send_many([{"destination": "noop", "body": body}] * 100)
            commands, trips = count_by_name()
            profile = cProfile.Profile() if args.profile else None
            t0 = time.perf_counter()
            if profile:
                profile.enable()
            run_worker(compare.OUTBOX_QUEUES, burst=True, logging_level="WARNING", relay=False)
            if profile:
                profile.disable()
            elapsed = time.perf_counter() - t0
            counts = get_repository().counts()
            where = f"{args.primaries}-primary cluster" if args.primaries else "one server"
            print(f"{where}, P = {args.partitions}: {args.n / elapsed:,.0f} msg/s; {counts}")
            per = args.n
            print(f"commands per delivered message: {sum(commands.values()) / per:.2f}")
            for name, count in commands.most_common(12):
                print(f"  {count / per:6.3f}  {name}")
            print(f"round trips per delivered message: {sum(trips.values()) / per:.3f}")
            for name, count in trips.most_common(8):
                print(f"  {count / per:6.3f}  {name}")
            if profile:
                pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        finally:
            if cluster is not None:
                cluster.stop()
            server.stop()


def count_by_name() -> tuple[Counter[str], Counter[str]]:
    """Count, from now on, the commands this process sends (``EVALSHA:<script>`` for the
    outbox's scripts) and the round trips (what each carried)."""
    from redis.connection import AbstractConnection

    from outbox.store.scripts import names, sha

    by_sha = {sha(name): name for name in names()}
    commands: Counter[str] = Counter()
    trips: Counter[str] = Counter()
    lock = threading.Lock()
    send_command, pack_commands = AbstractConnection.send_command, AbstractConnection.pack_commands

    def label(args) -> str:
        name = str(args[0])
        return f"EVALSHA:{by_sha.get(str(args[1]), '?')}" if name == "EVALSHA" else name

    def counted_send_command(self, *args, **kwargs):
        with lock:
            commands[label(args)] += 1
            trips[label(args)] += 1
        return send_command(self, *args, **kwargs)

    def counted_pack_commands(self, packed):
        packed = list(packed)
        with lock:
            for args in packed:
                commands[label(args)] += 1
            trips["pipeline of " + "+".join(sorted({label(args) for args in packed}))] += 1
        return pack_commands(self, packed)

    AbstractConnection.send_command = counted_send_command
    AbstractConnection.pack_commands = counted_pack_commands
    return commands, trips


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1:])
