"""The fault scenarios of ordered delivery (issue 23): keys kept in order while things break.

* ``ordering``: many ordering keys, their messages sent interleaved, to a receiver that
  answers 500 to some requests and resets some connections, while workers are SIGKILLed
  and Redis is restarted once. Checks, from the receiver's request log: no key's messages
  first accepted out of order, never two requests of one key in flight at once, nothing
  attempted before the messages ahead of it in its key were accepted, the ordering
  headers true; nothing lost, everything delivered.
* ``ordering-block`` / ``ordering-skip``: one message of one key is refused for good
  (400). With the policy ``block`` (the default) nothing behind it is delivered until it
  is requeued (``outbox.release_key``), then the key goes on in order; with ``skip`` the
  key goes on without it. The other keys are not held up.

The receiver (:mod:`tests.faults.receiver`) logs every signed request with two numbers of
one counter: when it was read and when its answer was decided, just before the answer is
written. Both are causal: a worker cannot see an answer before its ``decided``, so a
message promoted by that answer cannot arrive before it. The checks compare these numbers
only, never clocks, so a loaded machine cannot fake or hide a violation.

Registered in :data:`tests.faults.scenarios.SCENARIOS` (imported at the end of that module).
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from .harness import (
    Result,
    Run,
    counts,
    environment,
    in_flight_duplicates,
    paced,
    statuses,
    wait_until,
    worker_notes,
)
from .scenarios import faults_settings, killer, register, send_errors, settle, wait_workers

#: Redis of the ordering scenarios: restarted with SIGTERM, so it must reload what it had.
PERSISTENT_REDIS = {"appendonly": True, "appendfsync": "everysec"}


#: What ends a delivery job while Redis restarts, by design: a run retries its writes
#: while Redis is unreachable (or answers LOADING) for half of VISIBILITY_TIMEOUT, then
#: raises; the recovery sweep takes its messages back after their lease.
OUTAGE_ERRORS = ("ConnectionError", "BusyLoadingError", "TimeoutError")
_LOG_LINE = re.compile(r"^(\d\d:\d\d:\d\d |outbox )")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt))\b")


def failed_jobs(run: Run) -> Counter[str]:
    """Delivery jobs that ended by an exception, in the worker logs, by the exception's
    class name (the last exception of each traceback RQ logged)."""
    ended: Counter[str] = Counter()
    for path in run.log_dir.glob("worker-*.log"):
        lines = path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if "exception raised while executing" not in line:
                continue
            last = "?"
            for after in lines[i + 1 :]:
                if _LOG_LINE.match(after):
                    break
                found = _EXCEPTION_LINE.match(after)
                if found:
                    last = found.group(1)
            ended[last] += 1
    return ended


def key_name(k: int) -> str:
    return f"key-{k:03d}"


# -- reading the receiver's log ------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One signed request the receiver read (a row of its log).

    Attributes:
        arrived, decided: numbers of the receiver's one counter: when the request had been
            read, and when its answer was decided (before it was written).
        id: its ``webhook-id``.
        key, seq, prev: its ``Outbox-Ordering-Key``, ``-Sequence`` and ``-Previous`` headers
            (None when absent).
        answer: 200 (accepted), 400, 500, 503 or ``"reset"``.
    """

    arrived: int
    decided: int
    id: str
    key: str | None
    seq: int | None
    prev: int | None
    answer: Any

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Request:
        arrived, decided, message_id, key, seq, prev, answer = row
        return cls(
            int(arrived),
            int(decided) or 2**62,  # still being answered when the log was read
            str(message_id),
            key,
            int(seq) if seq else None,
            int(prev) if prev else None,
            answer,
        )


