"""The fault suite's short scenarios (``tests/faults/``), one test each, marked ``faults``.

Each runs ``python -m tests.faults --child <scenario> --size short`` in a process of its
own (its own private Redis, receiver and ``outbox_worker`` processes) and asserts the
scenario's verdict: nothing lost, every succeeded message received, the scenario's own
expectations met. ``scripts/faults`` runs the full sizes.

Scenarios in :data:`KNOWN_FAILURES` fail on today's delivery core for the reason given;
they are marked ``xfail(strict=False)`` so CI stays green while the claim-path rewrite is
under way (an XPASS in the summary means one got fixed: remove its entry). Set
``OUTBOX_FAULTS_STRICT=1`` to assert every scenario.

Run only these: ``scripts/test -m faults``; skip them: ``scripts/test -m "not faults"``.
"""

from __future__ import annotations

import os

import pytest

from tests.faults.cli import run_child
from tests.faults.harness import table
from tests.faults.scenarios import SCENARIOS

KNOWN_FAILURES = {
    "worker-kill": "retries wait in RQ's scheduled registry: a SIGKILLed worker's scheduler lock lives 61 s and "
    "survivors retry it every 10 min; a job left 'started' by a killed worker counts as live for the recovery sweep",
    "redis-restart-term": "send() inside a transaction writes on commit, so a Redis error loses a committed message; "
    "a worker mid-job when Redis goes away exits and leaves its message pending",
    "redis-restart-kill": "send() inside a transaction writes on commit, so a Redis error loses a committed message",
    "poison-group": "outcomes written once a second: batch mates answered before the crash are delivered again",
    "poison-orphans": "outcomes written once a second: batch mates answered before the crash are delivered again",
    "poison-fork": "outcomes written once a second: batch mates answered before the crash are delivered again",
    "job-timeout": "outcomes written once a second: batch mates answered before the job timeout are delivered again",
    # SQLite serialises the transactions (BEGIN IMMEDIATE), so the race is rarely lost there
    "idempotency-sqlite": "send() in a transaction returns a new id even when another transaction wins the key",
    "idempotency-postgres": "send() in a transaction returns a new id even when another transaction wins the key",
    "receiver-drip": "the webhook transport has no overall deadline for a dripped status line and headers",
}

STRICT = os.environ.get("OUTBOX_FAULTS_STRICT") == "1"


def _params():
    for name in SCENARIOS:
        marks = [pytest.mark.faults]
        if name in KNOWN_FAILURES and not STRICT:
            marks.append(pytest.mark.xfail(reason=f"today's code: {KNOWN_FAILURES[name]}", strict=False))
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_params()))
def test_fault_scenario(name):
    result = run_child(name, "short", timeout=240)
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.ok, "\n" + table([result])
