"""The fault scenarios (issue 11). Each is a function ``f(name, **params) -> Result``.

Every scenario sends a known set of messages through the public API against real parts
(a private Redis, ``manage.py outbox_worker`` subprocesses under a supervisor, the
receiver process), breaks something on purpose, waits until every message settled (or a
time limit passed), and counts: see :class:`tests.faults.harness.Result`. ``SHORT`` and
``FULL`` parameters are in :data:`SCENARIOS`; the CLI (``scripts/faults``) runs the full
ones by default, the pytest tests (``tests/faults/test_short_scenarios.py``) the short ones.

Scenarios take their sizes, durations and timeouts as parameters and only use the
public surface, so a new delivery core (batch claims, transactional capture) needs no
change here.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .harness import (
    ROOT,
    Result,
    Run,
    counts,
    environment,
    kill_group,
    paced,
    postgres_unavailable,
    spawn,
    statuses,
    tally,
    wait_settled,
    wait_until,
    worker_notes,
)

HOOK_MAX_DELAY = 4.0  # seconds: the hook destination's longest retry delay (tests/faults/settings.py)


@dataclass
class Scenario:
    name: str
    function: Callable[..., Result]
    short: dict[str, Any]
    full: dict[str, Any] = field(default_factory=dict)
    about: str = ""


SCENARIOS: dict[str, Scenario] = {}


def register(
    name: str,
    function: Callable[..., Result],
    short: dict[str, Any],
    full: dict[str, Any] | None = None,
    about: str = "",
) -> None:
    about = about or (function.__doc__ or "").strip().splitlines()[0]
    SCENARIOS[name] = Scenario(name, function, short, full or {}, about)


def send_errors(errors: Counter, exc: BaseException, where: str = "send()") -> None:
    errors[f"{where}: {type(exc).__module__.split('.')[0]}.{type(exc).__name__}"] += 1


def wait_workers(run: Run, count: int, timeout: float = 30.0) -> None:
    """Wait until ``count`` RQ workers are registered in the scenario's Redis.

    Raises:
        RuntimeError: they did not register within ``timeout`` seconds.
    """
    from redis import Redis
    from rq import Worker

    connection = Redis.from_url(run.redis.url)
    try:
        if not wait_until(lambda: len(Worker.all(connection=connection)) >= count, timeout, 0.1):
            raise RuntimeError(
                f"{count} workers did not register within {timeout:g} s; see {run.log_dir}/worker-*.log"
            )
    finally:
        connection.close()


def settle(
    run: Run, result: Result, acked: list[str], first_send: float, timeout: float, **kwargs: Any
) -> dict[str, str]:
    settled_at = wait_settled(len(set(acked)), timeout)
    if settled_at is None:
        result.notes.append(f"not settled within {timeout:g} s")
    return tally(run, result, acked, first_send=first_send, settled_at=settled_at, **kwargs)


def faults_settings(visibility_timeout: float, recovery_interval: float, **more: Any) -> dict[str, Any]:
    return {
        "VISIBILITY_TIMEOUT": int(visibility_timeout),
        "RECOVERY_INTERVAL": recovery_interval,
        "LATE_AFTER": recovery_interval,
        **more,
    }


# -- 1. workers SIGKILLed ----------------------------------------------------------------


def killer(
    run: Run,
    supervisor: Any,
    rng: random.Random,
    kill_for: float,
    kill_every: tuple[float, float],
    stop: threading.Event,
) -> threading.Thread:
    """A thread (not started) that SIGKILLs one of ``supervisor``'s workers every
    ``kill_every`` (min, max) seconds, at random, for ``kill_for`` seconds or until
    ``stop`` is set, each kill a fault of ``run``."""

    def kill() -> None:
        end = time.monotonic() + kill_for
        while True:
            wait = rng.uniform(*kill_every)
            if time.monotonic() + wait > end or stop.wait(wait):
                break
            supervisor.kill_one(rng)
            run.fault_ended()

    return threading.Thread(target=kill, name="killer", daemon=True)


def worker_kill(
    name: str,
    *,
    messages: int = 3000,
    rate: float = 150,
    workers: int = 3,
    kill_for: float = 60,
    kill_every: tuple[float, float] = (2, 5),
    restart_after: float = 1,
    fail_rate: float = 0.2,
    visibility_timeout: float = 10,
    recovery_interval: float = 2,
    settle_timeout: float = 180,
    seed: int = 1,
) -> Result:
    """Workers SIGKILLed with their process groups at random moments while messages flow.

    ``messages`` at ``rate``/s to the receiver (failing ``fail_rate`` of requests), ``workers``
    workers under the supervisor; for ``kill_for`` seconds one is SIGKILLed (whole process
    group) every ``kill_every`` seconds and restarted ``restart_after`` s later. Expected:
    nothing lost, and everything settled within VISIBILITY_TIMEOUT + 2 recovery intervals
    (+ one retry delay) of the last kill; the receiver stops failing once the kills end,
    so the bound measures recovery from the kills, not a message's streak of 500s.
    """
    import outbox

    result = Result(name)
    rng = random.Random(seed)
    with environment(name, settings=faults_settings(visibility_timeout, recovery_interval)) as run:
        assert run.receiver is not None
        run.receiver.set_mode(fail_rate=fail_rate)
        supervisor = run.workers(workers, restart_delay=restart_after)
        wait_workers(run, workers)
        stop = threading.Event()
        acked: list[str] = []
        errors: Counter = Counter()
        first_send = time.monotonic()
        thread = killer(run, supervisor, rng, kill_for, kill_every, stop)
        thread.start()
        try:
            for i in paced(messages, rate):
                try:
                    acked.append(outbox.send("hook", {"n": i}).id)
                except Exception as exc:
                    send_errors(errors, exc)
            thread.join(kill_for + 30)
        finally:
            stop.set()
        # The bound below measures recovery from the kills: from the last kill on, the
        # receiver stops failing, so a message's own streak of simulated 500s (each adding
        # a backoff delay) is not counted against the workers' recovery.
        run.receiver.set_mode(fail_rate=0.0)
        settle(run, result, acked, first_send, settle_timeout)
        bound = visibility_timeout + 2 * recovery_interval + HOOK_MAX_DELAY
        result.check(
            "settled within VISIBILITY_TIMEOUT + 2 sweeps (+ one retry delay) of the last kill",
            result.recover_s is not None and result.recover_s <= bound,
            f"{result.recover_s} s after the last kill; bound {bound:g} s",
        )
        if errors:
            result.notes.append(f"send() exceptions: {dict(errors)}")
        worker_notes(result, supervisor)
    return result


register(
    "worker-kill",
    worker_kill,
    short={
        "messages": 150,
        "rate": 50,
        "workers": 2,
        "kill_for": 4,
        "kill_every": (1.0, 2.0),
        "visibility_timeout": 3,
        "recovery_interval": 1,
        "settle_timeout": 15,
    },
)


# -- 2. Redis restarted ------------------------------------------------------------------


def redis_restart(
    name: str,
    *,
    sig: str = "SIGTERM",
    rate: float = 100,
    duration: float = 24,
    outage_at: float = 6,
    down_for: float = 6,
    workers: int = 2,
    visibility_timeout: float = 10,
    recovery_interval: float = 2,
    settle_timeout: float = 120,
) -> Result:
    """Redis (appendonly yes, appendfsync everysec) stopped with ``sig`` mid-load and started again.

    Sends for ``duration`` s at ``rate``/s, every other message inside ``transaction.atomic``
    with a ``User`` row; at ``outage_at`` s Redis is stopped with SIGTERM or SIGKILL and
    started again ``down_for`` s later on the same port and directory. Workers are *not*
    restarted by the harness: they must reconnect by themselves. A message sent in a
    transaction counts as acknowledged when its row committed. Expected: nothing
    acknowledged lost (a SIGKILL may cost the last second of writes with everysec), and
    every worker still running.
    """
    import outbox

    result = Result(name)
    signum = getattr(signal, sig)
    with environment(
        name,
        settings=faults_settings(visibility_timeout, recovery_interval),
        redis_options={"appendonly": True, "appendfsync": "everysec"},
        database=True,
    ) as run:
        from django.contrib.auth.models import User  # Django is set up now
        from django.db import transaction

        supervisor = run.workers(workers, restart=False)
        wait_workers(run, workers)
        acked: list[str] = []
        in_transaction: list[str] = []
        errors: Counter = Counter()
        outage: dict[str, float] = {}

        def break_redis() -> None:
            time.sleep(outage_at)
            outage["down"] = time.monotonic()
            run.redis.halt(signum)
            time.sleep(down_for)
            run.redis.start()
            outage["up"] = time.monotonic()
            run.fault_ended()

        thread = threading.Thread(target=break_redis, name="outage", daemon=True)
        first_send = time.monotonic()
        thread.start()
        for i in paced(int(rate * duration), rate):
            if i % 2:
                try:
                    acked.append(outbox.send("hook", {"n": i}).id)
                except Exception as exc:
                    send_errors(errors, exc)
                continue
            username = f"user-{i}"
            message = None
            try:
                with transaction.atomic():
                    User.objects.create(username=username)
                    message = outbox.send("hook", {"n": i, "user": username})
            except Exception as exc:
                send_errors(errors, exc, "transaction.atomic + send()")
            if message is not None and User.objects.filter(username=username).exists():
                acked.append(message.id)
                in_transaction.append(message.id)
        thread.join(outage_at + down_for + 30)
        found = settle(run, result, acked, first_send, settle_timeout)
        lost_in_tx = sum(1 for i in in_transaction if found[i] not in ("succeeded", "failed", "cancelled"))
        result.check(
            "no message sent inside a committed transaction lost",
            lost_in_tx == 0,
            f"{lost_in_tx} of {len(in_transaction)} lost",
        )
        alive = len(supervisor.alive())
        result.check(
            "workers reconnected by themselves (none exited)",
            alive == workers and not supervisor.crashes(),
            f"{alive} of {workers} running",
        )
        result.notes.append(f"Redis down {outage.get('up', 0) - outage.get('down', 0):.1f} s ({sig})")
        result.notes.append(f"exceptions: {dict(errors) or 'none'}")
        worker_notes(result, supervisor)
    return result


_redis_short = {
    "rate": 50,
    "duration": 5,
    "outage_at": 1.5,
    "down_for": 2,
    "visibility_timeout": 3,
    "recovery_interval": 1,
    "settle_timeout": 15,
}
register(
    "redis-restart-term",
    redis_restart,
    short={**_redis_short, "sig": "SIGTERM"},
    full={"sig": "SIGTERM"},
    about="Redis (AOF, everysec) stopped with SIGTERM mid-load for ~6 s; sends in transactions; workers must reconnect.",
)
register(
    "redis-restart-kill",
    redis_restart,
    short={**_redis_short, "sig": "SIGKILL"},
    full={"sig": "SIGKILL"},
    about="The same with SIGKILL (a crash: the last second of AOF writes may go).",
)


# -- 3. the receiver fails ---------------------------------------------------------------


def receiver_fault(
    name: str,
    *,
    mode: str = "down",
    messages: int = 600,
    rate: float = 40,
    workers: int = 2,
    fault_at: float = 2,
    fault_for: float = 30,
    hook_timeout: float = 2,
    drip: float = 0.1,
    visibility_timeout: float = 10,
    recovery_interval: float = 2,
    settle_timeout: float = 180,
) -> Result:
    """The receiver down (connections refused), slower than the deadline, or dripping bytes.

    From ``fault_at`` s for ``fault_for`` s the receiver is ``down``, or ``slow`` (answers
    after ``hook_timeout`` + 1 s), or ``drip`` (answers 200 one byte per ``drip`` s, about
    13 s in all, each byte well within the per-read timeout). Expected: nothing lost, none
    failed (the retry budget outlasts the fault), and for slow/drip every attempt ends
    within the transport's deadline (its ``longest_attempt``: connect + 2 × timeout).
    """
    import outbox

    result = Result(name)
    settings = faults_settings(
        visibility_timeout, recovery_interval, HOOK_TIMEOUT=hook_timeout, HOOK_RETRIES=40
    )
    with environment(name, settings=settings) as run:
        assert run.receiver is not None
        receiver = run.receiver
        supervisor = run.workers(workers)
        wait_workers(run, workers)
        faulty = {
            "down": {"down": True},
            "slow": {"slow": hook_timeout + 1},
            "drip": {"drip": drip, "drip_bytes": 60},
        }[mode]
        healthy = {"down": False, "slow": 0.0, "drip": 0.0}

        def fault() -> None:
            time.sleep(fault_at)
            receiver.set_mode(**faulty)
            time.sleep(fault_for)
            receiver.set_mode(**healthy)
            run.fault_ended()

        thread = threading.Thread(target=fault, name="fault", daemon=True)
        acked: list[str] = []
        errors: Counter = Counter()
        first_send = time.monotonic()
        thread.start()
        for i in paced(messages, rate):
            try:
                acked.append(outbox.send("hook", {"n": i}).id)
            except Exception as exc:
                send_errors(errors, exc)
        thread.join(fault_at + fault_for + 30)
        settle(run, result, acked, first_send, settle_timeout)
        result.check(
            "none failed: the retry budget outlasts the fault", result.failed == 0, f"{result.failed} failed"
        )
        if mode in ("slow", "drip"):
            deadline = (
                1 + 2 * hook_timeout
            )  # connect_timeout + 2 × timeout (WebhookTransport.longest_attempt)
            longest = max((a.duration_ms for i in acked for a in outbox.attempts(i)), default=0) / 1000
            result.check(
                "every attempt ended within the transport's deadline",
                longest <= deadline + 0.5,
                f"longest attempt {longest:.1f} s; deadline {deadline:g} s",
            )
        state = receiver.state()
        result.notes.append(
            f"receiver: {state.get('requests', 0)} requests, {state.get('failed', 0)} answered 500, "
            f"{state.get('bad_signature', 0)} bad signatures; fault {mode} for {fault_for:g} s"
        )
        result.check("every request carried a valid signature", not state.get("bad_signature"), "")
        if errors:
            result.notes.append(f"send() exceptions: {dict(errors)}")
        worker_notes(result, supervisor)
    return result


_receiver_short = {
    "messages": 40,
    "rate": 30,
    "workers": 1,
    "fault_at": 0.5,
    "fault_for": 2,
    "visibility_timeout": 10,
    "recovery_interval": 1,
    "settle_timeout": 15,
}
register(
    "receiver-down",
    receiver_fault,
    short={**_receiver_short, "mode": "down"},
    full={"mode": "down", "fault_for": 30},
    about="The receiver down (connections refused) for 30 s, then back.",
)
register(
    "receiver-slow",
    receiver_fault,
    short={**_receiver_short, "mode": "slow"},
    full={"mode": "slow", "fault_for": 20},
    about="The receiver slower than the transport deadline for 20 s.",
)
register(
    "receiver-drip",
    receiver_fault,
    short={**_receiver_short, "mode": "drip", "drip": 0.08},
    full={"mode": "drip", "fault_for": 20},
    about="The receiver drips its answers byte by byte for 20 s.",
)


# -- 4. a poison message -----------------------------------------------------------------


def poison(
    name: str,
    *,
    kill_mode: str = "group",
    batch: int = 20,
    poison_at: int = 10,
    others: int = 200,
    rate: float = 50,
    workers: int = 2,
    poison_retries: int = 2,
    visibility_timeout: float = 10,
    recovery_interval: float = 2,
    settle_timeout: float = 180,
) -> Result:
    """A message whose delivery kills its worker (``os._exit(1)``), alone and inside a batch.

    One poison message alone, then a ``send_many`` batch of ``batch`` with poison at index
    ``poison_at``, then ``others`` ordinary messages at ``rate``/s; all to the ``poison``
    callable destination, which logs every delivery. Workers under the supervisor, which
    restarts them; ``kill_mode``: ``group`` ends the dead worker's process group, ``leave``
    leaves its children running, ``fork`` runs workers with ``--fork`` (the work horse dies,
    not the worker). Expected: both poison messages failed after their retries; every
    other message succeeded (nothing blocked); no other message delivered again unless it
    was in flight at a crash (a ``lost`` attempt for each delivery beyond the first:
    at least once), and none charged more lost attempts than there are poison messages
    (each is attempted alone after a crash: issue 20, item 12).
    """
    import outbox

    result = Result(name)
    settings = faults_settings(visibility_timeout, recovery_interval, POISON_RETRIES=poison_retries)
    with environment(name, settings=settings, receiver=False) as run:
        supervisor = run.workers(
            workers,
            args=["--fork"] if kill_mode == "fork" else [],
            end_group=kill_mode != "leave",
            restart_delay=0.5,
        )
        wait_workers(run, workers)
        first_send = time.monotonic()
        alone = outbox.send("poison", {"n": "alone", "poison": True}).id
        items = [{"destination": "poison", "body": {"n": i, "poison": i == poison_at}} for i in range(batch)]
        batch_ids = [m.id for m in outbox.send_many(items)]
        acked = [alone, *batch_ids]
        for i in paced(others, rate):
            acked.append(outbox.send("poison", {"n": f"other-{i}"}).id)
        found = settle(
            run,
            result,
            acked,
            first_send,
            settle_timeout,
            must_receive=lambda i: i not in (alone, batch_ids[poison_at]),
        )
        poison_ids = {alone, batch_ids[poison_at]}
        result.check(
            "poison messages ended failed",
            all(found[i] == "failed" for i in poison_ids),
            ", ".join(
                f"{found[i]} after {sum(1 for m, p in log_lines(run) if m == i and p)} crashes"
                for i in (alone, batch_ids[poison_at])
            ),
        )
        not_poison = [i for i in acked if i not in poison_ids]
        succeeded = sum(1 for i in not_poison if found[i] == "succeeded")
        result.check(
            "every other message succeeded (nothing blocked)",
            succeeded == len(not_poison),
            f"{succeeded} of {len(not_poison)}",
        )
        lines = log_lines(run)
        first_crash = next((n for n, (m, p) in enumerate(lines) if m == batch_ids[poison_at] and p), None)
        delivered = Counter(m for m, p in lines if not p)
        lost = {m: sum(a.outcome == "lost" for a in outbox.attempts(m)) for m in not_poison}
        again = sorted(m for m in not_poison if delivered[m] > 1 + lost[m])
        result.check(
            "no other message delivered again but an attempt in flight at a crash",
            first_crash is not None and not again,
            f"{len(again)} delivered more often than 1 + its lost attempts"
            if first_crash is not None
            else "the batch's poison never ran",
        )
        charged = Counter(lost.values())
        result.check(
            "no other message charged more lost attempts than there are poison messages",
            max(lost.values(), default=0) <= len(poison_ids),
            f"lost attempts per non-poison message: {dict(sorted(charged.items()))}",
        )
        per_message = Counter(delivered[m] for m in not_poison)
        result.notes.append(f"deliveries per non-poison message: {dict(sorted(per_message.items()))}")
        poison_lost = [a for a in outbox.attempts(batch_ids[poison_at]) if a.outcome == "lost"]
        if poison_lost:
            crash = min(a.started_at for a in poison_lost)
            settled_after = [
                a.started_at + a.duration_ms / 1000 - crash
                for m in batch_ids
                if lost.get(m)
                for a in outbox.attempts(m)[:1]
            ]
            result.notes.append(
                f"batch mates lost beside the poison: {len(settled_after)}, settled "
                f"{max(settled_after, default=0):.1f} s after its first attempt at most "
                f"(VISIBILITY_TIMEOUT {visibility_timeout} s + RECOVERY_INTERVAL {recovery_interval} s "
                "+ a 0.5 s backoff, then one at a time)"
            )
        orphans = [e.pid for e in supervisor.exits if kill_group(e.pid, 0)]
        result.notes.append(f"process groups of dead workers still alive at the end: {len(orphans)}")
        worker_notes(result, supervisor)
    return result


def log_lines(run: Run) -> list[tuple[str, bool]]:
    from .targets import read_log

    return read_log(str(run.callable_log))


_poison_short = {
    "others": 10,
    "rate": 30,
    "poison_retries": 1,
    "visibility_timeout": 2,
    "recovery_interval": 1,
    "settle_timeout": 15,
}
register(
    "poison-group",
    poison,
    short={**_poison_short, "kill_mode": "group"},
    full={"kill_mode": "group"},
    about="A poison message (os._exit) alone and mid-batch; the supervisor ends the dead worker's group.",
)
register(
    "poison-orphans",
    poison,
    short={**_poison_short, "kill_mode": "leave"},
    full={"kill_mode": "leave"},
    about="The same; the dead worker's children (RQ scheduler) are left running.",
)
register(
    "poison-fork",
    poison,
    short={**_poison_short, "kill_mode": "fork"},
    full={"kill_mode": "fork"},
    about="The same with outbox_worker --fork (the work horse dies).",
)


# -- 5. a job timeout mid-batch ----------------------------------------------------------


def job_timeout(
    name: str,
    *,
    batch: int = 20,
    hang_at: int = 10,
    visibility_timeout: float = 3,
    recovery_interval: float = 1,
    workers: int = 1,
    settle_timeout: float = 90,
) -> Result:
    """RQ's job timeout (= VISIBILITY_TIMEOUT) fires in the middle of a batch.

    A ``send_many`` batch of ``batch`` webhooks; the receiver hangs for 3 × the timeout on
    message ``hang_at`` (once; it answers its retry), and the transport's own timeout is
    2 × VISIBILITY_TIMEOUT, so RQ kills the job first. Expected: all succeeded, the hung
    message after a retry, and no batch mate delivered twice.
    """
    import outbox

    result = Result(name)
    settings = faults_settings(visibility_timeout, recovery_interval, HOOK_TIMEOUT=2 * visibility_timeout)
    with environment(name, settings=settings) as run:
        supervisor = run.workers(workers)
        wait_workers(run, workers)
        first_send = time.monotonic()
        hang = {"hang": 3 * visibility_timeout, "hang_times": 1}
        items = [
            {"destination": "hook", "body": {"n": i, **(hang if i == hang_at else {})}} for i in range(batch)
        ]
        acked = [m.id for m in outbox.send_many(items)]
        run.fault_ended()  # the fault is in the batch itself
        found = settle(run, result, acked, first_send, settle_timeout)
        result.check(
            "all succeeded", all(s == "succeeded" for s in found.values()), str(dict(Counter(found.values())))
        )
        result.check("no message delivered twice", result.duplicates == 0, f"{result.duplicates} duplicates")
        hung = acked[hang_at]
        result.notes.append(
            "hung message attempts: "
            + ", ".join(f"{a.outcome} {a.duration_ms / 1000:.1f}s" for a in reversed(outbox.attempts(hung)))
        )
        worker_notes(result, supervisor)
    return result


register("job-timeout", job_timeout, short={"batch": 10, "hang_at": 5}, full={})


# -- 6. idempotency races ----------------------------------------------------------------


def idempotency(
    name: str,
    *,
    backend: str = "sqlite",
    rounds: int = 20,
    threads: int = 8,
    workers: int = 1,
    settle_timeout: float = 60,
) -> Result:
    """The same idempotency key from ``threads`` threads at once, and from as many concurrent transactions.

    Per round, ``threads`` threads wait at a barrier and call ``send()`` with one key; then
    as many threads each open ``transaction.atomic``, create a ``User`` row and ``send()``
    with another key. On ``backend`` ``postgres`` (``FAULTS_PG_DSN``, default
    ``postgresql://postgres@127.0.0.1:5432/test``; skipped when unreachable) or ``sqlite``.
    Expected: exactly one message per key, and every caller got its id.
    """
    import outbox

    result = Result(name)
    dsn = None
    if backend == "postgres":
        dsn = os.environ.get("FAULTS_PG_DSN") or "postgresql://postgres@127.0.0.1:5432/test"
        reason = postgres_unavailable(dsn)
        if reason:
            result.skipped = reason
            return result
    with environment(name, database=True, pg_dsn=dsn) as run:
        from django.contrib.auth.models import User  # Django is set up now
        from django.db import connection, transaction

        supervisor = run.workers(workers)
        first_send = time.monotonic()
        errors: Counter = Counter()
        returned: dict[str, list[str]] = {}

        def race(key: str, in_transaction: bool) -> None:
            barrier = threading.Barrier(threads)
            got: list[str] = []

            def caller(t: int) -> None:
                try:
                    barrier.wait(10)
                    if in_transaction:
                        with transaction.atomic():
                            User.objects.create(username=f"{key}-{t}")
                            message = outbox.send("hook", {"key": key}, idempotency_key=key)
                    else:
                        message = outbox.send("hook", {"key": key}, idempotency_key=key)
                    got.append(message.id)
                except Exception as exc:
                    send_errors(errors, exc, "transaction" if in_transaction else "send()")
                finally:
                    connection.close()

            callers = [threading.Thread(target=caller, args=(t,)) for t in range(threads)]
            for c in callers:
                c.start()
            for c in callers:
                c.join(60)
            returned[key] = got

        for r in range(rounds):
            race(f"threads-{r}", False)
            race(f"transactions-{r}", True)
        acked = [i for ids in returned.values() for i in ids]
        found = settle(run, result, acked, first_send, settle_timeout)
        total = sum(counts().values())
        result.check(
            "exactly one message per key",
            total == len(returned),
            f"{total} messages for {len(returned)} keys",
        )
        split = {k: len(set(ids)) for k, ids in returned.items() if len(set(ids)) != 1 or len(ids) != threads}
        result.check(
            "every caller got the key's one id",
            not split and all(found[ids[0]] != "missing" for ids in returned.values() if ids),
            f"{len(split)} keys whose callers got different ids (or no id): {dict(list(split.items())[:4])}"
            if split
            else "",
        )
        result.notes.append(
            f"database: {backend}; callers: {rounds * 2 * threads}; errors: {dict(errors) or 'none'}"
        )
        worker_notes(result, supervisor)
    return result


register(
    "idempotency-sqlite",
    idempotency,
    short={"backend": "sqlite", "rounds": 3},
    full={"backend": "sqlite"},
    about="One idempotency key from 8 threads and from 8 concurrent transactions (SQLite).",
)
register(
    "idempotency-postgres",
    idempotency,
    short={"backend": "postgres", "rounds": 3},
    full={"backend": "postgres"},
    about="The same on PostgreSQL (127.0.0.1:5432/test; skipped when unreachable).",
)


def requeue_race(
    name: str,
    *,
    messages: int = 20,
    delay: float = 1.5,
    requeuers: int = 4,
    workers: int = 2,
    settle_timeout: float = 60,
) -> Result:
    """``requeue()`` from ``requeuers`` threads while a worker delivers the same message.

    Each message makes the receiver take ``delay`` s; as soon as it is ``sending``, several
    threads requeue it at once. Then every settled message is requeued once more on
    purpose. Expected: a message being delivered is not requeued (``sending`` is not a
    requeueable status), and each message is delivered exactly 1 + (requeues that acted)
    times; no message is created.
    """
    import outbox

    result = Result(name)
    with environment(name) as run:
        supervisor = run.workers(workers)
        wait_workers(run, workers)
        first_send = time.monotonic()
        acted: Counter = Counter()
        caught_sending = 0
        acked = []
        for i in range(messages):
            message_id = outbox.send("hook", {"n": i, "delay": delay}).id
            acked.append(message_id)
            if not wait_until(lambda m=message_id: outbox.get(m).status == "sending", 10, 0.01):
                continue
            caught_sending += 1
            barrier = threading.Barrier(requeuers)

            def requeue(m: str = message_id, b: threading.Barrier = barrier) -> None:
                b.wait(5)
                acted[m] += outbox.requeue([m]).acted

            threads = [threading.Thread(target=requeue) for _ in range(requeuers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
        during = sum(acted.values())
        settled_at = wait_settled(messages, settle_timeout)
        requeueable = [i for i, s in statuses(acked).items() if s in ("succeeded", "failed", "cancelled")]
        after = outbox.requeue(acked)
        for i in requeueable:
            acted[i] += 1  # requeue() acts on every settled message
        if after.acted != len(requeueable):
            result.notes.append(
                f"the final requeue acted on {after.acted} messages, {len(requeueable)} were settled"
            )
        settled_at = wait_settled(messages, settle_timeout) or settled_at
        found = tally(run, result, acked, first_send=first_send, settled_at=settled_at)
        delivered = run.delivered()
        wrong = {i: (delivered[i], 1 + acted[i]) for i in acked if delivered[i] != 1 + acted[i]}
        result.check(
            "requeue refused while the message was being delivered",
            during == 0,
            f"{during} requeues acted on {caught_sending} sending messages",
        )
        result.check(
            "each message delivered exactly 1 + (requeues that acted) times",
            not wrong,
            f"{len(wrong)} messages off (delivered, expected): {dict(list(wrong.items())[:3])}"
            if wrong
            else "",
        )
        total = sum(counts().values())
        result.check("no message created by requeue", total == messages, f"{total} messages")
        result.duplicates = sum(1 for i in acked if delivered[i] > 1 + acted[i])
        result.notes.append(f"statuses: {dict(Counter(found.values()))}")
        worker_notes(result, supervisor)
    return result


register("requeue-race", requeue_race, short={"messages": 3, "delay": 0.5, "workers": 1}, full={})


# -- 7. an evicting Redis ----------------------------------------------------------------


def evicting_redis(
    name: str,
    *,
    messages: int = 3000,
    maxmemory: str = "4mb",
    policy: str = "allkeys-lru",
) -> Result:
    """A Redis with ``maxmemory-policy allkeys-lru``: the checks must say so; what it loses.

    Runs ``manage.py check`` and starts an ``outbox_worker`` against a Redis with
    ``maxmemory`` and ``policy``: both must report outbox.E006. Then, with no worker, sends
    ``messages`` with idempotency keys and counts how many Redis evicted, and sends the same
    keys again to count the duplicates that creates. The losses are expected (that is the
    misconfiguration); the checks are what must hold.
    """
    import subprocess
    import sys

    import outbox

    result = Result(name, lost_expected=True)
    options = {"appendonly": True, "maxmemory": maxmemory, "maxmemory_policy": policy}
    with environment(name, redis_options=options, receiver=False) as run:
        manage = [sys.executable, str(ROOT / "manage.py")]
        check = subprocess.run(
            [*manage, "check"], env=run.env, cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        output = check.stdout + check.stderr
        result.check(
            "manage.py check reports outbox.E006", "outbox.E006" in output, f"exit status {check.returncode}"
        )
        worker = spawn([*manage, "outbox_worker"], run.log_dir / "worker-0.log", run.env)
        log = run.log_dir / "worker-0.log"
        said = wait_until(lambda: "outbox.E006" in log.read_text(errors="replace"), 20, 0.2)
        running = wait_until(lambda: worker.poll() is not None, 5, 0.1) is None
        kill_group(worker.pid)
        worker.wait()
        result.check(
            "outbox_worker reports outbox.E006 at start",
            bool(said),
            "it refused to start (system check error)"
            if said and not running
            else ("logged it and runs" if said else "no word of it"),
        )
        first: list[str] = []
        for i in range(messages):
            first.append(outbox.send("hook", {"n": i, "pad": "x" * 200}, idempotency_key=f"key-{i}").id)
        found = statuses(first)
        result.sent = len(first)
        result.lost = sum(1 for s in found.values() if s == "missing")
        again = [
            outbox.send("hook", {"n": i, "pad": "x" * 200}, idempotency_key=f"key-{i}").id
            for i in range(messages)
        ]
        duplicates = sum(1 for a, b in zip(first, again, strict=True) if a != b)
        result.duplicates = duplicates  # no worker runs: nothing settles, so no settle time
        result.notes.append(
            f"{result.lost} of {messages} accepted messages evicted; re-sending the same {messages} idempotency "
            f"keys created {duplicates} new messages (maxmemory {maxmemory}, {policy})"
        )
    return result


register("evicting-redis", evicting_redis, short={"messages": 1000, "maxmemory": "3mb"}, full={})


# -- 5. an outage behind the circuit breaker (issue 8) --------------------------------------


@dataclass
class Sample:
    """One row of the outage timeline."""

    t: float
    receiver_up: bool
    sent: int
    delivered: int
    attempts: int
    failed_attempts: int
    breaker: str
    state: str
    parked: int
    retries_spent: int


def _retries_spent(ids: list[str]) -> int:
    """Sum of ``retry_count`` over ``ids`` (one pipeline)."""
    from outbox.store import get_repository

    repo = get_repository()
    pipe = repo.connection.pipeline(transaction=False)
    for message_id in ids:
        pipe.hget(repo.keys.resend(message_id), "retry_count")
    return sum(int(v or 0) for v in pipe.execute())


def receiver_outage(
    name: str,
    *,
    rate: float = 20,
    duration: float = 150,
    down_at: float = 30,
    down_for: float = 60,
    workers: int = 2,
    failures: int = 5,
    cooldown: float = 2,
    max_cooldown: float = 8,
    sample_every: float = 5,
    visibility_timeout: float = 10,
    recovery_interval: float = 2,
    settle_timeout: float = 120,
) -> Result:
    """A receiver down for a minute under steady traffic, behind the circuit breaker.

    ``rate`` messages/s for ``duration`` s; the receiver refuses connections from
    ``down_at`` for ``down_for`` s. The ``hook`` destination's breaker opens after
    ``failures`` consecutive failures and probes after ``cooldown`` s (doubling up to
    ``max_cooldown``). Expected: the breaker opens within the threshold; no message spends
    a retry while it is open (the retries spent in all are fewer than the failures that
    opened it: the outcome that opens it, and every later one, is not charged); ``destination.opened`` is published once;
    a probe closes it within ``max_cooldown`` + a few seconds of the receiver's return;
    everything is delivered, nothing twice. The timeline is written to
    ``.faults/<name>/timeline.md``.
    """
    import outbox
    from outbox.conf import outbox_settings
    from outbox.destinations import health

    result = Result(name)
    breaker = {"FAILURES": failures, "COOLDOWN": cooldown, "MAX_COOLDOWN": max_cooldown}
    settings = faults_settings(
        visibility_timeout, recovery_interval, HOOK_RETRIES=10, BREAKER=json.dumps(breaker)
    )
    with environment(name, settings=settings) as run:
        assert run.receiver is not None
        receiver = run.receiver
        events: list[tuple[float, dict[str, Any]]] = []
        from redis import Redis

        listener = Redis.from_url(run.redis.url)  # no socket timeout: it waits for events
        pubsub = listener.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(outbox_settings.EVENTS_CHANNEL)
        listening = threading.Event()
        listening.set()

        def listen() -> None:
            while listening.is_set():
                try:
                    item = pubsub.get_message(timeout=0.5)
                except Exception:
                    time.sleep(0.2)
                    continue
                if not item:
                    continue
                try:
                    data = json.loads(item["data"])
                except (TypeError, ValueError):
                    continue
                if str(data.get("event", "")).startswith("destination."):
                    events.append((time.monotonic(), data))

        threading.Thread(target=listen, name="events", daemon=True).start()
        supervisor = run.workers(workers)
        wait_workers(run, workers)
        acked: list[str] = []
        errors: Counter = Counter()
        samples: list[Sample] = []
        start = time.monotonic()
        up_again: list[float] = []
        stop = threading.Event()

        def fault() -> None:
            time.sleep(down_at)
            receiver.set_mode(down=True)
            time.sleep(down_for)
            receiver.set_mode(down=False)
            up_again.append(time.monotonic())
            run.fault_ended()

        def sample() -> None:
            while not stop.wait(sample_every):
                try:
                    h = health.get_health("hook")
                    t = time.monotonic() - start
                    down = down_at <= t < down_at + down_for
                    samples.append(
                        Sample(
                            t=round(t),
                            receiver_up=not down,
                            sent=len(acked),
                            delivered=len(run.delivered()),
                            attempts=sum(h.totals.values()),
                            failed_attempts=h.totals.get("retryable", 0) + h.totals.get("permanent", 0),
                            breaker=h.breaker,
                            state=h.state,
                            parked=h.parked,
                            retries_spent=_retries_spent(list(acked)),
                        )
                    )
                except Exception as exc:  # a sample is an observation; never end the run
                    result.notes.append(f"sample failed: {type(exc).__name__}: {exc}")

        threading.Thread(target=fault, name="fault", daemon=True).start()
        threading.Thread(target=sample, name="sampler", daemon=True).start()
        first_send = time.monotonic()
        for i in paced(int(rate * duration), rate):
            try:
                acked.append(outbox.send("hook", {"n": i}).id)
            except Exception as exc:
                send_errors(errors, exc)
        settle(run, result, acked, first_send, settle_timeout)
        stop.set()
        time.sleep(0.5)  # the last events
        listening.clear()
        time.sleep(0.6)
        pubsub.close()
        listener.close()

        kinds = Counter(e["event"] for _, e in events)
        opened = [(t, e) for t, e in events if e["event"] == "destination.opened"]
        closed = [(t, e) for t, e in events if e["event"] == "destination.closed"]
        spent = _retries_spent(list(acked))
        in_flight = int(outbox_settings.CONCURRENCY) * workers
        result.check(
            "the breaker opened once (one destination.opened event, not one per message)",
            len(opened) == 1,
            f"events: {dict(kinds)}",
        )
        if opened:
            first = opened[0][1]
            result.check(
                "it opened within the threshold",
                int(first.get("consecutive_failures", failures)) <= failures + in_flight,
                f"consecutive failures when opened: {first.get('consecutive_failures')}",
            )
        # Retries spent while the breaker was not closed, from the samples (every
        # `sample_every` s): the value at the first open sample holds the failures that
        # opened it (fewer than FAILURES), and it must not grow until the breaker closes.
        held = [x.retries_spent for x in samples if x.breaker != "closed"]
        result.check(
            "no retry spent while open: the count when it opened stays below the threshold and does not grow until it closes",
            bool(held) and held[0] < failures and max(held) == held[0],
            f"retries spent when it opened: {held[0] if held else '-'}; while open: "
            f"{max(held) - held[0] if held else '-'}; in all: {spent} ({len(acked)} messages)",
        )
        if held and spent > max(held):
            result.notes.append(
                f"retries spent after it closed: {spent - max(held)} (attempts that failed once the breaker "
                "had closed, e.g. timeouts while the parked messages went out; the error groups below count them)"
            )
        if up_again and closed:
            after = closed[-1][0] - up_again[0]
            result.check(
                "a probe closed it soon after the receiver returned",
                0 <= after <= max_cooldown + 5,
                f"closed {after:.1f} s after the receiver returned",
            )
        else:
            result.check("a probe closed it after the receiver returned", False, f"events: {dict(kinds)}")
        result.check("none failed", result.failed == 0, f"{result.failed} failed")
        # What the destination page draws: the outage's minutes and its error group.
        groups = health.error_groups("hook")
        failed_attempts = health.get_health("hook").totals.get("retryable", 0)
        result.check(
            "the error groups name the outage (connections refused), with every failed attempt counted",
            bool(groups)
            and groups[0].error_class == "ConnectError"
            and sum(g.count for g in groups) == failed_attempts,
            f"groups {[(g.status_code, g.error_class, g.count) for g in groups]}; failed attempts {failed_attempts}",
        )
        minutes = [m for m in health.timeline("hook", minutes=10) if m.retryable]
        result.check(
            "the per-minute timeline shows the outage's failed attempts",
            sum(m.retryable for m in minutes) == failed_attempts,
            f"minutes with failures: {[(m.minute * 60, m.retryable) for m in minutes]}",
        )
        rows = [
            "| t s | receiver | sent | delivered | attempts | failed attempts | breaker | state | parked | retries spent |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ] + [
            f"| {s.t:g} | {'up' if s.receiver_up else 'down'} | {s.sent} | {s.delivered} | {s.attempts} | "
            f"{s.failed_attempts} | {s.breaker} | {s.state} | {s.parked} | {s.retries_spent} |"
            for s in samples
        ]
        event_lines = [f"- {t - start:6.1f} s  {e['event']}" for t, e in events]
        (run.log_dir / "timeline.md").write_text(
            "\n".join(rows) + "\n\nEvents (seconds since the first send):\n\n" + "\n".join(event_lines) + "\n"
        )
        result.notes.append(f"timeline: {run.log_dir / 'timeline.md'}; events {dict(kinds)}")
        if errors:
            result.notes.append(f"send() exceptions: {dict(errors)}")
        worker_notes(result, supervisor)
    return result


register(
    "receiver-outage",
    receiver_outage,
    short={
        "rate": 20,
        "duration": 14,
        "down_at": 3,
        "down_for": 6,
        "workers": 1,
        "cooldown": 1,
        "max_cooldown": 2,
        "sample_every": 1,
        "settle_timeout": 30,
    },
    full={},
    about="The receiver down for a minute under steady traffic, behind the circuit breaker.",
)


# -- registered by their own modules: on a cluster (issue 22), ordered delivery (issue 23),
# webhooks fanned out to endpoints (issue 34) --

from . import cluster_scenarios, ordering_scenarios, webhook_scenarios  # noqa: E402, F401