@dataclass
class Examined:
    """What the receiver's log says about the order of each key (see :func:`examine`).

    Attributes:
        inversions: messages first accepted before an earlier message of their key was.
        ahead: messages attempted before every earlier message of their key was released
            (first accepted; or, one never accepted, its last attempt answered).
        overlaps: requests that arrived while another request of their key was in flight.
        max_in_flight: the most requests of one key in flight at once at the receiver.
        headers: first acceptances whose ordering headers were not the expected ones.
        never_accepted: messages expected to be delivered that the receiver never accepted.
        accepted_again: messages accepted more than once (at least once: a repeat after a
            crash), and their accepted requests beyond the first.
        order: per key, the sequence numbers in the order of their first acceptances.
    """

    inversions: list[str] = field(default_factory=list)
    ahead: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    max_in_flight: int = 0
    headers: list[str] = field(default_factory=list)
    never_accepted: list[str] = field(default_factory=list)
    accepted_again: int = 0
    repeats: int = 0
    order: dict[str, list[int]] = field(default_factory=dict)


def examine(
    log: Sequence[Sequence[Any]],
    keys: dict[str, list[tuple[str, int]]],
    set_aside: Collection[str] = (),
) -> Examined:
    """Check the order of every key in the receiver's request log.

    Args:
        log: :meth:`tests.faults.harness.ReceiverProcess.log`.
        keys: ordering key -> its messages as (id, sequence number: ``Message.order_seq``),
            in the order they were sent.
        set_aside: ids that are not to be delivered (a dead letter skipped by its key).

    The previous sequence a first acceptance must name is that of the message delivered
    before it in its key (the key's earlier messages less those set aside); none for the
    first.
    """
    requests = [Request.from_row(row) for row in log]
    by_id: dict[str, list[Request]] = defaultdict(list)
    by_key: dict[str, list[Request]] = defaultdict(list)
    for r in requests:
        by_id[r.id].append(r)
        if r.key is not None:
            by_key[r.key].append(r)
    out = Examined()
    for key, messages in keys.items():
        messages = sorted(messages, key=lambda m: m[1])
        first: dict[str, Request] = {}
        for message_id, _ in messages:
            accepted = sorted((r for r in by_id[message_id] if r.answer == 200), key=lambda r: r.decided)
            if accepted:
                first[message_id] = accepted[0]
                if len(accepted) > 1:
                    out.accepted_again += 1
                    out.repeats += len(accepted) - 1
            elif message_id not in set_aside:
                out.never_accepted.append(f"{key}#{dict(messages)[message_id]} ({message_id})")
        seq_of = dict(messages)
        # inversions: first accepted before an earlier message of the key was
        for message_id, seq in messages:
            if message_id not in first:
                continue
            later = [
                e
                for e, s in messages
                if s < seq and e in first and first[e].decided > first[message_id].decided
            ]
            if later:
                out.inversions.append(f"{key}#{seq} first accepted before #{seq_of[later[0]]}")
        out.order[key] = [seq_of[i] for i in sorted(first, key=lambda i: first[i].decided)]
        # ahead of its turn: attempted before the messages ahead of it were released
        bar, bar_seq = 0, None
        previous_delivered: int | None = None
        for message_id, seq in messages:
            mine = by_id[message_id]
            early = [r for r in mine if r.arrived < bar]
            if early:
                out.ahead.append(f"{key}#{seq} attempted before #{bar_seq} was released")
            if message_id in first:
                r = first[message_id]
                wrong = []
                if r.key != key:
                    wrong.append(f"key {r.key!r}")
                if r.seq != seq:
                    wrong.append(f"sequence {r.seq} (expected {seq})")
                if r.prev != previous_delivered:
                    wrong.append(f"previous {r.prev} (expected {previous_delivered})")
                if wrong:
                    out.headers.append(f"{key}#{seq}: " + ", ".join(wrong))
            if message_id not in set_aside:
                previous_delivered = seq
            released = (
                first[message_id].decided
                if message_id in first
                else max((r.decided for r in mine), default=0)
            )
            if released > bar:
                bar, bar_seq = released, seq
    # requests of one key in flight at once: arrivals and decisions in counter order
    for key, reqs in by_key.items():
        events = sorted(
            [(r.arrived, 1, r) for r in reqs] + [(r.decided, -1, r) for r in reqs], key=lambda e: e[0]
        )
        flying: dict[int, Request] = {}
        for _, step, r in events:
            if step == 1:
                if flying:
                    others = ", ".join(f"#{o.seq}" for o in flying.values())
                    out.overlaps.append(f"{key}#{r.seq} arrived while {others} in flight")
                flying[r.arrived] = r
                out.max_in_flight = max(out.max_in_flight, len(flying))
            else:
                flying.pop(r.arrived, None)
    return out


