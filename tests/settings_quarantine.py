"""Settings of the worker processes of tests/delivery/test_poison_quarantine.py: the test settings with
short leases and sweeps, and the ``crasher`` destination (:func:`tests.poison.crash_or_record`,
``MAX_IN_FLIGHT`` 16 as an operator sets it for throughput, ``max_retries`` 2, one retry
delay of 0.5 s)."""

from tests.settings import *  # noqa: F403 (the test settings, changed below)
from tests.settings import OUTBOX, SILENCED_SYSTEM_CHECKS

VISIBILITY_TIMEOUT = 6  # seconds: long enough that one more lease is past the test's bound
RECOVERY_INTERVAL = 1
FIRST_BACKOFF = 0.5
CRASHER = {
    "TRANSPORT": "callable",
    "OPTIONS": {"path": "tests.poison.crash_or_record", "deadline": 1},
    "RETRY": [FIRST_BACKOFF],
    "MAX_RETRIES": 2,
    "MAX_IN_FLIGHT": 16,
}
OUTBOX = {
    **OUTBOX,
    "DESTINATIONS": {**OUTBOX["DESTINATIONS"], "crasher": CRASHER},
    "VISIBILITY_TIMEOUT": VISIBILITY_TIMEOUT,
    "RECOVERY_INTERVAL": RECOVERY_INTERVAL,
    "WAKE_INTERVAL": 0.2,
}
SILENCED_SYSTEM_CHECKS = [*SILENCED_SYSTEM_CHECKS, "outbox.W003", "outbox.W004", "outbox.W005"]
