"""Fill Redis with many messages in realistic statuses, quickly, through the repository.

Messages are written with ``MessageRepository.create`` (the same Lua script ``send()``
uses; with partitions one call per partition, each message in the partition its
idempotency key maps to) in batches of 10,000 without wake-up jobs, then moved to their final status with
``MessageRepository.transition`` (the same compare-and-set the workers use), 2,000 per
call, with an attempt record each. Nothing bypasses the repository, so indexes and
counts are exactly what production code would produce.

Usage (inside a configured Django process)::

    from benchmarks.loader import load
    load(1_000_000, failed=100_000)
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable

from outbox.records import Attempt, Message, Status, new_message_id
from outbox.store import Change, get_repository
from outbox.store.background import wakeups
from outbox.store.keys import partition_for

CREATE_BATCH = 10_000
#: Messages per create call (a script of 10,000 could outlast a client's read timeout on a busy machine).
CREATE_CALL = 2_000
TRANSITION_BATCH = 2_000
ERRORS = [
    "HTTP 500 Internal Server Error",
    "HTTP 503 Service Unavailable",
    "timed out (ReadTimeout) after 10.0s",
    "HTTP 404 Not Found",
]


def load(
    total: int,
    *,
    failed: int,
    retrying: int | None = None,
    pending: int | None = None,
    destinations: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    seed: int = 7,
) -> dict[str, int]:
    """Create ``total`` messages: ``failed`` dead letters, some retrying and pending, the rest succeeded.

    Args:
        total: messages to create.
        failed: how many end ``failed`` (spread over the destinations, half of them on the first).
        retrying: how many end ``retrying`` (default 1% of total).
        pending: how many stay ``pending`` (default 1% of total).
        destinations: destination names to spread messages over.
        progress: called with a line of text now and then.

    Returns:
        Count per status written.
    """
    rng = random.Random(seed)
    destinations = destinations or ["orders"]
    retrying = total // 100 if retrying is None else retrying
    pending = total // 100 if pending is None else pending
    succeeded = total - failed - retrying - pending
    if succeeded < 0:
        raise ValueError("failed + retrying + pending exceed total")
    plan = (
        [Status.FAILED.value] * failed + [Status.RETRYING.value] * retrying + [Status.PENDING.value] * pending
    )
    plan += [Status.SUCCEEDED.value] * succeeded
    rng.shuffle(plan)
    repo = get_repository()
    parts = repo.keys.partitions
    start = time.time() - total * 0.001  # spread created_at over the past
    say = progress or (lambda line: None)
    done = 0
    for offset in range(0, total, CREATE_BATCH):
        batch = []
        for i in range(offset, min(total, offset + CREATE_BATCH)):
            created = start + i * 0.001
            dest = (
                destinations[0]
                if plan[i] == Status.FAILED.value and i % 2
                else destinations[i % len(destinations)]
            )
            # with partitions, the one its idempotency key maps to (as send() picks it)
            part = partition_for(dest, f"bench-{i}", parts) if parts > 1 else None
            batch.append(
                Message(
                    id=new_message_id(created, part),
                    destination=dest,
                    body=b'{"order":%d,"items":[{"sku":"A-1","qty":2}],"total":"19.90"}' % i,
                    content_type="application/json",
                    headers={"X-Tenant": f"t{i % 50}"},
                    created_at=created,
                    idempotency_key=f"bench-{i}",
                    max_retries=5,
                    retry_policy={
                        "strategy": "exponential",
                        "base": 10.0,
                        "factor": 2.0,
                        "max_delay": 21600.0,
                        "jitter": "equal",
                    },
                    send_time=created,
                    next_attempt_at=created,
                    queue="outbox",
                    updated_at=created,
                    job_id=wakeups.new_job_id(),
                )
            )
        for j in range(0, len(batch), CREATE_CALL):  # no wake-up job is enqueued: nothing delivers them
            repo.create(batch[j : j + CREATE_CALL], time.time())
        _move(repo, batch, plan[offset : offset + len(batch)], rng)
        done += len(batch)
        say(f"loaded {done:,}/{total:,}")
    return {"succeeded": succeeded, "failed": failed, "retrying": retrying, "pending": pending}


def _move(repo, batch: list[Message], statuses: list[str], rng: random.Random) -> None:
    now = time.time()
    changes = []
    for message, status in zip(batch, statuses, strict=True):
        if status == Status.PENDING.value:
            continue
        error = "" if status == Status.SUCCEEDED.value else rng.choice(ERRORS)
        retry_count = {"succeeded": rng.choice([0, 0, 0, 1]), "failed": 6, "retrying": rng.randint(1, 4)}[
            status
        ]
        next_at = now + rng.uniform(60, 3600) if status == Status.RETRYING.value else None
        fields = {"retry_count": str(retry_count), "last_attempt_at": repr(message.created_at + 1)}
        if error:
            fields["last_error"] = error
            fields["last_status_code"] = error[5:8] if error.startswith("HTTP") else ""
        if next_at:
            fields["next_attempt_at"] = repr(next_at)
        fields = {k: v for k, v in fields.items() if v}
        changes.append(
            Change(
                id=message.id,
                from_statuses=(Status.PENDING.value,),
                to=status,
                score=next_at or message.created_at + 1,
                set=fields,
                unset=() if next_at else ("next_attempt_at",),
                attempt=Attempt(
                    started_at=message.created_at + 1,
                    duration_ms=rng.uniform(5, 400),
                    outcome=status,
                    error=error,
                ),
            )
        )
    for i in range(0, len(changes), TRANSITION_BATCH):
        repo.transition(changes[i : i + TRANSITION_BATCH], now)


if __name__ == "__main__":  # pragma: no cover - manual use
    import django

    django.setup()
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    t0 = time.perf_counter()
    print(load(n, failed=n // 10, progress=print))
    print(f"{time.perf_counter() - t0:.1f} s")