def order_checks(result: Result, found: Examined) -> None:
    """The ordering checks every ordering scenario makes, on ``result``."""
    result.check(
        "0 per-key inversions among first acceptances",
        not found.inversions,
        f"{len(found.inversions)} inversions" + (f": {found.inversions[:3]}" if found.inversions else ""),
    )
    result.check(
        "at most 1 request of a key in flight at the receiver at any moment",
        found.max_in_flight <= 1,
        f"most in flight for one key: {found.max_in_flight}; {len(found.overlaps)} overlapping requests"
        + (f": {found.overlaps[:3]}" if found.overlaps else ""),
    )
    result.check(
        "nothing attempted before the messages ahead of it in its key were released",
        not found.ahead,
        f"{len(found.ahead)} messages" + (f": {found.ahead[:3]}" if found.ahead else ""),
    )
    result.check(
        "ordering headers at each first acceptance: its key, its sequence, the sequence delivered before it",
        not found.headers,
        f"{len(found.headers)} wrong" + (f": {found.headers[:3]}" if found.headers else ""),
    )
    result.check(
        "every message to be delivered was accepted by the receiver",
        not found.never_accepted,
        f"{len(found.never_accepted)} never accepted"
        + (f": {found.never_accepted[:3]}" if found.never_accepted else ""),
    )
    if found.accepted_again:
        result.notes.append(
            f"accepted again after their first acceptance (at least once): {found.accepted_again} messages, "
            f"{found.repeats} repeats"
        )


def sequences(sent: dict[str, list[str]]) -> tuple[dict[str, list[tuple[str, int]]], list[str]]:
    """Per key, its sent messages as (id, ``order_seq``), and the keys whose sequence numbers
    are not 1, 2, 3, ... in the order they were sent."""
    import outbox

    keys: dict[str, list[tuple[str, int]]] = {}
    wrong = []
    for key, ids in sent.items():
        seqs = [outbox.get(i).order_seq or 0 for i in ids]
        keys[key] = list(zip(ids, seqs, strict=True))
        if seqs != list(range(1, len(ids) + 1)):
            wrong.append(f"{key}: {seqs}")
    return keys, wrong


def receiver_notes(result: Result, run: Run) -> None:
    assert run.receiver is not None
    state = run.receiver.state()
    result.notes.append(
        f"receiver: {state.get('requests', 0)} requests, {state.get('failed', 0)} answered 500, "
        f"{state.get('reset', 0)} connections reset, {state.get('refused', 0)} refused (400), "
        f"{state.get('bad_signature', 0)} bad signatures"
    )
    result.notes[-1] += (
        f", {state.get('incomplete', 0)} cut short by their sender (a worker killed while sending)"
    )
    result.check(
        "every request carried a valid signature",
        not state.get("bad_signature"),
        "; ".join(state.get("bad_examples", [])),
    )


# -- ordering: keys in order through kills, a Redis restart and a flaky receiver ------------


