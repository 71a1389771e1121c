"""What a worker sends to Redis per delivered message, by command and by Lua script, on
one server or a private cluster, at a given partition count (issue 22: where the time
goes on a cluster; docs/benchmarks.md, "On a cluster").

    .venv/bin/python -m benchmarks.worker_commands [--primaries 3] [--partitions 16] [--n 2000] [--profile]
    .venv/bin/python -m benchmarks.worker_commands --primaries 0 --partitions 1 --n 10000 --per-key 10 --server-time

``--primaries 0`` is one private server. N no-op messages (``benchmarks.compare_settings``,
out of the box) are sent with ``send_many(100)``, then one burst worker run
(``outbox.delivery.worker.run_worker``) in this process delivers them while every
command redis-py sends is counted (``EVALSHA`` by script name) with the round trip it
went in. Prints messages/s (one run: read it against the load), the commands per
delivered message, and the round trips per delivered message by what they carried;
``--profile`` adds the 30 functions of most own time (cProfile).

``--per-key K`` sends ordered traffic instead (issue 23, docs/benchmarks.md, "Ordered
delivery"): N / K ordering keys of K messages each, interleaved
(``benchmarks.compare.ordered_items``). ``--server-time`` (one server only) adds the
server's own time per delivered message by script, and by the commands each script ran
inside it (``INFO commandstats`` read before and after each script call; a pipeline's
commands are then sent one at a time, so the rate printed is not the worker's).
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
    parser.add_argument("--per-key", type=int, default=0, help="ordered traffic: messages per ordering key")
    parser.add_argument(
        "--server-time", action="store_true", help="server µs per message by script (one server)"
    )
    args = parser.parse_args(argv)
    if args.server_time and args.primaries:
        parser.error("--server-time needs one server (--primaries 0)")

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
            from outbox.delivery.worker import WorkerOptions, run_worker
            from outbox.store import get_repository

            body = compare.body_200()
            if args.per_key:
                keys = args.n // args.per_key
                items = compare.ordered_items("noop", keys, args.per_key, True, body)
            else:
                items = [{"destination": "noop", "body": body}] * args.n
            for i in range(0, len(items), 100):
                outbox.send_many(items[i : i + 100])
            commands, trips = count_by_name()
            timed = time_scripts(server.url) if args.server_time else None
            profile = cProfile.Profile() if args.profile else None
            t0 = time.perf_counter()
            if profile:
                profile.enable()
            run_worker(compare.OUTBOX_QUEUES, WorkerOptions(burst=True, logging_level="WARNING", relay=False))
            if profile:
                profile.disable()
            elapsed = time.perf_counter() - t0
            counts = get_repository().counts()
            where = f"{args.primaries}-primary cluster" if args.primaries else "one server"
            traffic = (
                f"ordered, {args.n // args.per_key:,} keys x {args.per_key}" if args.per_key else "unordered"
            )
            print(f"{where}, P = {args.partitions}, {traffic}: {args.n / elapsed:,.0f} msg/s; {counts}")
            per = args.n
            print(f"commands per delivered message: {sum(commands.values()) / per:.2f}")
            for name, count in commands.most_common(12):
                print(f"  {count / per:6.3f}  {name}")
            print(f"round trips per delivered message: {sum(trips.values()) / per:.3f}")
            for name, count in trips.most_common(8):
                print(f"  {count / per:6.3f}  {name}")
            if timed is not None:
                calls, usec, inner = timed
                print(f"server µs per delivered message in scripts: {sum(usec.values()) / per:.1f}")
                for name, us in usec.most_common():
                    print(
                        f"  {us / per:6.1f} µs  {name} ({calls[name]} calls, {us / calls[name]:,.0f} µs each)"
                    )
                    for cmd, (n_calls, cmd_us) in sorted(inner[name].items(), key=lambda kv: -kv[1][1])[:8]:
                        print(f"         {cmd_us / per:6.2f} µs  {n_calls / per:5.2f} x {cmd}")
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
        if str(args[0]).upper() != "INFO":  # --server-time's reads, not the worker's
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


def time_scripts(url: str) -> tuple[Counter[str], Counter[str], dict[str, dict[str, list[int]]]]:
    """From now on, send each command of a pipeline in a round trip of its own and read
    ``INFO commandstats`` (on a connection of its own) before and after each script call.
    Returns, filled as the run goes: calls and server µs by script name, and per script
    the commands it ran inside (name -> [calls, µs]; a script's EVALSHA counts its whole
    run, each command inside it counts again under its own name)."""
    from redis import Redis
    from redis.client import Pipeline

    from outbox.store.scripts import names, sha

    by_sha = {sha(name): name for name in names()}
    probe = Redis.from_url(url)
    calls: Counter[str] = Counter()
    usec: Counter[str] = Counter()
    inner: dict[str, dict[str, list[int]]] = {}
    lock = threading.Lock()
    execute = Pipeline._execute_pipeline

    def stats() -> dict[str, tuple[int, int]]:
        return {k: (int(v["calls"]), int(v["usec"])) for k, v in probe.info("commandstats").items()}

    def one_at_a_time(self, connection, commands, raise_on_error):
        responses = []
        for command in commands:
            args = command[0]
            if str(args[0]).upper() != "EVALSHA":
                responses.extend(execute(self, connection, [command], raise_on_error))
                continue
            name = by_sha.get(str(args[1]), "?")
            with lock:  # the server's figures of this call alone
                before = stats()
                responses.extend(execute(self, connection, [command], raise_on_error))
                after = stats()
            calls[name] += 1
            usec[name] += after["cmdstat_evalsha"][1] - before["cmdstat_evalsha"][1]
            mine = inner.setdefault(name, {})
            for cmd, (n, us) in after.items():
                n0, us0 = before.get(cmd, (0, 0))
                if cmd not in ("cmdstat_evalsha", "cmdstat_info") and n > n0:
                    got = mine.setdefault(cmd.removeprefix("cmdstat_"), [0, 0])
                    got[0] += n - n0
                    got[1] += us - us0
        return responses

    Pipeline._execute_pipeline = one_at_a_time
    return calls, usec, inner


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1:])