def ordering(
    name: str,
    *,
    keys: int = 200,
    per_key: int = 15,
    rate: float = 150,
    workers: int = 3,
    kill_for: float = 60,
    kill_every: tuple[float, float] = (2, 5),
    restart_after: float = 1,
    fail_rate: float = 0.2,
    reset_rate: float = 0.05,
    work: float = 0.05,
    redis_at: float = 10,
    redis_down: float = 3,
    visibility_timeout: float = 10,
    recovery_interval: float = 2,
    send_timeout: float = 60,
    settle_timeout: float = 300,
    seed: int = 1,
) -> Result:
    """Ordered keys through worker kills, a Redis restart and a receiver that fails and resets.

    ``keys`` ordering keys × ``per_key`` messages, sent round-robin over the keys (message n
    of every key, then n + 1) at ``rate``/s, each ``send()`` repeated with the same
    idempotency key until acknowledged (while Redis is down); the receiver takes ``work``
    seconds over each request (so a kill often finds attempts in flight, which the receiver
    then accepts from a dead worker: the head is delivered again after its lease, at least
    once), answers 500 to ``fail_rate`` of requests and resets ``reset_rate`` of connections. ``workers`` workers
    under the supervisor: for ``kill_for`` s one is SIGKILLed (process group) every
    ``kill_every`` s and restarted ``restart_after`` s later. At ``redis_at`` s Redis (AOF)
    is stopped with SIGTERM and started again ``redis_down`` s later. Expected: no key's
    messages first accepted out of order, at most one request of a key in flight at the
    receiver, nothing attempted before its turn, true ordering headers, nothing lost,
    every message succeeded.
    """
    import outbox

    result = Result(name)
    rng = random.Random(seed)
    settings = faults_settings(visibility_timeout, recovery_interval)
    with environment(name, settings=settings, redis_options=PERSISTENT_REDIS) as run:
        assert run.receiver is not None
        run.receiver.set_mode(fail_rate=fail_rate, reset_rate=reset_rate)
        supervisor = run.workers(workers, restart_delay=restart_after)
        wait_workers(run, workers)
        stop = threading.Event()
        outage: dict[str, float] = {}

        def restart_redis() -> None:
            if stop.wait(redis_at):
                return
            outage["down"] = time.monotonic()
            run.redis.halt(signal.SIGTERM)
            time.sleep(redis_down)
            run.redis.start()
            outage["up"] = time.monotonic()
            run.fault_ended()

        kills = killer(run, supervisor, rng, kill_for, kill_every, stop)
        outage_thread = threading.Thread(target=restart_redis, name="redis-restart", daemon=True)
        acked: list[str] = []
        sent: dict[str, list[str]] = defaultdict(list)
        errors: Counter = Counter()
        gave_up = 0
        first_send = time.monotonic()
        kills.start()
        outage_thread.start()
        try:
            for i in paced(keys * per_key, rate):
                key, n = key_name(i % keys), i // keys
                deadline = time.monotonic() + send_timeout
                while True:
                    try:
                        message = outbox.send(
                            "hook",
                            {"key": key, "n": n, "delay": work},
                            ordering_key=key,
                            idempotency_key=f"{key}/{n}",
                        )
                    except Exception as exc:  # Redis is down: send again, as a caller would
                        send_errors(errors, exc)
                        if time.monotonic() > deadline:
                            gave_up += 1
                            break
                        time.sleep(0.1)
                        continue
                    acked.append(message.id)
                    sent[key].append(message.id)
                    break
                if gave_up:
                    break  # a key missing a message would be sent out of its order: stop
            outage_thread.join(redis_at + redis_down + 30)
            # settle while the kills go on (a kill after everything settled changes nothing),
            # so settle s is when the last message settled, not when the kills ended
            found = settle(run, result, acked, first_send, settle_timeout)
            kills.join(kill_for + 30)
        finally:
            stop.set()
        result.check(
            "every message sent and succeeded",
            result.sent == keys * per_key and result.succeeded == result.sent,
            f"{result.succeeded} of {result.sent} succeeded ({keys * per_key} to send); statuses "
            f"{dict(Counter(found.values()))}",
        )
        by_key, misnumbered = sequences(sent)
        result.check(
            "each key's sequence numbers follow the order its messages were sent (1, 2, 3, ...)",
            not misnumbered,
            f"{len(misnumbered)} keys" + (f": {misnumbered[:2]}" if misnumbered else ""),
        )
        order_checks(result, examine(run.receiver.log(), by_key))
        offset = time.time() - time.monotonic()
        kill_times = [e.at + offset for e in supervisor.exits if e.killed_by_us]
        duplicated, beyond = in_flight_duplicates(run, acked, kill_times, visibility_timeout)
        result.check(
            "a message delivered again only when an attempt was in flight at a kill",
            not beyond,
            f"{duplicated} delivered more than once, {len(beyond)} of them not explained by a kill"
            + (f": {beyond[:3]}" if beyond else ""),
        )
        ended = failed_jobs(run)
        result.check(
            "no delivery job ended by an error other than Redis being unreachable or loading",
            not any(name not in OUTAGE_ERRORS for name in ended),
            f"jobs ended by an exception: {dict(ended) or 'none'}",
        )
        receiver_notes(result, run)
        result.notes.append(
            f"Redis down {outage.get('up', 0) - outage.get('down', 0):.1f} s (SIGTERM, AOF) at {redis_at:g} s; "
            f"send() errors (each sent again with its idempotency key): {dict(errors) or 'none'}"
            + (f"; gave up after {send_timeout:g} s: {gave_up}" if gave_up else "")
        )
        worker_notes(result, supervisor)
    return result


register(
    "ordering",
    ordering,
    short={
        "keys": 20,
        "per_key": 5,
        "rate": 50,
        "workers": 2,
        "kill_for": 5,
        "kill_every": (1.0, 2.0),
        "redis_at": 1,
        "redis_down": 1,
        "visibility_timeout": 6,
        "recovery_interval": 1,
        "settle_timeout": 60,
    },
    full={},
    about="200 ordering keys x 15 messages, interleaved, through worker kills, a Redis restart and a "
    "receiver failing 20 % and resetting 5 %: each key in order, one in flight per key.",
)


# -- ordering-block / ordering-skip: a dead letter at a key's head ---------------------------


def ordering_dead_letter(
    name: str,
    *,
    policy: str = "block",
    keys: int = 100,
    per_key: int = 10,
    rate: float = 150,
    workers: int = 3,
    refuse_at: int = 3,
    fail_rate: float = 0.2,
    reset_rate: float = 0.05,
    visibility_timeout: float = 10,
    recovery_interval: float = 2,
    settle_timeout: float = 180,
) -> Result:
    """A message at one key's head refused for good (400): the key blocks until it is
    requeued (policy ``block``), or goes on without it (``skip``); other keys go on.

    ``keys`` × ``per_key`` messages sent round-robin at ``rate``/s to the receiver, which
    fails ``fail_rate`` and resets ``reset_rate`` of requests and answers 400 to message
    ``refuse_at`` of the first key (it becomes a dead letter at once). ``block``: once every
    other message is delivered, nothing of that key after it may have arrived,
    ``outbox.blocked_keys`` must list the key with it at its head, and the messages behind
    it must be waiting; then the receiver accepts it and the scenario requeues it with
    ``outbox.release_key(dest, key, "requeue")`` (recover s counts from there), and the
    whole key must arrive in order. ``skip``: the key's other messages arrive in order
    without it, and no key is blocked. Both: every other key in order, one request of a
    key in flight at a time.
    """
    import outbox

    result = Result(name)
    settings = faults_settings(visibility_timeout, recovery_interval, ORDERING=policy)
    with environment(name, settings=settings) as run:
        assert run.receiver is not None
        receiver = run.receiver
        receiver.set_mode(fail_rate=fail_rate, reset_rate=reset_rate, refuse_marked=True)
        supervisor = run.workers(workers)
        wait_workers(run, workers)
        stuck = key_name(0)
        acked: list[str] = []
        sent: dict[str, list[str]] = defaultdict(list)
        errors: Counter = Counter()
        first_send = time.monotonic()
        for i in paced(keys * per_key, rate):
            key, n = key_name(i % keys), i // keys
            body: dict[str, Any] = {"key": key, "n": n}
            if key == stuck and n == refuse_at:
                body["refuse"] = True
            try:
                message = outbox.send("hook", body, ordering_key=key)
            except Exception as exc:
                send_errors(errors, exc)
                continue
            acked.append(message.id)
            sent[key].append(message.id)
        refused = sent[stuck][refuse_at]
        behind = sent[stuck][refuse_at + 1 :]
        others = [i for i in acked if i not in behind and i != refused]

        def stopped_at_the_dead_letter() -> dict[str, int] | None:
            c = counts()
            ok = (
                c["pending"] + c["sending"] + c["retrying"] == 0
                and c["failed"] == 1
                and c["waiting"] == (len(behind) if policy == "block" else 0)
            )
            return c if ok else None

        if policy == "block":
            reached = wait_until(stopped_at_the_dead_letter, settle_timeout, 0.25)
            result.check(
                "the key stopped at its dead letter while every other message was delivered",
                reached is not None and statuses([refused])[refused] == "failed",
                f"counts {reached or counts()}",
            )
            arrived = Counter(Request.from_row(row).seq for row in receiver.log() if row[3] == stuck)
            refused_seq = refuse_at + 1
            early = {s: c for s, c in arrived.items() if s is not None and s > refused_seq}
            result.check(
                "nothing of the key behind its dead letter arrived",
                not early,
                f"requests by sequence: {dict(sorted(arrived.items()))}",
            )
            blocked = outbox.blocked_keys("hook")
            listed = [(b.key, b.head.id if b.head else None, b.waiting) for b in blocked]
            result.check(
                "outbox.blocked_keys lists the key, its dead letter at its head, the rest waiting",
                listed == [(stuck, refused, len(behind))]
                and all(s == "waiting" for s in statuses(behind).values()),
                f"blocked keys {listed}; behind it: {dict(Counter(statuses(behind).values()))}",
            )
            receiver.set_mode(refuse_marked=False)
            run.fault_ended()  # recover s: from the requeue until everything settled
            try:
                head = outbox.release_key("hook", stuck, "requeue")
            except Exception as exc:
                head = f"{type(exc).__name__}: {exc}"
            result.check(
                'outbox.release_key(dest, key, "requeue") requeued the dead letter and unblocked the key',
                head == refused and not outbox.blocked_keys("hook"),
                f"returned {head!r}",
            )
        found = settle(
            run,
            result,
            acked,
            first_send,
            settle_timeout,
            must_receive=lambda i: policy == "block" or i != refused,
        )
        expected_failed = 0 if policy == "block" else 1
        result.check(
            "every message settled: all succeeded"
            + ("" if policy == "block" else " but the skipped dead letter, failed"),
            result.succeeded == len(acked) - expected_failed
            and found[refused] == ("succeeded" if policy == "block" else "failed"),
            f"statuses {dict(Counter(found.values()))}; the refused one {found[refused]}",
        )
        if policy == "skip":
            result.check(
                "no key blocked (skip)", not outbox.blocked_keys("hook"), f"{outbox.blocked_keys('hook')}"
            )
        by_key, misnumbered = sequences(sent)
        result.check(
            "each key's sequence numbers follow the order its messages were sent (1, 2, 3, ...)",
            not misnumbered,
            f"{len(misnumbered)} keys" + (f": {misnumbered[:2]}" if misnumbered else ""),
        )
        found_order = examine(receiver.log(), by_key, set_aside=() if policy == "block" else (refused,))
        expected = [s for i, s in by_key[stuck] if policy == "block" or i != refused]
        result.check(
            "the key's messages first accepted in order"
            + (" after the requeue" if policy == "block" else " without it"),
            found_order.order.get(stuck) == expected,
            f"sequences in order of first acceptance: {found_order.order.get(stuck)}",
        )
        order_checks(result, found_order)
        others_ok = sum(1 for i in others if found[i] == "succeeded")
        result.check(
            "every other key delivered", others_ok == len(others), f"{others_ok} of {len(others)} succeeded"
        )
        receiver_notes(result, run)
        if errors:
            result.notes.append(f"send() exceptions: {dict(errors)}")
        worker_notes(result, supervisor)
    return result


_dead_letter_short = {
    "keys": 10,
    "per_key": 5,
    "rate": 50,
    "workers": 2,
    "refuse_at": 2,
    "visibility_timeout": 6,
    "recovery_interval": 1,
    "settle_timeout": 60,
}
register(
    "ordering-block",
    ordering_dead_letter,
    short={**_dead_letter_short, "policy": "block"},
    full={"policy": "block"},
    about="A key's head refused for good (400): nothing behind it until release_key requeues it; "
    "then the key in order; other keys go on.",
)
register(
    "ordering-skip",
    ordering_dead_letter,
    short={**_dead_letter_short, "policy": "skip"},
    full={"policy": "skip"},
    about="The same with the destination's ORDERING 'skip': the key goes on in order without its dead letter.",
)
